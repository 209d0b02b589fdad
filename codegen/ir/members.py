"""A multi-output nest: several outputs computed by one loop nest, packed along a last axis.

Gradient nests that share their loops (the Gaussian kernel's `dZ[j, p]` and `dB[j]`: free
`j`, summed over `i`, both reading `exp(-|X[i] - Z[j]|^2)`) are computed by one nest
(`codegen.passes.group`). Like the one-pass nest (`LoopNest.online`), it is an ordinary
`LoopNest` whose output packs the members along its last axis, so every back end, the
binding's shapes, batching and the kernel records take it unchanged: the last free index `m`
runs over `[0, K)` with `K` a constant, and each term's body is a switch on it,

    G[j, m] = sum_i where(m == 0, body_0, 0) + where(m == 1, body_1, 0) + ...

A back end that knows the form (the C back end's ``members`` strategy) computes the K bodies
together, their common sub-expressions once, one accumulator each, each element written
once; any other evaluates it as written, and computes the same numbers.

>>> import sympy
>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, index_symbol, tensor_base
>>> j, i, m = (index_symbol(n) for n in "jim")
>>> A = tensor_base("A")
>>> body = switch(m, (A[i, j], A[i, j] ** 2))
>>> nest = LoopNest("G", (Range(j, 0, 4), Range(m, 0, 2)),
...                 (Term(body, (Range(i, 0, 3),)),), (Operand("A", 2),))
>>> member_bodies(nest)
((A[i, j], A[i, j]**2),)
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from codegen.ir.nest import LoopNest

#: The most members one nest packs (each is an accumulator in registers).
MAX_MEMBERS = 16


def switch(index: sympy.Symbol, bodies: Sequence[sympy.Expr]) -> sympy.Expr:
    """`sum_k where(index == k, bodies[k], 0)`: the body of a multi-output term."""
    return sympy.Add(
        *(
            sympy.Piecewise((body, sympy.Eq(index, k)), (0, True))
            for k, body in enumerate(bodies)
            if body != 0
        )
    )


def member_count(nest: LoopNest) -> int:
    """K for a multi-output nest (its last free range is `[0, K)`, K constant), else 0."""
    if not nest.free or nest.reduction != "sum" or nest.online:
        return 0
    last = nest.free[-1]
    if last.start != 0 or not sympy.sympify(last.stop).is_Integer:
        return 0
    count = int(last.stop)
    return count if 1 <= count <= MAX_MEMBERS else 0


def member_bodies(nest: LoopNest) -> tuple[tuple[sympy.Expr, ...], ...] | None:
    """Per term, the body of each member of a multi-output nest; None when `nest` is not
    one (its last free index must appear only in the switch's conditions)."""
    count = member_count(nest)
    if not count:
        return None
    index = nest.free[-1].index
    found = []
    for term in nest.terms:
        reads = [
            *term.constraints,
            term.guard,
            *(x for r in term.reduced for x in (r.start, r.stop)),
        ]
        if any(index in sympy.sympify(x).free_symbols for x in reads):
            return None
        bodies = _split(term.body, index, count)
        if bodies is None:
            return None
        found.append(bodies)
    return tuple(found)


def _split(body: sympy.Expr, index: sympy.Symbol, count: int) -> tuple[sympy.Expr, ...] | None:
    bodies: list[sympy.Expr] = [sympy.Integer(0)] * count
    for part in sympy.Add.make_args(body):
        if part == 0:
            continue
        if not isinstance(part, sympy.Piecewise) or len(part.args) != 2:
            return None
        (value, condition), (other, otherwise) = part.args
        if other != 0 or otherwise != sympy.true or not isinstance(condition, sympy.Eq):
            return None
        sides = set(condition.args)
        if index not in sides or len(sides) != 2:
            return None
        (k,) = sides - {index}
        if not k.is_Integer or not 0 <= int(k) < count or index in value.free_symbols:
            return None
        bodies[int(k)] = bodies[int(k)] + value
    return tuple(bodies)
