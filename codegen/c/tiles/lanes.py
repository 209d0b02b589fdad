"""The loops over a register tile's rows and vector lanes, shared by the tile and dot strategies
(`codegen.c.tiles.tiles`, `codegen.c.tiles.dot`) and the unswitched lanes
(`codegen.c.tiles.unswitch`)."""

from __future__ import annotations

import sympy

from codegen.c.geometry import CpuGeometry
from codegen.c.reductions.row_dots import plain_reads
from codegen.c.tiles.rows import batch_row_calls, batch_row_sums, row_loop, unroll_pragma
from codegen.emit.emitter import Emitter, Lines, block_lines
from codegen.emit.staging import Assign, Loop, Plan, calls

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
    batched: Lines = []
    if plan is not None and not selected:
        if simd:
            plan, batched = batch_lane_sums(e, plan, vector_level, wn)
        inner = e.level_lines(plan, vector_level, inner, simd=simd)
    lane = [f"const int64_t {vec} = {vec0} + w_;", *around[0], *inner, *around[1]]
    lines = block_lines(f"for (int64_t w_ = 0; w_ < {wn}; ++w_)", lane)
    # Fully unrolled tile loops keep the accumulators in registers.
    lines = batched + (["#pragma omp simd"] if simd else unroll_pragma(wn, s.width)) + lines
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


def batch_lane_sums(e: CEmitter, plan: Plan, level: int, wn: str) -> tuple[Plan, Lines]:
    """The nested sums of the lane level that read the lanes, computed before the lane loop
    with their loop outside it: for each value of the summed index, one simd loop adds a
    vector of the lanes' values into `<t>l[w_]`, which the lane loop then reads.

    Written inside the lanes (a column statistic's gradient, BatchNorm's
    `sum_b dY[b, f]*(X[b, f] - mu[f])` in lanes of `f`), each lane's sum is a loop the
    compiler does not vectorise across. A sum qualifies when its bounds read nothing of the
    lane level, its body reads of that level only statements without calls or loops (computed
    again in the new loop), and, under the level's tests, only plain accesses (in bounds for
    every lane of the tile). Each lane adds its values in the same order, so the numbers do
    not change."""
    statements = plan.statements[level]
    assigns = {st.symbol: st for st in statements if isinstance(st, Assign)}
    lane = sympy.Symbol(e.schedule.vector or "", integer=True)
    vec, vec0 = e.printer.index(lane), e.tile_name("o", lane)
    lanes = f"for (int64_t w_ = 0; w_ < {wn}; ++w_)"
    batched: Lines = []
    kept: list = []
    for st in statements:
        needs = _lane_sum_needs(st, assigns, lane, bool(plan.tests[level]))
        if needs is None:
            kept.append(st)
            continue
        name = f"{st.symbol.name}l"
        index = e.printer.index(st.index)
        lo, hi = e.printer.index(st.start), e.printer.index(st.stop)
        fill = [f"const int64_t {vec} = {vec0} + w_;", *e.statement_lines(needs, True)]
        fill += [*e.statement_lines(st.inner, True)]
        fill.append(f"{name}[w_] += {e.printer.doprint(st.value)};")
        batched += [f"{e.f} {name}[{e.schedule.width}];", "#pragma omp simd"]
        batched += block_lines(lanes, [f"{name}[w_] = 0;"])
        each = ["#pragma omp simd", *block_lines(lanes, fill)]
        batched += block_lines(f"for (int64_t {index} = {lo}; {index} < {hi}; ++{index})", each)
        kept.append(Assign(st.symbol, sympy.Dummy(f"{name}[w_]", real=True)))
    return (plan.with_level(level, kept) if batched else plan), batched


def _lane_sum_needs(
    st: object, assigns: dict, lane: sympy.Symbol, tested: bool
) -> list[Assign] | None:
    """The lane level's statements a nested sum reads (in order), where `st` is a sum that
    `batch_lane_sums` takes; else None."""
    if not isinstance(st, Loop) or st.reduction != "sum":
        return None
    if any(isinstance(x, Loop) for x in st.inner):
        return None
    bounds = sympy.sympify(st.start).free_symbols | sympy.sympify(st.stop).free_symbols
    if lane in bounds or bounds & set(assigns):
        return None
    exprs = [st.value, *(x.expr for x in st.inner)]
    needed: dict[sympy.Symbol, Assign] = {}
    pending = set().union(*(x.free_symbols for x in exprs))
    if lane not in pending and not pending & set(assigns):
        return None  # reads nothing of the lanes
    while found := [s for s in pending & set(assigns) if s not in needed]:
        for symbol in found:
            statement = assigns[symbol]
            if calls(statement.expr):
                return None
            needed[symbol] = statement
            pending |= statement.expr.free_symbols
    reads = [*exprs, *(x.expr for x in needed.values())]
    if tested and not plain_reads(*reads):
        return None
    return [x for x in assigns.values() if x.symbol in needed]
