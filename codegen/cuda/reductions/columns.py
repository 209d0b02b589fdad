"""The columns strategy of the CUDA emitter: few outputs, a long reduction across them.

See `codegen.cuda.schedule` for when it applies (LayerNorm's `dg[f] := dY[b,t,f]*N[b,t,f]`:
768 outputs, 8192 values each). The first kernel gives each thread one output element,
consecutive threads consecutive elements (`blockIdx.x`: loads along the contiguous axis
coalesce), and cuts every term's reduced loops, flattened in loop order, into `parts`
slices, one per `blockIdx.y` (a host parameter: enough for `TARGET_BLOCKS` blocks in all,
at most the schedule's `blocks`, each of at least `SLICE_VALUES` iterations). Within a
slice the reduced indices advance like an odometer (no division per value). Each slice's
partial state goes to the workspace (`wa_[c*total + e]`, `wb_` likewise); the second
kernel gives each thread one output element and folds its `parts` states in slice order:
deterministic, no atomics. With one slice (many outputs, or a short reduction) the first
kernel writes the output and the second is not launched.
"""

from __future__ import annotations

import sympy

from codegen.cuda.dialect import CudaEmitter
from codegen.cuda.reductions.split import PARTS, STATE_BYTES
from codegen.emit.emitter import Lines, block_lines, indent_lines
from codegen.ir.functions import CeilDiv

#: Blocks the first kernel aims for: 4 per SM of a 132-SM H100/H200 (at least 2 per SM
#: keep every SM busy while another block waits on memory).
TARGET_BLOCKS = 528
#: The fewest values a slice reduces (a short reduction is not worth a second kernel).
SLICE_VALUES = 16
FLAT = "(idx_t)blockIdx.x*(idx_t)blockDim.x + (idx_t)threadIdx.x"
STRIDE = "(idx_t)gridDim.x*(idx_t)blockDim.x"


def _length(e: CudaEmitter, n: int) -> sympy.Expr:
    """Term `n`'s reduced iterations: the product of its loops' lengths (extents only)."""
    total = sympy.Integer(1)
    for r in e.term_order(n):
        total *= sympy.Max(e.bounds[n].stops[r] - e.bounds[n].starts[r], 0)
    return total


def column_parts(e: CudaEmitter) -> sympy.Expr:
    """The number of slices: enough for `TARGET_BLOCKS` blocks, at most the schedule's
    `blocks`, at least `SLICE_VALUES` iterations of the longest term each; at least 1."""
    lengths = [_length(e, n) for n, t in enumerate(e.nest.terms) if t.reduced]
    across = CeilDiv(e.count(e.schedule.free_order, {}), e.schedule.threads)
    wanted = sympy.Min(e.schedule.blocks, CeilDiv(TARGET_BLOCKS, sympy.Max(across, 1)))
    longest = sympy.Max(1, *lengths)
    return sympy.Max(1, sympy.Min(wanted, CeilDiv(longest, SLICE_VALUES)))


def columns_grid(e: CudaEmitter) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    across = CeilDiv(e.count(e.schedule.free_order, {}), e.schedule.threads)
    return (across, column_parts(e), sympy.Integer(1))


def combine_grid(e: CudaEmitter) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """The second kernel's grid: none when there is one slice."""
    across = CeilDiv(e.count(e.schedule.free_order, {}), e.schedule.threads)
    return (sympy.Min(1, column_parts(e) - 1) * across, sympy.Integer(1), sympy.Integer(1))


def _partials(e: CudaEmitter) -> Lines:
    """The workspace as `wa_` (and `wb_`): `parts` states per output element."""
    ta, tb = e.state_types()
    kinds = (ta, tb)[: len(e.reducer.init)]
    cells = column_parts(e) * e.count(e.schedule.free_order, {})
    e.scratch(cells * sum(STATE_BYTES[kind] for kind in kinds))
    total = e.idx(e.count(e.schedule.free_order, {}))
    if len(kinds) == 1:
        return [f"{ta} *__restrict__ wa_ = ({ta} *)ws_;"]
    return [
        f"{tb} *__restrict__ wb_ = ({tb} *)ws_;",
        f"{ta} *__restrict__ wa_ = ({ta} *)(wb_ + {PARTS}*{total});",
    ]


