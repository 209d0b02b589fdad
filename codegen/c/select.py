"""The "select" strategy of the C emitter: topk and argtopk, one output row at a time (the
row's code in `codegen.emit.select`), rows shared among threads."""

from __future__ import annotations

from codegen.c.schedule import Schedule
from codegen.c.strategies import omp_parallel
from codegen.emit.emitter import Emitter, Lines, block_lines
from codegen.emit.select import row_indices, row_lines


def select(e: Emitter[Schedule]) -> Lines:
    """The whole function body of a topk/argtopk nest."""
    lines = row_lines(e)
    free = row_indices(e)
    for symbol in reversed(free):
        lines = block_lines(e.free_loop(symbol), lines)
    return omp_parallel(e, len(free)) + lines
