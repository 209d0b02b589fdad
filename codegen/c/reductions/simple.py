"""The scalar and split strategies of the C emitter (see `codegen.c.schedule`), and the
parallel loop and chunked terms the other strategies share."""

from __future__ import annotations

import sympy

from codegen.c.geometry import CpuGeometry
from codegen.c.reductions.row_dots import DOT_ROWS, batchable_sum, row_dot_lines
from codegen.c.threads import CLAUSES
from codegen.emit.emitter import Emitter, Lines, block_lines, indent_lines
from codegen.emit.staging import Assign, Loop, Plan, Statement
from codegen.ir.reductions import Pass


def parallel_loop(e: Emitter[CpuGeometry], collapse: int, loop: Lines) -> Lines:
    """`loop` (one statement: a loop over the `collapse` outermost free indices, nested
    when more than one) shared out among the kernel's team when the schedule is parallel:
    `threads_` threads, as `tdsl_team` gave the kernel, each noting when it started
    (`codegen.c.threads`)."""
    if not e.schedule.parallel or collapse == 0:
        return loop
    assert loop[0].startswith("for ") and loop[-1] == "}", loop[:1]
    clause = f" collapse({collapse})" if collapse > 1 else ""
    region = ["tdsl_team_arrived(asked_);", f"#pragma omp for{clause} schedule(guided)", *loop]
    e.printer.called.add("team")  # the kernel reserves a team (`codegen.c.emit`)
    return [f"#pragma omp parallel {CLAUSES}", "{", *indent_lines(region), "}"]


#: Values a term computes at once into a buffer for a reduction with passes (logsumexp).
CHUNK = 256


def scalar(e: Emitter[CpuGeometry]) -> Lines:
    """One output element at a time: the free loops, then each term's reduced loops (in
    chunks with the reduction's vectorised passes where it has them, and for a sum whose
    values each compute a dot product that 8 values can share, `_batched_sum`)."""
    body = [*e.declare()]
    for n, term in enumerate(e.nest.terms):
        passes = e.reducer.passes or (_SUM_PASSES if _batched_sum(e, n) else ())
        body += _chunked_term(e, n, passes) if passes and term.reduced else e.term_lines(n)
    lines = [*body, e.store_line("")]
    free = e.free_symbols()
    for r in reversed(free):
        lines = block_lines(e.free_loop(r), lines)
    return parallel_loop(e, len(free), lines)


def chunk_fill(e: Emitter[CpuGeometry], n: int, also: str = "") -> tuple[Plan, Lines, str, str]:
    """The lines that compute the `cn_` values of term `n` from `c0_` on (its innermost
    reduced loop) into `chunk_`, the identity where a test leaves one out (`also`: a
    statement run with each value computed). Returns the term's plan, those lines, and the
    loop's bounds."""
    order = e.term_order(n)
    plan = e.plan(n, [[], *e.reduced_levels(n)])
    inner, kind = order[-1], e.index_type
    j = e.printer.index(inner)
    lo, hi = e.idx(e.bounds[n].starts[inner]), e.idx(e.bounds[n].stops[inner])
    plan, dots = _batch_dots(e, plan, len(order), inner)
    fold = e.fold_lines(n, plan, "", update=f"chunk_[{j} - c0_] = {{v}};{also}")
    values = [f"chunk_[{j} - c0_] = {e.reducer.init[0]};", *e.level_lines(plan, len(order), fold)]
    if dots:
        each = block_lines("for (int64_t r_ = 0; r_ < jn_; ++r_)", [_at_row(kind, j), *values])
        head = f"for ({kind} j0_ = c0_; j0_ < c0_ + cn_; j0_ += {DOT_ROWS})"
        bound = f"const {kind} jn_ = tdsl_imin({DOT_ROWS}, c0_ + cn_ - j0_);"
        return plan, block_lines(head, [bound, *dots, *each]), lo, hi
    return plan, block_lines(f"for ({kind} {j} = c0_; {j} < c0_ + cn_; ++{j})", values), lo, hi


#: A sum over a chunk's values: one vectorised pass.
_SUM_PASSES = (Pass("{a} += {v};", "reduction(+:{a})"),)


def _batched_sum(e: Emitter[CpuGeometry], n: int) -> bool:
    """Whether term `n` of a sum computes, per value of its innermost reduced index, a dot
    product of contiguous rows that 8 values can share (a score modifier's gradient by
    rows: `sum_d Q[i, d]*K[j, d]` for 8 keys `j`, `Q[i, :]` read once): then the term
    runs in chunks, as logsumexp's does."""
    order = e.term_order(n)
    if e.reducer.name != "sum" or not order:
        return False
    plan = e.plan(n, [[], *e.reduced_levels(n)])
    return bool(_batch_dots(e, plan, len(order), order[-1])[1])


