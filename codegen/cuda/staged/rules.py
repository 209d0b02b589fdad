"""When the staged tiles apply (smem, mma, pairwise), what they check, their words and
their figures for the static report (`codegen.cuda.report`); their records are in
`codegen.cuda.strategies`.

Counts follow the tiles the emitters write: a warp's block of `LANE_ROWS*rows x
LANE_COLS*cols` (an mma tile of 16 x 8) in the last tile computes whole, and an smem tile
loads each element of a staged tile once per block that needs it, a pairwise tile each
element in range.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence

import sympy

from codegen.cuda.geometry import SMEM_THREADS, Ask, GpuGeometry
from codegen.cuda.layout import split_contraction, split_pairwise
from codegen.cuda.reductions.rules import reduced_words
from codegen.cuda.staged.fragments import MMA_M, MMA_N, tensor_core_type, warp_tiles
from codegen.cuda.staged.tiles import LANE_COLS, LANE_ROWS
from codegen.emit.loop_order import bound_indices
from codegen.ir.nest import LoopNest, accesses

Shapes = Mapping[str, Sequence[int]] | None
Dtypes = Mapping[str, str] | None
ITEM_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8}


def _first_row(nest: LoopNest, ask: Ask, split: Callable) -> str | None:
    """The innermost free index but the last whose (row, last) pair `split` takes, where
    no loop bound reads either."""
    free = ask.base.free_order
    if not free:
        return None
    bounded = bound_indices(nest, ask.base)
    vector = free[-1]
    for row in reversed(free[:-1]) if vector not in bounded else ():
        if row not in bounded and split(nest, row, vector) is not None:
            return row
    return None


def _tile(ask: Ask, strategy: str, row: str, tile_k: int = 16) -> GpuGeometry:
    vector = ask.base.free_order[-1]
    return dataclasses.replace(
        ask.base, strategy=strategy, row=row, vector=vector, rows=4, cols=4, tile_k=tile_k
    )


def mma_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> GpuGeometry | None:
    """A contraction `a*b` of two bfloat16 (or two float16) accesses."""
    row = _first_row(nest, ask, split_contraction)
    if row is None or tensor_core_type(nest, dtypes, row, ask.base.free_order[-1]) is None:
        return None
    return _tile(ask, "mma", row, tile_k=32)


def smem_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> GpuGeometry | None:
    """A contraction `a*b`, `a` without the last free index, `b` without the row."""
    row = _first_row(nest, ask, split_contraction)
    return None if row is None else _tile(ask, "smem", row)


def pairwise_applies(
    nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask
) -> GpuGeometry | None:
    """A body whose accesses each read the row or the last free index, not both."""
    row = _first_row(nest, ask, split_pairwise)
    return None if row is None else _tile(ask, "pairwise", row)


def _validate(nest: LoopNest, s: GpuGeometry, split: Callable) -> None:
    free = s.free_order
    if s.row not in free or s.vector not in free or s.row == s.vector:
        raise ValueError("a tile needs two distinct free indices row and vector")
    if {s.row, s.vector} & bound_indices(nest, s):
        raise ValueError("loop bounds depend on the tile's indices")
    if split(nest, s.row or "", s.vector or "") is None:
        raise ValueError(
            f"the {s.strategy} strategy needs one term: a*b (smem, a without vector,"
            " b without row), or accesses that read row or vector, not both (pairwise)"
        )


def smem_validate(nest: LoopNest, s: GpuGeometry) -> None:
    _validate(nest, s, split_contraction)


def pairwise_validate(nest: LoopNest, s: GpuGeometry) -> None:
    _validate(nest, s, split_pairwise)


def mma_validate(nest: LoopNest, s: GpuGeometry) -> None:
    """The warps' tiles, then the pairwise split (a contraction of two accesses is one)."""
    if not warp_tiles(s.rows, s.cols, s.tile_k):
        raise ValueError("an mma tile needs tile_k a multiple of 16, split evenly by 8 warps")
    _validate(nest, s, split_pairwise)


def header(s: GpuGeometry, cores: str = "") -> str:
    t, k = SMEM_THREADS, s.tile_k
    return f"tile={s.row}x{s.vector}={t * s.rows}x{t * s.cols} k={k}{cores} index={s.index_type}"


def mma_header(s: GpuGeometry) -> str:
    return header(s, " tensor-cores=mma.sync.m16n8k16")


def smem_words(s: GpuGeometry) -> str:
    t = SMEM_THREADS
    return (
        f"{t} x {t} threads per {t * s.rows} {s.row} x {t * s.cols} {s.vector} output tile, "
        f"staging {s.tile_k}-deep slices of {reduced_words(s)} in shared memory"
    )


def mma_words(s: GpuGeometry) -> str:
    return f"{smem_words(s)}, products on tensor cores (mma.sync m16n8k16, float sums)"


def pairwise_words(s: GpuGeometry) -> str:
    t = SMEM_THREADS
    return (
        f"{t} x {t} threads per {t * s.rows} {s.row} x {t * s.cols} {s.vector} output tile, "
        f"{s.rows} x {s.cols} per thread, each access staged in {s.tile_k}-deep slices of "
        f"{reduced_words(s)} in shared memory"
    )


