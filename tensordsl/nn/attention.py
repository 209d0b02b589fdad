"""Multi-head attention with score and mask modifiers written in the language (FlexAttention's
idea), as one program whose `(T, S)` scores are never stored, forwards or backwards.

The program, for queries `(B, T, H, E)` and keys and values `(B, S, H, E)`::

    s_[b,h,i,j] := q_[b,i,h,d] * k_[b,j,h,d] * scale_
    (logsumexp) lse_[b,h,i] := where(MASK, MOD, -inf)
    out_[b,h,i,e] := where(MASK, exp(MOD - lse_[b,h,i]), 0) * v_[b,j,h,e]

(the output transposed to `(B, T, H, E)` after the call) where `MOD` is `score_mod` with `S`
standing for `s_[b,h,i,j]` (plus the bias, if any), and `MASK` the product of `j <= i`
(causal) and `mask_mod`. The scores `s_` are a sum larger than every input and output, read
only by reductions: the program recomputes them inside the logsumexp, the weighted sum and
every gradient nest (docs/language.md, "Programs"), and a mask made of index comparisons
bounds the loops instead of being tested. The output is written head-major, `out_[b,h,i,e]`,
like the logsumexp `lse_[b,h,i]`: the two then share their rows' order with the query `i`
innermost, and the back ends that have one run them as one pass
(`codegen.passes.online.pair`: a block of consecutive queries shares each row of `v_`)
instead of computing every score twice; the transpose to the layout of
`jax.nn.dot_product_attention` is one copy of the output.

The convention of `score_mod` and `mask_mod`: an expression of the language over

* `S`, the scaled score `q . k * scale` (plus `bias`), written alone (score_mod only);
* the indices `b` (the batch position, the leading axes flattened row-major), `h` (head),
  `i` (query position) and `j` (key position); no other index (it would be summed over);
* the names of `mod_args`: arrays read with index expressions over b, h, i, j
  (`R[h, i - j + 7]`), and scalars read bare.

>>> import numpy as np
>>> q = k = v = np.arange(12.0).reshape(1, 3, 1, 4) / 10
>>> out = attention(q, k, v, causal=True, backend="reference")
>>> out.shape
(1, 3, 1, 4)
>>> np.asarray(out[0, 0, 0], np.float64).round(4).tolist()   # the first query: the first key
[0.0, 0.1, 0.2, 0.3]
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from tensordsl.errors import OptionError, ParseError, ShapeError, UnknownNameError, close_match
from tensordsl.frontend.parse import Access, Name, parse
from tensordsl.nn._common import as_array, as_float_array, build, check_rank

INDICES = ("b", "h", "i", "j")
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
) -> None:
    """Raise for a name the expression may not read; collect the spans of the bare `S`."""
    allowed = {*INDICES} if in_access else {*INDICES, "inf", *scalars}
    allowed |= {"S"} if option == "score_mod" and not in_access else set()
    shift = len(_HEAD)
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
        candidates = allowed | arrays
        raise UnknownNameError(
            what,
            text,
            (start, stop),
            expected=expected,
            hint=close_match(node.name, candidates),
        )
    if isinstance(node, Name) and node.name == "S":
        spans.append(node.span)
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
        for index in node.indices:
            _check_names(option, text, index, scalars, arrays, spans, in_access=True)
        return
    for child in _children(node):
        _check_names(option, text, child, scalars, arrays, spans, in_access)


def modifier(option: str, text: Any, scalars: set[str], arrays: set[str], score: str) -> str:
    """`text` (a score_mod or mask_mod) checked, with every bare `S` replaced by `score`.

    >>> modifier("score_mod", "S + R[h, i - j + 3]", set(), {"R"}, "s_[b,h,i,j]")
    '(s_[b,h,i,j]) + R[h, i - j + 3]'
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
    _check_names(option, text, tree, scalars, arrays, spans)
    for start, stop in sorted(spans, reverse=True):
        start, stop = start - len(_HEAD), stop - len(_HEAD)
        text = f"{text[:start]}({score}){text[stop:]}"
    return text


def _mod_inputs(mod_args: Any) -> tuple[dict[str, Any], set[str], set[str]]:
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


def _bias(bias: Any, batch: tuple[int, ...], full: tuple[int, ...]) -> tuple[Any, str]:
    """The bias reshaped for the program, and its access (`bias_[h,i,j]`): a batch axis and
    the h, i, j axes it has (an axis of extent 1 that broadcasts is dropped)."""
    bias = as_float_array(bias, "attention", "bias")
    shape = (*batch, *full)
    if bias.ndim > len(shape) or any(
        b not in (1, s) for b, s in zip(bias.shape[::-1], shape[::-1])
    ):
        raise ShapeError(
            f"attention: 'bias' of shape {tuple(bias.shape)} does not broadcast to {shape}",
            expected="a bias broadcastable to (..., heads, queries, keys)",
        )
    bias = bias.reshape((1,) * (len(shape) - bias.ndim) + tuple(bias.shape))
    lead, rest = bias.shape[: len(batch)], bias.shape[len(batch) :]
    names, keep = [], []
    if any(n != 1 for n in lead):
        bias = jnp.broadcast_to(bias, (*batch, *rest)).reshape((math.prod(batch), *rest))
        names.append("b")
        keep.append(0)
    else:
        bias = bias.reshape(rest)
    offset = len(names)
    for axis, (name, extent, wanted) in enumerate(zip(INDICES[1:], rest, full)):
        if extent == wanted:
            names.append(name)
            keep.append(offset + axis)
    bias = bias.reshape(tuple(bias.shape[a] for a in keep))
    return bias, (f"bias_[{','.join(names)}]" if names else "bias_")