def _chunked_term(e: Emitter[CpuGeometry], n: int, passes: tuple[Pass, ...]) -> Lines:
    """Term `n` with its innermost reduced loop cut into chunks of `CHUNK` values: each
    chunk's values computed once into a buffer (`chunk_fill`), reduced by
    `Reduction.passes` in simd loops over the buffer, and combined into the state.
    logsumexp then calls one vectorised exp per value instead of a scalar exp and a branch,
    and computes an expensive value (attention's scores) once."""
    plan, fill, lo, hi = chunk_fill(e, n)
    kind = e.index_type
    chunk = [
        f"const {kind} cn_ = tdsl_imin({CHUNK}, chi_ - c0_);",
        *fill,
        *e.declare("c_"),
        *(line for p in passes for line in buffer_pass(e, p, ("c_", "c_b_"))),
        e.fmt(e.reducer.combine, e.names(), ("c_", "c_b_")),
    ]
    innermost = [
        f"const {kind} clo_ = {lo}, chi_ = {hi};",
        f"{e.f} chunk_[{CHUNK}];",
        *block_lines(f"for ({kind} c0_ = clo_; c0_ < chi_; c0_ += {CHUNK})", chunk),
    ]
    loops = e.loops(n, innermost, stop_at=len(e.term_order(n)) - 1, plan=plan)
    return ["{", *indent_lines(e.level_lines(plan, 0, loops)), "}"]


def _at_row(kind: str, j: str) -> str:
    """The value `j` of the reduced index for the row `r_` of a block from `j0_`."""
    return f"const {kind} {j} = j0_ + r_;"


def _batch_dots(
    e: Emitter[CpuGeometry], plan: Plan, level: int, inner: sympy.Symbol
) -> tuple[Plan, Lines]:
    """The nested dot products of the level of the innermost reduced index `inner` computed
    for 8 consecutive values of it at once, in vectors (`codegen.c.reductions.row_dots`), into
    `<t>a[r_]`: attention's logsumexp computes 8 scores `sum_e Q[i, e]*K[j, e]` together,
    reading `Q[i, :]` once. Only sums that `batchable_sum` allows are batched. Returns the
    plan with those sums replaced by reads of the arrays, and the lines that compute them
    (empty if none)."""
    statements = plan.statements[level]
    tested = bool(plan.tests[level])
    local = {st.symbol for st in statements}
    lines: Lines = []
    kept: list[Statement] = []
    at_row = _at_row(e.index_type, e.printer.index(inner))
    for st in statements:
        state = f"{st.symbol.name}a"
        dots = None
        if isinstance(st, Loop) and batchable_sum(st, local, tested):
            dots = row_dot_lines(e, st, state, "jn_", inner.name, at_row)
        if dots is None:
            kept.append(st)
            continue
        lines += dots
        kept.append(Assign(st.symbol, sympy.Dummy(f"{state}[r_]", real=True)))
    return (plan.with_level(level, kept) if lines else plan), lines


def buffer_pass(e: Emitter[CpuGeometry], p: Pass, state: tuple[str, str]) -> Lines:
    """One pass of a reduction over the `cn_` values of `chunk_` into `state`."""
    lines = [e.fmt(p.before, state)] if p.before else []
    loop = block_lines(
        f"for ({e.index_type} q_ = 0; q_ < cn_; ++q_)",
        [f"const {e.f} val_ = chunk_[q_];", e.fmt(p.update, state)],
    )
    part = [f"#pragma omp simd {e.fmt(p.simd, state)}", *loop]
    return lines + (block_lines(f"if ({e.fmt(p.only_if, state)})", part) if p.only_if else part)


def split(e: Emitter[CpuGeometry]) -> Lines:
    """A full reduction: the outermost reduced loop in fixed chunks, combined in order."""
    chunks = e.schedule.chunks
    dims = f"[{chunks}]"
    lines = [*e.declare("part_", dims)]
    chunk = [*e.declare()]
    for n, term in enumerate(e.nest.terms):
        if not term.reduced:
            chunk += block_lines("if (c_ == 0)", e.term_lines(n))
            continue
        first = e.term_order(n)[0]
        lo, hi = e.idx(e.bounds[n].starts[first]), e.idx(e.bounds[n].stops[first])
        part = (f"lo_ + len_*c_/{chunks}", f"lo_ + len_*(c_ + 1)/{chunks}")
        chunk += [
            "{",
            *indent_lines(
                [
                    f"const int64_t lo_ = {lo}, len_ = tdsl_imax({hi} - lo_, 0);",
                    *e.term_lines(n, first=part),
                ]
            ),
            "}",
        ]
    states = len(e.reducer.init)
    pairs = list(zip(e.names("part_", "[c_]"), e.names(), strict=True))[:states]
    chunk += [f"{p} = {a};" for p, a in pairs]
    lines += parallel_loop(e, 1, block_lines(f"for (int64_t c_ = 0; c_ < {chunks}; ++c_)", chunk))
    combine = e.fmt(e.reducer.combine, e.names(), e.names("part_", "[c_]"))
    lines += [*e.declare(), *block_lines(f"for (int64_t c_ = 0; c_ < {chunks}; ++c_)", [combine])]
    return [*lines, e.store_line()]
