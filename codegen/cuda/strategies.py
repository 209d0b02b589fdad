"""One `Strategy` record per CUDA strategy: what `codegen.cuda.emit` asks of it.

A strategy's loops live in its folder (`reductions/`, `staged/`, `attention/`); its record
here says how to launch it, which function writes its body, whether a second kernel
follows, which device functions it needs and how many threads per SM ptxas must leave
registers for. `emit_cuda` reads the record of the schedule's strategy and compares no
strategy names. (The heuristic that picks one, `codegen.cuda.schedule`, and the static
report, `codegen.cuda.report`, still test names: issue 34.)

>>> [s.name for s in STRATEGIES][:3]
['thread', 'tile', 'smem']
>>> BY_NAME["split"].second_pass is not None, BY_NAME["thread"].second_pass
(True, None)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import sympy

from codegen.cuda.attention.online import launch as online_launch
from codegen.cuda.attention.online import online
from codegen.cuda.dialect import CudaEmitter
from codegen.cuda.reductions.columns import columns, columns_grid, combine_columns
from codegen.cuda.reductions.columns import combine_grid as combine_columns_grid
from codegen.cuda.reductions.rows import rows, rows_grid
from codegen.cuda.reductions.simple import block_reduce, thread, tile
from codegen.cuda.reductions.split import combine_grid, combine_partials, partial_count, split
from codegen.cuda.schedule import SMEM_THREADS
from codegen.cuda.staged.mma import device_functions, mma, mma_type
from codegen.cuda.staged.pairwise import pairwise
from codegen.cuda.staged.tiles import smem
from codegen.emit.emitter import Lines
from codegen.emit.select import row_indices
from codegen.ir.functions import CeilDiv

Grid = tuple[sympy.Expr, sympy.Expr, sympy.Expr]
Block = tuple[int, int, int]
Launch = tuple[Grid, Block]


@dataclass(frozen=True)
class Strategy:
    """Everything the emitter needs of one strategy."""

    name: str
    #: Writes the first kernel's body (its loops) through the emitter.
    body: Callable[[CudaEmitter], Lines]
    #: The first kernel's grid and the block every kernel of the source shares.
    launch: Callable[[CudaEmitter], Launch]
    #: A second kernel launched after the first: its body and its grid; None: one kernel.
    second_pass: tuple[Callable[[CudaEmitter], Lines], Callable[[CudaEmitter], Grid]] | None = None
    #: Device functions written before the kernels; None: none.
    device_functions: Callable[[CudaEmitter], Lines] | None = None
    #: Threads per SM that ptxas must leave registers for (128 each), the second figure of
    #: `__launch_bounds__`; 0: the first figure alone.
    resident_threads: int = 0


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


#: The one-pass kernels' 2 blocks of 256 threads (`codegen.cuda.schedule.ONLINE_THREADS`);
#: without the figure ptxas has given their weighted variant (attention's dK) 96 registers
#: and spilled 196 bytes.
ONE_PASS_RESIDENT_THREADS = 512

STRATEGIES: tuple[Strategy, ...] = (
    Strategy("thread", thread, _one_per_thread),
    Strategy("tile", tile, partial(_one_per_thread, tiled=True)),
    Strategy("smem", smem, _staged_launch),
    Strategy("pairwise", pairwise, _staged_launch),
    Strategy("mma", mma, _staged_launch, device_functions=_mma_device_functions),
    Strategy("block", block_reduce, partial(_one_per_thread, per_block=True)),
    Strategy(
        "split",
        split,
        partial(_row_of_blocks, partial_count),
        second_pass=(combine_partials, combine_grid),
    ),
    Strategy("online", online, online_launch, resident_threads=ONE_PASS_RESIDENT_THREADS),
    Strategy("weighted", online, online_launch, resident_threads=ONE_PASS_RESIDENT_THREADS),
    Strategy("rows", rows, partial(_row_of_blocks, rows_grid)),
    Strategy(
        "columns",
        columns,
        _columns_launch,
        second_pass=(combine_columns, combine_columns_grid),
    ),
)
#: The record of each strategy by its name (`GpuSchedule.strategy`).
BY_NAME: dict[str, Strategy] = {s.name: s for s in STRATEGIES}
