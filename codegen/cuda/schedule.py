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

The heuristic (`choose_gpu_schedule`) takes the first record of
`codegen.cuda.strategies.STRATEGIES` whose `applies` returns a schedule; each record's rule
is in its family's `rules.py`. In that order: a one-pass nest -> ``online`` (64 rows x 4
lanes, tiles of 32 keys; 32 rows x 8 lanes with float64), and only it; a weighted sum with
nested reductions in its weight -> ``weighted`` (the same tiles); a nest of floats with an
XLA plan -> ``xla``, unless the caller asks for a generated kernel (a loop order,
`kernel=True`, `TENSORDSL_XLA_CONTRACTIONS=0`); no free index -> ``split`` (``block`` when
no term has a reduced loop); contraction-shaped -> ``mma`` for bf16/f16 products, else
``smem``; a body split by two free indices -> ``pairwise``; a second-to-last free index
that bounds do not depend on and that some access does not use -> ``tile`` with 4 rows
(its rows share loads), unless the nest is a row reduction whose widest access reads that
index; a row reduction -> ``rows``; a column reduction -> ``columns``; else ``thread``
(topk's only strategy). Row and column reductions are told apart by `reduction_layout`:
which index the largest access reads contiguously.

>>> from codegen.ir.examples import matmul as example
>>> matmul = example()
>>> choose_gpu_schedule(matmul).strategy
'xla'
>>> s = choose_gpu_schedule(matmul, kernel=True)
>>> s.strategy, s.row, s.vector, s.rows, s.cols
('smem', 'i', 'j', 4, 4)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from codegen.cuda.attention.rules import one_pass
from codegen.cuda.geometry import (
    INDEX_TYPES,
    ONLINE_COLUMNS,
    ONLINE_THREADS,
    SMEM_THREADS,
    Ask,
    GpuGeometry,
)
from codegen.cuda.strategies import BY_NAME, STRATEGIES, Strategy
from codegen.emit.loop_order import default_loop_order, valid_unique, validate_schedule
from codegen.ir.nest import LoopNest
from codegen.ir.reductions import REDUCTIONS

#: Every strategy's name, in the heuristic's order (`codegen.cuda.strategies.STRATEGIES`).
GPU_STRATEGIES = tuple(s.name for s in STRATEGIES)
__all__ = [
    "GPU_STRATEGIES",
    "INDEX_TYPES",
    "ONLINE_COLUMNS",
    "ONLINE_THREADS",
    "SMEM_THREADS",
    "GpuSchedule",
    "candidate_gpu_schedules",
    "choose_gpu_schedule",
    "online_schedule",
    "validate_gpu",
]


@dataclass(frozen=True)
class GpuSchedule(GpuGeometry):
    """Thread/block mapping of one nest (see the module docstring); its words come from its
    strategy's record."""

    @property
    def record(self) -> Strategy:
        """The record of the schedule's strategy (`codegen.cuda.strategies`)."""
        return BY_NAME[self.strategy]

    def describe(self) -> str:
        """One line for the header comment of generated code."""
        return f"strategy={self.strategy} {super().describe()} {self.record.header(self)}"

    def in_words(self) -> str:
        """The schedule in plain words, for `explain` (`describe` is the terse header form).

        >>> GpuSchedule(("i",), (("j",),), strategy="block", threads=256).in_words()
        'one block of 256 threads per output element, splitting j across its threads'
        """
        return self.record.in_words(self)


def _takes(record: Strategy, nest: LoopNest) -> bool:
    """A one-pass nest takes the one-pass records alone, topk the `selects` ones alone."""
    selects = REDUCTIONS[nest.reduction].selects
    return record.one_pass == bool(nest.online) and (record.selects or not selects)


def validate_gpu(nest: LoopNest, schedule: GpuGeometry) -> None:
    """Raise ValueError when `schedule` does not fit `nest`."""
    validate_schedule(nest, schedule, GPU_STRATEGIES, ("rows", "cols", "tile_k", "blocks"))
    record = BY_NAME[schedule.strategy]
    if schedule.index_type not in INDEX_TYPES:
        raise ValueError(f"index_type must be one of {sorted(INDEX_TYPES)}")
    if record.one_pass != bool(nest.online):
        raise ValueError("the online strategy is for one-pass nests (codegen.passes.online)")
    if REDUCTIONS[nest.reduction].selects and not record.selects:
        raise ValueError("topk/argtopk take the thread strategy (a row per thread), only it")
    threads = schedule.threads
    if record.block_threads and (threads < 32 or threads > 1024 or threads & (threads - 1)):
        raise ValueError("threads must be a power of two in [32, 1024]")
    if record.validate is not None:
        record.validate(nest, schedule)


def choose_gpu_schedule(
    nest: LoopNest,
    dtypes: Mapping[str, str] | None = None,
    *,
    index_type: str = "int32",
    loop_order: Sequence[str] | None = None,
    kernel: bool = False,
    shapes: Mapping[str, Sequence[int]] | None = None,
) -> GpuSchedule:
    """The heuristic GPU schedule of `nest`: the first record of
    `codegen.cuda.strategies.STRATEGIES` that applies (see the module docstring).

    Args:
        nest: the loop nest.
        dtypes: numpy dtype names of the operands and output (a nest of floats with an XLA
            plan runs as XLA's dot).
        index_type: "int32" (default) or "int64" when a tensor may reach 2^31 elements.
        loop_order: index names fixing the order of free and reduced loops, as on the CPU.
            A loop order asks for a generated kernel.
        kernel: True for a generated kernel even where XLA would compute the nest.
        shapes: the operands' shapes where known (no record reads them yet).

    Returns:
        A valid `GpuSchedule`.
    """
    order = default_loop_order(nest, loop_order)
    base = GpuSchedule(order.free_order, order.reduced_order, index_type=index_type)
    ask = Ask(base, None if loop_order is None else tuple(loop_order), kernel)
    for record in STRATEGIES:
        if _takes(record, nest) and (found := record.applies(nest, shapes, dtypes, ask)):
            assert isinstance(found, GpuSchedule)  # each record replaces fields of `base`
            return found
    raise AssertionError(f"no strategy applies to {nest}")  # thread applies to every nest


def online_schedule(
    nest: LoopNest, *, index_type: str = "int32", rows: int = 0, lanes: int = 4, keys: int = 32
) -> GpuSchedule:
    """The online strategy's schedule of a one-pass nest (the weighted one's of a weighted
    sum): `rows` rows per block (0: `ONLINE_THREADS / lanes`), `lanes` threads per row,
    tiles of `keys` keys (`codegen.cuda.attention.online`); the free indices as written, the
    packed one last."""
    order = default_loop_order(nest)
    base = GpuSchedule(order.free_order, order.reduced_order)
    found = one_pass(nest, base, index_type=index_type, rows=rows, lanes=lanes, keys=keys)
    assert isinstance(found, GpuSchedule)
    return found


def _as_schedules(found: Sequence[GpuGeometry]) -> tuple[GpuSchedule, ...]:
    """A record's schedules: fields of the `GpuSchedule` it was given, replaced."""
    assert all(isinstance(s, GpuSchedule) for s in found)
    return cast(tuple[GpuSchedule, ...], tuple(found))


def candidate_gpu_schedules(nest: LoopNest) -> tuple[GpuSchedule, ...]:
    """The heuristic's kernel, the thread fallback, block and split schedules and small
    variants (a one-pass or weighted nest: its record's tiles)."""
    pick = choose_gpu_schedule(nest, kernel=True)
    if pick.record.candidates is not None:
        return _as_schedules(pick.record.candidates(nest, pick))
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
        *_as_schedules(pick.record.variants(pick)),
    ]
    if len(free) > 1:
        picks.append(GpuSchedule(free, reduced, "tile", row=free[-2], rows=3, threads=32))
    if free:
        picks += [
            GpuSchedule(free, reduced, "rows", threads=64),
            GpuSchedule(free, reduced, "columns", threads=32, blocks=5),
        ]
    return valid_unique(nest, picks, validate_gpu)
