"""The pairwise strategy of the CUDA emitter: every row against every column, from shared
memory (see `codegen.cuda.schedule` for when it applies).

For a body whose accesses each read the free index `row` or the free index `vector` (the
column), not both (`codegen.cuda.layout.split_pairwise`): pairwise distances
`(X[i,k] - Y[j,k])^2`, `abs(X[i,k] - Y[j,k])`, a Gaussian kernel's `exp(-g*(X[i,k] -
Y[j,k])^2)`, `(W[k,i] - X[k,j])^2`; any reduction. A block of 16 x 16 threads computes a
`16*rows x 16*cols` output tile, each thread `rows x cols` outputs in registers, each warp
a `4*rows x 8*cols` block of them (`codegen.cuda.staged.tiles.lane_lines`: rows `tr_ + 4*r`,
columns `tc_ + 8*c`, so a warp's stores walk 8 columns). For each
`tile_k`-deep slice of the innermost reduced index, every distinct access is staged in an
array of its own: a row-side access as `rs<n>_[tile_k][16*rows + pad]`, a column-side one as
`cs<n>_[tile_k][16*cols + pad]`, one that reads neither (`w[k]`) as `ks<n>_[tile_k][1]`.
Consecutive threads load consecutive elements of the access's contiguous axis (k for
`X[i,k]`, i for `W[k,i]`: coalesced), and each row of an array is padded so that those
stores hit no bank twice (`codegen.cuda.staged.tiles.row_pitch`). Each thread then reads its rows'
and columns' values of each access into registers and evaluates the whole body at each of
its `rows x cols` points, folding it into the point's reduction state.

A product's zero padding adds nothing to a sum; `exp(-(0-0)^2)` would. So the loop over a
slice runs over the values in range: a whole slice has a constant trip count (unrolled),
the last one its own count. Bounds are tested only where a slice is staged (values outside
the ranges are staged as 0), where outputs are stored, and once per tile and warp: a warp
whose block has no row or no column in range runs no points (`busy_`). The rest of an odd
size's last tile is computed on but never stored: at most `4*rows - 1` rows and `8*cols - 1`
columns past the extents per tile.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from codegen.cuda.dialect import CudaEmitter
from codegen.cuda.geometry import SMEM_THREADS
from codegen.cuda.layout import split_pairwise
from codegen.cuda.staged.tiles import (
    LANE_COLS,
    LANE_ROWS,
    busy_line,
    lane_lines,
    row_pitch,
    shared_declarations,
    slice_loop,
    slice_points,
    tile_axes,
)
from codegen.emit.emitter import Lines, block_lines, indent_lines


@dataclass(frozen=True)
class Staged:
    """One access staged per slice: its array, its side, the width of a row of the array."""

    access: sympy.Indexed
    array: str
    side: str  # "row", "column" or "common"
    width: int
    walks_k: bool  # the access's contiguous axis reads the slice's index


def staged_accesses(e: CudaEmitter) -> tuple[Staged, ...]:
    """The accesses of the body in the arrays `pairwise` stages them in.

    >>> from codegen.cuda.schedule import choose_gpu_schedule
    >>> from tensordsl.frontend.lower import lower
    >>> from tensordsl.frontend.parse import parse
    >>> nest = lower(parse("D[i,j] := w[k]*(W[k,i] - X[j,k])^2")).nest
    >>> e = CudaEmitter(nest, dict.fromkeys("DwWX", "float32"), choose_gpu_schedule(nest))
    >>> [(str(a.access), a.array, a.width, a.walks_k) for a in staged_accesses(e)]
    [('W[k, i]', 'rs0_', 64, False), ('X[j, k]', 'cs0_', 64, True), ('w[k]', 'ks0_', 1, True)]
    """
    s, t = e.schedule, SMEM_THREADS
    sides = split_pairwise(e.nest, s.row or "", s.vector or "")
    assert sides is not None, "validate_gpu admits pairwise schedules of pairwise bodies only"
    inner = e.term_order(0)[-1]
    found = []
    for side, prefix, width, group in (
        ("row", "rs", t * s.rows, sides.rows),
        ("column", "cs", t * s.cols, sides.columns),
        ("common", "ks", 1, sides.common),
    ):
        for n, access in enumerate(group):
            walks_k = inner in access.indices[-1].free_symbols
            found.append(Staged(access, f"{prefix}{n}_", side, width, walks_k))
    return tuple(found)


def _stage(e: CudaEmitter, a: Staged, ranges: dict[str, tuple[str, str, str]]) -> Lines:
    """Load one slice of `a` into its array: `tile_k` rows of `a.width`, 0 outside the
    ranges. `ranges[side]`: the C index, the tile's origin and the stop of the side's free
    index."""
    s, threads = e.schedule, SMEM_THREADS * SMEM_THREADS
    tk, width = s.tile_k, a.width
    inner = e.term_order(0)[-1]
    k, k0 = e.printer.index(inner), e.tile_name("o", inner)
    kk, xx = ("t_ % {tk}", "t_ / {tk}") if a.walks_k else ("t_ / {w}", "t_ % {w}")
    value = e.printer.doprint(e.hoist(a.access))
    lines = [f"const int kk_ = {kk.format(tk=tk, w=width)}, xx_ = {xx.format(tk=tk, w=width)};"]
    tests = [f"{k} < hi_"]
    if a.side in ranges:
        index, origin, stop = ranges[a.side]
        lines.append(f"const idx_t {index} = {origin} + xx_;")
        tests.insert(0, f"{index} < {stop}")
    lines += [
        f"const idx_t {k} = {k0} + kk_;",
        f"{a.array}[kk_][xx_] = ({' && '.join(tests)}) ? ({value}) : ({e.f})0;",
    ]
    count = -(-tk * width // threads)
    if tk * width % threads:
        lines = block_lines(f"if (t_ < {tk * width})", lines)
    return ["#pragma unroll"] + block_lines(
        f"for (int l_ = 0; l_ < {count}; ++l_)", [f"const int t_ = tid_ + {threads}*l_;", *lines]
    )


def _points(e: CudaEmitter, staged: tuple[Staged, ...]) -> Lines:
    """The body at each of a thread's `rows x cols` points for the slice's value `kk_`: each
    access read once per row (or column) into a register, then the body per point."""
    s = e.schedule
    term = e.nest.terms[0]
    inner = e.term_order(0)[-1]
    lines: Lines = []
    registers: dict[tuple[int, int], dict[sympy.Basic, sympy.Basic]] = {
        (r, c): {} for r in range(s.rows) for c in range(s.cols)
    }
    for a in staged:
        count, lane, step = {
            "row": (s.rows, "tr_", LANE_ROWS),
            "column": (s.cols, "tc_", LANE_COLS),
        }.get(a.side, (1, "", 0))
        values = [sympy.Dummy(f"{a.array}{q}", real=True) for q in range(count)]
        for q, value in enumerate(values):
            at = f"{lane} + {step * q}" if lane else "0"
            lines.append(f"const {e.f} {value.name} = {a.array}[kk_][{at}];")
        for (r, c), mapping in registers.items():
            mapping[a.access] = values[r if a.side == "row" else c if a.side == "column" else 0]
    first = term.body.xreplace(registers[0, 0])
    if inner in first.free_symbols or e.reducer.positional:
        k0 = e.tile_name("o", inner)
        lines.insert(0, f"const idx_t {e.printer.index(inner)} = {k0} + kk_;")
    if e.reducer.positional:
        lines.append(f"const idx_t pos_ = {e.position(term)};")
    for (r, c), mapping in registers.items():
        value = e.printer.doprint(e.hoist(term.body.xreplace(mapping)))
        update = e.fmt(e.reducer.update, e.names("acc_", f"[{r}][{c}]"))
        lines += ["{", *indent_lines([f"const {e.f} val_ = {value};", update]), "}"]
    return [*lines, *e.fma_hook(s.rows * s.cols)]


def pairwise(e: CudaEmitter) -> Lines:
    """A `16*rows x 16*cols` tile of outputs per block of 16 x 16 threads, every access of the
    body staged in shared memory per slice of the innermost reduced index."""
    s, t = e.schedule, SMEM_THREADS
    rn, vn = s.row or "", s.vector or ""
    tm, tn, tk = t * s.rows, t * s.cols, s.tile_k
    row, col, row0, col0, row_stop, col_stop = tile_axes(e)
    order = e.term_order(0)
    k0 = e.tile_name("o", order[-1])
    staged = staged_accesses(e)
    ranges = {"row": (row, row0, row_stop), "column": (col, col0, col_stop)}
    stages = [line for a in staged for line in _stage(e, a, ranges)]
    reduction = slice_loop(e, k0, tk, stages, slice_points(k0, tk, _points(e, staged)))
    stores = []
    for r in range(s.rows):
        for c in range(s.cols):
            test = f"if ({row} < {row_stop} && {col} < {col_stop})"
            store = [
                f"const idx_t {row} = {row0} + tr_ + {LANE_ROWS * r};",
                f"const idx_t {col} = {col0} + tc_ + {LANE_COLS * c};",
                *block_lines(test, [e.store_line(f"[{r}][{c}]")]),
            ]
            stores += ["{", *indent_lines(store), "}"]
    tile = [
        f"const idx_t {row0} = {e.idx(e.free_range(rn).start)} + by_*{tm};",
        f"const idx_t {col0} = {e.idx(e.free_range(vn).start)} + bx_*{tn};",
        busy_line(row0, col0, row_stop, col_stop),
        *e.declare(dims=f"[{s.rows}][{s.cols}]"),
        *block_lines(
            f"for (int r_ = 0; r_ < {s.rows}; ++r_)",
            block_lines(f"for (int c_ = 0; c_ < {s.cols}; ++c_)", e.init("[r_][c_]")),
        ),
        *e.guarded(0, reduction),
        *stores,
    ]
    batch = [name for name in s.free_order if name not in (rn, vn)]
    ntm, ntn = e.idx(e.count([rn], {rn: tm})), e.idx(e.count([vn], {vn: tn}))
    loops = block_lines(f"for (idx_t bx_ = blockIdx.x; bx_ < {ntn}; bx_ += gridDim.x)", tile)
    loops = block_lines(f"for (idx_t by_ = blockIdx.y; by_ < {ntm}; by_ += gridDim.y)", loops)
    loops = block_lines(
        f"for (idx_t bz_ = blockIdx.z; bz_ < {e.idx(e.count(batch, {}))}; bz_ += gridDim.z)",
        [*(e.decode("bz_", batch, {}) if batch else []), *loops],
    )
    arrays = [(a.array, tk, row_pitch(a.width, tk, a.walks_k)) for a in staged]
    return [
        *shared_declarations(e, arrays),
        "const int tx_ = threadIdx.x, ty_ = threadIdx.y, tid_ = ty_*16 + tx_;",
        *lane_lines(s.rows, s.cols),
        *loops,
    ]
