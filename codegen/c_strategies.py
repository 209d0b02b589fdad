"""The scalar and split strategies of the C emitter (see `codegen.schedule`)."""

from __future__ import annotations

from codegen.emitter import PARALLEL_WORK, Emitter, Lines, block_lines, indent_lines
from codegen.ir import Reduce
from codegen.schedule import Schedule


def omp_parallel(e: Emitter[Schedule], collapse: int) -> Lines:
    """The OpenMP pragma over the `collapse` outermost free loops, when the schedule is
    parallel (the work test keeps small nests on one thread)."""
    if not e.schedule.parallel or collapse == 0:
        return []
    clause = f" collapse({collapse})" if collapse > 1 else ""
    return [f"#pragma omp parallel for{clause} schedule(static) if(work_ >= {PARALLEL_WORK})"]


def scalar(e: Emitter[Schedule]) -> Lines:
    """One output element at a time: the free loops, then each term's reduced loops (in the
    reduction's vectorised passes where it has them and the values are cheap to compute
    again: no nested reduction)."""
    body = [*e.declare()]
    cheap = not any(term.body.atoms(Reduce) for term in e.nest.terms)
    if e.reducer.passes and cheap:
        body += _passes(e)
    else:
        for n in range(len(e.nest.terms)):
            body += e.term_lines(n)
    lines = [*body, e.store_line("")]
    free = e.free_symbols()
    for r in reversed(free):
        lines = block_lines(e.free_loop(r), lines)
    return omp_parallel(e, len(free)) + lines


def _passes(e: Emitter[Schedule]) -> Lines:
    """Every term's loops once per pass of `Reduction.passes`, each a simd loop."""
    state = e.names()
    lines: Lines = []
    for p in e.reducer.passes:
        if p.before:
            lines.append(e.fmt(p.before, state))
        simd = e.fmt(p.simd, state)
        part: Lines = []
        for n in range(len(e.nest.terms)):
            part += e.term_lines(n, update=p.update, simd=simd)
        lines += block_lines(f"if ({e.fmt(p.only_if, state)})", part) if p.only_if else part
    return lines


def split(e: Emitter[Schedule]) -> Lines:
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
    if e.schedule.parallel:
        lines.append(f"#pragma omp parallel for schedule(static) if(work_ >= {PARALLEL_WORK})")
    lines += block_lines(f"for (int64_t c_ = 0; c_ < {chunks}; ++c_)", chunk)
    combine = e.fmt(e.reducer.combine, e.names(), e.names("part_", "[c_]"))
    lines += [*e.declare(), *block_lines(f"for (int64_t c_ = 0; c_ < {chunks}; ++c_)", [combine])]
    return [*lines, e.store_line()]
