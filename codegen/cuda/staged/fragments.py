"""Tensor-core tiles: when a contraction may use `mma.sync` m16n8k16, and its fragment layout.

The mma strategy (`codegen.cuda.staged.mma`) is the smem tile whose products run on tensor cores:
`mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32` (or `.f16.f16`) multiplies a 16 x 16
tile of A by a 16 x 8 tile of B and adds a 16 x 8 float tile, one warp together. A product
of two bf16 (or two f16) values is exact in float32 and the sums stay in float32, so the
result has the precision of the SIMT tile's float accumulation: no user option is needed.
float32 inputs keep the SIMT tile (TF32 would round them to 10 mantissa bits).

Each lane of the warp holds pieces of the tiles ("fragments", PTX ISA 9.7.14.5.8), by its
group `g = lane / 4` and its place in the group `q = lane % 4`; a 32-bit register holds two
16-bit values, the lower index in the lower half:

* A (16 x 16, row-major): register r = 0..3 holds row `g + 8*(r % 2)`, columns
  `2*q + 8*(r // 2)` and the next one (`a_fragment`);
* B (16 x 8, column-major): register r = 0..1 holds rows `2*q + 8*r` and the next one of
  column `g` (`b_fragment`);
* C and D (16 x 8 float): value v = 0..3 is row `g + 8*(v // 2)`, column `2*q + v % 2`
  (`c_fragment`).

>>> a_fragment(5)  # lane 5: group 1, place 1
(((1, 2), (1, 3)), ((9, 2), (9, 3)), ((1, 10), (1, 11)), ((9, 10), (9, 11)))
>>> b_fragment(5), c_fragment(5)
((((2, 1), (3, 1)), ((10, 1), (11, 1))), ((1, 2), (1, 3), (9, 2), (9, 3)))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import sympy

from codegen.cuda.layout import split_contraction
from codegen.ir.nest import LoopNest

MMA_M, MMA_N, MMA_K = 16, 8, 16
#: Warps of the smem block (16 x 16 threads).
WARPS = 8
#: Input types with a tensor-core product (float accumulators), by their PTX names.
MMA_TYPES = {"bfloat16": "bf16", "float16": "f16"}
#: Output types of a tensor-core nest: the float accumulators are stored as these.
MMA_OUTPUTS = ("float32", "bfloat16", "float16")

Cell = tuple[int, int]


def a_fragment(lane: int) -> tuple[tuple[Cell, ...], ...]:
    """(row, column) of A in each half of each of the lane's 4 A registers."""
    g, q = divmod(lane, 4)
    return tuple(
        tuple((g + 8 * (r % 2), 2 * q + 8 * (r // 2) + h) for h in (0, 1)) for r in range(4)
    )


def b_fragment(lane: int) -> tuple[tuple[Cell, ...], ...]:
    """(row, column) of B in each half of each of the lane's 2 B registers."""
    g, q = divmod(lane, 4)
    return tuple(tuple((2 * q + 8 * r + h, g) for h in (0, 1)) for r in range(2))


def c_fragment(lane: int) -> tuple[Cell, ...]:
    """(row, column) of C and D of each of the lane's 4 float values."""
    g, q = divmod(lane, 4)
    return tuple((g + 8 * (v // 2), 2 * q + v % 2) for v in range(4))


#: The most mma tiles a warp keeps (4 float accumulators per lane each).
WARP_TILES = 16


class WarpTiles(NamedTuple):
    """How the 8 warps share an mma block tile: `row_warps` warps along the row index, each
    warp `m_tiles` x `n_tiles` mma tiles (16 x 8 outputs each)."""

    row_warps: int
    m_tiles: int
    n_tiles: int


def warp_tiles(rows: int, cols: int, tile_k: int) -> WarpTiles | None:
    """The split of a `16*rows x 16*cols` smem tile among the 8 warps that loads the fewest
    fragment words per mma (4 per A tile, 2 per B tile; ties: more warps along the rows);
    None when `tile_k` is not a multiple of 16, no split is even, or a warp would keep
    more than `WARP_TILES` tiles.

    >>> warp_tiles(4, 4, 32), warp_tiles(8, 8, 32)
    (WarpTiles(row_warps=4, m_tiles=1, n_tiles=4), WarpTiles(row_warps=4, m_tiles=2, n_tiles=8))
    >>> warp_tiles(2, 4, 16), warp_tiles(4, 4, 8), warp_tiles(2, 1, 16), warp_tiles(8, 16, 16)
    (WarpTiles(row_warps=2, m_tiles=1, n_tiles=2), None, None, None)
    """
    if tile_k % MMA_K or rows < 1 or cols < 1:
        return None
    found = None
    for row_warps in (8, 4, 2, 1):
        across = WARPS // row_warps
        if rows % row_warps or 16 * cols // MMA_N % across:
            continue
        split = WarpTiles(row_warps, rows // row_warps, 16 * cols // MMA_N // across)
        cost = 4 * split.m_tiles + 2 * split.n_tiles
        if split.m_tiles * split.n_tiles <= WARP_TILES and (found is None or cost < found[0]):
            found = (cost, split)
    return None if found is None else found[1]


def tensor_core_type(
    nest: LoopNest, dtypes: Mapping[str, str] | None, row: str, vector: str
) -> str | None:
    """ "bfloat16" or "float16" when `nest` is a contraction `a*b` (`split_contraction`) whose
    factors are each one access of an operand of that type, accumulated in float and
    stored as float32, bfloat16 or float16; else None. A factor that computes (`2*A[i,k]`,
    `exp(A[i,k])`) would be rounded to 16 bits before the product: it keeps the SIMT tile.
    """
    if not dtypes or dtypes.get(nest.output) not in MMA_OUTPUTS:
        return None
    parts = split_contraction(nest, row, vector)
    if parts is None or not all(isinstance(part, sympy.Indexed) for part in parts):
        return None
    types = {dtypes.get(str(part.base)) for part in parts}
    found = types.pop() if len(types) == 1 else None
    return found if found in MMA_TYPES else None
