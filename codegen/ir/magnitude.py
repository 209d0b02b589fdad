"""How large the integer arithmetic of a nest can get: the bound a back end compares with the
range of its index type.

A back end that computes indices in 32 bits must know more than the tensors' sizes: an
access `X[i + 2^40]` over a range that starts at `-2^40` reads inside a small tensor, yet
both its range start and its offset leave int32, and `X[mod(3*i + 2^40)]` computes a sum
far beyond the tensor before wrapping it. `index_magnitude` bounds every integer
sub-expression (partial sums and products included) of the nest's accesses, ranges,
constraints and guards over the ranges its indices run through, for given extents.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, index_symbol, tensor_base
>>> i = index_symbol("i")
>>> nest = LoopNest("Y", (Range(i, -2**40, 6 - 2**40),),
...                 (Term(tensor_base("X")[i + 2**40]),), (Operand("X", 1),))
>>> index_magnitude(nest, {}) == 2**41  # |i| <= 2^40, so |i + 2^40| <= 2^41
True
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import sympy

from codegen.ir.functions import Clamp, Wrap
from codegen.ir.nest import LoopNest, Reduce, extent_of

#: (the largest magnitude of the expression's value, the largest of any sub-expression's)
Bound = tuple[int, int]


def index_magnitude(nest: LoopNest, extents: Mapping[sympy.Symbol, int]) -> int:
    """The largest magnitude any integer value or sub-expression of `nest`'s index arithmetic
    reaches (conservatively: a sum bounded by the sum of its terms' bounds) for `extents`
    (the value of every extent symbol the nest names)."""
    indices: dict[sympy.Symbol, int] = {}
    peak = 0
    for r in (*nest.free, *(r for t in nest.terms for r in t.reduced)):
        peak = max(peak, _range(r.index, r.start, r.stop, indices, extents))
    for expr in nest.expressions():
        peak = max(peak, _bound(expr, indices, extents)[1])
    return peak


def _range(
    index: sympy.Symbol,
    start: sympy.Expr,
    stop: sympy.Expr,
    indices: dict[sympy.Symbol, int],
    extents: Mapping[sympy.Symbol, int],
) -> int:
    """Records the bound of `index` over `[start, stop)`; returns the bounds' peak."""
    lo, hi = (
        _bound(sympy.sympify(start), indices, extents),
        _bound(sympy.sympify(stop), indices, extents),
    )
    indices[index] = max(lo[0], hi[0])
    return max(lo[1], hi[1])


def _bound(
    expr: sympy.Basic, indices: dict[sympy.Symbol, int], extents: Mapping[sympy.Symbol, int]
) -> Bound:
    if isinstance(expr, sympy.Rational):  # an Integer too; a fraction rounded up
        value = -(-abs(int(expr.p)) // int(expr.q))
        return value, value
    if isinstance(expr, sympy.Symbol):
        value = indices.get(expr, extents.get(expr, 0) if extent_of(expr) else 0)
        return value, value
    if isinstance(expr, sympy.Indexed):  # a tensor's value is no index; its indices are
        return 0, max((_bound(i, indices, extents)[1] for i in expr.indices), default=0)
    if isinstance(expr, Reduce):
        peak = _range(expr.index, expr.start, expr.stop, indices, extents)
        return 0, max(peak, _bound(expr.body, indices, extents)[1])
    parts = [_bound(a, indices, extents) for a in expr.args]
    peak = max((p for _, p in parts), default=0)
    values = [v for v, _ in parts]
    if isinstance(expr, sympy.Add):
        value = sum(values)
    elif isinstance(expr, sympy.Mul):
        value = math.prod(values)
    elif isinstance(expr, (Wrap, Clamp)):  # the result lies in [0, n)
        value = values[1]
    elif isinstance(expr, sympy.Pow) and isinstance(expr.exp, sympy.Integer) and expr.exp > 0:
        value = values[0] ** min(int(expr.exp), 64)
    else:  # a division, a minimum, a comparison: no larger than its arguments
        value = max(values, default=0)
    return value, max(peak, value)
