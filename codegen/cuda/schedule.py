"""GPU schedules: how the loops of a nest map onto CUDA threads and blocks.

A `GpuSchedule` is separate from the nest, like the CPU `Schedule`; every schedule computes
the same numbers. Free indices are flattened in `free_order`, the LAST one varying fastest,
so consecutive threads (`threadIdx.x`) write consecutive output elements when the output's
contiguous axis is last (coalesced stores). Every loop over outputs is grid-stride, so any
grid size covers any extent. Each output element is reduced in registers and written once.

Strategies (`GpuSchedule.strategy`):

* ``"thread"`` -- one output element per thread, the reduction loops (any reduction, several
  terms, constraints as loop bounds, guards) in registers. The fallback for every nest, and
  topk's one strategy (a row per thread, its k slots in registers: `codegen.emit.select`).
* ``"tile"`` -- each thread computes ``rows`` consecutive values of the free index `row`
  (register tile); loads that do not depend on `row` are shared. Needs reduced loop bounds
  that do not depend on `row`.
* ``"smem"`` -- contraction-shaped nests (one sum term `a * b` where `a` does not use the free
  index `vector` and `b` does not use `row`, e.g. matmul, attention, conv with channels):
  16 x 16 threads compute a ``16*rows x 16*cols`` output tile (4 x 4 per thread), staging
  ``tile_k``-deep tiles of `a` and `b` along the innermost reduced index through shared
  memory. Other free indices (batch) go on `blockIdx.z`.
* ``"pairwise"`` -- the same tile for a body whose accesses each read the free index `row`
  or `vector`, not both (pairwise distances `(X[i,k] - Y[j,k])^2`, `exp(-(X-Y)^2)`; any
  reduction): each access staged on its own along the innermost reduced index, loads
  walking its contiguous axis; each thread evaluates the whole body for its ``rows x cols``
  outputs from shared memory (`codegen.cuda.staged.pairwise`).
* ``"mma"`` -- the smem tile with its products on tensor cores (`mma.sync` m16n8k16, float
  accumulators), for a product of two bfloat16 (or two float16) accesses
  (`codegen.cuda.staged.fragments`, `codegen.cuda.staged.mma`).
* ``"block"`` -- few outputs with a long reduction: one block per output element, the
  innermost reduced loop of every term strided across the block's `threads` threads, partial
  states combined by a shared-memory tree (deterministic order).
* ``"split"`` -- a full reduction (no free index) over many blocks, in two kernels
  (`codegen.cuda.reductions.split`): the outermost reduced loop cut into at most `blocks`
  slices, each block's partial states written to scratch space, then combined in slice order by one
  block (deterministic, no atomics); with one slice, the first kernel writes the output.
* ``"online"`` -- a one-pass nest (`LoopNest.online`, `codegen.passes.online`: a logsumexp and
  the softmax-weighted sum that reads it, attention's forward): one block per `rows` rows,
  `cols` threads per row sharing the packed output columns, key tiles of `tile_k` keys
  staged in shared memory, masks on the indices as skipped tiles (`codegen.cuda.attention.online`).
  The only strategy for such a nest, and such a nest's only strategy.
* ``"weighted"`` -- the same kernel for a sum `O[..., r, c] = sum_k a(r, k) * b(k, c)` whose
  weight `a` holds nested reductions (attention's gradient nests dQ, dK, dV: the scores
  and `sum_e dO*V` recomputed inside; `split_weighted`): each `a(r, k)` is computed once
  per block, not once per column `c`, and `b` is staged per key tile.
* ``"rows"`` -- a row reduction (the innermost reduced index, or a nested reduction's, is
  the contiguous axis of the largest access): groups of `width` consecutive threads reduce
  one output element each, their lanes striding the row (coalesced), combined by
  `__shfl_xor_sync` and in order through shared memory past a warp; `width`, a host
  parameter, follows the row length (`codegen.cuda.reductions.rows`).
* ``"columns"`` -- a column reduction (the last free index is the contiguous axis of the
  largest access, LayerNorm's `dg[f] := dY[b,t,f]*N[b,t,f]`): threads walk the outputs; the
  reduced loops are cut into `parts` slices on `blockIdx.y` (`TARGET_BLOCKS` blocks), folded
  in slice order by a second kernel (`codegen.cuda.reductions.columns`).
* ``"xla"`` -- a contraction with its elementwise companions (`codegen.ir.contraction.xla_plan`):
  no kernel is generated, the runner calls XLA's dot (`jnp.einsum`, cuBLAS on a GPU), as on
  the CPU.

Index arithmetic uses 32-bit `int` by default (`index_type="int32"`); pass
``index_type="int64"`` when some tensor may have 2^31 elements or more (the caller decides:
`tensordsl.backends.cuda.prepare` does from each call's shapes, a kernel variant per index type).

The heuristic (`choose_gpu_schedule`): a one-pass nest -> ``online`` (64 rows x 4 lanes,
tiles of 32 keys; 32 rows x 8 lanes with float64); a weighted sum with nested reductions in
its weight -> ``weighted`` (the same tiles); a nest of floats with an XLA plan -> ``xla``,
unless the caller asks for a generated kernel (a loop order, `kernel=True`,
`TENSORDSL_XLA_CONTRACTIONS=0`); no free index -> ``split`` (``block`` when no term has a
reduced loop); contraction-shaped -> ``smem`` (``mma`` for bf16/f16 products); a body
split by two free indices -> ``pairwise``; a row reduction -> ``rows``; a second-to-last
free index that bounds do not depend on and that some access does not use -> ``tile`` with 4
rows (its rows share loads); a column reduction -> ``columns``; else ``thread``. Row and
column reductions are told apart by `reduction_layout`: which index the largest access
reads contiguously.

>>> from codegen.ir.examples import matmul as example
>>> matmul = example()
>>> choose_gpu_schedule(matmul).strategy
'xla'
>>> s = choose_gpu_schedule(matmul, kernel=True)
>>> s.strategy, s.row, s.vector, s.rows, s.cols
('smem', 'i', 'j', 4, 4)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import sympy

from codegen.cuda.layout import (
    rectangular,
    reduction_layout,
    split_contraction,
    split_pairwise,
    weighted_form,
)
from codegen.cuda.staged.fragments import tensor_core_type, warp_tiles
from codegen.emit.loop_order import (
    LoopOrder,
    bound_indices,
    default_loop_order,
    term_order,
    valid_unique,
    validate_schedule,
)
from codegen.ir.bounds import loop_bounds
from codegen.ir.contraction import xla_contraction
from codegen.ir.nest import LoopNest, accesses
from codegen.ir.reductions import REDUCTIONS

GPU_STRATEGIES = (
    *("thread", "tile", "smem", "pairwise", "mma", "block", "split", "rows", "columns"),
    *("online", "weighted", "xla"),
)
INDEX_TYPES = {"int32": "int", "int64": "long long"}
SMEM_THREADS = 16  # threads per side of an smem block (16 x 16)
#: The online and weighted strategies: the output columns (the logsumexp aside) a block
#: keeps in registers in one pass over the keys, `ONLINE_COLUMNS / cols` per thread; more
#: take further passes (`tensordsl.backends.table` bounds the one-pass nest's).
ONLINE_COLUMNS = 128
#: The online and weighted strategies' threads per block: 64 rows of 4 lanes (32 of 8 with
#: float64), FlashAttention-2's row tile: K and V are read once per row tile (docs/backends.md).
ONLINE_THREADS = 256


@dataclass(frozen=True)
class GpuSchedule(LoopOrder):
    """Thread/block mapping of one nest (see the module docstring)."""

    strategy: str = "thread"
    threads: int = 256  # threads per block (thread, tile, block, split)
    row: str | None = None
    vector: str | None = None
    rows: int = 1
    cols: int = 1
    tile_k: int = 16
    index_type: str = "int32"
    #: split: the most blocks (slices) of the first kernel. Only host-side values (the
    #: grid, the workspace) depend on it, so it is left out of the repr that entry names hash.
    blocks: int = field(default=1024, repr=False)

    def describe(self) -> str:
        """One line for the header comment of generated code."""
        parts = [f"strategy={self.strategy}", super().describe()]
        if self.strategy == "xla":
            return " ".join([*parts, "(jnp.einsum: XLA's dot, no generated kernel)"])
        if self.strategy == "tile":
            parts.append(f"tile={self.row}x1={self.rows}x1")
        if self.strategy in ("online", "weighted"):
            parts.append(
                f"tile=rows x keys={self.rows}x{self.tile_k} lanes/row={self.cols} "
                f"columns<={ONLINE_COLUMNS} threads={self.rows * self.cols} "
                f"staged=weights[{self.tile_k}][{ONLINE_COLUMNS}],scores[{self.rows}]"
                f"[{self.tile_k}+pad] in shared memory; key tiles outside the rows' "
                "ranges skipped"
            )
        elif self.strategy in ("smem", "mma", "pairwise"):
            parts.append(
                f"tile={self.row}x{self.vector}={SMEM_THREADS * self.rows}x"
                f"{SMEM_THREADS * self.cols} k={self.tile_k}"
                + (" tensor-cores=mma.sync.m16n8k16" if self.strategy == "mma" else "")
            )
        else:
            parts.append(f"threads={self.threads}")
        if self.strategy == "split":
            parts.append(f"blocks<={self.blocks}")
        parts.append(f"index={self.index_type}")
        return " ".join(parts)

    def in_words(self) -> str:
        """The schedule in plain words, for `explain` (`describe` is the terse header form).

        >>> GpuSchedule(("i",), (("j",),), strategy="block", threads=256).in_words()
        'one block of 256 threads per output element, splitting j across its threads'
        """
        reduced = " then ".join(", ".join(o) for o in self.reduced_order if o) or "nothing"
        side = SMEM_THREADS
        registers = f"reducing {reduced} in registers" if reduced != "nothing" else "no reduction"
        smem = (
            f"{side} x {side} threads per {side * self.rows} {self.row} x "
            f"{side * self.cols} {self.vector} output tile, staging {self.tile_k}-deep "
            f"slices of {reduced} in shared memory"
        )
        return {
            "thread": f"one output element per thread, {registers}",
            "tile": f"{self.rows} consecutive {self.row} per thread, {registers}",
            "smem": smem,
            "mma": f"{smem}, products on tensor cores (mma.sync m16n8k16, float sums)",
            "pairwise": f"{side} x {side} threads per {side * self.rows} {self.row} x "
            f"{side * self.cols} {self.vector} output tile, {self.rows} x {self.cols} per thread, "
            f"each access staged in {self.tile_k}-deep slices of {reduced} in shared memory",
            "block": f"one block of {self.threads} threads per output element, splitting "
            f"{reduced} across its threads",
            "split": f"the reduction over {reduced} split across up to {self.blocks} blocks, "
            "then combined in order by one block",
            "rows": f"a group of lanes per output element striding {reduced} (coalesced), "
            "combined by warp shuffles",
            "columns": f"one output element per thread along the contiguous axis, {reduced} "
            "cut into slices across blocks, then combined in order",
            "online": f"{self.rows} rows per block, {self.cols} threads per row, key tiles of "
            f"{self.tile_k} staged in shared memory, one pass (online softmax)",
            "weighted": f"{self.rows} rows per block, {self.cols} threads per row, each weight "
            f"computed once per block, key tiles of {self.tile_k} staged in shared memory",
            "xla": "XLA's dot (jnp.einsum, cuBLAS): no generated kernel",
        }[self.strategy]


def _bounds_read_column(nest: LoopNest, order: LoopOrder) -> bool:
    """Whether a reduced loop's bound reads the last free index (tests on the free indices
    alone may: the weighted kernel tests them at the store)."""
    column = order.free_order[-1]
    for n, term in enumerate(nest.terms):
        bounds = loop_bounds(term, term_order(nest, order, n))
        for expr in (*bounds.starts.values(), *bounds.stops.values()):
            if any(s.name == column for s in expr.free_symbols):
                return True
    return False


def _widest_misses(nest: LoopNest, index: str) -> bool:
    """True when an access of the highest rank does not use `index`."""
    found = [a for term in nest.terms for a in accesses(term.body)]
    rank = max((len(a.indices) for a in found), default=0)
    return any(
        len(a.indices) == rank and index not in {s.name for s in a.free_symbols} for a in found
    )


def _names_used(nest: LoopNest, index: str) -> bool:
    """True when some access of the nest does not use `index` (so a row tile saves loads)."""
    for term in nest.terms:
        for access in term.body.atoms(sympy.Indexed):
            if index not in {s.name for s in access.free_symbols}:
                return True
    return False


def _widest_contiguous(
    nest: LoopNest, reduced: tuple[tuple[str, ...], ...]
) -> tuple[tuple[str, ...], ...]:
    """Each term's reduced loops with the contiguous axis of its highest-rank access
    innermost (the split strategy's threads stride the innermost loop: LayerNorm's
    `dF := dV[b,t]*(X[b,t,f] - M[b,t])^2` strides f, not t, which more accesses read last)."""
    found = []
    for term, names in zip(nest.terms, reduced, strict=True):
        ranked = sorted(accesses(term.body), key=lambda a: -len(a.indices))
        last = {s.name for s in ranked[0].indices[-1].free_symbols} if ranked else set()
        inner = [name for name in names if name in last]
        if len(inner) == 1 and names and names[-1] != inner[0]:
            names = (*(n for n in names if n != inner[0]), inner[0])
        found.append(tuple(names))
    return tuple(found)


def validate_gpu(nest: LoopNest, schedule: GpuSchedule) -> None:
    """Raise ValueError when `schedule` does not fit `nest`."""
    validate_schedule(nest, schedule, GPU_STRATEGIES, ("rows", "cols", "tile_k", "blocks"))
    free = schedule.free_order
    if schedule.index_type not in INDEX_TYPES:
        raise ValueError(f"index_type must be one of {sorted(INDEX_TYPES)}")
    if (schedule.strategy == "online") != bool(nest.online):
        raise ValueError("the online strategy is for one-pass nests (codegen.passes.online)")
    if REDUCTIONS[nest.reduction].selects and schedule.strategy != "thread":
        raise ValueError("topk/argtopk take the thread strategy (a row per thread), only it")
    if schedule.strategy == "weighted" and (
        len(free) < 2 or _bounds_read_column(nest, schedule) or not weighted_form(nest)
    ):
        raise ValueError("the weighted strategy needs a sum a*b (codegen.cuda.schedule)")
    if schedule.strategy in ("online", "weighted"):
        packed = nest.free[-1].index.name
        lanes, rows = schedule.cols, schedule.rows
        if free[-1:] != (packed,):
            raise ValueError(f"the column index {packed!r} must be the last free index")
        if 32 % lanes or rows * lanes > 1024 or rows * lanes % 32 or ONLINE_COLUMNS % lanes:
            raise ValueError("online: cols (lanes per row) must divide 32, rows*cols in [32, 1024]")
        return
    threads = schedule.threads
    if threads < 32 or threads > 1024 or threads & (threads - 1):
        raise ValueError("threads must be a power of two in [32, 1024]")
    bounded = bound_indices(nest, schedule)
    if schedule.strategy == "tile" and (schedule.row not in free or schedule.row in bounded):
        raise ValueError(f"tile row {schedule.row!r} must be a free index loops don't use")
    if schedule.strategy == "columns" and not (
        any(t.reduced for t in nest.terms) and rectangular(nest, schedule)
    ):
        raise ValueError("the columns strategy needs reduced loops bounded by extents alone")
    if schedule.strategy in ("rows", "columns") and not free:
        raise ValueError(f"the {schedule.strategy} strategy needs a free index")
    if schedule.strategy == "mma" and not warp_tiles(schedule.rows, schedule.cols, schedule.tile_k):
        raise ValueError("an mma tile needs tile_k a multiple of 16, split evenly by 8 warps")
    if schedule.strategy in ("smem", "mma", "pairwise"):
        if (
            schedule.row not in free
            or schedule.vector not in free
            or schedule.row == schedule.vector
        ):
            raise ValueError("a tile needs two distinct free indices row and vector")
        if {schedule.row, schedule.vector} & bounded:
            raise ValueError("loop bounds depend on the tile's indices")
        split = split_contraction if schedule.strategy == "smem" else split_pairwise
        if split(nest, schedule.row or "", schedule.vector or "") is None:
            raise ValueError(
                f"the {schedule.strategy} strategy needs one term: a*b (smem, a without vector,"
                " b without row), or accesses that read row or vector, not both (pairwise)"
            )


def choose_gpu_schedule(
    nest: LoopNest,
    dtypes: Mapping[str, str] | None = None,
    *,
    index_type: str = "int32",
    loop_order: Sequence[str] | None = None,
    kernel: bool = False,
) -> GpuSchedule:
    """The heuristic GPU schedule of `nest` (see the module docstring).

    Args:
        nest: the loop nest.
        dtypes: numpy dtype names of the operands and output (a nest of floats with an XLA
            plan runs as XLA's dot).
        index_type: "int32" (default) or "int64" when a tensor may reach 2^31 elements.
        loop_order: index names fixing the order of free and reduced loops, as on the CPU.
            A loop order asks for a generated kernel.
        kernel: True for a generated kernel even where XLA would compute the nest.

    Returns:
        A valid `GpuSchedule`.
    """
    order = default_loop_order(nest, loop_order)
    free, reduced = order.free_order, order.reduced_order
    if nest.online:
        return online_schedule(nest, index_type=index_type, lanes=_lanes(dtypes))
    if REDUCTIONS[nest.reduction].selects:  # topk: a row per thread, its k slots in registers
        return GpuSchedule(free, reduced, index_type=index_type)
    weighted = not loop_order and free and weighted_form(nest)
    if weighted and not _bounds_read_column(nest, order):
        return online_schedule(nest, index_type=index_type, lanes=_lanes(dtypes))
    if not kernel and loop_order is None and xla_contraction(nest, dtypes):
        return GpuSchedule(free, reduced, strategy="xla", index_type=index_type)
    base = GpuSchedule(free, reduced, index_type=index_type)
    if not free:
        if loop_order is None:
            reduced = _widest_contiguous(nest, reduced)
        strategy = "split" if any(reduced) else "block"
        return GpuSchedule(free, reduced, strategy=strategy, index_type=index_type)
    bounded = bound_indices(nest, base)
    vector = free[-1]
    for split, strategy in ((split_contraction, "smem"), (split_pairwise, "pairwise")):
        for row in reversed(free[:-1]) if vector not in bounded else ():
            if row not in bounded and split(nest, row, vector) is not None:
                mma = strategy == "smem" and tensor_core_type(nest, dtypes, row, vector) is not None
                return GpuSchedule(
                    free,
                    reduced,
                    "mma" if mma else strategy,
                    row=row,
                    vector=vector,
                    rows=4,
                    cols=4,
                    tile_k=32 if mma else 16,
                    index_type=index_type,
                )
    layout = reduction_layout(nest, base)
    tileable = len(free) > 1 and free[-2] not in bounded and _names_used(nest, free[-2])
    tile = GpuSchedule(free, reduced, "tile", row=free[-2] if tileable else None, rows=4,
                       index_type=index_type)  # fmt: skip
    # Rows of a tile share the loads of a widest access that misses their index (Y[j,k]
    # across rows i of pairwise distances' gradient dX[i,k]): that beats a warp per short
    # row (measured on an H200 for the distances themselves, before they took pairwise:
    # 16384^2 over k 64, 119 ms with rows, 19.7 ms with tiles).
    if tileable and any(t.reduced for t in nest.terms) and _widest_misses(nest, free[-2]):
        return tile
    if layout == "rows":
        return GpuSchedule(free, reduced, "rows", index_type=index_type)
    if tileable and any(t.reduced for t in nest.terms):
        return tile
    if layout == "columns":
        return GpuSchedule(free, reduced, "columns", index_type=index_type)
    return base


def _lanes(dtypes: Mapping[str, str] | None) -> int:
    """Threads per row of the online kernel: 4 (32 float sums each in registers), 8 where
    float64 is involved (16 double sums each: 32 spill)."""
    return 8 if dtypes and "float64" in dtypes.values() else 4


def online_schedule(
    nest: LoopNest, *, index_type: str = "int32", rows: int = 0, lanes: int = 4, keys: int = 32
) -> GpuSchedule:
    """The online strategy's schedule of a one-pass nest: `rows` rows per block
    (0: `ONLINE_THREADS / lanes`), `lanes` threads per row, tiles of `keys` keys
    (`codegen.cuda.attention.online`); the free indices as written, the packed one last."""
    rows = rows or ONLINE_THREADS // lanes
    order = default_loop_order(nest)
    return GpuSchedule(
        order.free_order,
        order.reduced_order,
        "online" if nest.online else "weighted",
        threads=rows * lanes,
        row=order.free_order[-2],
        vector=order.free_order[-1],
        rows=rows,
        cols=lanes,
        tile_k=keys,
        index_type=index_type,
    )


def candidate_gpu_schedules(nest: LoopNest) -> tuple[GpuSchedule, ...]:
    """The heuristic's kernel, the thread fallback, block and split schedules and small
    variants."""
    if nest.online or choose_gpu_schedule(nest, kernel=True).strategy == "weighted":
        return tuple(
            online_schedule(nest, rows=r, lanes=n, keys=k, index_type=t)
            for r, n, k, t in ((64, 4, 32, "int32"), (8, 4, 8, "int64"), (32, 1, 16, "int32"))
        )
    pick = choose_gpu_schedule(nest, kernel=True)
    free, reduced = pick.free_order, pick.reduced_order
    picks = [
        pick,
        GpuSchedule(free, reduced, "thread", threads=64),
        GpuSchedule(free, reduced, "block", threads=32),
        GpuSchedule(free, reduced, "split", threads=32, blocks=3, index_type="int64"),
        GpuSchedule(tuple(reversed(free)), tuple(tuple(reversed(o)) for o in reduced)),
        GpuSchedule(
            free,
            reduced,
            pick.strategy,
            row=pick.row,
            vector=pick.vector,
            rows=pick.rows,
            cols=pick.cols,
            index_type="int64",
        ),
    ]
    if pick.strategy in ("smem", "pairwise"):
        small = GpuSchedule(free, reduced, pick.strategy, row=pick.row, vector=pick.vector)
        picks.append(dataclasses.replace(small, rows=2, cols=1, tile_k=8))
    if len(free) > 1:
        picks.append(GpuSchedule(free, reduced, "tile", row=free[-2], rows=3, threads=32))
    if free:
        picks += [
            GpuSchedule(free, reduced, "rows", threads=64),
            GpuSchedule(free, reduced, "columns", threads=32, blocks=5),
        ]
    return valid_unique(nest, picks, validate_gpu)
