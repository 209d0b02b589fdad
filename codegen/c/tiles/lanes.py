"""The loops over a register tile's rows and vector lanes, shared by the tile and dot strategies
(`codegen.c.tiles.tiles`, `codegen.c.tiles.dot`) and the unswitched lanes
(`codegen.c.tiles.unswitch`)."""

from __future__ import annotations

import sympy

from codegen.c.geometry import CpuGeometry
from codegen.c.tiles.rows import batch_row_calls, batch_row_sums, row_loop, unroll_pragma
from codegen.emit.emitter import Emitter, Lines, block_lines
from codegen.emit.staging import Plan

CEmitter = Emitter[CpuGeometry]


def lane_loops(
    e: CEmitter,
    rn: str,
    wn: str,
    inner: Lines,
    simd: bool = True,
    plan: Plan | None = None,
    level: int = 0,
    around: tuple[Lines, Lines] = ([], []),
    selected: bool = False,
    lanes_only: bool = False,
) -> Lines:
    """Loops over the register tile: rows (if any) outside, simd lanes inside. With a `plan`,
    the row loop's body starts with the plan's level `level` and the lane loop's with the
    next one (or the lane loop's with `level` when there is no row). `around` are lines of
    the lane loop before and after its level (outside that level's tests). `selected`:
    `inner` already holds the lane level's statements and tests (`selected_fold_lines`).
    `lanes_only`: the lane loop alone (`rows_around` adds the rows)."""
    s = e.schedule
    vector = sympy.Symbol(s.vector or "", integer=True)
    vec, vec0 = e.printer.index(vector), e.tile_name("o", vector)
    vector_level = level + 1 if s.row else level
    if plan is not None and not selected:
        inner = e.level_lines(plan, vector_level, inner, simd=simd)
    lane = [f"const int64_t {vec} = {vec0} + w_;", *around[0], *inner, *around[1]]
    lines = block_lines(f"for (int64_t w_ = 0; w_ < {wn}; ++w_)", lane)
    # Fully unrolled tile loops keep the accumulators in registers.
    lines = (["#pragma omp simd"] if simd else unroll_pragma(wn, s.width)) + lines
    return lines if s.row is None or lanes_only else rows_around(e, rn, lines, plan, level)


def rows_around(e: CEmitter, rn: str, lines: Lines, plan: Plan | None, level: int) -> Lines:
    """The tile's row loop around lane loops `lines`, the plan's row level before them."""
    batched: Lines = []
    if plan is not None:
        plan, batched, sums = batch_row_sums(e, plan, level, rn)
        plan, calls = batch_row_calls(e, plan, level, rn, sums)
        batched += calls
        lines = e.level_lines(plan, level, lines)
    return batched + row_loop(e, rn, lines)


def lane_levels(e: CEmitter) -> list[list[sympy.Symbol]]:
    """The levels of the tile's row (if any) and vector lanes."""
    s = e.schedule
    names = [s.row, s.vector] if s.row else [s.vector]
    return [[sympy.Symbol(name or "", integer=True)] for name in names]
