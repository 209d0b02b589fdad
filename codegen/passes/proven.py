"""Constraints that a call's shapes prove true for every output element, dropped.

A gradient nest keeps the eliminated index's range as constraints on the free indices
(LayerNorm's `dM[b,t]` tests `b + 1 <= X.shape[0]` for `b` in `[0, dN.shape[0])`): they
read different tensors' extents, so nothing proves them for every shape, but for one
call's shapes a constraint `c >= 0` that is affine in the free indices is least at a
corner of their box, and where that least value is not negative the test is true for every
output element. The CUDA runner emits the kernel of the nest without it for those shapes
(a kernel per set of proven tests, as per index type); other shapes keep the test.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> from codegen.ir.extents import extent_values
>>> from codegen.passes import grad
>>> nest = grad.gradient(lower(parse("V[b] := (X[b,f] - M[b])^2")).nest, "M").nest
>>> nest.free[0].stop, nest.terms[0].constraints
(dM.shape[0], (X.shape[0] - b - 1,))
>>> drop_proven(nest, extents=extent_values(nest, {"X": (4, 5), "dM": (4,)})).terms[0].constraints
()
>>> drop_proven(nest, extents=extent_values(nest, {"X": (3, 5), "dM": (4,)})) == nest
True
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import sympy

from codegen.ir.nest import LoopNest, Range, extent_of


def _least(
    constraint: sympy.Expr, free: Mapping[sympy.Symbol, Range], extents: Mapping
) -> sympy.Expr | None:
    """The least value of an affine `constraint` of free indices over their box, as a
    number; None where it reads another index or a coefficient is not a number."""
    corner = {}
    for symbol in constraint.free_symbols:
        if extent_of(symbol) is not None:
            continue
        if symbol not in free:
            return None
        slope = sympy.diff(constraint, symbol).xreplace(extents)
        if not slope.is_Integer:
            return None
        r = free[symbol]
        corner[symbol] = r.start if slope >= 0 else r.stop - 1
    least = sympy.sympify(constraint.xreplace(corner)).xreplace(extents)
    return least if least.is_Integer else None


def drop_proven(nest: LoopNest, /, *, extents: Mapping[sympy.Symbol, int]) -> LoopNest:
    """`nest` without the constraints that hold for every output element at these extents.

    Args:
        nest: a loop nest.
        extents: the value of every extent symbol of the nest (`extent_values`).

    Returns:
        The nest, with each term's constraints on free indices alone that are true on the
        whole box of free ranges removed (the same nest where none is).
    """
    values = {s: sympy.Integer(v) for s, v in extents.items()}
    free = {r.index: r for r in nest.free}
    terms = []
    for term in nest.terms:
        kept = []
        for constraint in term.constraints:
            least = _least(constraint, free, values)
            if least is None or least < 0:
                kept.append(constraint)
        terms.append(dataclasses.replace(term, constraints=tuple(kept)))
    if all(t.constraints == k.constraints for t, k in zip(nest.terms, terms, strict=True)):
        return nest
    return dataclasses.replace(nest, terms=tuple(terms))
