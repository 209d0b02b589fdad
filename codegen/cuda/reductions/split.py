"""The split strategy of the CUDA emitter: a full reduction over many blocks, in two kernels.

See `codegen.cuda.schedule` for when it applies. The first kernel (`split`) cuts the
outermost reduced loop of every term into `parts` slices (a host parameter); block `b`
reduces slices `b, b + gridDim.x, ...` and writes each slice's partial state to the
workspace `ws_`. Within a slice, a term with one reduced loop strides it across the
block's threads; a term with more splits the threads into rows of `lanes` (a host
parameter: the innermost loop's length, at most the block, or the whole block where that
length depends on the outer loops): the rows stride over the slice's outer iterations,
the lanes of a row over the innermost loop, so a short innermost loop still keeps the
threads busy. The threads' states meet in a shared-memory tree. The second kernel
(`combine_partials`, one block) folds the partial states with the reduction's `combine`
template, thread `t` those of slices `t, t + blockDim.x, ...` in order, then the same
tree: a fixed order for given shapes, so the result does not depend on scheduling, and no
atomics. With one slice the first kernel writes the output itself and the host does not
launch the second (its grid, `min(1, parts - 1)`, is empty).

The workspace holds `parts` states: the second state variable's array first (`wb_`: a
position, 8 bytes, or a sum of the accumulation type), then the first's (`wa_`), so each
array is aligned for its type when the buffer is.
"""

from __future__ import annotations

import sympy

from codegen.cuda.dialect import CudaEmitter
from codegen.cuda.reductions.simple import shared_states, tree_lines
from codegen.emit.emitter import Lines, block_lines, indent_lines
from codegen.ir.functions import CeilDiv, FloorDiv

#: Bytes of each C type a partial state may have.
STATE_BYTES = {"float": 4, "double": 8, "long long": 8}
PARTS = "parts"  # the host parameter: the number of slices


def partial_count(e: CudaEmitter) -> sympy.Expr:
    """The number of slices, an expression of extents: enough for each block to give every
    thread (with one reduced loop) or every row of lanes (with more) an iteration of the
    outermost loop, the most over the terms; at least 1, at most the schedule's `blocks`."""
    counts = []
    for n in range(len(e.nest.terms)):
        order = e.term_order(n)
        if not order:
            continue
        bounds = e.bounds[n]
        length = sympy.Max(bounds.stops[order[0]] - bounds.starts[order[0]], 0)
        rows = FloorDiv(e.schedule.threads, lanes(e, n)) if len(order) > 1 else e.schedule.threads
        counts.append(CeilDiv(length, rows))
    if not counts:
        return sympy.Integer(1)
    return sympy.Max(1, sympy.Min(e.schedule.blocks, sympy.Max(*counts)))


def lanes(e: CudaEmitter, n: int) -> sympy.Expr:
    """Threads per outer iteration of term `n` (of several reduced loops): its innermost
    loop's length, at least 1 and at most the block; the block where the length depends on
    the outer loops."""
    inner, threads = e.term_order(n)[-1], e.schedule.threads
    length = e.bounds[n].stops[inner] - e.bounds[n].starts[inner]
    if length.free_symbols & set(e.nest.terms[n].reduced_indices):
        return sympy.Integer(threads)
    return sympy.Max(1, sympy.Min(threads, length))


def combine_grid(e: CudaEmitter) -> tuple[sympy.Expr, sympy.Expr, sympy.Expr]:
    """The second kernel's grid: one block, none when there is one slice."""
    one = sympy.Integer(1)
    return (sympy.Min(1, partial_count(e) - 1), one, one)


def _partials(e: CudaEmitter) -> Lines:
    """The workspace as the arrays `wa_` (and `wb_`) of `parts` states each."""
    ta, tb = e.state_types()
    if len(e.reducer.init) == 1:
        return [f"{ta} *__restrict__ wa_ = ({ta} *){e.scratch(_workspace(e))};"]
    return [
        f"{tb} *__restrict__ wb_ = ({tb} *){e.scratch(_workspace(e))};",
        f"{ta} *__restrict__ wa_ = ({ta} *)(wb_ + {PARTS});",
    ]


