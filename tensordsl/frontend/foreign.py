"""Hints for notations from elsewhere, on a parse error: an einsum string (alone, quoted in
a statement, or as an `einsum(...)` call) and the `@` operator, rewritten in this language
with the user's own names where the source has them.
"""

from __future__ import annotations

import re

_EINSUM = re.compile(r"\s*([A-Za-z]*(?:\s*,\s*[A-Za-z]*)*)\s*->\s*([A-Za-z]*)\s*")
#: `einsum("ik,kj->ij", A, B)` or a quoted einsum string inside a statement
_EINSUM_CALL = re.compile(r"""(?:\w+\.)*einsum\(\s*(['"])(.*?)\1\s*((?:,\s*\w+\s*)*)\)""")
_QUOTED = re.compile(r"""(['"])(.*?)\1""")
_OPERAND = r"([A-Za-z_]\w*)(?:\[([^\]]*)\])?"
_MATMUL = re.compile(_OPERAND + r"\s*@\s*" + _OPERAND)
#: Python's prefixes of integer literals in other bases: base, its name, its digits.
_OTHER_BASES = {
    "x": (16, "a hexadecimal", re.compile(r"[0-9a-fA-F_]+")),
    "o": (8, "an octal", re.compile(r"[0-7_]+")),
    "b": (2, "a binary", re.compile(r"[01_]+")),
}


def foreign_literal(number: str, name: str) -> tuple[str, str] | None:
    """What is wrong and what was expected, where a number and the name written against it
    are one of Python's literals (`0x1F`, `0b101`, `1_000`) rather than an implicit product:
    the language writes numbers in decimal, without separators.

    >>> foreign_literal("1", "_000")
    ("'1_000' separates digits with '_'", 'a decimal number, such as 1000')
    >>> foreign_literal("2", "i") is None
    True
    """
    text = number + name
    base = _OTHER_BASES.get(name[:1].lower()) if number == "0" else None
    if base is not None and base[2].fullmatch(name[1:]):
        value = str(int(text, 0))
        return f"'{text}' is {base[1]} literal, which the language does not read", (
            f"a decimal number, such as {value}"
        )
    if name.startswith("_") and re.fullmatch(r"[\d_]+", name[1:] or "x"):
        return (
            f"'{text}' separates digits with '_'",
            f"a decimal number, such as {text.replace('_', '')}",
        )
    return None


def foreign_notation_hint(source: str) -> str | None:
    """How to write an einsum string or a `@` product in this language, when `source` is
    one or holds one (a parse error's hint), with the user's own names where it has them.

    >>> print(foreign_notation_hint("ik,kj->ij"))  # doctest: +ELLIPSIS
    an einsum string: name the tensors, as in 'Y[i,j] := A[i,k] * B[k,j]' (...)
    >>> print(foreign_notation_hint("Y[b,o] := X[b,i] @ W[i,o]"))  # doctest: +ELLIPSIS
    '@' is not an operator: ... as in 'Y[b,o] := X[b,i] * W[i,o]' (i, on no left side, ...)
    >>> print(foreign_notation_hint("Y[i] := jnp.exp(X[i])"))
    functions are named without a module: 'exp(...)', not 'jnp.exp(...)'
    """
    statement = source.strip()
    call = _EINSUM_CALL.search(statement)
    quoted = _QUOTED.search(statement)
    output = re.match(r"\s*(?:\(\w+\)\s*)?([A-Za-z_]\w*)[^:=]*:=", statement)
    out = output.group(1) if output is not None else "Y"
    if call is not None:
        names = [n.strip() for n in call.group(3).split(",") if n.strip()]
        return _einsum_hint(call.group(2), names, out)
    if quoted is not None and _EINSUM.fullmatch(quoted.group(2)):
        return _einsum_hint(quoted.group(2), [], out)
    if _EINSUM.fullmatch(source) is not None:
        return _einsum_hint(source, [], out)
    if "@" in source:
        return _matmul_hint(statement)
    module = _MODULE_CALL.search(statement)
    if module is not None:
        return (
            f"functions are named without a module: '{module.group(2)}(...)', not "
            f"'{module.group(1)}.{module.group(2)}(...)'"
        )
    return None


#: A library function called through its module, as in Python (`jnp.exp(X[i])`).
_MODULE_CALL = re.compile(r"\b(np|jnp|numpy|jax\.numpy|jax\.nn|jax|math|torch|F|lax)\.(\w+)\s*\(")


def _einsum_hint(spec: str, names: list[str], output: str) -> str | None:
    einsum = _EINSUM.fullmatch(spec)
    if einsum is None:
        return None
    letters = [part.strip() for part in einsum.group(1).split(",")]
    default = iter("ABCDEFGHKLMNPQRSTUVWXZ")
    names = [*names, *(next(default) for _ in letters)][: len(letters)]
    reads = [_access(name, part) for name, part in zip(names, letters)]
    left = _access(output, einsum.group(2))
    return (
        f"an einsum string: name the tensors, as in '{left} := {' * '.join(reads)}' "
        "(indices on no left side are summed)"
    )


def _matmul_hint(statement: str) -> str:
    """`A @ B` written with its indices: the user's statement with '*' for '@' where the
    right operand has an index list, else the usual matrix product with the user's names."""
    lhs, sep, body = statement.partition(":=")
    right = re.match(r"\s*@\s*" + _OPERAND, statement[statement.index("@") :])
    if sep and right is not None and right.group(2) is not None:
        example = re.sub(r"\s*@\s*", " * ", statement)
        left = set(re.findall(r"\w+", lhs.partition("[")[2]))
        inside = [
            i
            for group in re.findall(r"\[([^\]]*)\]", body)
            for i in re.findall(r"[A-Za-z_]\w*", group)
        ]
        summed = [i for i in dict.fromkeys(inside) if i not in left]
    else:
        found = _MATMUL.search(statement)
        a, b = (found.group(1), found.group(3)) if found is not None else ("A", "B")
        out = re.fullmatch(r"(\w+)\s*(?:\[\s*(\w+)\s*,\s*(\w+)\s*\])?", lhs.strip())
        name, i, j = (out.group(1), out.group(2) or "i", out.group(3) or "j") if out else "Cij"
        k = next(x for x in "kjlmnpqr" if x not in (i, j))
        example, summed = f"{name}[{i},{j}] := {a}[{i},{k}] * {b}[{k},{j}]", [k]
    what = f" ({', '.join(summed)}, on no left side, {'is' if len(summed) == 1 else 'are'} summed)"
    return (
        "'@' is not an operator: write the product with its indices and '*', as in "
        f"'{example}'" + (what if summed else "")
    )


def _access(name: str, letters: str) -> str:
    return f"{name}[{','.join(letters)}]" if letters else name
