"""When the one-pass strategies apply (online, weighted), what they check and their words;
their records are in `codegen.cuda.strategies`, their kernel in `codegen.cuda.attention.online`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from codegen.cuda.geometry import ONLINE_COLUMNS, ONLINE_THREADS, Ask, GpuGeometry
from codegen.cuda.layout import weighted_form
from codegen.emit.loop_order import LoopOrder, default_loop_order, term_order
from codegen.ir.bounds import loop_bounds
from codegen.ir.nest import LoopNest

Shapes = Mapping[str, Sequence[int]] | None
Dtypes = Mapping[str, str] | None


def lanes(dtypes: Dtypes) -> int:
    """Threads per row of the online kernel: 4 (32 float sums each in registers), 8 where
    float64 is involved (16 double sums each: 32 spill)."""
    return 8 if dtypes and "float64" in dtypes.values() else 4


def one_pass(
    nest: LoopNest,
    base: GpuGeometry,
    *,
    index_type: str = "int32",
    rows: int = 0,
    lanes: int = 4,
    keys: int = 32,
) -> GpuGeometry:
    """`base` as the online (a one-pass nest) or weighted schedule: `rows` rows per block
    (0: `ONLINE_THREADS / lanes`), `lanes` threads per row, tiles of `keys` keys
    (`codegen.cuda.attention.online`); the free indices as written, the packed one last."""
    rows = rows or ONLINE_THREADS // lanes
    order = default_loop_order(nest)
    return dataclasses.replace(
        base,
        free_order=order.free_order,
        reduced_order=order.reduced_order,
        strategy="online" if nest.online else "weighted",
        threads=rows * lanes,
        row=order.free_order[-2],
        vector=order.free_order[-1],
        rows=rows,
        cols=lanes,
        tile_k=keys,
        index_type=index_type,
    )


def online_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> GpuGeometry:
    """A one-pass nest (`codegen.passes.online`), whatever the loop order asked."""
    return one_pass(nest, ask.base, index_type=ask.base.index_type, lanes=lanes(dtypes))


def bounds_read_column(nest: LoopNest, order: LoopOrder) -> bool:
    """Whether a reduced loop's bound reads the last free index (tests on the free indices
    alone may: the weighted kernel tests them at the store)."""
    column = order.free_order[-1]
    for n, term in enumerate(nest.terms):
        bounds = loop_bounds(term, term_order(nest, order, n))
        for expr in (*bounds.starts.values(), *bounds.stops.values()):
            if any(s.name == column for s in expr.free_symbols):
                return True
    return False


def weighted_applies(
    nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask
) -> GpuGeometry | None:
    """A weighted sum with nested reductions in its weight, no loop order asked."""
    if ask.loop_order or not ask.base.free_order or not weighted_form(nest):
        return None
    if bounds_read_column(nest, ask.base):
        return None
    return one_pass(nest, ask.base, index_type=ask.base.index_type, lanes=lanes(dtypes))


def _tiles(nest: LoopNest, s: GpuGeometry) -> None:
    packed = nest.free[-1].index.name
    lanes, rows = s.cols, s.rows
    if s.free_order[-1:] != (packed,):
        raise ValueError(f"the column index {packed!r} must be the last free index")
    if 32 % lanes or rows * lanes > 1024 or rows * lanes % 32 or ONLINE_COLUMNS % lanes:
        raise ValueError("online: cols (lanes per row) must divide 32, rows*cols in [32, 1024]")


def online_validate(nest: LoopNest, s: GpuGeometry) -> None:
    _tiles(nest, s)


def weighted_validate(nest: LoopNest, s: GpuGeometry) -> None:
    if len(s.free_order) < 2 or bounds_read_column(nest, s) or not weighted_form(nest):
        raise ValueError("the weighted strategy needs a sum a*b (codegen.cuda.schedule)")
    _tiles(nest, s)


def header(s: GpuGeometry) -> str:
    return (
        f"tile=rows x keys={s.rows}x{s.tile_k} lanes/row={s.cols} "
        f"columns<={ONLINE_COLUMNS} threads={s.rows * s.cols} "
        f"staged=weights[{s.tile_k}][{ONLINE_COLUMNS}],scores[{s.rows}]"
        f"[{s.tile_k}+pad] in shared memory; key tiles outside the rows' "
        f"ranges skipped index={s.index_type}"
    )


def online_words(s: GpuGeometry) -> str:
    return (
        f"{s.rows} rows per block, {s.cols} threads per row, key tiles of "
        f"{s.tile_k} staged in shared memory, one pass (online softmax)"
    )


def weighted_words(s: GpuGeometry) -> str:
    return (
        f"{s.rows} rows per block, {s.cols} threads per row, each weight "
        f"computed once per block, key tiles of {s.tile_k} staged in shared memory"
    )


def candidates(nest: LoopNest, pick: GpuGeometry) -> tuple[GpuGeometry, ...]:
    """The candidate schedules of a one-pass or weighted nest: the heuristic's tiles, a
    small one with int64 indices, one lane per row."""
    return tuple(
        one_pass(nest, pick, rows=r, lanes=n, keys=k, index_type=t)
        for r, n, k, t in ((64, 4, 32, "int32"), (8, 4, 8, "int64"), (32, 1, 16, "int32"))
    )
