"""The thread, tile and block strategies of the CUDA emitter (see `codegen.cuda.schedule`),
and the shared-memory tree that block and split combine states with."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from codegen.cuda.dialect import CudaEmitter
from codegen.emit.emitter import Lines, block_lines, indent_lines
from codegen.emit.select import row_indices, row_lines


def _per_element(
    e: CudaEmitter,
    flat: str,
    stride: str,
    body: Lines,
    tiles: Mapping[str, int] | None = None,
    order: Sequence[str] | None = None,
) -> Lines:
    """A grid-stride loop over the (tiled) output elements, decoding the free indices (those
    of `order`, the schedule's by default)."""
    tiles = tiles or {}
    order = e.schedule.free_order if order is None else order
    total = e.idx(e.count(order, tiles))
    head = f"for (idx_t e_ = {flat}; e_ < {total}; e_ += {stride})"
    return block_lines(head, [*e.decode("e_", order, tiles), *body])


def thread(e: CudaEmitter) -> Lines:
    """One output element per thread, its reductions in registers; for topk, one output
    row per thread, its k slots in registers (`codegen.emit.select`)."""
    flat = "(idx_t)blockIdx.x*(idx_t)blockDim.x + (idx_t)threadIdx.x"
    stride = "(idx_t)gridDim.x*(idx_t)blockDim.x"
    if e.reducer.selects:
        rows = [s.name for s in row_indices(e)]
        return _per_element(e, flat, stride, row_lines(e), order=rows)
    body = [*e.declare()]
    for n in range(len(e.nest.terms)):
        body += e.term_lines(n)
    body.append(e.store_line(""))
    return _per_element(e, flat, stride, body)


def tile(e: CudaEmitter) -> Lines:
    """Each thread computes `rows` consecutive values of the free index `row`."""
    s = e.schedule
    rn = s.row or ""
    r = e.free_range(rn)
    row, row0 = e.printer.index(r.index), e.tile_name("o", r.index)
    stop = e.idx(r.stop)
    dims, sub = f"[{s.rows}]", "[r_]"

    def lanes(inner: Lines, clamp: bool) -> Lines:
        value = f"tdsl_imin({row0} + r_, {stop} - 1)" if clamp else f"{row0} + r_"
        return ["#pragma unroll"] + block_lines(
            f"for (int r_ = 0; r_ < {s.rows}; ++r_)", [f"const idx_t {row} = {value};", *inner]
        )

    body = [*e.declare(dims=dims), *lanes(e.init(sub), False)]
    for n in range(len(e.nest.terms)):
        levels = [[], *e.reduced_levels(n), [r.index]]
        plan = e.plan(n, levels)
        inner = lanes(e.level_lines(plan, len(levels) - 1, e.fold_lines(n, plan, sub)), True)
        loops = e.loops(n, inner, plan=plan)
        body += ["{", *indent_lines(e.level_lines(plan, 0, loops)), "}"]
    body += lanes(block_lines(f"if ({row} < {stop})", [e.store_line(sub)]), False)
    flat = "(idx_t)blockIdx.x*(idx_t)blockDim.x + (idx_t)threadIdx.x"
    return _per_element(e, flat, "(idx_t)gridDim.x*(idx_t)blockDim.x", body, {rn: s.rows})


def shared_states(e: CudaEmitter) -> Lines:
    """The shared arrays of `tree_lines`: one per state variable, one element per thread."""
    threads, (ta, tb) = e.schedule.threads, e.state_types()
    decls = [f"__shared__ {ta} sa_[{threads}];"]
    if len(e.reducer.init) > 1:
        decls.append(f"__shared__ {tb} sb_[{threads}];")
    return decls


def tree_lines(e: CudaEmitter) -> Lines:
    """Combine the block's states `acc_` by a shared-memory tree (deterministic order);
    thread 0 ends with the block's state. Ends with a barrier: `sa_` may be reused."""
    a, b = e.names()
    states = len(e.reducer.init)
    shared = [f"sa_[threadIdx.x] = {a};"] + ([f"sb_[threadIdx.x] = {b};"] if states > 1 else [])
    combine = e.fmt(e.reducer.combine, (a, b), ("sa_[threadIdx.x + h_]", "sb_[threadIdx.x + h_]"))
    return [
        *shared,
        "__syncthreads();",
        *block_lines(
            f"for (int h_ = {e.schedule.threads // 2}; h_ > 0; h_ >>= 1)",
            [*block_lines("if (threadIdx.x < h_)", [combine, *shared]), "__syncthreads();"],
        ),
    ]


def block_reduce(e: CudaEmitter) -> Lines:
    """One block per output element; partial states combined by a shared-memory tree."""
    body = [*e.declare()]
    for n, term in enumerate(e.nest.terms):
        if not term.reduced:
            body += block_lines("if (threadIdx.x == 0)", e.term_lines(n))
            continue
        body += e.term_lines(n, step=("(idx_t)threadIdx.x", "(idx_t)blockDim.x"))
    body += [
        *tree_lines(e),
        *block_lines("if (threadIdx.x == 0)", [e.store_line("")]),
        "__syncthreads(); /* sa_ is reused by the next output element */",
    ]
    return shared_states(e) + _per_element(e, "(idx_t)blockIdx.x", "(idx_t)gridDim.x", body)
