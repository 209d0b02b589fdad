"""What a call's shape checks already guarantee, so that `explain` does not repeat it.

A gradient nest keeps the eliminated index's range as constraints; one on free indices
alone becomes a test per output element (`only where W.shape[0] - k - 1 >= 0`). Where the
forward nest's accesses make that test always true for the shapes a call accepts (`k`
indexes both `W` and `X` alone, so their extents agree), `explain` leaves it out. The
generated code may still test it: it is true, so that costs nothing but a comparison.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> from codegen.ir.nest import extent_symbol, index_symbol, Range
>>> forward = lower(parse("D[i,j] := (W[k,i] - X[k,j])^2")).nest
>>> same = equal_extents(forward)
>>> k = index_symbol("k")
>>> implied(extent_symbol("W", 0) - k - 1, (Range(k, 0, extent_symbol("X", 0)),), same)
True
>>> implied(extent_symbol("W", 1) - k - 1, (Range(k, 0, extent_symbol("X", 0)),), same)
False
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy

from codegen.ir.nest import LoopNest, Range, Reduce, accesses, extent_of, extent_symbol


def equal_extents(forward: LoopNest) -> dict[sympy.Symbol, sympy.Symbol]:
    """Extent symbols a call's shape checks make equal, each mapped to one of its class.

    An index used alone on several axes whose range was inferred from one of them (not given
    by `ranges=`, which gives numbers) needs the same extent on each (Tullio's rule, checked
    at every call): `W.shape[0]` and `X.shape[0]` for `k` in `W[k,i] - X[k,j]`.
    """
    ranges = {r.index: r for r in forward.free}
    for term in forward.terms:
        ranges.update({r.index: r for r in term.reduced})
        for nested in term.body.atoms(Reduce):  # an inlined intermediate's own sum
            ranges[nested.index] = Range(nested.index, nested.start, nested.stop)
    uses: dict[sympy.Symbol, list[sympy.Symbol]] = {}
    for term in forward.terms:
        for access in accesses(term.body):
            for axis, index in enumerate(access.indices):
                if index in ranges:
                    uses.setdefault(index, []).append(extent_symbol(access.base.name, axis))
    same: dict[sympy.Symbol, sympy.Symbol] = {}
    for index, extents in uses.items():
        r = ranges[index]
        if r.start == 0 and r.stop in extents:
            same.update({e: r.stop for e in extents if e != r.stop})
    return same


def implied(
    test: sympy.Expr, free: Sequence[Range], same: Mapping[sympy.Symbol, sympy.Symbol]
) -> bool:
    """Whether `test >= 0` holds for every value of the free indices in their ranges, for
    any shapes that pass the call's checks (`same`: extents known equal)."""
    test = sympy.expand(test.xreplace(dict(same)))
    lowest = test
    for r in free:
        a = test.coeff(r.index)
        if not a.is_number or a.free_symbols:
            return False
        value = r.start if a > 0 else r.stop - 1
        lowest = lowest.subs(r.index, sympy.expand(value.xreplace(dict(same))))
    lowest = sympy.expand(lowest)
    if any(extent_of(s) is None for s in lowest.free_symbols):
        return False
    return bool(lowest.is_nonnegative)
