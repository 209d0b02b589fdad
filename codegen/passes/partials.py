"""A gradient nest with few output elements and many reduced points, as per-row partial sums.

The gradient of a parameter that a score modifier reads besides q, k and v (ALiBi's slopes
`slope[h] * (j - i)`, a learnable soft-cap or scale) has a handful of elements, each a sum
over every (batch, query, key) point: `dslope[h] = sum_b,i,j dS * (j - i)`. As written, its
nest has as many free points as heads: its threads have a few long sums to share, and its
schedule is the one for a short output, not the one for a pass over rows of pairs. Split,
it is a nest of the shape of attention's row passes, one element per (head, batch, query),
each written once by the thread that owns its row (no atomics),

    dslope_rows_[h, b, i] = sum_j dS * (j - i)

summed over `b, i` afterwards by the caller in a fixed order (XLA's reduction on the host:
the same bits on every call). What is split off: each term's reduced indices but its
innermost one, when all terms have the same such loops, each over a range fixed by the
extents alone (starting at 0), and no body binds them again.

>>> import sympy
>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, index_symbol, tensor_base
>>> h, b, i, j = (index_symbol(n) for n in "hbij")
>>> A = tensor_base("A")
>>> nest = LoopNest("dW", (Range(h, 0, 2),),
...                 (Term(A[b, h, i, j] * (j - i), (Range(b, 0, 4), Range(i, 0, 64),
...                                                  Range(j, 0, 64)), (i - j,)),),
...                 (Operand("A", 4),))
>>> rows = row_partials(nest, {"A": (4, 2, 64, 64), "dW": (2,)})
>>> rows.nest.output, rows.summed, [str(r.index) for r in rows.nest.free]
('dW_rows_', (1, 2), ['h', 'b', 'i'])
>>> [str(r.index) for r in rows.nest.terms[0].reduced]
['j']
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.ir.extents import extent_values
from codegen.ir.members import member_bodies
from codegen.ir.nest import LoopNest, Range, Reduce, Term

Shapes = Mapping[str, Sequence[int]]

#: A nest with fewer free points than this, and at least `GAIN` times as many once split,
#: is split: its threads then share rows of pairs, not a few long sums.
FEW_POINTS = 1024
GAIN = 64


@dataclass(frozen=True)
class RowPartials:
    """The partial nest of a gradient, and the axes of its output the caller sums over
    (the gradient is `sum(nest's output, axis=summed)`)."""

    nest: LoopNest
    summed: tuple[int, ...]


def row_partials(nest: LoopNest, shapes: Shapes) -> RowPartials | None:
    """`nest` as per-row partial sums (module docstring), or None when it does not split or
    splitting gains nothing (enough free points already, or too few reduced ones).

    Args:
        nest: a gradient nest (a sum).
        shapes: the shape of every tensor it names, its own output's included.

    Returns:
        The partial nest, whose output `<output>_rows_` has the gradient's axes then the
        split-off indices', and the axes to sum; or None.
    """
    if nest.reduction != "sum" or nest.online or member_bodies(nest) is not None:
        return None
    outer = _outer_ranges(nest.terms)
    bounds = {
        s for r in outer or () for x in (r.start, r.stop) for s in sympy.sympify(x).free_symbols
    }
    if outer is None or bounds & set(nest.free_indices):
        return None
    extents = {s: sympy.Integer(v) for s, v in extent_values(nest, shapes).items()}
    sizes = [sympy.sympify(r.stop).xreplace(extents) for r in (*nest.free, *outer)]
    starts = [sympy.sympify(r.start).xreplace(extents) for r in (*nest.free, *outer)]
    if not all(x.is_Integer for x in (*sizes, *starts)) or any(x != 0 for x in starts):
        return None
    free_points = math.prod(int(x) for x in sizes[: len(nest.free)])
    split_points = math.prod(int(x) for x in sizes[len(nest.free) :])
    if free_points >= FEW_POINTS or split_points < GAIN:
        return None
    taken = {op.name for op in nest.operands} | {nest.output}
    output = f"{nest.output}_rows_"
    while output in taken:
        output += "_"
    terms = tuple(Term(t.body, t.reduced[len(outer) :], t.constraints, t.guard) for t in nest.terms)
    partial = LoopNest(output, (*nest.free, *outer), terms, nest.operands, "sum")
    return RowPartials(partial, tuple(range(len(nest.free), len(nest.free) + len(outer))))


def _outer_ranges(terms: Sequence[Term]) -> tuple[Range, ...] | None:
    """The reduced ranges but the innermost one, the same in every term (same indices, same
    bounds, free of loop indices), none bound again inside a body; None otherwise."""
    first = terms[0].reduced[:-1]
    if not first:
        return None
    for term in terms:
        if term.reduced[:-1] != first or len(term.reduced) != len(first) + 1:
            return None
        bound = {r.index for r in term.body.atoms(Reduce)}
        if bound & set(term.reduced_indices):
            return None
    # rectangular once free: bounds that no loop index moves
    loops = {r.index for t in terms for r in t.reduced}
    for r in first:
        if (sympy.sympify(r.start).free_symbols | sympy.sympify(r.stop).free_symbols) & loops:
            return None
    return first
