"""Two gradient nests of attention as one attention tile program: dK and dV together.

The gradient nests of attention's keys and values (`codegen.passes.grad`) are weighted
attention kernels (`codegen.tiles.attention.build`) over the same rows (the keys `j`), the
same loop (the queries `i`) and the same outer indices, whose weights recompute the same
scores and softmax weights. `pair_attention` packs two such nests along their columns, as
`codegen.cuda.attention.paired` does for the CUDA kernel (both return a
`codegen.passes.packing.Pair`)::

    G[.., j, c] = sum_i where(c < C1, a1(j, i) * b1(i, c), a2(j, i) * b2(i, c - C1))

an ordinary `LoopNest` (every back end computes it as written) whose attention tile
program has two members: one kernel walks the query tiles once, computes the scores' dots
and the shared exponential once per tile and accumulates both gradients (FlashAttention-2's
dK/dV kernel). Unlike the CUDA pairing, the rows need not be the next-to-last free index
(the `(B, T, H, E)` layout's dK is `dK[b, j, h, p]`), and both members' columns may fill a
tile of up to `2 * WIDEST`.

Two nests pair when each is a one-member weighted attention program, their outer, row, loop
and single axes have the same ranges (matched in order), their weights share a nested sum
once the second's indices are renamed to the first's (dQ shares nothing with dK: its rows
are the queries), their kept constraints and guards (array masks) agree, and the packed nest
is an attention program itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import sympy

from codegen.ir.extents import extent_values, output_shape
from codegen.ir.nest import LoopNest, Operand, Range, Reduce, Term, index_symbol
from codegen.passes.packing import Pair, folded_extents, renamed_indices
from codegen.tiles.attention.build import attention_program
from codegen.tiles.attention.partials import partial_of
from codegen.tiles.attention.program import AttentionProgram
from codegen.tiles.program import TileAxis

Shapes = Mapping[str, Sequence[int]]


def pair_attention(nests: Mapping[str, LoopNest], shapes: Shapes, dtype: str) -> tuple[Pair, ...]:
    """Pairs of `nests` (by output) that one attention kernel computes (module docstring);
    each nest in one pair at most, in the order given.

    Args:
        nests: gradient nests by output name.
        shapes: the shape of every tensor the nests name.
        dtype: the gradients' dtype.

    Returns:
        The pairs (`codegen.passes.packing.Pair`), each with the gradients of score
        parameters its kernel computes too (`Pair.extras`); a nest in none runs alone.
    """
    programs = {name: _program(nest, shapes, dtype) for name, nest in nests.items()}
    taken: set[str] = set()
    found = []
    names = [n for n, p in programs.items() if p is not None]
    for n, first in enumerate(names):
        for second in names[n + 1 :]:
            if first in taken or second in taken:
                continue
            pair = _pair(programs[first], programs[second], shapes, dtype, set(nests))  # type: ignore[arg-type]
            if pair is not None:
                found.append(pair)
                taken |= {first, second}
    return tuple(_with_partials(p, nests, taken, shapes, dtype) for p in found)


def _with_partials(
    pair: Pair, nests: Mapping[str, LoopNest], taken: set[str], shapes: Shapes, dtype: str
) -> Pair:
    """`pair` with the gradient nests of score parameters among the unpaired `nests` that
    its kernel computes as partial sums (`codegen.tiles.attention.partials`); each nest
    joins one pair at most (`taken` grows)."""
    known = dict(shapes)
    known[pair.nest.output] = output_shape(pair.nest, known)
    program = attention_program(pair.nest, known, {n: dtype for n in pair.nest.operand_names})
    if program is None:
        return pair
    extras = []
    for name, nest in nests.items():
        if name in taken or name not in shapes:
            continue
        if partial_of(program, nest, known) is not None:
            extras.append(nest)
            taken.add(name)
    return replace(pair, extras=tuple(extras)) if extras else pair


def _program(nest: LoopNest, shapes: Shapes, dtype: str) -> AttentionProgram | None:
    dtypes = {name: dtype for name in (*nest.operand_names, nest.output)}
    program = attention_program(nest, shapes, dtypes)
    if program is None or program.kind != "weighted" or len(program.members) != 1:
        return None
    return program


def _same(a: Sequence[TileAxis], b: Sequence[TileAxis]) -> bool:
    return [(x.start, x.extent) for x in a] == [(y.start, y.extent) for y in b]


def _pair(
    first: AttentionProgram, second: AttentionProgram, shapes: Shapes, dtype: str, taken: set[str]
) -> Pair | None:
    axes = [(p.outer, (p.rows,), (p.loop,), p.singles) for p in (first, second)]
    if not all(_same(a, b) and len(a) == len(b) for a, b in zip(*axes)):
        return None
    one, two = first.nest, second.nest
    used = {s.name for n in (one, two) for e in n.expressions() for s in e.free_symbols}
    used |= {r.index.name for n in (one, two) for t in n.terms for r in t.body.atoms(Reduce)}
    name = "c"
    while name in used:
        name += "_"
    column = index_symbol(name)
    renames = {
        b.index: a.index
        for a, b in zip(
            (*first.outer, first.rows, first.loop, *first.singles),
            (*second.outer, second.rows, second.loop, *second.singles),
        )
    }
    renames[two.free[-1].index] = column
    extents = {s: sympy.Integer(v) for n in (one, two) for s, v in extent_values(n, shapes).items()}
    moved_first = folded_extents(renamed_indices(one, {one.free[-1].index: column}), extents)
    moved = folded_extents(renamed_indices(two, renames), extents)
    # The members' weight and value, renamed as the packed nest reads them.
    parts = []
    for nest in (moved_first, moved):
        program = attention_program(nest, shapes, {n: dtype for n in nest.operand_names})
        if program is None or len(program.members) != 1:
            return None
        parts.append(program)
    (a1, b1), (a2, b2) = ((p.members[0].weight, p.members[0].value) for p in parts)
    if not a1.atoms(Reduce) & a2.atoms(Reduce):  # nothing shared (dQ with dK or dV)
        return None
    if set(map(str, parts[0].constraints)) != set(map(str, parts[1].constraints)):
        return None
    if parts[0].guard != parts[1].guard:
        return None
    split = first.members[0].column.extent
    body = sympy.Piecewise(
        (a1 * b1, sympy.StrictLessThan(column, split)),
        (a2 * b2.xreplace({column: column - split}), True),
    )
    term = moved_first.terms[0]
    operands: dict[str, Operand] = {}
    for op in (*one.operands, *two.operands):
        operands.setdefault(op.name, op)
    output = f"{one.output}_{two.output}"
    while output in taken or output in operands:
        output += "_"
    width = split + second.members[0].column.extent
    free = (*moved_first.free[:-1], Range(column, 0, width))
    kept = tuple(parts[0].constraints)  # those that hold everywhere dropped (a column test)
    guard = term.guard
    nest = LoopNest(
        output, free, (Term(body, term.reduced, kept, guard),), tuple(operands.values())
    )
    known = dict(shapes)
    known[output] = (*(s for s in _shape(first)), width)
    if attention_program(nest, known, {n: dtype for n in nest.operand_names}) is None:
        return None
    return Pair(nest, (one.output, two.output), split)


def _shape(program: AttentionProgram) -> tuple[int, ...]:
    """The output's shape but its columns."""
    by_index = {a.index: a.extent for a in (*program.outer, program.rows)}
    return tuple(by_index[r.index] for r in program.nest.free[:-1])
