"""The modifiers of `tensordsl.nn.attention`: `score_mod` and `mask_mod` checked against the
names they may read, rewritten into the attention program's terms (the score, FlexAttention's
names, grouped-query heads), with the map back to the user's text for errors; and `mod_args`.

>>> modifier("score_mod", "score + R[h, q_idx - kv_idx]", set(), {"R"}, "s_[b,h,i,j]").text
'(s_[b,h,i,j]) + R[h, i - j]'
"""

from __future__ import annotations

import dataclasses
from typing import Any

from tensordsl.errors import (
    OptionError,
    ParseError,
    RangeError,
    TensorDSLError,
    UnknownNameError,
    UnsupportedError,
    close_match,
)
from tensordsl.frontend.parse import Access, Binary, Name, Number, Unary, parse
from tensordsl.nn._common import as_array

INDICES = ("b", "h", "i", "j")
#: FlexAttention's names for the score and the indices (a mod_args name of the same spelling
#: takes precedence).
ALIASES = {"score": "S", "q_idx": "i", "kv_idx": "j"}
_HEAD = "M[b,h,i,j] := "


def _children(node: Any) -> list[Any]:
    found = []
    for field in dataclasses.fields(node):
        value = getattr(node, field.name)
        for item in value if isinstance(value, tuple) else (value,):
            if dataclasses.is_dataclass(item):
                found.append(item)
    return found


def _check_names(
    option: str,
    text: str,
    node: Any,
    scalars: set[str],
    arrays: set[str],
    spans: list[Any],
    in_access: bool = False,
    reads: set[str] | None = None,
) -> None:
    """Raise for a name the expression may not read; collect `(span, name)` of the bare `S`
    and of FlexAttention's names (ALIASES), with the name each stands for, and in `reads`
    the mod_args names read."""
    reads = set() if reads is None else reads
    allowed = {*INDICES} if in_access else {*INDICES, "inf", *scalars}
    allowed |= {"S"} if option == "score_mod" and not in_access else set()
    shift = len(_HEAD)
    name = getattr(node, "name", None)
    if isinstance(node, Name) and name in ALIASES and name not in scalars | arrays:
        node = dataclasses.replace(node, name=ALIASES[node.name])
    if isinstance(node, Name) and node.name not in allowed:
        start, stop = node.span[0] - shift, node.span[1] - shift
        if in_access:
            what = f"{option}: '{node.name}' in an index list is not one of the indices b, h, i, j"
            expected = "index expressions over b, h, i, j (another index would be summed over)"
        elif node.name == "S":
            what = "mask_mod reads the score 'S'"
            expected = "a condition on b, h, i, j and mod_args (modify scores with score_mod)"
        else:
            what = f"{option} reads '{node.name}', which is not S, an index or a mod_args name"
            expected = "S (the score), the indices b, h, i, j, or a scalar given in mod_args"
        candidates = allowed | arrays | {a for a, n in ALIASES.items() if n in allowed}
        raise UnknownNameError(
            what,
            text,
            (start, stop),
            expected=expected,
            hint=close_match(node.name, candidates),
        )
    if isinstance(node, Name) and (node.name == "S" or node.name != name):
        spans.append((node.span, node.name))
    if isinstance(node, Name) and node.name in scalars:
        reads.add(node.name)
    if isinstance(node, Access):
        if node.name not in arrays:
            span = (node.name_span[0] - shift, node.name_span[1] - shift)
            raise UnknownNameError(
                f"{option} reads the array '{node.name}', which is not given in mod_args",
                text,
                span,
                expected="mod_args={'" + node.name + "': array}",
                hint=close_match(node.name, arrays),
            )
        reads.add(node.name)
        for index in node.indices:
            _check_names(option, text, index, scalars, arrays, spans, True, reads)
        return
    for child in _children(node):
        _check_names(option, text, child, scalars, arrays, spans, in_access, reads)


@dataclasses.dataclass(frozen=True)
class Modifier:
    """A score_mod or mask_mod as written (`written`) and as it enters the program (`text`,
    every bare `S` replaced by the score, every `h` by the query head's indices under grouped
    heads); `origin[n]` is the offset in `written` of the character at `text[n]`, so an error
    about the program underlines the user's text."""

    option: str
    written: str
    text: str
    origin: tuple[int, ...]
    reads: frozenset[str]  # the mod_args names it reads


