"""Find the attention tile program of a nest (`codegen.tiles.attention`), or None.

A nest is an attention kernel when, for the call's shapes:

* it is a one-pass nest (`codegen.passes.online.pair`: scores and weights over one reduced
  range), or a sum of one term `a(r, l) * b(l, c)` (every added product with the same
  factors `b` reading the last free index, the column), or two such sums packed along their
  columns (`codegen.cuda.attention.paired`'s `where(c < C1, a1*b1, a2*b2)`);
* its weights hold nested sums, each a product of a side that reads the reduced (loop)
  index and one that does not: a dot of tiles. The free index that the second sides read
  and the first do not is the row index (the queries of the forward, the keys of dK; the
  longest of several, as grouped-query heads' group is read by the queries only); the
  other free indices but the column are outer (one value per program instance);
* in float64 only, a nested sum that is no such dot (its sides both read the rows and the
  loop index: the exact weight `sum_e dO[i,e] * (V[j,e] - O[i,e])` of attention's float64
  gradients, `codegen.passes.online.centred`) is computed per (row, key) pair on a
  `[rows x keys x width]` tile, in tiles half as long;
* `b` reads the loop index and the column, not the rows; no constraint tests a column;
  a guard (an array mask: `Term.guard`, the same on both terms of a one-pass nest) reads no
  column and no nested sum: it is tested per (row, loop value) pair on every tile.

The loop index is the reduced index the dots' key sides read (the others, grouped-query
heads' group in dK and dV, run one value at a time). Tiles: rows and keys of up to
`ROW_TILE` and `KEY_TILE` values (powers of two, at least `MIN_TILE`: Triton's dot), half
that for head dims over 64; head dims and columns whole, padded to a power of two of at
least `MIN_TILE`, up to `WIDEST`.

>>> from codegen.ir.examples import matmul
>>> attention_program(matmul(), {"A": (4, 3), "B": (3, 2)}) is None   # no nested sum
True

Causal attention's one-pass nest: two query tiles of 64, the first visits one key tile.

>>> from codegen.ir.nest import Operand, extent_symbol, index_symbol, tensor_base
>>> from codegen.passes.online import pair
>>> i, j, d, e = (index_symbol(n) for n in "ijde")
>>> Q, K, V, L = (tensor_base(n) for n in "QKVL")
>>> score = Reduce("sum", Q[i, d] * K[j, d], d, 0, extent_symbol("Q", 1))
>>> keys, rows = (Range(j, 0, extent_symbol("K", 0)),), Range(i, 0, extent_symbol("Q", 0))
>>> lse = LoopNest("L", (rows,), (Term(score, keys, (i - j,)),),
...     (Operand("Q", 2), Operand("K", 2)), "logsumexp")
>>> out = LoopNest("O", (rows, Range(e, 0, extent_symbol("V", 1))),
...     (Term(sympy.exp(score - L[i]) * V[j, e], keys, (i - j,)),),
...     (Operand("Q", 2), Operand("K", 2), Operand("L", 1), Operand("V", 2)))
>>> program = attention_program(pair(lse, out), {"Q": (100, 64), "K": (100, 64), "V": (100, 64)})
>>> program.kind, program.grid_shape, program.rows.tile, program.tile_ranges()
('online', (2,), 64, ((0, 1), (0, 2)))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import sympy

from codegen.ir.affine import holds_everywhere
from codegen.ir.extents import evaluate_int, extent_values
from codegen.ir.nest import LoopNest, Range, Reduce, Term, default_dtypes, map_expressions
from codegen.passes.grad import merge_terms
from codegen.tiles.attention.program import AttentionProgram, Member, NestedDot
from codegen.tiles.build import _bounds
from codegen.tiles.precision import dot_precision
from codegen.tiles.program import TileAxis

#: The largest row and key tiles (head dims up to 64; half that above).
ROW_TILE, KEY_TILE = 64, 64
#: The smallest tile side and padded width (Triton's `tl.dot` takes 16 and up).
MIN_TILE = 16
#: The widest head dim or column count kept whole in one tile.
WIDEST = 256
_HALF = ("float16", "bfloat16")


def _power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _reads(expr: sympy.Basic, index: sympy.Symbol) -> bool:
    return index in expr.free_symbols


def _members(
    nest: LoopNest, extents: Mapping[sympy.Symbol, int]
) -> tuple[Term, list[tuple[sympy.Expr, sympy.Expr, int]]] | None:
    """The term and its members as (weight, value, column shift); None if not that form.
    A one-pass nest's two terms must walk the same reduced ranges for the call's extents
    (a relative-bias table's pair sums over `Min(K.shape[1], V.shape[1])` and
    `K.shape[1]` keys: the same loop when K and V have as many)."""
    column = nest.free[-1].index
    if nest.online:
        if len(nest.terms) != 2:
            return None
        loops = [tuple(_axis(r, extents) for r in t.reduced) for t in nest.terms]
        if loops[0] != loops[1]:
            return None
        scores, weight = nest.terms
        if set(scores.constraints) != set(weight.constraints):
            return None
        return weight, [(scores.body, weight.body, 0)]
    if nest.reduction != "sum" or len(nest.terms) != 1:
        return None
    (term,) = nest.terms
    body = term.body
    if isinstance(body, sympy.Piecewise) and len(body.args) == 2:
        (first, test), (second, otherwise) = body.args
        if otherwise != sympy.true or not isinstance(test, sympy.StrictLessThan):
            return None
        if test.lhs != column or not test.rhs.is_Integer:
            return None
        split = int(test.rhs)
        one, two = _weighted(first, column), _weighted(second, column)
        if one is None or two is None:
            return None
        (a1, b1), (a2, b2) = one, two
        return term, [(a1, b1, 0), (a2, b2.xreplace({column: column + split}), split)]
    found = _weighted(body, column)
    return None if found is None else (term, [(found[0], found[1], 0)])


def _weighted(body: sympy.Expr, column: sympy.Symbol) -> tuple[sympy.Expr, sympy.Expr] | None:
    """`(a, b)` with `body = a * b`, `b` the factors reading the column (the same in every
    added product), `a` not reading it."""
    products = [sympy.Mul.make_args(t) for t in sympy.Add.make_args(sympy.expand(body, deep=False))]
    columns = [frozenset(f for f in p if _reads(f, column)) for p in products]
    if not columns[0] or any(c != columns[0] for c in columns):
        return None
    b = sympy.Mul(*sorted(columns[0], key=str))
    if b.atoms(Reduce) or not b.atoms(sympy.Indexed):
        return None
    a = sympy.Add(*(sympy.Mul(*(f for f in p if f not in columns[0])) for p in products))
    return None if _reads(a, column) else (a, b)


def _split_dot(node: Reduce, loop: sympy.Symbol) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """`(rows side, keys side, scale)` of a nested sum's body (keys: reads `loop`)."""
    rows, keys, scale = [], [], []
    for factor in sympy.Mul.make_args(node.body):
        if _reads(factor, loop):
            keys.append(factor)
        elif _reads(factor, node.index):
            rows.append(factor)
        else:
            scale.append(factor)
    return sympy.Mul(*rows), sympy.Mul(*keys), sympy.Mul(*scale)


