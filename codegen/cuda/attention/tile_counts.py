"""Counts of the online and weighted kernels (`codegen.cuda.attention.online`) for concrete
shapes: the key tiles a block visits and skips, and the FMAs executed against the useful ones. A row
weights only the keys of a tile in its own range, but the rows of a warp (`32 / lanes`
consecutive ones) run in step: a warp pays, on each visited tile, for its rows times the
most keys one of them has in range there (a tile inside every row's range: all its pairs);
the pairs in range are useful. `explain` prints them; issue 24's target
is executed / useful <= 1.3 (causal attention: only the unmasked half is useful).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.cuda.attention import query_tiles
from codegen.cuda.attention.key_tiles import PITCH
from codegen.cuda.attention.online import (
    scores_and_weights,
    shared_bytes,
    staged_keys,
    staged_queries,
)
from codegen.cuda.schedule import GpuSchedule, choose_gpu_schedule
from codegen.cuda.staged.shared import STATIC_SHARED_LIMIT
from codegen.emit.loop_order import term_order
from codegen.ir.bounds import loop_bounds
from codegen.ir.extents import extent_values
from codegen.ir.nest import LoopNest, Reduce, default_dtypes
from codegen.ir.source import Spell, as_written


@dataclass(frozen=True)
class TileCounts:
    """What the online kernel does for concrete shapes (`tile_counts`)."""

    blocks: int  # row tiles times outer values
    tiles: int  # key tiles of the whole key range, over every block
    visited: int  # key tiles a block walks (the rest are skipped)
    boundary: int  # visited tiles that test each pair
    executed_pairs: int  # (row, key) pairs the warps of visited tiles pay for, valid rows
    useful_pairs: int  # pairs in range
    score_fmas: int  # FMAs of one score (the nested sums' lengths), at least 1
    columns: int  # packed columns less the logsumexp: FMAs of one weighted-sum update

    @property
    def skipped(self) -> int:
        return self.tiles - self.visited

    @property
    def executed_fmas(self) -> int:
        return self.executed_pairs * (self.score_fmas + self.columns)

    @property
    def useful_fmas(self) -> int:
        return self.useful_pairs * (self.score_fmas + self.columns)

    @property
    def ratio(self) -> float:
        return self.executed_fmas / self.useful_fmas if self.useful_fmas else 1.0


def _nested_length(body: sympy.Expr, extents: Mapping[sympy.Symbol, int]) -> int:
    """The FMAs of one evaluation of `body`: the product of its nested sums' lengths (those
    that depend on no index), summed over the nested sums; at least 1."""
    total = 0
    for nested in body.atoms(Reduce):
        length = sympy.sympify((nested.stop - nested.start).xreplace(extents))
        if length.is_Integer:
            total += max(int(length), 0) * _nested_length(nested.body, extents)
    return max(total, 1)


def tile_counts(
    nest: LoopNest, shapes: Mapping[str, Sequence[int]], schedule: GpuSchedule | None = None
) -> TileCounts:
    """Tiles visited and skipped, and score evaluations executed and useful, of the online
    kernel of the one-pass `nest` for `shapes` (every tensor the nest names) under
    `schedule` (the heuristic's by default)."""
    extents = extent_values(nest, shapes)
    order = schedule or choose_gpu_schedule(nest)
    tile_rows, tile_keys, warp = order.rows, order.tile_k, max(32 // order.cols, 1)
    *outer, row, packed = (
        next(r for r in nest.free if r.index.name == n) for n in order.free_order
    )
    j_symbol = term_order(nest, order, 0)[-1]
    bounds = loop_bounds(scores_and_weights(nest)[0], (j_symbol,))
    free_symbols = [r.index for r in (*outer, row)]
    exprs = (bounds.starts[j_symbol], bounds.stops[j_symbol], *bounds.free_tests)
    functions = [sympy.lambdify(free_symbols, x.xreplace(extents), "math") for x in exprs]

    def value(r: object) -> int:
        return int(sympy.sympify(sympy.sympify(r).xreplace(extents)))

    outer_values = [range(value(r.start), value(r.stop)) for r in outer]
    rows = range(value(row.start), value(row.stop))
    key_range = nest.terms[0].reduced[0]
    keys = max(value(key_range.stop) - value(key_range.start), 0)
    depends = {s for x in exprs for s in x.free_symbols} & {r.index for r in outer}
    blocks = visited = boundary = executed = useful = 0
    for point in _points(outer_values if depends else [range(1) for _ in outer]):
        for start in range(rows.start, rows.stop, tile_rows):
            by_row = []  # each valid row's key range, (0, 0) where it has none
            for i in range(start, min(start + tile_rows, rows.stop)):
                lo, hi, *tests = (int(fn(*point, i)) for fn in functions)
                by_row.append((lo, hi) if all(t >= 0 for t in tests) and hi > lo else (0, 0))
            ranges = [(lo, hi) for lo, hi in by_row if hi > lo]
            blocks += 1
            if not ranges:
                continue
            blo, bhi = min(lo for lo, _ in ranges), max(hi for _, hi in ranges)
            flo, fhi = max(lo for lo, _ in ranges), min(hi for _, hi in ranges)
            for j0 in range(blo, bhi, tile_keys):
                visited += 1
                boundary += not (j0 >= flo and j0 + tile_keys <= fhi)
                end = min(j0 + tile_keys, bhi)
                for w in range(0, len(by_row), warp):
                    group = by_row[w : w + warp]
                    most = max(max(min(hi, end) - max(lo, j0), 0) for lo, hi in group)
                    executed += len(group) * most
            useful += sum(hi - lo for lo, hi in ranges)
    copies = 1 if depends else math.prod(len(r) for r in outer_values)
    tiles = blocks * -(-keys // tile_keys)
    body = scores_and_weights(nest)[0].body
    return TileCounts(
        blocks * copies,
        tiles * copies,
        visited * copies,
        boundary * copies,
        executed * copies,
        useful * copies,
        _nested_length(body, extents),
        max(value(packed.stop) - value(packed.start) - bool(nest.online), 0),
    )


def _points(ranges: Sequence[range]) -> list[tuple[int, ...]]:
    points: list[tuple[int, ...]] = [()]
    for r in ranges:
        points = [(*p, v) for p in points for v in r]
    return points


def one_pass_lines(
    nest: LoopNest, shapes: Mapping[str, Sequence[int]], *, spell: Spell = as_written
) -> list[str]:
    """The CUDA kernel of a one-pass nest (`online`) for concrete shapes (every
    tensor it names), as a program's `explain(shapes)` words it: its tile and staging, the
    grid, the key tiles visited and skipped, and the score evaluations executed per useful one
    (a warp pays, on a visited tile, for its rows times the most keys one of them has in
    range: `tile_counts`); `spell` rewrites the staged reads before they are printed."""
    schedule = choose_gpu_schedule(nest, default_dtypes(nest))
    shared = shared_bytes(nest, schedule, "float")
    dynamic = ", dynamic: past the static 48 KB" if shared > STATIC_SHARED_LIMIT else ""
    counts = tile_counts(nest, shapes, schedule)
    rows = schedule.rows * schedule.cols
    keys = staged_keys(nest, schedule)
    staged = (
        f"the keys' read {spell(keys.access)} staged per tile as ks_[{schedule.tile_k}][{PITCH}] "
        f"(float32, sum over {keys.nested.index} of at most {PITCH - 1})"
        if keys is not None
        else "no read of the score staged per key tile"
    )
    query = staged_queries(nest, schedule, keys) if keys is not None else None
    if query is not None:
        staged += (
            f"; the rows' read {spell(query)} staged once per row tile as "
            f"qs_[{schedule.rows}][{query_tiles.PITCH}] (sum of at most {query_tiles.DEPTH})"
        )
    return [
        f"cuda: {schedule.describe()}",
        f"cuda: {staged}",
        f"cuda: {counts.blocks} blocks of {rows} threads, {shared} bytes of shared memory "
        f"(float32{dynamic}); {counts.visited} of {counts.tiles} key tiles "
        f"visited ({counts.skipped} skipped, {counts.boundary} tested per pair); "
        f"FMAs executed/useful = {counts.executed_fmas}/{counts.useful_fmas} = "
        f"{counts.ratio:.3f}",
    ]