def modifier(
    option: str,
    text: Any,
    scalars: set[str],
    arrays: set[str],
    score: str,
    head: str | None = None,
) -> Modifier:
    """`text` (a score_mod or mask_mod) checked, with every bare `S` (or `score`) replaced
    by `score`, FlexAttention's `q_idx` and `kv_idx` by `i` and `j`, and, with grouped-query
    heads, every `h` by `head` (the query head in the program's indices).

    >>> modifier("score_mod", "S + R[h, i - j + 3]", set(), {"R"}, "s_[b,h,i,j]").text
    '(s_[b,h,i,j]) + R[h, i - j + 3]'
    >>> modifier("mask_mod", "h < 2", set(), set(), "", head="hk_*4 + g_").text
    '(hk_*4 + g_) < 2'
    >>> modifier("mask_mod", "(q_idx >= kv_idx) & (q_idx - kv_idx < 8)", set(), set(), "").text
    '(i >= j) & (i - j < 8)'
    """
    if not isinstance(text, str) or not text.strip():
        raise OptionError(
            f"{option} is {text!r}, not an expression",
            expected=f"{option} a string such as "
            + ("'S + R[h, i - j + 7]'" if option == "score_mod" else "'abs(i - j) <= 64'"),
        )
    try:
        tree = parse(_HEAD + text).body
    except ParseError as error:
        span = None
        if error.span is not None:
            span = (max(error.span[0] - len(_HEAD), 0), max(error.span[1] - len(_HEAD), 1))
        raise ParseError(
            f"{option}: {error.what}", text, span, expected=error.expected, hint=error.hint
        ) from None
    spans: list[Any] = []
    reads: set[str] = set()
    _check_names(option, text, tree, scalars, arrays, spans, reads=reads)
    if option == "score_mod" and not any(name == "S" for _, name in spans):
        raise UnsupportedError(
            "score_mod does not read the score S (attention runs only modifications of it)",
            text,
            (0, len(text)),
            expected="a score_mod that reads S, such as 'S + (i - j)' or 'S + R[h, j]'",
            hint="to weigh keys without q and k, pass q of zeros (S is then 0)",
        )
    heads = _name_spans(tree, "h") if head is not None else []
    replaced = [(span, f"({score})" if name == "S" else name) for span, name in spans]
    replaced += [(span, f"({head})") for span in heads]
    written, origin = text, list(range(len(text)))
    for (start, stop), new in sorted(replaced, reverse=True):
        start, stop = start - len(_HEAD), stop - len(_HEAD)
        text = f"{text[:start]}{new}{text[stop:]}"
        origin[start:stop] = [start] * len(new)
    return Modifier(option, written, text, tuple(origin), frozenset(reads))


def in_modifier(error: TensorDSLError, modifiers: list[Modifier]) -> TensorDSLError:
    """An error about the attention program, raised again about the modifier whose text it
    underlines (an unknown function, a boundary form as a value), or without the program
    (the library's own statements are not the user's)."""
    kind = type(error)
    if error.source is not None and error.span is not None:
        start, stop = error.span
        for each in modifiers:
            at = error.source.find(each.text)
            while at >= 0:
                if at <= start and stop <= at + len(each.text):
                    first = each.origin[start - at]
                    last = each.origin[max(stop - at - 1, start - at)] + 1
                    what = f"{each.option}: {error.what}"
                    span = (first, max(last, first + 1))
                    return kind(what, each.written, span, expected=error.expected, hint=error.hint)
                at = error.source.find(each.text, at + 1)
    return kind(f"attention: {error.what}", expected=error.expected, hint=error.hint)


def _name_spans(node: Any, name: str) -> list[tuple[int, int]]:
    """The spans of every `Name` node `name` under `node`, in index lists too."""
    if isinstance(node, Name):
        return [node.span] if node.name == name else []
    children = list(node.indices) if isinstance(node, Access) else _children(node)
    return [span for child in children for span in _name_spans(child, name)]


def mod_inputs(mod_args: Any) -> tuple[dict[str, Any], set[str], set[str]]:
    """mod_args checked: the inputs, the scalar names, the array names."""
    if mod_args is None:
        return {}, set(), set()
    if not isinstance(mod_args, dict):
        raise OptionError(
            f"attention: mod_args is a {type(mod_args).__name__}, not a dict",
            expected="mod_args={'R': array, 'slope': 0.5}: names to arrays or numbers",
        )
    inputs: dict[str, Any] = {}
    for name, value in mod_args.items():
        if (
            not (isinstance(name, str) and name.isidentifier())
            or name.endswith("_")
            or name in (*INDICES, "S", "inf")
        ):
            raise OptionError(
                f"attention: mod_args name {name!r} cannot be used",
                expected="an identifier other than S, b, h, i, j, inf, not ending in '_'",
            )
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        # A Python number stays weakly typed: it does not promote float32 scores to float64.
        inputs[name] = float(value) if number else as_array(value, "attention", name)
    scalars = {n for n, v in inputs.items() if isinstance(v, float) or v.ndim == 0}
    return inputs, scalars, set(inputs) - scalars