def attention_source(score: str, mask: str | None) -> str:
    """The program for a score expression (over s_) and a mask condition (or None)."""
    lines = ["s_[b,h,i,j] := q_[b,i,h,d] * k_[b,j,h,d] * scale_"]
    if mask is None:
        lines.append(f"(logsumexp) lse_[b,h,i] := {score}")
        lines.append(f"out_[b,h,i,e] := exp({score} - lse_[b,h,i]) * v_[b,j,h,e]")
    else:
        lines.append(f"(logsumexp) lse_[b,h,i] := where({mask}, {score}, -inf)")
        lines.append(f"out_[b,h,i,e] := where({mask}, exp({score} - lse_[b,h,i]), 0) * v_[b,j,h,e]")
    return "\n".join(lines)


def _check_qkv(q: Any, k: Any, v: Any) -> tuple[Any, Any, Any]:
    arrays = {"q": q, "k": k, "v": v}
    for name in arrays:
        arrays[name] = as_float_array(arrays[name], "attention", name)
        layout = "(..., keys, heads, width)" if name != "q" else "(..., queries, heads, width)"
        check_rank(arrays[name], "attention", name, 3, layout, at_least=True)
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    pairs = (
        ("k", k.shape[:-3], "q", q.shape[:-3], "the leading (batch) shape"),
        ("v", v.shape[:-3], "q", q.shape[:-3], "the leading (batch) shape"),
        ("k", k.shape[-2], "q", q.shape[-2], "the head count"),
        ("v", v.shape[-2], "q", q.shape[-2], "the head count"),
        ("k", k.shape[-1], "q", q.shape[-1], "the width (last axis)"),
        ("v", v.shape[-3], "k", k.shape[-3], "the key count"),
    )
    for name, got, other, want, what in pairs:
        if tuple(np.atleast_1d(got)) != tuple(np.atleast_1d(want)):
            raise ShapeError(
                f"attention: {what} of '{name}' is {got} but {want} in '{other}'",
                expected=f"the same {what} in '{name}' and '{other}' "
                "(q: (..., T, H, E), k: (..., S, H, E), v: (..., S, H, Ev))",
            )
    return q, k, v


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    score_mod: str | None = None,
    mask_mod: str | None = None,
    bias: Any = None,
    scale: Any = None,
    mod_args: dict[str, Any] | None = None,
    backend: str = "auto",
) -> Any:
    """Softmax attention, `softmax(q k^T * scale + bias, masked) v` per head, with no
    `(T, S)` array stored, forwards or backwards (the layout of `jax.nn.dot_product_attention`).

    Args:
        q: queries `(..., T, H, E)`; the leading axes are batch axes, flattened into `b`.
        k: keys `(..., S, H, E)`, the same leading axes and heads.
        v: values `(..., S, H, Ev)`.
        causal: keep only keys `j <= i` (query i sees keys 0..i, aligned at the start).
        score_mod: an expression of the new score over `S` (the scaled score plus the bias),
            b, h, i, j and `mod_args`, e.g. `"S + R[h, i - j + 7]"` (a relative bias per
            head), `"S - slope * abs(i - j)"` (ALiBi), `"30 * tanh(S / 30)"` (soft-capping).
        mask_mod: a condition over b, h, i, j and `mod_args`, nonzero where a key is kept,
            e.g. `"abs(i - j) <= 64"` (a band: the loops visit the band only), or
            `"M[b, j] > 0"` (a padding mask). Combined with `causal` by "and".
        bias: an array broadcastable to `(..., H, T, S)`, added to the scaled scores.
        scale: multiplies `q . k`; default `1 / sqrt(E)`.
        mod_args: arrays and scalars the modifiers read, by name; arrays are differentiated.
        backend: the kernels' back end.

    Returns:
        `(..., T, H, Ev)`. A query that keeps no key gets 0 and gives no gradient
        (FlexAttention's rule), whatever the mask reads.

    Raises:
        ShapeError: the shapes of q, k, v or bias do not agree.
        OptionError: a modifier that is not a string, a bad mod_args name.
        UnknownNameError, ParseError: a modifier that reads an unknown name, or does not parse
            (the message underlines it in the modifier).
    """
    q, k, v = _check_qkv(q, k, v)
    batch, (T, H, E), S = tuple(q.shape[:-3]), q.shape[-3:], k.shape[-3]
    inputs, scalars, arrays = _mod_inputs(mod_args)
    score = "s_[b,h,i,j]"
    if bias is not None:
        inputs["bias_"], access = _bias(bias, batch, (H, T, S))
        score = f"{score} + {access}"
    if score_mod is not None:
        score = modifier("score_mod", score_mod, scalars, arrays, score)
    conditions = ["j <= i"] if causal else []
    if mask_mod is not None:
        conditions.append(modifier("mask_mod", mask_mod, scalars, arrays, ""))
    mask = " * ".join(f"({c})" for c in conditions) if conditions else None
    flat = [x.reshape((math.prod(batch), *x.shape[-3:])) for x in (q, k, v)]
    inputs.update(q_=flat[0], k_=flat[1], v_=flat[2])
    inputs["scale_"] = (
        1.0 / math.sqrt(E)
        if scale is None
        else (float(scale) if isinstance(scale, (int, float)) else jnp.asarray(scale, q.dtype))
    )
    out = jnp.swapaxes(build(attention_source(score, mask), backend)(**inputs), 1, 2)
    return out.reshape((*batch, *out.shape[1:]))
