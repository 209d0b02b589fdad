"""One `Strategy` record per CUDA strategy, in the heuristic's order: everything the
schedule, the emitter and the static report ask of a strategy.

A strategy's loops live in its folder (`reductions/`, `staged/`, `attention/`), and its
`rules.py` there says when it applies, what it checks and its words; its record here ties
them together: how to launch it, which function writes its body, whether a second kernel
follows, which device functions it needs, how many threads per SM ptxas must leave
registers for, and the static report's figures. The heuristic
(`codegen.cuda.schedule.choose_gpu_schedule`) takes the first record whose `applies`
returns a schedule; `validate_gpu`, `GpuSchedule.describe`, `emit_cuda` and `cuda_report`
read the record of the schedule's strategy. No module compares strategy names
(tests/unit/test_cuda_strategies.py). Adding a strategy: its emitter and rules in its
family's folder, one record in `STRATEGIES` at its place in the heuristic's order, a golden
source and an emulator run (tests/gpu/test_strategies_emulated.py).

>>> [s.name for s in STRATEGIES][:4]
['online', 'weighted', 'xla', 'split']
>>> BY_NAME["split"].second_pass is not None, BY_NAME["thread"].second_pass
(True, None)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

import sympy

from codegen.cuda.attention import rules as one_pass
from codegen.cuda.attention.online import launch as online_launch
from codegen.cuda.attention.online import online
from codegen.cuda.dialect import CudaEmitter
from codegen.cuda.geometry import SMEM_THREADS, Ask, GpuGeometry
from codegen.cuda.reductions import rules as reductions
from codegen.cuda.reductions.columns import columns, columns_grid, combine_columns
from codegen.cuda.reductions.columns import combine_grid as combine_columns_grid
from codegen.cuda.reductions.rows import rows, rows_grid
from codegen.cuda.reductions.simple import block_reduce, thread, tile
from codegen.cuda.reductions.split import combine_grid, combine_partials, partial_count, split
from codegen.cuda.staged import rules as staged
from codegen.cuda.staged.mma import device_functions, mma, mma_type
from codegen.cuda.staged.pairwise import pairwise
from codegen.cuda.staged.tiles import smem
from codegen.emit.emitter import Lines
from codegen.emit.select import row_indices
from codegen.ir.contraction import xla_contraction
from codegen.ir.functions import CeilDiv
from codegen.ir.nest import LoopNest

Grid = tuple[sympy.Expr, sympy.Expr, sympy.Expr]
Block = tuple[int, int, int]
Launch = tuple[Grid, Block]
Shapes = Mapping[str, Sequence[int]] | None
Dtypes = Mapping[str, str] | None
#: `applies(nest, shapes, dtypes, ask)`: the strategy's schedule of the nest, or None where
#: it does not fit (or a record before it in the heuristic's order should take it).
Applies = Callable[[LoopNest, Shapes, Dtypes, Ask], GpuGeometry | None]
#: The static report's figure of executed over useful points: (nest, schedule, the free
#: indices' extents, the extents' values).
Redundancy = Callable[[LoopNest, GpuGeometry, Mapping[str, int], Mapping], float]
#: The static report's bytes loaded: (nest, schedule, extents' values, dtypes, points).
Loads = Callable[[LoopNest, GpuGeometry, Mapping, Mapping[str, str], float], float]


def _no_variants(s: GpuGeometry) -> tuple[GpuGeometry, ...]:
    return ()


def _unstaged(nest: LoopNest, s: GpuGeometry) -> Mapping[sympy.Indexed, str] | None:
    return {}


@dataclass(frozen=True)
class Strategy:
    """Everything the schedule, the emitter and the static report need of one strategy."""

    name: str
    #: The heuristic's rule: a schedule of this strategy for the nest, or None.
    applies: Applies
    #: The schedule's header words after its loop order (`GpuSchedule.describe`).
    header: Callable[[GpuGeometry], str]
    #: The schedule in plain words, for `explain` (`GpuSchedule.in_words`).
    in_words: Callable[[GpuGeometry], str]
    #: Writes the first kernel's body (its loops) through the emitter; None: no kernel (the
    #: runner computes the nest: "xla").
    body: Callable[[CudaEmitter], Lines] | None
    #: The first kernel's grid and the block every kernel of the source shares.
    launch: Callable[[CudaEmitter], Launch] | None
    #: Raises ValueError where a schedule of this strategy does not fit the nest.
    validate: Callable[[LoopNest, GpuGeometry], None] | None = None
    #: A second kernel launched after the first: its body and its grid; None: one kernel.
    second_pass: tuple[Callable[[CudaEmitter], Lines], Callable[[CudaEmitter], Grid]] | None = None
    #: Device functions written before the kernels; None: none.
    device_functions: Callable[[CudaEmitter], Lines] | None = None
    #: Threads per SM that ptxas must leave registers for (128 each), the second figure of
    #: `__launch_bounds__`; 0: the first figure alone.
    resident_threads: int = 0
    #: For one-pass nests (`LoopNest.online`) alone, and they for it alone.
    one_pass: bool = False
    #: Takes topk/argtopk nests (a row per thread); the others do not.
    selects: bool = False
    #: `threads` is the block's size (a power of two in [32, 1024]); False: rows x cols.
    block_threads: bool = True
    #: The candidate schedules of a nest this strategy takes, in place of the usual ones.
    candidates: Callable[[LoopNest, GpuGeometry], tuple[GpuGeometry, ...]] | None = None
    #: Variants of the heuristic's schedule added to the usual candidates.
    variants: Callable[[GpuGeometry], tuple[GpuGeometry, ...]] = _no_variants
    #: The static report: bytes loaded where the staging decides them; None: as the loops do.
    loads: Loads | None = None
    #: The static report: the share of a load each output element pays; None: all of it.
    load_share: Callable[[GpuGeometry, sympy.Indexed], float] | None = None
    #: The static report: executed over useful points; None: 1.
    redundancy: Redundancy | None = None
    #: The static report: whether consecutive lanes step the innermost reduced loop, for
    #: the host's group width; None: they step the last free index.
    reduction_lanes: Callable[[int], bool] | None = None
    #: The static report: the index each staged access's staging threads step; None: the
    #: report does not follow the staging.
    staging: Callable[[LoopNest, GpuGeometry], Mapping[sympy.Indexed, str] | None] = _unstaged


def _one_per_thread(e: CudaEmitter, *, tiled: bool = False, per_block: bool = False) -> Launch:
    """A thread (`per_block`: a block) per output element, or per tile of `rows` rows."""
    s, one = e.schedule, sympy.Integer(1)
    tiles = {s.row or "": s.rows} if tiled else {}
    rows_ = [x.name for x in row_indices(e)] if e.reducer.selects else s.free_order  # topk
    total = e.count(rows_, tiles)
    x = total if per_block else CeilDiv(total, s.threads)
    return (x, one, one), (s.threads, 1, 1)


def _staged_launch(e: CudaEmitter) -> Launch:
    """16 x 16 threads per block, a block per output tile, batch indices on z."""
    s, t = e.schedule, SMEM_THREADS
    rn, vn = s.row or "", s.vector or ""
    batch = [n for n in s.free_order if n not in (rn, vn)]
    grid = (e.count([vn], {vn: t * s.cols}), e.count([rn], {rn: t * s.rows}), e.count(batch, {}))
    return grid, (t, t, 1)


def _row_of_blocks(count: Callable[[CudaEmitter], sympy.Expr], e: CudaEmitter) -> Launch:
    one = sympy.Integer(1)
    return (count(e), one, one), (e.schedule.threads, 1, 1)


def _columns_launch(e: CudaEmitter) -> Launch:
    return columns_grid(e), (e.schedule.threads, 1, 1)


def _mma_device_functions(e: CudaEmitter) -> Lines:
    return device_functions(mma_type(e))


def _xla_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> GpuGeometry | None:
    """A nest of floats with an XLA plan, where the caller asked for no kernel."""
    if ask.kernel or ask.loop_order is not None or not xla_contraction(nest, dtypes):
        return None
    return dataclasses.replace(ask.base, strategy="xla")


#: The one-pass kernels' 2 blocks of 256 threads (`codegen.cuda.geometry.ONLINE_THREADS`);
#: without the figure ptxas has given their weighted variant (attention's dK) 96 registers
#: and spilled 196 bytes.
ONE_PASS_RESIDENT_THREADS = 512
_one_pass_record = partial(
    Strategy,
    body=online,
    launch=online_launch,
    resident_threads=ONE_PASS_RESIDENT_THREADS,
    block_threads=False,
    header=one_pass.header,
    candidates=one_pass.candidates,
)
_staged_record = partial(
    Strategy, launch=_staged_launch, header=staged.header, redundancy=staged.redundancy
)

#: Every strategy, in the heuristic's order: the first whose `applies` returns a schedule
#: is the nest's (a one-pass nest takes only `one_pass` records, topk only `selects` ones).
STRATEGIES: tuple[Strategy, ...] = (
    _one_pass_record(
        "online",
        one_pass.online_applies,
        in_words=one_pass.online_words,
        validate=one_pass.online_validate,
        one_pass=True,
    ),
    _one_pass_record(
        "weighted",
        one_pass.weighted_applies,
        in_words=one_pass.weighted_words,
        validate=one_pass.weighted_validate,
    ),
    Strategy(
        "xla",
        _xla_applies,
        header=lambda s: "(jnp.einsum: XLA's dot, no generated kernel)",
        in_words=lambda s: "XLA's dot (jnp.einsum, cuBLAS): no generated kernel",
        body=None,
        launch=None,
    ),
    Strategy(
        "split",
        reductions.split_applies,
        header=reductions.split_header,
        in_words=reductions.split_words,
        body=split,
        launch=partial(_row_of_blocks, partial_count),
        second_pass=(combine_partials, combine_grid),
        reduction_lanes=reductions.always,
    ),
    Strategy(
        "block",
        reductions.block_applies,
        header=reductions.threads_header,
        in_words=reductions.block_words,
        body=block_reduce,
        launch=partial(_one_per_thread, per_block=True),
        reduction_lanes=reductions.always,
    ),
    Strategy(
        "mma",
        staged.mma_applies,
        header=staged.mma_header,
        in_words=staged.mma_words,
        body=mma,
        launch=_staged_launch,
        validate=staged.mma_validate,
        device_functions=_mma_device_functions,
        loads=staged.smem_loads,
        redundancy=staged.mma_redundancy,
        staging=staged.untracked,
    ),
    _staged_record(
        "smem",
        staged.smem_applies,
        in_words=staged.smem_words,
        body=smem,
        validate=staged.smem_validate,
        variants=staged.smaller,
        loads=staged.smem_loads,
        staging=staged.untracked,
    ),
    _staged_record(
        "pairwise",
        staged.pairwise_applies,
        in_words=staged.pairwise_words,
        body=pairwise,
        validate=staged.pairwise_validate,
        variants=staged.smaller,
        loads=staged.pairwise_loads,
        staging=staged.pairwise_staging,
    ),
    Strategy(
        "tile",
        reductions.tile_applies,
        header=reductions.tile_header,
        in_words=reductions.tile_words,
        body=tile,
        launch=partial(_one_per_thread, tiled=True),
        validate=reductions.tile_validate,
        load_share=reductions.tile_share,
        redundancy=reductions.tile_redundancy,
    ),
    Strategy(
        "rows",
        reductions.rows_applies,
        header=reductions.threads_header,
        in_words=reductions.rows_words,
        body=rows,
        launch=partial(_row_of_blocks, rows_grid),
        validate=reductions.needs_free,
        reduction_lanes=reductions.grouped,
    ),
    Strategy(
        "columns",
        reductions.columns_applies,
        header=reductions.threads_header,
        in_words=reductions.columns_words,
        body=columns,
        launch=_columns_launch,
        validate=reductions.columns_validate,
        second_pass=(combine_columns, combine_columns_grid),
    ),
    Strategy(
        "thread",
        reductions.thread_applies,
        header=reductions.threads_header,
        in_words=reductions.thread_words,
        body=thread,
        launch=_one_per_thread,
        selects=True,
    ),
)
#: The record of each strategy by its name (`GpuSchedule.strategy`).
BY_NAME: dict[str, Strategy] = {s.name: s for s in STRATEGIES}