def and_masks(*masks: str) -> str:
    """One `mask_mod` keeping a key where every one of `masks` keeps it (FlexAttention's
    `and_masks`, for modifiers written as text); index comparisons among them still bound
    the loops.

    >>> and_masks("j <= i", "M[b, j] > 0")
    '(j <= i) & (M[b, j] > 0)'
    """
    return _joined("and_masks", masks, " & ")


def or_masks(*masks: str) -> str:
    """One `mask_mod` keeping a key where any of `masks` keeps it (FlexAttention's
    `or_masks`).

    >>> or_masks("j <= i", "j < 4")
    '(j <= i) | (j < 4)'
    """
    return _joined("or_masks", masks, " | ")


def _joined(helper: str, masks: tuple[str, ...], operator: str) -> str:
    if not masks or not all(isinstance(m, str) and m.strip() for m in masks):
        raise OptionError(
            f"{helper} takes mask_mod texts, got {masks!r}",
            expected=f"{helper}('j <= i', 'M[b, j] > 0'): one or more conditions as strings",
        )
    return operator.join(f"({m})" for m in masks)


def check_reads(modifiers: list[Modifier], extents: dict[str, int], shapes: dict[str, Any]) -> None:
    """Refuse a mod_args array that a modifier reads outside its shape for these q and k.

    In a kernel an index read only shifted takes the values for which every read stays
    inside (Tullio's rule), so `P[j + 1]` with `P` of `S` values would silently leave out the
    last key, and a relative table too small for `T` would shorten the output. Attention's
    indices run over the whole of q and k (`extents`), so such a read is the user's mistake:
    an affine index list is checked at its least and largest values (exact: each index
    appears with one coefficient); `mod`, `clamp`, `pad` and other forms are left to the
    kernel.

    Raises:
        RangeError: the first read outside its array, underlined in the modifier.
    """
    for each in modifiers:
        for access in _accesses(parse(_HEAD + each.written).body):
            for axis, index in enumerate(access.indices[: len(shapes[access.name])]):
                form = _affine(index)
                if form is None or any(extents[n] == 0 for n in form if n):
                    continue  # not affine, or no value read at all
                least = form.pop("", 0) + sum(
                    min(c * 0, c * (extents[n] - 1)) for n, c in form.items()
                )
                most = least + sum(abs(c) * (extents[n] - 1) for n, c in form.items())
                size = shapes[access.name][axis]
                if least < 0 or most >= size:
                    start, stop = (s - len(_HEAD) for s in access.span)
                    box = ", ".join(f"{n} in [0, {extents[n]})" for n in INDICES)
                    raise RangeError(
                        f"{each.option}: '{each.written[start:stop]}' reads axis {axis} of "
                        f"'{access.name}' at {least}..{most}, outside [0, {size})",
                        each.written,
                        (start, stop),
                        expected=f"every read inside the array for {box} (from q and k)",
                        hint="a larger array, or the index wrapped as mod(...) or clamp(...)",
                    )


def _accesses(node: Any) -> list[Access]:
    if isinstance(node, Access):
        return [node]
    return [found for child in _children(node) for found in _accesses(child)]


def _affine(node: Any) -> dict[str, int] | None:
    """An index expression as {index: coefficient, "": constant}, or None if not affine."""
    if isinstance(node, Number):
        value = float(node.text)
        return {"": int(value)} if value.is_integer() else None
    if isinstance(node, Name):
        return {ALIASES.get(node.name, node.name): 1}
    if isinstance(node, Unary) and node.op in "+-":
        form = _affine(node.operand)
        sign = -1 if node.op == "-" else 1
        return None if form is None else {n: sign * c for n, c in form.items()}
    if isinstance(node, Binary) and node.op in ("+", "-", "*"):
        left, right = _affine(node.left), _affine(node.right)
        if left is None or right is None:
            return None
        if node.op == "*":
            if set(left) <= {""}:
                left, right = right, left
            if not set(right) <= {""}:
                return None
            return {n: c * right.get("", 0) for n, c in left.items()}
        sign = -1 if node.op == "-" else 1
        merged = dict(left)
        for n, c in right.items():
            merged[n] = merged.get(n, 0) + sign * c
        return merged
    return None
