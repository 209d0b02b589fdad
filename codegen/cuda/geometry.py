"""The fields of a GPU schedule and the sizes every strategy shares, without the strategies.

`GpuGeometry` is what a strategy's emitter reads of its schedule (which strategy, the
threads, the tile's indices and sizes, the index type); `codegen.cuda.schedule.GpuSchedule`
adds the words, validation and heuristic, which read each strategy's record
(`codegen.cuda.strategies`). The split keeps the records above the emitters they name and
the schedule above the records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from codegen.emit.loop_order import LoopOrder

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
class GpuGeometry(LoopOrder):
    """Thread/block mapping of one nest: the fields (see `codegen.cuda.schedule`)."""

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


@dataclass(frozen=True)
class Ask:
    """What the heuristic asks each strategy's `applies`: the schedule every record starts
    from (the loop order and index type, the other fields at their defaults; a record returns
    it replaced), whether the caller fixed the loop order, and whether it wants a generated
    kernel where XLA would compute the nest."""

    base: GpuGeometry
    loop_order: tuple[str, ...] | None = None
    kernel: bool = False