def _odometer(e: CudaEmitter, names: list[str], n: int) -> Lines:
    """Advance term `n`'s reduced indices `names` (outermost first) by one iteration."""
    bounds = e.bounds[n]
    lines: Lines = []
    for depth in range(len(names)):  # the innermost index's test is the outermost if
        r = e.term_order(n)[depth]
        lo, hi = e.idx(bounds.starts[r]), e.idx(bounds.stops[r])
        lines = block_lines(f"if (++{names[depth]} == {hi})", [f"{names[depth]} = {lo};", *lines])
    return lines


def _slice(e: CudaEmitter, n: int) -> Lines:
    """Term `n` over slice `c_` of its flattened reduced loops, folded into `acc_`."""
    order = e.term_order(n)
    names = [e.printer.index(r) for r in order]
    bounds = e.bounds[n]
    plan = e.plan(n, [[], list(order)])
    lines = [
        f"const idx_t len_ = {e.idx(_length(e, n))};",
        f"const idx_t base_ = len_ / {PARTS}, rest_ = len_ % {PARTS};",
        "const idx_t q0_ = c_*base_ + tdsl_imin(c_, rest_);",
        "const idx_t q1_ = (c_ + 1)*base_ + tdsl_imin(c_ + 1, rest_);",
    ]
    start = ["idx_t d_ = q0_;"]  # the slice's first iteration, decoded (every length > 0)
    for r, name in reversed(list(zip(order, names, strict=True))):
        lo, hi = e.idx(bounds.starts[r]), e.idx(bounds.stops[r])
        start += [f"idx_t {name} = {lo} + d_ % ({hi} - {lo});", f"d_ /= ({hi} - {lo});"]
    inner = e.level_lines(plan, 1, e.fold_lines(n, plan, ""))
    step = _odometer(e, names, n) if len(names) > 1 else [f"++{names[0]};"]
    loop = block_lines("for (idx_t k_ = q0_; k_ < q1_; ++k_)", [*inner, *step])
    lines += block_lines("if (q0_ < q1_)", [*start, *loop])
    return ["{", *indent_lines(e.level_lines(plan, 0, lines)), "}"]


def columns(e: CudaEmitter) -> Lines:
    """First kernel: thread per output element, block row `blockIdx.y` per slice."""
    e.named.append((PARTS, column_parts(e)))
    total = e.idx(e.count(e.schedule.free_order, {}))
    body = [*e.decode("e_", e.schedule.free_order, {}), *e.declare()]
    for n, term in enumerate(e.nest.terms):
        if term.reduced:
            body += _slice(e, n)
        else:  # no loop to cut: slice 0 folds it in
            body += block_lines("if (c_ == 0)", e.term_lines(n))
    stores = [f"{w}[c_*{total} + e_] = {a};" for w, a in zip(("wa_", "wb_"), e.names())]
    body += [
        f"if ({PARTS} == 1) {{",
        f"    {e.store_line('')}",
        "} else {",
        *indent_lines(stores[: len(e.reducer.init)]),
        "}",
    ]
    per_element = block_lines(f"for (idx_t e_ = {FLAT}; e_ < {total}; e_ += {STRIDE})", body)
    slices = f"for (idx_t c_ = (idx_t)blockIdx.y; c_ < {PARTS}; c_ += (idx_t)gridDim.y)"
    return [*_partials(e), *block_lines(slices, per_element)]


def combine_columns(e: CudaEmitter) -> Lines:
    """Second kernel: each output element's partial states folded in slice order."""
    total = e.idx(e.count(e.schedule.free_order, {}))
    names = e.names()
    fold = block_lines(
        f"for (idx_t c_ = 0; c_ < {PARTS}; ++c_)",
        [e.fmt(e.reducer.combine, names, (f"wa_[c_*{total} + e_]", f"wb_[c_*{total} + e_]"))],
    )
    body = [*e.decode("e_", e.schedule.free_order, {}), *e.declare(), *fold, e.store_line("")]
    per_element = block_lines(f"for (idx_t e_ = {FLAT}; e_ < {total}; e_ += {STRIDE})", body)
    return [*_partials(e), *per_element]
