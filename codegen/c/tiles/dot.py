"""The dot strategy of the C emitter: a tile's lanes over a short vector axis as dot products.

A vector axis shorter than a tile (the Gaussian kernel's coordinates, `dX[i, p]`) runs as
dot products over `u` innermost: rows, then columns, then `u`'s lanes; a function call that
reads a row and the lanes but not the column is computed once per (row, lane). It shares
the tile strategy's lanes and grid (`codegen.c.tiles`).
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from codegen.c.tiles.rows import row_loop, unroll_pragma
from codegen.c.tiles.tiles import CEmitter, lane_levels, lane_loops, stored, tiled
from codegen.emit.emitter import Lines, block_lines, indent_lines
from codegen.emit.staging import Assign, Plan


def _lanes_inside(
    p: CEmitter,
    n: int,
    outer: list[list[sympy.Symbol]],
    rn: str,
    wn: str,
    tests: Sequence[sympy.Expr],
    sub: str,
) -> tuple[Plan, Lines]:
    """The dot strategy's lanes over `u` innermost: rows, then columns, then `u`'s lanes."""
    order = p.term_order(n)
    u, u0 = p.printer.index(order[-1]), p.tile_name("o", order[-1])
    tile_levels = lane_levels(p)
    plan = p.plan(n, [*outer, *tile_levels, [order[-1]]], tests)
    level = len(outer) + len(tile_levels)
    lane = [
        f"const int64_t {u} = {u0} + l_;",
        *p.level_lines(plan, level, p.fold_lines(n, plan, sub + "[l_]"), simd=True),
    ]
    loop = f"for (int64_t l_ = 0; l_ < {p.schedule.lanes}; ++l_)"
    vector = ["#pragma omp simd", *block_lines(loop, lane)]
    return plan, lane_loops(p, rn, wn, vector, simd=False, plan=plan, level=len(outer))


def _lane_major(
    p: CEmitter,
    n: int,
    outer: list[list[sympy.Symbol]],
    rn: str,
    wn: str,
    tests: Sequence[sympy.Expr],
    sub: str,
) -> tuple[Plan, Lines] | None:
    """The dot strategy's lanes when a function call depends on a row and `u` but not on the
    column index: per row, one simd loop over `u`'s lanes computes what does not read the
    column into lane arrays, then each column's simd loop reads them, so the call runs once
    per (row, lane) for all the columns instead of once per column (the Gaussian kernel's
    `dX[i, p]`: one `exp` per (i, j) for the three coordinates p). None when no such call
    exists."""
    s = p.schedule
    order = p.term_order(n)
    u, u0 = p.printer.index(order[-1]), p.tile_name("o", order[-1])
    row_level = [[sympy.Symbol(s.row, integer=True)]] if s.row else []
    column = sympy.Symbol(s.vector or "", integer=True)
    numbered = p.temporaries
    plan = p.plan(n, [*outer, *row_level, [order[-1]], [column]], tests)
    lane_level = len(outer) + len(row_level)
    shared = plan.statements[lane_level]
    if not any(isinstance(st, Assign) and st.expr.has(sympy.Function) for st in shared):
        p.temporaries = numbered  # the other form numbers its temporaries alike
        return None
    names = [st.symbol.name for st in shared]
    lane = f"const int64_t {u} = {u0} + l_;"
    loop = f"for (int64_t l_ = 0; l_ < {s.lanes}; ++l_)"
    stores = [f"{name}lane[l_] = {name};" for name in names]  # `<t>a` is a nested state
    first = [lane, *p.level_lines(plan, lane_level, stores, simd=True)]
    reloads = [f"const {p.f} {name} = {name}lane[l_];" for name in names]
    inner = [*reloads, *p.level_lines(plan, lane_level + 1, p.fold_lines(n, plan, sub + "[l_]"))]
    conditions = plan.tests[lane_level]
    if conditions:
        inner = block_lines(f"if ({' && '.join(p.printer.doprint(t) for t in conditions)})", inner)
    vec, vec0 = p.printer.index(column), p.tile_name("o", column)
    column_body = [
        f"const int64_t {vec} = {vec0} + w_;",
        "#pragma omp simd",
        *block_lines(loop, [lane, *inner]),
    ]
    lines = [
        *(f"{p.f} {name}lane[{s.lanes}];" for name in names),
        "#pragma omp simd",
        *block_lines(loop, first),
        *unroll_pragma(wn, s.width),
        *block_lines(f"for (int64_t w_ = 0; w_ < {wn}; ++w_)", column_body),
    ]
    if s.row:
        lines = row_loop(p, rn, p.level_lines(plan, len(outer), lines))
    return plan, lines


def dot(e: CEmitter) -> Lines:
    s = e.schedule
    lanes = s.lanes
    dims = f"[{s.rows}][{s.width}][{lanes}]" if s.row else f"[{s.width}][{lanes}]"
    sub = "[r_][w_]" if s.row else "[w_]"
    tile_levels = lane_levels(e)

    def body(p: CEmitter, rn: str, wn: str, tests: Sequence[Sequence[sympy.Expr]]) -> Lines:
        init = block_lines(f"for (int64_t l_ = 0; l_ < {lanes}; ++l_)", p.init(sub + "[l_]"))
        lines = [*p.declare(dims=dims), *lane_loops(p, rn, wn, init, simd=False)]
        for n in range(len(p.nest.terms)):
            order = p.term_order(n)
            u, u0 = p.printer.index(order[-1]), p.tile_name("o", order[-1])
            lo, hi = p.idx(p.bounds[n].starts[order[-1]]), p.idx(p.bounds[n].stops[order[-1]])
            outer = [[], *p.reduced_levels(n, len(order) - 1)]
            # The vector part: dot-product lanes over the innermost reduced index u.
            plan, vector = _lane_major(p, n, outer, rn, wn, tests[n], sub) or _lanes_inside(
                p, n, outer, rn, wn, tests[n], sub
            )
            # The rest of u, one value at a time.
            rest_plan = p.plan(n, [*outer, [order[-1]], *tile_levels], tests[n])
            rest_lanes = lane_loops(
                p,
                rn,
                wn,
                p.fold_lines(n, rest_plan, sub + "[0]"),
                simd=False,
                plan=rest_plan,
                level=len(outer) + 1,
            )
            rest = block_lines(
                f"for (int64_t {u} = {u0}; {u} < {hi}; ++{u})",
                p.level_lines(rest_plan, len(outer), rest_lanes),
            )
            inner = [
                f"int64_t {u0} = {lo};",
                *block_lines(f"for (; {u0} + {lanes} <= {hi}; {u0} += {lanes})", vector),
                *rest,
            ]
            plans = [plan, rest_plan]
            loops = p.loops(n, ["{", *indent_lines(inner), "}"], stop_at=len(order) - 1, plan=plans)
            lines += ["{", *indent_lines(p.level_lines(plans, 0, loops)), "}"]
        combine = p.fmt(p.reducer.combine, p.names("tot_"), p.names("acc_", sub + "[l_]"))
        store = [
            *p.declare("tot_"),
            *block_lines(f"for (int64_t l_ = 0; l_ < {lanes}; ++l_)", [combine]),
            *stored(p, [p.store_line(base="tot_")]),
        ]
        return lines + lane_loops(p, rn, wn, store, simd=False)

    return tiled(e, body)
