"""The "select" strategy of the C emitter: topk and argtopk, one output row at a time (the
row's code in `codegen.emit.select`), rows shared among threads.

The innermost reduced loop goes in chunks of `CHUNK` values: each chunk's values (and
flat positions) computed first in one `#pragma omp simd` loop into buffers, the lanes over
the reduced index (a nested sum inside, the distance of a k-nearest-neighbour search, runs
per lane), then inserted into the slots one after another, most of them skipped by one
comparison with the last slot."""

from __future__ import annotations

from codegen.c.geometry import CpuGeometry
from codegen.c.reductions.simple import CHUNK, parallel_loop
from codegen.emit.emitter import Emitter, Lines, block_lines, indent_lines
from codegen.emit.select import row_indices, row_lines, update_template


def select(e: Emitter[CpuGeometry]) -> Lines:
    """The whole function body of a topk/argtopk nest."""
    chunked = bool(e.nest.terms[0].reduced) if len(e.nest.terms) == 1 else False
    lines = row_lines(e, _chunked_term) if chunked else row_lines(e)
    free = row_indices(e)
    for symbol in reversed(free):
        lines = block_lines(e.free_loop(symbol), lines)
    return parallel_loop(e, len(free), lines)


def _chunked_term(e: Emitter[CpuGeometry]) -> Lines:
    """The reduced loops, the innermost in chunks (module docstring); a value a test leaves
    out keeps the position -1 and is not inserted."""
    order = e.term_order(0)
    plan = e.plan(0, [[], *e.reduced_levels(0)])
    inner, kind = order[-1], e.index_type
    j = e.printer.index(inner)
    lo, hi = e.idx(e.bounds[0].starts[inner]), e.idx(e.bounds[0].stops[inner])
    buffered = f"chunk_[{j} - c0_] = {{v}}; cpos_[{j} - c0_] = pos_;"
    fold = e.fold_lines(0, plan, "", update=buffered)
    values = [f"cpos_[{j} - c0_] = -1;", *e.level_lines(plan, len(order), fold, simd=True)]
    insert = [
        f"const {kind} pos_ = cpos_[q_];",
        *block_lines(
            "if (pos_ >= 0)",
            [f"const {e.f} val_ = chunk_[q_];", e.fmt(update_template(e), e.names())],
        ),
    ]
    chunk = [
        f"const {kind} cn_ = tdsl_imin({CHUNK}, chi_ - c0_);",
        "#pragma omp simd",
        *block_lines(f"for ({kind} {j} = c0_; {j} < c0_ + cn_; ++{j})", values),
        *block_lines(f"for ({kind} q_ = 0; q_ < cn_; ++q_)", insert),
    ]
    innermost = [
        f"const {kind} clo_ = {lo}, chi_ = {hi};",
        f"{e.f} chunk_[{CHUNK}];",
        f"{kind} cpos_[{CHUNK}];",
        *block_lines(f"for ({kind} c0_ = clo_; c0_ < chi_; c0_ += {CHUNK})", chunk),
    ]
    loops = e.loops(0, innermost, stop_at=len(order) - 1, plan=plan)
    return ["{", *indent_lines(e.level_lines(plan, 0, loops)), "}"]
