"""The smem strategy of the CUDA emitter: contraction tiles staged through shared memory.

See `codegen.cuda.schedule` for when it applies.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from codegen.cuda.dialect import CudaEmitter
from codegen.cuda.geometry import SMEM_THREADS
from codegen.cuda.layout import split_contraction
from codegen.cuda.staged import shared
from codegen.emit.emitter import Lines, block_lines, indent_lines


def tile_axes(e: CudaEmitter) -> tuple[str, str, str, str, str, str]:
    """The C names of a tile strategy's row and column indices (the schedule's `row` and
    `vector`), of the tile's first row and column, and their stops."""
    s = e.schedule
    rows, cols = e.free_range(s.row or ""), e.free_range(s.vector or "")
    return (
        e.printer.index(rows.index),
        e.printer.index(cols.index),
        e.tile_name("o", rows.index),
        e.tile_name("o", cols.index),
        e.idx(rows.stop),
        e.idx(cols.stop),
    )


def smem(e: CudaEmitter) -> Lines:
    """A contraction tile of 16 x 16 threads staged through shared memory; each warp computes
    one block of it (`lane_lines`) and skips its products where that block lies past the
    extents, the last slice stopping at the reduced index's stop (`slice_points`)."""
    s, t = e.schedule, SMEM_THREADS
    rn, vn = s.row or "", s.vector or ""
    tm, tn, tk = t * s.rows, t * s.cols, s.tile_k
    a_part, b_part = split_contraction(e.nest, rn, vn)  # type: ignore[misc]
    row, col, row0, col0, row_stop, col_stop = tile_axes(e)
    order = e.term_order(0)
    k, k0 = e.printer.index(order[-1]), e.tile_name("o", order[-1])

    def contiguous_k(part: sympy.Expr) -> bool:
        return any(
            order[-1] in access.indices[-1].free_symbols for access in part.atoms(sympy.Indexed)
        )

    def stage(
        part: sympy.Expr, array: str, width: int, index: str, origin: str, stop: str
    ) -> Lines:
        """Load a `tk x width` tile of `part` into shared memory (zero outside the ranges)."""
        kk, xx = ("t_ % {tk}", "t_ / {tk}") if contiguous_k(part) else ("t_ / {w}", "t_ % {w}")
        value = e.printer.doprint(e.hoist(part))
        inner = [
            f"const int t_ = tid_ + {t * t}*l_;",
            f"const int kk_ = {kk.format(tk=tk, w=width)}, xx_ = {xx.format(tk=tk, w=width)};",
            f"const idx_t {index} = {origin} + xx_;",
            f"const idx_t {k} = {k0} + kk_;",
            f"{array}[kk_][xx_] = ({index} < {stop} && {k} < hi_) ? ({value}) : ({e.f})0;",
        ]
        count = -(-tk * width // (t * t))
        guard = block_lines(f"if (t_ < {tk * width})", inner[1:])
        return ["#pragma unroll"] + block_lines(
            f"for (int l_ = 0; l_ < {count}; ++l_)", [inner[0], *guard]
        )

    product = [
        *(f"a_[{r}] = As_[kk_][tr_ + {LANE_ROWS * r}];" for r in range(s.rows)),
        *(f"b_[{c}] = Bs_[kk_][tc_ + {LANE_COLS * c}];" for c in range(s.cols)),
        *(f"acc_[{r}][{c}] += a_[{r}]*b_[{c}];" for r in range(s.rows) for c in range(s.cols)),
        *e.fma_hook(s.rows * s.cols),
    ]
    stages = [
        *stage(a_part, "As_", tm, row, row0, row_stop),
        *stage(b_part, "Bs_", tn, col, col0, col_stop),
    ]
    reduction = slice_loop(e, k0, tk, stages, slice_points(k0, tk, product))
    stores = []
    for r in range(s.rows):
        for c in range(s.cols):
            stores += [
                "{",
                *indent_lines(
                    [
                        f"const idx_t {row} = {row0} + tr_ + {LANE_ROWS * r};",
                        f"const idx_t {col} = {col0} + tc_ + {LANE_COLS * c};",
                        *block_lines(
                            f"if ({row} < {row_stop} && {col} < {col_stop})",
                            [e.store_line(f"[{r}][{c}]")],
                        ),
                    ]
                ),
                "}",
            ]
    tile = [
        f"const idx_t {row0} = {e.idx(e.free_range(rn).start)} + by_*{tm};",
        f"const idx_t {col0} = {e.idx(e.free_range(vn).start)} + bx_*{tn};",
        busy_line(row0, col0, row_stop, col_stop),
        f"{e.f} acc_[{s.rows}][{s.cols}];",
        *block_lines(
            f"for (int r_ = 0; r_ < {s.rows}; ++r_)",
            block_lines(f"for (int c_ = 0; c_ < {s.cols}; ++c_)", ["acc_[r_][c_] = 0;"]),
        ),
        f"{e.f} a_[{s.rows}], b_[{s.cols}];",
        *e.guarded(0, reduction),
        *stores,
    ]
    pitches = (row_pitch(tm, tk, contiguous_k(a_part)), row_pitch(tn, tk, contiguous_k(b_part)))
    return [
        *tile_declarations(e, ((tk, pitches[0]), (tk, pitches[1])), e.f),
        "const int tx_ = threadIdx.x, ty_ = threadIdx.y, tid_ = ty_*16 + tx_;",
        *lane_lines(s.rows, s.cols),
        *tile_loops(e, tile, tm, tn),
    ]


#: Lanes of a warp along a tile's rows and along its columns (4 x 8 = 32): each warp of an
#: smem or pairwise block computes one `4*rows x 8*cols` block of the output tile, so that a
#: warp whose block lies wholly past the extents (an odd size's last tile) skips its
#: products as a whole, with no divergence (`busy_line`).
LANE_ROWS, LANE_COLS = 4, 8


def lane_lines(rows: int, cols: int) -> Lines:
    """`wr_`, `wc_`: the first row and column of the thread's warp's block in the tile (warps
    `SMEM_THREADS // LANE_COLS` across); `tr_`, `tc_`: the thread's first row and column,
    whose micro-tile is rows `tr_ + LANE_ROWS*r`, columns `tc_ + LANE_COLS*c`. A warp's
    reads of a staged row then touch 4 (or 8) consecutive words: broadcasts, no bank
    conflict; its stores of an output row, 8 consecutive columns."""
    across = SMEM_THREADS // LANE_COLS
    return [
        f"const int wr_ = tid_ / 32 / {across} * {LANE_ROWS * rows}, "
        f"wc_ = tid_ / 32 % {across} * {LANE_COLS * cols};",
        f"const int tr_ = wr_ + tid_ % 32 / {LANE_COLS}, tc_ = wc_ + tid_ % {LANE_COLS};",
    ]


def busy_line(row0: str, col0: str, row_stop: str, col_stop: str) -> str:
    """`busy_`: the warp's block of the tile has a row and a column in range (the same for
    every lane of the warp); a warp that is not busy stages and waits at the barriers but
    runs no products."""
    return f"const bool busy_ = {row0} + wr_ < {row_stop} && {col0} + wc_ < {col_stop};"


def slice_points(k0: str, tk: int, points: Lines) -> Lines:
    """`points` (a thread's products at the slice's value `kk_`) for each value of a slice
    in range, in a busy warp only: a whole slice in a loop of `tk` (unrolled), the last one
    to the reduced index's stop (`hi_`), the same bound for the whole block."""
    whole = ["#pragma unroll", *block_lines(f"for (int kk_ = 0; kk_ < {tk}; ++kk_)", points)]
    part = block_lines("for (int kk_ = 0; kk_ < kn_; ++kk_)", points)
    lines = [
        f"const int kn_ = (int)tdsl_imin((idx_t){tk}, hi_ - {k0});",
        *block_lines(f"if (kn_ == {tk})", whole)[:-1],
        *block_lines("} else", part),
    ]
    return block_lines("if (busy_)", lines)


def tile_loops(e: CudaEmitter, tile: Lines, tm: int, tn: int) -> Lines:
    """Grid-stride loops of the blocks over `tm x tn` output tiles (`bx_` along the vector
    index, `by_` along the row index) and the other free indices (`bz_`) around `tile`."""
    s = e.schedule
    rn, vn = s.row or "", s.vector or ""
    batch = [name for name in s.free_order if name not in (rn, vn)]
    ntm = e.idx(e.count([rn], {rn: tm}))
    ntn = e.idx(e.count([vn], {vn: tn}))
    loops = block_lines(f"for (idx_t bx_ = blockIdx.x; bx_ < {ntn}; bx_ += gridDim.x)", tile)
    loops = block_lines(f"for (idx_t by_ = blockIdx.y; by_ < {ntm}; by_ += gridDim.y)", loops)
    nbatch = e.idx(e.count(batch, {}))
    return block_lines(
        f"for (idx_t bz_ = blockIdx.z; bz_ < {nbatch}; bz_ += gridDim.z)",
        [*(e.decode("bz_", batch, {}) if batch else []), *loops],
    )


def slice_loop(e: CudaEmitter, k0: str, tk: int, stages: Lines, body: Lines) -> Lines:
    """Term 0's reduced loops around its innermost one walked in `tk`-deep slices from `k0`:
    per slice, `stages` fill the shared tiles, a barrier, `body` reads them, a barrier
    (the tile strategies' k loop: smem, mma, pairwise)."""
    order = e.term_order(0)
    starts, stops = e.bounds[0].starts, e.bounds[0].stops
    k_lo, k_hi = e.idx(starts[order[-1]]), e.idx(stops[order[-1]])
    k_loop = block_lines(
        f"for (idx_t {k0} = lo_; {k0} < hi_; {k0} += {tk})",
        [*stages, "__syncthreads();", *body, "__syncthreads();"],
    )
    inner = ["{", *indent_lines([f"const idx_t lo_ = {k_lo}, hi_ = {k_hi};", *k_loop]), "}"]
    return e.loops(0, inner, stop_at=len(order) - 1)


def tile_declarations(e: CudaEmitter, shapes: tuple[tuple[int, int], ...], ctype: str) -> Lines:
    """`As_` and `Bs_` of `ctype` with `shapes` (rows, row length); see
    `shared_declarations`."""
    arrays = [
        (name, rows, pitch) for name, (rows, pitch) in zip(("As_", "Bs_"), shapes, strict=True)
    ]
    return shared_declarations(e, arrays, ctype)


def shared_declarations(
    e: CudaEmitter, arrays: Sequence[tuple[str, int, int]], ctype: str | None = None
) -> Lines:
    """Two-dimensional shared arrays `(name, rows, pitch)` of `ctype` (the accumulation
    type by default), declared by `codegen.cuda.staged.shared.declare`: static up to
    `STATIC_SHARED_LIMIT` bytes in all, else views of the block's dynamic shared memory."""
    ctype = ctype or e.f
    return shared.declare(e, [(name, ctype, (rows, pitch)) for name, rows, pitch in arrays])


BANKS = 32


def store_conflicts(pitch: int, width: int, tk: int, contiguous_k: bool) -> int:
    """The most distinct words one bank serves when the first warp stores a `tk x width`
    tile with rows `pitch` elements apart, as `smem` stages it: thread t writes row
    `t % tk`, column `t / tk` when k is the contiguous axis of the source, else row
    `t / width`, column `t % width`. 1: no bank conflict.

    >>> store_conflicts(65, 64, 16, True), store_conflicts(66, 64, 16, True)
    (2, 1)
    """
    words: dict[int, set[int]] = {}
    for t in range(min(BANKS, tk * width)):
        row, column = (t % tk, t // tk) if contiguous_k else (t // width, t % width)
        address = row * pitch + column
        words.setdefault(address % BANKS, set()).add(address)
    return max(len(found) for found in words.values())


def row_pitch(width: int, tk: int, contiguous_k: bool) -> int:
    """The row length of a staged tile: `width` plus the first padding (1, then 0, 2, 3...)
    whose stores have no bank conflict. The loads that follow read one or two words
    per row of a warp (see `smem`), which no pitch makes conflict."""
    for pad in (1, 0, *range(2, BANKS + 1)):
        if store_conflicts(width + pad, width, tk, contiguous_k) == 1:
            return width + pad
    return width + 1
