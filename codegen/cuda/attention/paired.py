"""Two weighted gradient nests as one CUDA kernel with two outputs: attention's dK and dV.

The gradient nests of attention's keys and values are both weighted sums
(`codegen.cuda.layout.split_weighted`) over the same loops, free `(b, h, j, column)` and
summed over the query rows `i`, whose weights recompute the same scores and softmax weights
`P = exp(S - L)`:

    dK[j, p] = sum_i a1(j, i) * Q[i, p]      a1 = scale * P * (dP + dL), dP = sum_e dO*V
    dV[j, e] = sum_i a2(j, i) * dO[i, e]     a2 = P

Run apart, each is a weighted kernel (`codegen.cuda.attention.online`) that recomputes `S` (and the
exponential) for every pair `(j, i)`. `pair_weighted` packs two such nests along their
column axis into one nest, FlashAttention-2's backward split (one block per tile of key
rows `j`, looping over the query tiles, dK and dV accumulated together):

    G[j, c] = sum_i where(c < C1, a1(j, i) * b1(i, c), a2(j, i) * b2(i, c - C1))

with `C1` the first member's column count. It is an ordinary `LoopNest` (any back end
computes it as written); the CUDA schedule recognises the form
(`codegen.cuda.layout.split_paired`) and runs the weighted kernel with both weights of a
pair planned together (their common sub-expressions, the scores and the exponential, once
per pair), `ss_` and `ss2_` holding them per tile, and each packed column adding the
weight of its member. Each element of G is written once, by one block: no atomics.

Two nests pair when, for the call's shapes (the pair is made for them: a max or min of
extents alone is replaced by its value, `codegen.passes.packing.folded_extents`), their
free ranges but the columns are the same, their one reduced range is the same, their
constraints are the same once those that hold everywhere are dropped, none of the kept ones
tests a column, both column ranges
start at 0, both members' columns fit one pass of the kernel (`ONLINE_COLUMNS`: past it,
each pass would compute both weights, more than the two kernels apart), their weights
share a nested reduction (the scores; dQ and dV of full attention over equal extents would
pair, sharing nothing), and the kernel fits the static shared memory (float64's does not).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy

from codegen.cuda.attention.online import shared_bytes
from codegen.cuda.layout import split_weighted
from codegen.cuda.schedule import ONLINE_COLUMNS, choose_gpu_schedule
from codegen.cuda.staged.shared import STATIC_SHARED_LIMIT
from codegen.ir.affine import holds_everywhere
from codegen.ir.extents import extent_values
from codegen.ir.nest import LoopNest, Operand, Range, Reduce, Term, index_symbol
from codegen.passes.packing import Pair, folded_extents, renamed_indices

Shapes = Mapping[str, Sequence[int]]


def pair_weighted(nests: Mapping[str, LoopNest], shapes: Shapes, dtype: str) -> tuple[Pair, ...]:
    """Pairs of `nests` (keyed by output, in the order to keep) that one kernel computes
    together (module docstring); each nest in one pair at most.

    Args:
        nests: gradient nests by output name.
        shapes: the shape of every tensor the nests name.
        dtype: the gradients' dtype (a pair whose kernel would declare more than the
            static shared memory, float64's, is not made).

    Returns:
        The pairs; a nest in none runs as its own.
    """
    taken: set[str] = set()
    found = []
    names = list(nests)
    for n, first in enumerate(names):
        for second in names[n + 1 :]:
            if first in taken or second in taken:
                continue
            pair = _pair(nests[first], nests[second], shapes, set(nests))
            if pair is not None and _fits(pair.nest, dtype):
                found.append(pair)
                taken |= {first, second}
    return tuple(found)


def _fits(nest: LoopNest, dtype: str) -> bool:
    """Whether the weighted kernel of the pair `nest` fits the static shared memory (with
    float64 accumulation, its second score array does not)."""
    dtypes = {name: dtype for name in (*nest.operand_names, nest.output)}
    f = "double" if dtype == "float64" else "float"
    return shared_bytes(nest, choose_gpu_schedule(nest, dtypes), f) <= STATIC_SHARED_LIMIT


def _pair(first: LoopNest, second: LoopNest, shapes: Shapes, taken: set[str]) -> Pair | None:
    """The pair of `first` and `second`, or None where they do not pair."""
    if any(not _weighted(n) for n in (first, second)) or len(first.free) != len(second.free):
        return None
    extents = {
        s: sympy.Integer(v) for n in (first, second) for s, v in extent_values(n, shapes).items()
    }
    # One new name for both columns: a member's column may be named like a nested sum's
    # index of the other (dV's `e`, dK's `sum_e dO*V`).
    used = {s.name for n in (first, second) for e in n.expressions() for s in e.free_symbols}
    used |= {r.index.name for n in (first, second) for t in n.terms for r in t.body.atoms(Reduce)}
    name = "c"
    while name in used:
        name += "_"
    renames = {r.index: f.index for r, f in zip(second.free[:-1], first.free[:-1], strict=True)}
    renames[second.terms[0].reduced[0].index] = first.terms[0].reduced[0].index
    renames[second.free[-1].index] = index_symbol(name)
    first = folded_extents(
        renamed_indices(first, {first.free[-1].index: index_symbol(name)}), extents
    )
    moved = folded_extents(renamed_indices(second, renames), extents)

    def concrete(x: sympy.Basic) -> sympy.Basic:
        return sympy.sympify(x).xreplace(extents)

    loops = [(*n.free[:-1], n.terms[0].reduced[0]) for n in (first, moved)]
    bounds = [[concrete(x) for r in rs for x in (r.start, r.stop)] for rs in loops]
    widths = [concrete(n.free[-1].stop) for n in (first, moved)]
    starts = [concrete(n.free[-1].start) for n in (first, moved)]
    if bounds[0] != bounds[1] or starts != [0, 0] or not all(w.is_Integer for w in widths):
        return None
    if sum(int(w) for w in widths) > ONLINE_COLUMNS or first.terms[0].guard != moved.terms[0].guard:
        return None
    kept = [_kept(n, concrete) for n in (first, moved)]
    if kept[0] is None or kept[1] is None:
        return None
    if {str(concrete(c)) for c in kept[0]} != {str(concrete(c)) for c in kept[1]}:
        return None
    a1, b1 = split_weighted(first)  # type: ignore[misc]
    a2, b2 = split_weighted(moved)  # type: ignore[misc]
    if not a1.atoms(Reduce) & a2.atoms(Reduce):  # nothing shared (dQ and dV): no gain
        return None
    column, split = first.free[-1].index, first.free[-1].stop
    body = sympy.Piecewise(
        (a1 * b1, sympy.StrictLessThan(column, split)),
        (a2 * b2.xreplace({column: column - split}), True),
    )
    term = Term(body, first.terms[0].reduced, tuple(kept[0]), first.terms[0].guard)
    operands: dict[str, Operand] = {}
    for op in (*first.operands, *second.operands):
        operands.setdefault(op.name, op)
    output = f"{first.output}_{second.output}"
    while output in taken or output in operands:
        output += "_"
    free = (*first.free[:-1], Range(column, 0, split + moved.free[-1].stop))
    nest = LoopNest(output, free, (term,), tuple(operands.values()), "sum")
    return Pair(nest, (first.output, second.output), int(widths[0]))


def _weighted(nest: LoopNest) -> bool:
    return split_weighted(nest) is not None and len(nest.terms[0].reduced) == 1


def _kept(nest: LoopNest, concrete) -> list[sympy.Expr] | None:
    """The constraints of `nest`'s term that do not hold everywhere on its loops, or None
    when one of them tests the column."""
    term = nest.terms[0]
    box = {}
    for r in (*nest.free, *term.reduced):
        lo, hi = concrete(r.start), concrete(r.stop)
        if not (lo.is_Integer and hi.is_Integer):
            return None
        box[r.index] = (int(lo), int(hi) - 1)
    kept = [c for c in term.constraints if not holds_everywhere(concrete(c), box)]
    column = nest.free[-1].index
    return None if any(column in c.free_symbols for c in kept) else kept