def _workspace(e: CudaEmitter) -> sympy.Expr:
    """Bytes of the workspace: `parts` partial states."""
    kinds = e.state_types()[: len(e.reducer.init)]
    return partial_count(e) * sum(STATE_BYTES[kind] for kind in kinds)


def _slice(e: CudaEmitter, n: int) -> Lines:
    """Term `n` over slice `c_` of its outermost reduced loop, folded into `acc_`."""
    order = e.term_order(n)
    lo, hi = e.idx(e.bounds[n].starts[order[0]]), e.idx(e.bounds[n].stops[order[0]])
    # Slice c_ starts after c_ slices of base_ iterations and min(c_, rest_) longer ones:
    # no product exceeds len_, so no index type overflows.
    part = (
        "lo_ + c_*base_ + tdsl_imin(c_, rest_)",
        "lo_ + (c_ + 1)*base_ + tdsl_imin(c_ + 1, rest_)",
    )
    lines = [
        f"const idx_t lo_ = {lo}, len_ = tdsl_imax({hi} - lo_, 0);",
        f"const idx_t base_ = len_ / {PARTS}, rest_ = len_ % {PARTS};",
    ]
    if len(order) == 1:
        lines += e.term_lines(n, first=part, step=("(idx_t)threadIdx.x", "(idx_t)blockDim.x"))
        return ["{", *indent_lines(lines), "}"]
    width = e.idx(lanes(e, n))
    lines.append(
        f"const idx_t lane_ = (idx_t)threadIdx.x % {width}, row_ = (idx_t)threadIdx.x / {width};"
    )
    rows = f"(idx_t)blockDim.x / {width}"
    term = e.term_lines(n, first=part, first_step=("row_", rows), step=("lane_", width))
    lines += block_lines(f"if (row_ < {rows})", term)  # the threads of whole rows
    return ["{", *indent_lines(lines), "}"]


def split(e: CudaEmitter) -> Lines:
    """First kernel: each block reduces slices of the outermost reduced loops and writes each
    slice's partial state to the workspace (or, with one slice, the output)."""
    e.named.append((PARTS, partial_count(e)))
    body = [*e.declare()]
    for n, term in enumerate(e.nest.terms):
        if term.reduced:
            body += _slice(e, n)
        else:  # no loop to cut: slice 0 folds it in
            body += block_lines("if (c_ == 0 && threadIdx.x == 0)", e.term_lines(n))
    stores = [f"{w}[c_] = {a};" for w, a in zip(("wa_", "wb_"), e.names())]
    body += tree_lines(e)
    body += block_lines(
        "if (threadIdx.x == 0)",
        [
            f"if ({PARTS} == 1) {{",
            f"    {e.store_line('')}",
            "} else {",
            *indent_lines(stores[: len(e.reducer.init)]),
            "}",
        ],
    )
    loop = f"for (idx_t c_ = (idx_t)blockIdx.x; c_ < {PARTS}; c_ += (idx_t)gridDim.x)"
    return [*shared_states(e), *_partials(e), *block_lines(loop, body)]


def combine_partials(e: CudaEmitter) -> Lines:
    """Second kernel: one block folds the partial states in slice order into the output."""
    names = e.names()
    partial = ("wa_[c_]", "wb_[c_]")
    fold = block_lines(
        f"for (idx_t c_ = (idx_t)threadIdx.x; c_ < {PARTS}; c_ += (idx_t)blockDim.x)",
        [e.fmt(e.reducer.combine, names, partial)],
    )
    body = [
        *e.declare(),
        *fold,
        *tree_lines(e),
        *block_lines("if (threadIdx.x == 0)", [e.store_line("")]),
    ]
    return [*shared_states(e), *_partials(e), *block_lines("if (blockIdx.x == 0)", body)]