def attention_program(
    nest: LoopNest,
    shapes: Mapping[str, Sequence[int]],
    dtypes: Mapping[str, str] | None = None,
    *,
    precision: str = "default",
) -> AttentionProgram | None:
    """The attention tile program of `nest` for these shapes, or None (module docstring).

    Args:
        nest: the loop nest.
        shapes: the shape of every tensor the nest names.
        dtypes: dtype names of the operands and the output (default float32).
        precision: how float32 dots round, a key of `codegen.tiles.precision.MODES`.

    Returns:
        The `AttentionProgram`, or None when the nest is not an attention kernel.
    """
    if len(nest.free) < 2:
        return None
    extents = extent_values(nest, shapes)
    nest = concrete(nest, extents)
    found = _members(nest, extents)
    if found is None or not found[0].reduced:
        return None
    term, members = found
    guard = _guard(nest, extents)
    if guard is None:
        return None
    nodes = sorted({n for a, _, _ in members for n in a.atoms(Reduce)}, key=str)
    if not nodes or any(n.reduction != "sum" or not _fixed(n, extents) for n in nodes):
        return None
    dtypes = dict(dtypes or default_dtypes(nest))
    out = str(dtypes.get(nest.output, "float32"))
    roles = _roles(nest, term, nodes, extents, pairwise=out == "float64")
    if roles is None:
        return None
    row_index, loop_index = roles
    if any(_reads(b, row_index) or not _reads(b, loop_index) for _, b, _ in members):
        return None
    pairs = tuple(n for n in nodes if _pairwise(n, row_index, loop_index))
    if pairs and out != "float64":
        return None
    dots = tuple(_dot(node, loop_index, extents) for node in nodes if node not in pairs)
    built = _built(nest, members, extents)
    kept = _kept(nest, term, extents)
    wide = max(_dot(node, loop_index, extents).width.tile for node in nodes)
    if built is None or kept is None or wide > WIDEST:
        return None
    free = {r.index: _axis(r, extents) for r in nest.free[:-1]}
    reduced = {r.index: _axis(r, extents) for r in term.reduced}
    halved = wide > 64 or bool(pairs)
    rows = _tiled(free[row_index], ROW_TILE // 2 if halved else ROW_TILE)
    loop = _tiled(reduced[loop_index], KEY_TILE // 2 if halved else KEY_TILE)
    if rows.extent == 0:
        return None
    outer = tuple(a for index, a in free.items() if index != row_index)
    singles = tuple(a for index, a in reduced.items() if index != loop_index)
    bounds = _bounds(kept, [a.index for a in (*outer, rows)], [loop_index])
    return AttentionProgram(
        nest=nest,
        kind="online" if nest.online else "weighted",
        outer=outer,
        rows=rows,
        loop=loop,
        singles=singles,
        members=built,
        dots=dots,
        pairs=pairs,
        constraints=tuple(kept),
        guard=guard,
        bounds=tuple(b for b in bounds if b.index == loop_index),
        accumulate="float32" if out in _HALF else out,
        extents=tuple(sorted(extents.items(), key=lambda item: item[0].name)),
        precision=dot_precision(precision, out),
    )


def concrete(nest: LoopNest, extents: Mapping[sympy.Symbol, int]) -> LoopNest:
    """`nest` for the call's extents: every extent replaced by its value, each term's
    constraints that hold on its whole box dropped (the rest sorted), and summed terms over
    the same loops merged into one (`codegen.passes.grad.merge_terms`).

    A program's gradient nest of an input that two statements read has a term from each;
    with a relative-bias table (`R[h, i - j + T - 1]`) their ranges and offsets are written
    differently (`Min(K.shape[1], V.shape[1])`, `Max(0, K.shape[1] - T)`) and only agree
    for the call's shapes: as one term, dQ and dK are attention kernels again."""
    values = {s: sympy.Integer(v) for s, v in extents.items()}
    fixed = map_expressions(nest, lambda e: sympy.sympify(e).xreplace(values))
    free = {r.index: (int(r.start), int(r.stop) - 1) for r in fixed.free}
    terms = []
    for term in fixed.terms:
        box = dict(free)
        box.update({r.index: (int(r.start), int(r.stop) - 1) for r in term.reduced})
        kept = {c for c in term.constraints if not holds_everywhere(c, box)}
        terms.append(Term(term.body, term.reduced, tuple(sorted(kept, key=str)), term.guard))
    if nest.reduction == "sum" and not nest.online:
        terms = list(merge_terms(tuple(terms)))
    return replace(fixed, terms=tuple(terms))


def _axis(r: Range, extents: Mapping[sympy.Symbol, int], tile: int = 1) -> TileAxis:
    start, stop = evaluate_int(r.start, extents), evaluate_int(r.stop, extents)
    return TileAxis(r.index, start, max(0, stop - start), tile)


def _tiled(axis: TileAxis, most: int) -> TileAxis:
    """`axis` in tiles of up to `most` values (a power of two, at least MIN_TILE)."""
    tile = max(MIN_TILE, min(most, _power_of_two(axis.extent)))
    return TileAxis(axis.index, axis.start, axis.extent, tile)


def _fixed(node: Reduce, extents: Mapping[sympy.Symbol, int]) -> bool:
    """Whether the nested sum's range is known for the call's shapes (no loop index)."""
    return all(
        sympy.sympify(sympy.sympify(x).xreplace(extents)).is_Integer
        for x in (node.start, node.stop)
    )


def _pairwise(node: Reduce, rows: sympy.Symbol, loop: sympy.Symbol) -> bool:
    """Whether a nested sum is no dot of a rows side and a keys side (module docstring)."""
    rows_side, keys_side, _ = _split_dot(node, loop)
    return rows_side == 1 or _reads(keys_side, rows)


def _roles(
    nest: LoopNest,
    term: Term,
    nodes: Sequence[Reduce],
    extents: Mapping[sympy.Symbol, int],
    *,
    pairwise: bool = False,
) -> tuple[sympy.Symbol, sympy.Symbol] | None:
    """(row index, loop index), or None: the loop is the longest reduced index every dot's
    key side reads; the rows the longest free index (not the column) that a dot's row side
    reads and its key side does not (several: grouped-query heads' group reads the queries
    only, and is outer). `pairwise` (float64): a nested sum with no rows side is no dot and
    names no row (`_pairwise`)."""
    reduced = {r.index: r for r in term.reduced}
    loops = [r for r in reduced if all(_reads(n, r) for n in nodes)]
    if not loops:
        return None
    loop = max(loops, key=lambda r: (_axis(reduced[r], extents).extent, str(r)))
    free = {r.index: r for r in nest.free[:-1]}
    candidates: set[sympy.Symbol] = set()
    for node in nodes:
        rows_side, keys_side, _ = _split_dot(node, loop)
        if keys_side == 1 or (rows_side == 1 and not pairwise):
            return None
        candidates |= {f for f in free if _reads(rows_side, f) and not _reads(keys_side, f)}
    if not candidates:
        return None
    order = {r.index: n for n, r in enumerate(nest.free)}
    rows = max(candidates, key=lambda f: (_axis(free[f], extents).extent, order[f]))
    return rows, loop


def _dot(node: Reduce, loop: sympy.Symbol, extents: Mapping[sympy.Symbol, int]) -> NestedDot:
    rows_side, keys_side, scale = _split_dot(node, loop)
    start, stop = evaluate_int(node.start, extents), evaluate_int(node.stop, extents)
    length = max(0, stop - start)
    width = TileAxis(node.index, start, length, _power_of_two(max(MIN_TILE, length)))
    return NestedDot(node, rows_side, keys_side, scale, width)


def _built(
    nest: LoopNest, members: Sequence[tuple], extents: Mapping[sympy.Symbol, int]
) -> tuple[Member, ...] | None:
    """The members with their column axes (the packed logsumexp left out), or None."""
    last = nest.free[-1]
    if evaluate_int(last.start, extents) != 0:
        return None
    stop = evaluate_int(last.stop, extents) - (1 if nest.online else 0)
    ends = [shift for _, _, shift in members[1:]] + [stop]
    built = []
    for (weight, value, shift), end in zip(members, ends):
        count = end - shift
        tile = _power_of_two(max(MIN_TILE, count))
        if count <= 0 or tile > WIDEST:
            return None
        name = nest.output if len(members) == 1 else f"{nest.output}[{shift}:{end}]"
        built.append(Member(name, weight, value, TileAxis(last.index, 0, count, tile)))
    return tuple(built)


def _guard(nest: LoopNest, extents: Mapping[sympy.Symbol, int]) -> sympy.Basic | None:
    """The terms' guard with concrete extents (the same on every term), or None when they
    differ or it reads the column or a nested sum."""
    guards = {t.guard for t in nest.terms}
    if len(guards) != 1:
        return None
    guard = sympy.sympify(next(iter(guards))).xreplace(extents)
    if guard.atoms(Reduce) or _reads(guard, nest.free[-1].index):
        return None
    return guard


def _kept(
    nest: LoopNest, term: Term, extents: Mapping[sympy.Symbol, int]
) -> list[sympy.Expr] | None:
    """The term's constraints that do not hold everywhere (concrete), or None when one of
    them tests the column."""
    box = {}
    for r in (*nest.free, *term.reduced):
        axis = _axis(r, extents)
        if axis.extent == 0:
            return None
        box[r.index] = (axis.start, axis.start + axis.extent - 1)
    kept = []
    for constraint in term.constraints:
        concrete = sympy.sympify(sympy.sympify(constraint).xreplace(extents))
        if holds_everywhere(concrete, box):
            continue
        if _reads(concrete, nest.free[-1].index):
            return None
        kept.append(concrete)
    return kept
