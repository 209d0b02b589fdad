"""The fields of a CPU schedule, without the strategies.

`CpuGeometry` is what a strategy's emitter reads of its schedule (which strategy, the
parallel loops, the tile's indices and sizes, the schedule for short vector axes);
`codegen.c.schedule.Schedule` adds the words, validation and heuristic, which read each
strategy's record (`codegen.c.strategies`). The split keeps the records above the emitters
they name and the schedule above the records, as in `codegen.cuda.geometry`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from codegen.emit.loop_order import LoopOrder

#: The operands' shapes where known, and the dtypes of the operands and output.
Shapes = Mapping[str, Sequence[int]] | None
Dtypes = Mapping[str, str] | None


@dataclass(frozen=True)
class CpuGeometry(LoopOrder):
    """Loop order and parallel/vector mapping of one nest: the fields (see
    `codegen.c.schedule`)."""

    strategy: str = "scalar"
    parallel: bool = True
    row: str | None = None
    vector: str | None = None
    rows: int = 1
    width: int = 1
    chunks: int = 64  # split: number of chunks of the outermost reduced loop
    lanes: int = 8  # dot: vector partial sums per dot product
    #: Used instead when the vector index's extent is below `width` (decided at run time).
    small: CpuGeometry | None = None


@dataclass(frozen=True)
class Ask:
    """What the heuristic asks each strategy's `applies`: the schedule every record starts
    from (the loop order, the other fields at their defaults; a record returns it replaced),
    whether the caller fixed the loop order, and whether it wants a generated kernel where
    XLA would compute the nest."""

    base: CpuGeometry
    loop_order: tuple[str, ...] | None = None
    kernel: bool = False