def smaller(s: GpuGeometry) -> tuple[GpuGeometry, ...]:
    """A small variant for the candidate schedules: 2 x 1 per thread, slices of 8."""
    fresh = type(s)(s.free_order, s.reduced_order, s.strategy, row=s.row, vector=s.vector)
    return (dataclasses.replace(fresh, rows=2, cols=1, tile_k=8),)


# The static report's figures.


def smem_loads(
    nest: LoopNest, s: GpuGeometry, extents: Mapping, dtypes: Mapping[str, str], points: float
) -> float:
    """Bytes an smem schedule loads: every staged tile element once per block that needs it."""
    sizes = {r.index.name: int((r.stop - r.start).xreplace(extents)) for r in nest.free}
    (term,) = nest.terms
    depth = math.prod(int((r.stop - r.start).xreplace(extents)) for r in term.reduced)
    tm, tn = SMEM_THREADS * s.rows, SMEM_THREADS * s.cols
    m, n = sizes[s.row or ""], sizes[s.vector or ""]
    batch = math.prod(v for name, v in sizes.items() if name not in (s.row, s.vector))
    total = 0.0
    for access in accesses(term.body):
        names = {x.name for x in access.free_symbols}
        item = ITEM_BYTES.get(dtypes.get(str(access.base), "float32"), 4)
        if s.vector in names:  # a b tile: once per row of tiles
            total += math.ceil(m / tm) * math.ceil(n / tn) * tn * depth * batch * item
        else:
            total += math.ceil(n / tn) * math.ceil(m / tm) * tm * depth * batch * item
    return total


def pairwise_loads(
    nest: LoopNest, s: GpuGeometry, extents: Mapping, dtypes: Mapping[str, str], points: float
) -> float:
    """Bytes a pairwise schedule loads: a row-side element in range once per block column,
    a column-side one once per block row, one that reads neither once per block. Loop
    bounds do not read the tile's indices, so each (row, column) has `points / (m*n)`."""
    sizes = {r.index.name: max(int((r.stop - r.start).xreplace(extents)), 1) for r in nest.free}
    m, n = sizes[s.row or ""], sizes[s.vector or ""]
    blocks = (math.ceil(m / (SMEM_THREADS * s.rows)), math.ceil(n / (SMEM_THREADS * s.cols)))
    sides = split_pairwise(nest, s.row or "", s.vector or "")
    assert sides is not None
    share = [(sides.rows, blocks[1] * m), (sides.columns, blocks[0] * n)]
    share.append((sides.common, blocks[0] * blocks[1]))
    total = 0.0
    for group, times in share:
        for access in group:
            item = ITEM_BYTES.get(dtypes.get(str(access.base), "float32"), 4)
            total += points / (m * n) * times * item
    return total


def _covered(extent: int, tile: int, step: int) -> int:
    """Rows (or columns) a tile strategy computes along `extent`: whole tiles of `tile`, and
    in the last one whole warp blocks (or mma tiles) of `step` (the others skip)."""
    whole, rest = divmod(extent, tile)
    return whole * tile + math.ceil(rest / step) * step


def redundancy(nest: LoopNest, s: GpuGeometry, sizes: Mapping[str, int], extents: Mapping) -> float:
    """Executed over useful points: a warp's block of LANE_ROWS*rows x LANE_COLS*cols in
    the last tile computes whole; slices stop where k does."""
    tm, tn = SMEM_THREADS * s.rows, SMEM_THREADS * s.cols
    m, n = sizes[s.row or ""], sizes[s.vector or ""]
    rows, cols = _covered(m, tm, LANE_ROWS * s.rows), _covered(n, tn, LANE_COLS * s.cols)
    return rows / m * cols / n


def mma_redundancy(
    nest: LoopNest, s: GpuGeometry, sizes: Mapping[str, int], extents: Mapping
) -> float:
    """mma tiles of 16 x 8, k in steps of 16 and a last one of 8."""
    tm, tn = SMEM_THREADS * s.rows, SMEM_THREADS * s.cols
    m, n = sizes[s.row or ""], sizes[s.vector or ""]
    inner = nest.terms[0].reduced[-1]
    k = max(int((inner.stop - inner.start).xreplace(extents)), 1)
    deep = math.ceil(k / 8) * 8 / k
    return _covered(m, tm, MMA_M) / m * _covered(n, tn, MMA_N) / n * deep


def untracked(nest: LoopNest, s: GpuGeometry) -> None:
    """The smem and mma staging, which the report does not follow (lanes: none)."""
    return None


def pairwise_staging(nest: LoopNest, s: GpuGeometry) -> dict[sympy.Indexed, str]:
    """The index consecutive threads step where a pairwise schedule stages each access:
    the slice's reduced index where the access's last axis reads it (and for an access
    that reads neither free index of the tile), else the side's free index."""
    sides = split_pairwise(nest, s.row or "", s.vector or "")
    assert sides is not None
    inner = s.reduced_order[0][-1]
    found = {}
    for group, index in ((sides.rows, s.row), (sides.columns, s.vector), (sides.common, inner)):
        for access in group:
            walks = inner in {x.name for x in access.indices[-1].free_symbols}
            found[access] = inner if walks else index or inner
    return found
