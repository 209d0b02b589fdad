"""A one-hot pick written as an equality, read as a gather: `Z[b,t,v] * (Y[b,t] == v)`.

Summed over `v`, the equality keeps one term, `Z[b,t,Y[b,t]]`, or none when `Y[b,t]` is
outside the range of `v`. Looping over `v` costs the whole axis per output element (the
vocabulary, for the target pick of a cross-entropy); `one_hot_gathers` rewrites the
statement so that `Z` is read through the index array `Y` instead (a gather,
`tensordsl/frontend/gathers.py`), masked: a position outside the table reads 0 (no
`RangeError`, no NaN), so the value stays the equality's, 0 when nothing matches, and the
gradient goes to the picked entries alone.

The form recognised, for a sum over an index `v` that is on no left side and has no
`ranges=`: the body is a product (signs allowed) with one factor `(Y[...] == v)` or
`(v == Y[...])`, or `where(Y[...] == v, a, 0)` whose `a` is such a product, where `Y[...]`
is an access at plain indices without `v`. Every other factor that mentions `v` must be an
access with `v` alone on some axes (`Z[b,t,v]`): the range of `v` is then where those axes
reach, and outside it one of them is the masked 0, so the product is 0 as the sum would be.
Anything else (`v` in a function, an index expression, another comparison) stays a loop.
The entries of `Z` other than the picked one are not read: a NaN or infinity there does not
reach the result, as `0 * inf` would in the loop.

>>> from tensordsl.frontend.parse import parse
>>> st, masked = one_hot_gathers(parse("P[b] := -Z[b,v] * (v == Y[b])"), ())
>>> masked, st.source[slice(*masked[0])]
(((9, 15),), 'Z[b,v]')
>>> from tensordsl.frontend.indices import text_of
>>> [text_of(st.source, i.span) for i in st.body.left.operand.indices]
['b', 'Y[b]']
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import replace

from tensordsl.frontend.gathers import Gather, reads_array
from tensordsl.frontend.indices import walk
from tensordsl.frontend.parse import (
    Access,
    Binary,
    Call,
    Compare,
    Expr,
    Name,
    Number,
    Span,
    Statement,
    Unary,
)


def one_hot_gathers(
    statement: Statement, ranges: Collection[str]
) -> tuple[Statement, tuple[Span, ...]]:
    """`statement` with each one-hot pick over a summed index read as a gather.

    Args:
        statement: a statement whose reduction is a sum.
        ranges: the indices given by `ranges=` (never rewritten: their range is the user's).

    Returns:
        The statement (the same object when nothing is rewritten) and the spans of the
        accesses that became gathers, to be masked (a position outside reads 0).
    """
    left = {n.name for i in statement.indices or () for n in walk(i) if isinstance(n, Name)}
    masked: list[Span] = []
    while True:
        found = _pick(statement.body, left | set(ranges))
        if found is None:
            return statement, tuple(masked)
        factor, index, array, spans = found
        body = _substitute(statement.body, factor, index, array)
        statement = replace(statement, body=body)
        masked += spans


def _factors(node: Expr) -> list[Expr]:
    """The factors of a product, through signs."""
    if isinstance(node, Binary) and node.op == "*":
        return [*_factors(node.left), *_factors(node.right)]
    if isinstance(node, Unary):
        return _factors(node.operand)
    return [node]


def _equality(node: Expr) -> tuple[str, Access] | None:
    """`(index, Y[...])` for `Y[...] == index` or `index == Y[...]`."""
    if not isinstance(node, Compare) or node.op != "==":
        return None
    for name, other in ((node.right, node.left), (node.left, node.right)):
        if (
            isinstance(name, Name)
            and isinstance(other, Access)
            and not reads_array(other)
            and not _mentions(other, name.name)
        ):
            return name.name, other
    return None


def _is_zero(node: Expr) -> bool:
    return isinstance(node, Number) and float(node.text) == 0.0


def _pick(body: Expr, kept: set[str]) -> tuple[Expr, str, Access, list[Span]] | None:
    """The first equality factor over an index that can be read as a gather, with the
    index, the index array's access and the spans of the accesses it turns into gathers."""
    factors = _factors(body)
    for factor in factors:
        inner: list[Expr] = []
        if isinstance(factor, Call) and factor.name == "where" and len(factor.args) == 3:
            condition, inner = factor.args[0], _factors(factor.args[1])
            if not _is_zero(factor.args[2]):
                continue
        else:
            condition = factor
        equality = _equality(condition)
        if equality is None or equality[0] in kept:
            continue
        index, array = equality
        others = [f for f in factors if f is not factor] + inner
        spans = _gathered_spans(others, index)
        if spans:
            return factor, index, array, spans
    return None


def _mentions(node: Expr, index: str) -> bool:
    return any(isinstance(n, Name) and n.name == index for n in walk(node))


def _gathered_spans(factors: list[Expr], index: str) -> list[Span]:
    """The spans of the factors that read `index` alone on an axis, or [] when another
    factor mentions it otherwise."""
    spans = []
    for factor in factors:
        if not _mentions(factor, index):
            continue
        if not isinstance(factor, Access) or reads_array(factor):
            return []
        for axis in factor.indices:
            bare = isinstance(axis, Name) and axis.name == index
            if not bare and _mentions(axis, index):
                return []
        spans.append(factor.span)
    return spans


def _substitute(node: Expr, factor: Expr, index: str, array: Access) -> Expr:
    """The product `node` with `factor` replaced (an equality by 1, a `where` by its value)
    and `index` by the index array's access on every axis."""
    if node is factor:
        if isinstance(node, Call):
            return _substitute(node.args[1], factor, index, array)
        return Number("1", node.span)
    if isinstance(node, Binary):
        return replace(
            node,
            left=_substitute(node.left, factor, index, array),
            right=_substitute(node.right, factor, index, array),
        )
    if isinstance(node, Unary):
        return replace(node, operand=_substitute(node.operand, factor, index, array))
    if isinstance(node, Access):
        axes = tuple(
            array if isinstance(axis, Name) and axis.name == index else axis
            for axis in node.indices
        )
        return replace(node, indices=axes)
    return node


def pick_text(statement: Statement, gather: Gather) -> str:
    """How `explain` names a masked gather: the access as written, and what picks.

    >>> from tensordsl.frontend.lower import lower
    >>> from tensordsl.frontend.parse import parse
    >>> st = parse("P[b] := Z[b,v] * (Y[b] == v)")
    >>> pick_text(st, lower(st).gathers[0])
    'Z[b,v] at v = Y[b] (a one-hot pick: 0 where Y[b] is outside the range of v)'
    """
    text = statement.source
    access = next(
        n for n in walk(statement.body) if isinstance(n, Access) and n.span == gather.span
    )
    picks = [
        (
            getattr(access.indices[n], "name", "?"),
            text[axis.reads[0].span[0] : axis.reads[0].span[1]],
        )
        for n, axis in enumerate(gather.axes)
        if axis.reads
    ]
    where = ", ".join(f"{index} = {picked}" for index, picked in picks)
    outside = " or ".join(f"{picked} is outside the range of {index}" for index, picked in picks)
    return f"{text[gather.span[0] : gather.span[1]]} at {where} (a one-hot pick: 0 where {outside})"
