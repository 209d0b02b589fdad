"""Small constant axes: a last free index that runs over a few values only.

GPT-J's rotary embedding pairs neighbours on a last axis of 2 and reads the partner as
`X[..., 1-p]`: that read bounds `p` to `[max(0, 2 - n), min(2, n))` for an axis of `n`, at
most 2 values whatever the shapes, and its gradient nest tests `min(2, n)` the same way. Such
an axis cannot be a vector axis (its reads run backwards, and 2 lanes are no vector); the C
back end unrolls it instead and puts the free index before it in vector lanes
(`codegen.c.tiles.unroll`), where a scalar loop would run one element at a time.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> f, p = index_symbol("f"), index_symbol("p")
>>> n = extent_symbol("X", 1)
>>> X = tensor_base("X")
>>> nest = LoopNest("Y", (Range(f, 0, extent_symbol("X", 0)),
...                       Range(p, sympy.Max(0, 2 - n), sympy.Min(2, n))),
...                 (Term(X[f, 1 - p]),), (Operand("X", 2),))
>>> small_extent(nest)
2
"""

from __future__ import annotations

import sympy

from codegen.ir.nest import LoopNest, extent_of

#: Extents of a last axis unrolled (a pair, a 3-vector, a quaternion).
SMALL_EXTENTS = (2, 3, 4)


def small_extent(nest: LoopNest) -> int | None:
    """K when `nest`'s last free index is a small constant axis that the C back end unrolls:
    its range is `[0, K)` with K in `SMALL_EXTENTS`, or ends at a `min` of K and extents
    (a read `X[..., 1-p]`), or is a whole axis `[0, n)` that the nest tests against such a
    `min` (the gradient of such a read). Only nests with an index before it and no reduced
    index qualify (elementwise work: the unrolled body is all the work of an output
    element). Otherwise None."""
    if len(nest.free) < 2 or nest.online or any(t.reduced for t in nest.terms):
        return None
    last = nest.free[-1]
    start, stop = sympy.sympify(last.start), sympy.sympify(last.stop)
    if stop.is_Integer:
        bound = int(stop) - (int(start) if start.is_Integer else 0)
        return bound if bound in SMALL_EXTENTS and start.is_Integer else None
    if not (start.is_Integer or isinstance(start, sympy.Max)):
        return None
    places = [stop]
    if stop.is_Symbol and extent_of(stop) is not None:  # a whole axis: what the nest tests
        places += [x for t in nest.terms for x in (t.body, t.guard, *t.constraints)]
    found = sorted(
        int(k)
        for place in places
        for low in sympy.sympify(place).atoms(sympy.Min)
        if stop in low.args or low == stop
        for k in low.args
        if k.is_Integer and int(k) in SMALL_EXTENTS
    )
    return found[0] if found else None
