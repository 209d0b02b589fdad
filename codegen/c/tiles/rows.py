"""A tile's rows in the C emitter: the row index and loop, and the work of the row level
computed for all the rows at once.

A tile strategy (`codegen.c.tiles`, `codegen.c.tiles.dot`) binds its row index once per row of the
tile; what the row level computes that reads no lane is batched over the rows: nested sums
in one loop of independent accumulation chains (in 8-float vectors where they are dot
products of contiguous rows, `codegen.c.reductions.row_dots`), function calls in one simd loop.
"""

from __future__ import annotations

import sympy

from codegen.c.geometry import CpuGeometry
from codegen.c.reductions.row_dots import (
    DOT_ROWS,
    batchable_sum,
    plain_reads,
    row_dot_lines,
    row_of,
)
from codegen.emit.emitter import Emitter, Lines, block_lines, indent_lines
from codegen.emit.staging import Assign, Loop, Plan, Statement

CEmitter = Emitter[CpuGeometry]


def declare_row(e: CEmitter) -> str:
    """The row index of the tile's row `r_`."""
    row_index = sympy.Symbol(e.schedule.row or "", integer=True)
    return f"const int64_t {e.printer.index(row_index)} = {e.tile_name('o', row_index)} + r_;"


def unroll_pragma(count: str, size: int) -> Lines:
    """GCC's unroll pragma for a tile loop of `count` iterations (at most `size`), when
    `count` is a number: a whole tile's loop unrolled keeps its accumulators in registers.
    An edge tile's count is known only at run time; unrolled, that loop kept no accumulator
    in a register and tripled GCC's time on a tile nest (the matmul nest's -O3 build 0.4-0.6 s
    with one tile size, 1.0-1.5 s once the half-width tile brought a second edge path), so
    it stays a loop."""
    return [f"#pragma GCC unroll {size}"] if count.isdigit() else []


def row_loop(e: CEmitter, rn: str, body: Lines) -> Lines:
    """The tile's rows, each binding its row index before `body` (unrolled in a whole
    tile, `unroll_pragma`)."""
    return [
        *unroll_pragma(rn, e.schedule.rows),
        *block_lines(f"for (int64_t r_ = 0; r_ < {rn}; ++r_)", [declare_row(e), *body]),
    ]


def batch_row_sums(
    e: CEmitter, plan: Plan, level: int, rn: str
) -> tuple[Plan, Lines, dict[sympy.Symbol, sympy.Expr]]:
    """The nested sums of the row level computed for all the tile's rows in one loop.

    A nested sum per row (attention's `sum_d Q[i, d]*K[j, d]` in a tile over `i`) is a chain
    of dependent additions; computing the rows' sums in the same loop gives `rows` independent
    chains, which the core overlaps. A sum is batched
    when nothing else of the row level feeds it; it is then read from `<t>a[r_]`. The rows'
    sums are computed outside the row level's tests, and the sums of masked rows go unused
    (which sums qualify: `batchable_sum`). A dot product of two contiguous float32 rows runs
    in vectors (`codegen.c.reductions.row_dots`). Also returns each batched sum's symbol with
    its array element.
    """
    statements = plan.statements[level]
    tested = bool(plan.tests[level])
    local = {st.symbol for st in statements}
    batched: Lines = []
    kept: list[Statement] = []
    ready: dict[sympy.Symbol, sympy.Expr] = {}
    for st in statements:
        if not isinstance(st, Loop) or not batchable_sum(st, local, tested):
            kept.append(st)
            continue
        state = f"{st.symbol.name}a"
        vector = None
        if e.schedule.rows == DOT_ROWS:
            vector = row_dot_lines(e, st, state, rn, e.schedule.row or "", declare_row(e))
        batched += vector or _row_sums_in_scalars(e, st, state, rn)
        ready[st.symbol] = sympy.Dummy(f"{state}[r_]", real=True)
        kept.append(Assign(st.symbol, ready[st.symbol]))
    return (plan.with_level(level, kept) if batched else plan), batched, ready


def _row_sums_in_scalars(e: CEmitter, st: Loop, state: str, rn: str) -> Lines:
    """The sums of the tile's rows in one scalar accumulator each (`<state><r>`), then
    gathered into `<state>[r_]`. GCC vectorises a simd reduction into an array
    (`reduction(+:a[:4])`) through memory; into scalars it keeps the partial sums in
    registers (attention's dQ nest runs about twice as fast). In a partial tile the rows
    past the last compute the last row's sum again (`row_of`)."""
    rows = e.schedule.rows
    index = e.printer.index(st.index)
    lo, hi = e.printer.index(st.start), e.printer.index(st.stop)
    loop = f"for (int64_t {index} = {lo}; {index} < {hi}; ++{index})"
    inner = [declare_row(e), *e.statement_lines(st.inner, True)]
    value = e.printer.doprint(st.value)
    names = [f"{state}{r}" for r in range(rows)]
    per_row = []
    for r, name in enumerate(names):
        body = [f"const int64_t r_ = {row_of(r, rn, rows)};", *inner, f"{name} += {value};"]
        per_row += ["{", *indent_lines(body), "}"]
    return [
        f"{e.f} {', '.join(f'{name} = 0' for name in names)};",
        f"#pragma omp simd reduction(+:{', '.join(names)})",
        *block_lines(loop, per_row),
        f"const {e.f} {state}[{rows}] = {{{', '.join(names)}}};",
    ]


def batch_row_calls(
    e: CEmitter, plan: Plan, level: int, rn: str, sums: dict[sympy.Symbol, sympy.Expr]
) -> tuple[Plan, Lines]:
    """The function calls of the row level computed for all the tile's rows in one simd
    loop into `<t>r[r_]`, where they read nothing of that level but the batched `sums`.

    Attention's weights `exp(S[i, j] - L[i])` are one call per (row, j): unrolled over the
    rows they are scalar libm calls, in a simd loop one vector call (libmvec) for the rows
    (attention's weighted sum and its gradients at T=1024: about 5% faster). Under the row
    level's tests (a causal mask) only a call whose reads are plain accesses, in bounds for
    every row and every value of the loop indices: a test may guard a read (a gradient's
    `dY[p - k]`).
    """
    statements = plan.statements[level]
    tested = bool(plan.tests[level])
    local = {st.symbol for st in statements}
    ready = dict(sums)
    kept: list[Statement] = []
    lines: Lines = []
    for st in statements:
        if not isinstance(st, Assign) or st.symbol in ready:
            kept.append(st)
            continue
        calls = [f for f in st.expr.atoms(sympy.Function) if not isinstance(f, sympy.Piecewise)]
        local_reads = st.expr.free_symbols & local
        if not calls or not local_reads <= set(ready) or (tested and not plain_reads(st.expr)):
            kept.append(st)
            continue
        array = f"{st.symbol.name}r"
        value = e.printer.doprint(st.expr.xreplace(ready))
        lines += [
            f"{e.f} {array}[{e.schedule.rows}];",
            "#pragma omp simd",
            *block_lines(
                f"for (int64_t r_ = 0; r_ < {rn}; ++r_)",
                [declare_row(e), f"{array}[r_] = {value};"],
            ),
        ]
        ready[st.symbol] = sympy.Dummy(f"{array}[r_]", real=True)
        kept.append(Assign(st.symbol, ready[st.symbol]))
    return (plan.with_level(level, kept) if lines else plan), lines
