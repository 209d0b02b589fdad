"""When the reduction strategies apply (xla, split, select, scalar), what they check and their
words (see `codegen.c.tiles.rules` for the form of a rule)."""

from __future__ import annotations

import dataclasses

from codegen.c.geometry import Ask, CpuGeometry, Dtypes, Shapes
from codegen.c.tiles.rules import vector_friendly
from codegen.emit import loop_order as orders
from codegen.ir.contraction import xla_contraction
from codegen.ir.nest import LoopNest
from codegen.passes.row_passes import row_statistics


def xla_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> CpuGeometry | None:
    """A nest with an XLA plan, where the caller asked for no kernel."""
    if ask.kernel or ask.loop_order is not None or not xla_contraction(nest, dtypes):
        return None
    return dataclasses.replace(ask.base, strategy="xla")


def split_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> CpuGeometry | None:
    """A full reduction (no free index): chunks of the outermost reduced loop in parallel."""
    return None if ask.base.free_order else dataclasses.replace(ask.base, strategy="split")


def row_passes_applies(
    nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask
) -> CpuGeometry | None:
    """An elementwise nest whose nested reductions are statistics of its rows
    (`codegen.c.reductions.statistics`), its free loops as written, the last one contiguous."""
    if ask.loop_order is not None or not row_statistics(nest):
        return None
    free = ask.base.free_order
    last = nest.free[-1].index.name
    if free[-1:] != (last,) or not vector_friendly(nest, last):
        return None
    return dataclasses.replace(ask.base, strategy="row_passes", vector=last)


def select_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> CpuGeometry:
    """Every topk/argtopk nest (the heuristic gives it no other record)."""
    return dataclasses.replace(ask.base, strategy="select")


def scalar_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> CpuGeometry:
    """Every nest: the fallback, its free loops in the tiles' order."""
    free = ask.base.free_order
    if ask.loop_order is None and free:
        free = orders.shared_row_last(nest, free)
    return dataclasses.replace(ask.base, free_order=free)


def no_header(s: CpuGeometry) -> tuple[str, ...]:
    return ()


def row_passes_words(s: CpuGeometry, inside: str, reduced: str) -> str:
    rows = ", ".join(s.free_order[:-1])
    return (
        f"one row of {rows} at a time: its nested reductions as passes over the row, then "
        f"its {s.vector} elements in vector lanes"
    )


def split_header(s: CpuGeometry) -> tuple[str, ...]:
    return (f"chunks={s.chunks}",)


def xla_header(s: CpuGeometry) -> tuple[str, ...]:
    return ("(jnp.einsum: XLA's dot, no generated kernel)",)


def scalar_words(s: CpuGeometry, inside: str, reduced: str) -> str:
    return f"one output element at a time, {inside}"


def split_words(s: CpuGeometry, inside: str, reduced: str) -> str:
    return (
        f"the reduction over {reduced} cut into {s.chunks} chunks reduced in "
        "parallel and combined in order"
    )


def select_words(s: CpuGeometry, inside: str, reduced: str) -> str:
    return f"one output row at a time, its k best in sorted slots, {inside}"


def xla_words(s: CpuGeometry, inside: str, reduced: str) -> str:
    return "XLA's dot (jnp.einsum): no generated kernel"
