"""The mma strategy of the CUDA emitter: the smem tile with its products on tensor cores.

The block, grid and output tile are the smem strategy's (16 x 16 threads, a `16*rows x
16*cols` tile, 64 x 64 by default); the 8 warps split the tile (`fragments.warp_tiles`):
warp `w` takes `m_tiles` 16-row mma tiles along the row index (`w % row_warps`) by
`n_tiles` 8-column ones along the vector index (`w // row_warps`), 16 x 32 outputs by
default, keeping their float accumulators in registers in the C/D fragment layout.
`tile_k`-deep slices of both factors are staged as 32-bit words of two 16-bit values
along the reduced index (`As_[row][k/2]`, `Bs_[column][k/2]`: both fragments' registers
are then one word each); the word pitch `tile_k/2 + 4` makes a warp's fragment loads
(rows g, words q) hit 32 distinct banks. Values outside the ranges are staged as zeros.

At odd sizes the work stops near the extents, with tests that are the same for a warp's 32
lanes (no divergence): a warp skips each of its mma tiles that lies wholly past the row or
column stop (`rl_`, `cl_`: the rows and columns left from the warp's first), and a slice
runs its steps of 16 only up to the reduced index's stop (`kn_`), the last step an m16n8k8
product where 8 or fewer values are left (`deep_` false). So a tile computes at most 15
rows, 7 columns and 7 values of k past the extents.

The product is `td_mma_16816_<type>(d, a, b)` (`td_mma_1688_<type>`: the first 8 of k, from
A's words 0 and 1 and B's word 0 of the same fragments): inline PTX `mma.sync` on a GPU
(sm_80 or later), a warp-collective function of the same layout under the emulator
(`codegen/cuda/emulator/runtime.h`, which defines `TDSL_CUDA_EMULATOR`).
"""

from __future__ import annotations

import sympy

from codegen.cuda.dialect import CudaEmitter
from codegen.cuda.geometry import SMEM_THREADS
from codegen.cuda.layout import split_contraction
from codegen.cuda.staged.fragments import (
    MMA_K,
    MMA_M,
    MMA_N,
    MMA_TYPES,
    tensor_core_type,
    warp_tiles,
)
from codegen.cuda.staged.tiles import slice_loop, tile_axes, tile_declarations, tile_loops
from codegen.emit.emitter import Lines, block_lines

#: 16-bit conversions of a float, by the input type.
_BITS = {
    "bfloat16": "__bfloat16_as_ushort(__float2bfloat16_rn({}))",
    "float16": "__half_as_ushort(__float2half_rn({}))",
}


def device_functions(dtype: str) -> Lines:
    """`td_pack_<t>` (two floats as one word of 16-bit values) and `td_mma_16816_<t>`
    (D += A*B on tensor cores; the emulator supplies its own) for input type `dtype`."""
    t = MMA_TYPES[dtype]
    lo, hi = _BITS[dtype].format("lo"), _BITS[dtype].format("hi")
    return [
        f"static __device__ __forceinline__ unsigned td_pack_{t}(float lo, float hi) {{",
        f"    return (unsigned){lo} | ((unsigned){hi} << 16);",
        "}",
        "#ifndef TDSL_CUDA_EMULATOR",
        "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800",
        '#error "tensordsl: the mma strategy needs sm_80 or later"',
        "#endif",
        "/* D += A*B for a warp: A 16x16 (row), B 16x8 (col), D 16x8 float, in fragments. */",
        f"static __device__ __forceinline__ void td_mma_16816_{t}(",
        "    float d[4], const unsigned a[4], const unsigned b[2]) {",
        f'    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32 "',
        '                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"',
        '                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])',
        '                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));',
        "}",
        "/* The same for the first 8 of k (A's registers 0 and 1, B's register 0): m16n8k8. */",
        f"static __device__ __forceinline__ void td_mma_1688_{t}(",
        "    float d[4], const unsigned a[4], const unsigned b[2]) {",
        f'    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.{t}.{t}.f32 "',
        '                 "{%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"',
        '                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])',
        '                 : "r"(a[0]), "r"(a[1]), "r"(b[0]));',
        "}",
        "#endif",
    ]


def mma_type(e: CudaEmitter) -> str:
    """The tensor-core input type of `e`'s nest; ValueError when it has none."""
    s = e.schedule
    found = tensor_core_type(e.nest, e.dtypes, s.row or "", s.vector or "")
    if found is None or e.f != "float":
        raise ValueError(
            "the mma strategy needs a product of two bfloat16 (or two float16) accesses "
            "accumulated in float (codegen.cuda.staged.fragments.tensor_core_type)"
        )
    return found


def mma(e: CudaEmitter) -> Lines:
    """A contraction tile of 8 warps whose products run on tensor cores (module docstring)."""
    s, t = e.schedule, SMEM_THREADS
    t_name = MMA_TYPES[mma_type(e)]
    rn, vn = s.row or "", s.vector or ""
    tm, tn, tk = t * s.rows, t * s.cols, s.tile_k
    grid = warp_tiles(s.rows, s.cols, tk)
    assert grid is not None  # validate_gpu
    row_warps, m_tiles, n_tiles = grid
    words, pitch = tk // 2, tk // 2 + 4
    a_part, b_part = split_contraction(e.nest, rn, vn)  # type: ignore[misc]
    row, col, row0, col0, row_stop, col_stop = tile_axes(e)
    order = e.term_order(0)
    k, k0 = e.printer.index(order[-1]), e.tile_name("o", order[-1])

    def stage(
        part: sympy.Indexed, array: str, width: int, index: str, origin: str, stop: str
    ) -> Lines:
        """Stage a `width x tk` slice of `part` as words of two values along k; consecutive
        threads step k where the access reads it contiguously (coalesced), else `index`."""
        contiguous = order[-1] in part.indices[-1].free_symbols
        kp, xx = (f"t_ % {words}", f"t_ / {words}") if contiguous else (
            f"t_ / {width}", f"t_ % {width}")  # fmt: skip
        value = e.printer.doprint(e.hoist(part))
        pair = block_lines(
            "for (int h_ = 0; h_ < 2; ++h_)",
            [
                f"const idx_t {k} = {k0} + 2*kp_ + h_;",
                f"pair_[h_] = ({index} < {stop} && {k} < hi_) ? ({value}) : 0.0f;",
            ],
        )
        inner = [
            f"const int kp_ = {kp}, xx_ = {xx};",
            f"const idx_t {index} = {origin} + xx_;",
            "float pair_[2];",
            "#pragma unroll",
            *pair,
            f"{array}[xx_][kp_] = td_pack_{t_name}(pair_[0], pair_[1]);",
        ]
        body = [
            f"const int t_ = tid_ + {t * t}*l_;",
            *block_lines(f"if (t_ < {width * words})", inner),
        ]
        count = -(-width * words // (t * t))
        return ["#pragma unroll", *block_lines(f"for (int l_ = 0; l_ < {count}; ++l_)", body)]

    a_loads = [
        f"a_[m_][{r}] = As_[wm_ + {MMA_M}*m_ + lg_ + {8 * (r % 2)}][ks_ + lq_ + {4 * (r // 2)}];"
        for r in range(4)
    ]

    def products(depth: int) -> Lines:
        """The warp's mma tiles in range, each `td_mma_<16x8xdepth>` (depth 16 or 8)."""
        name = f"td_mma_168{depth}_{t_name}" if depth == 8 else f"td_mma_16816_{t_name}"
        b_loads = [
            f"b_[{r}] = Bs_[wn_ + {MMA_N}*n_ + lg_][ks_ + lq_ + {4 * r}];"
            for r in range(depth // 8)
        ]
        # A warp's 16 x 8 x depth products: 64 per lane (32 at depth 8).
        mma = [f"{name}(acc_[m_][n_], a_[m_], b_);", *e.fma_hook(MMA_M * MMA_N * depth // 32)]
        inner = block_lines(
            f"for (int m_ = 0; m_ < {m_tiles}; ++m_)", _unless(f"{MMA_M}*m_ < rl_", mma)
        )
        return [
            "#pragma unroll",
            *block_lines(
                f"for (int n_ = 0; n_ < {n_tiles}; ++n_)",
                _unless(f"{MMA_N}*n_ < cl_", [*b_loads, "#pragma unroll", *inner]),
            ),
        ]

    step = [
        f"unsigned a_[{m_tiles}][4], b_[2];",
        "#pragma unroll",
        *block_lines(
            f"for (int m_ = 0; m_ < {m_tiles}; ++m_)", _unless(f"{MMA_M}*m_ < rl_", a_loads)
        ),
        # a last step with 8 or fewer values of k left takes an m16n8k8 product
        *block_lines(f"if (2*ks_ + {MMA_K // 2} < kn_)", products(MMA_K))[:-1],
        *block_lines("} else", products(MMA_K // 2)),
    ]
    stages = [
        *stage(a_part, "As_", tm, row, row0, row_stop),
        *stage(b_part, "Bs_", tn, col, col0, col_stop),
    ]
    body = [
        f"const int kn_ = (int)tdsl_imin((idx_t){tk}, hi_ - {k0});",
        "#pragma unroll",
        *block_lines(
            f"for (int ks_ = 0; ks_ < {words}; ks_ += {MMA_K // 2})",
            block_lines("if (2*ks_ < kn_)", step),
        ),
    ]
    reduction = slice_loop(e, k0, tk, stages, body)
    store = [
        f"const idx_t {row} = {row0} + wm_ + {MMA_M}*m_ + lg_ + 8*(c_ / 2);",
        f"const idx_t {col} = {col0} + wn_ + {MMA_N}*n_ + 2*lq_ + c_ % 2;",
        *block_lines(
            f"if ({row} < {row_stop} && {col} < {col_stop})", [e.store_line("[m_][n_][c_]")]
        ),
    ]
    tile = [
        f"const idx_t {row0} = {e.idx(e.free_range(rn).start)} + by_*{tm};",
        f"const idx_t {col0} = {e.idx(e.free_range(vn).start)} + bx_*{tn};",
        f"const idx_t rl_ = {row_stop} - ({row0} + wm_), cl_ = {col_stop} - ({col0} + wn_);",
        f"float acc_[{m_tiles}][{n_tiles}][4];",
        *_tiles(m_tiles, n_tiles, ["acc_[m_][n_][c_] = 0;"]),
        *e.guarded(0, reduction),
        *_tiles(m_tiles, n_tiles, store),
    ]
    return [
        *tile_declarations(e, ((tm, pitch), (tn, pitch)), "unsigned"),
        "const int tx_ = threadIdx.x, ty_ = threadIdx.y, tid_ = ty_*16 + tx_;",
        "/* lane group lg_ and place lq_ in it: the fragment layout (codegen.cuda.fragments) */",
        "const int warp_ = tid_ / 32, lg_ = tid_ % 32 / 4, lq_ = tid_ % 4;",
        f"const int wm_ = warp_ % {row_warps} * {MMA_M * m_tiles}, "
        f"wn_ = warp_ / {row_warps} * {MMA_N * n_tiles};",
        *tile_loops(e, tile, tm, tn),
    ]


def _unless(test: str, body: Lines) -> Lines:
    """`body` under `if (test)`, a test the same for every lane of a warp."""
    return block_lines(f"if ({test})", body)


def _tiles(m_tiles: int, n_tiles: int, body: Lines) -> Lines:
    """`body` for each value `c_` of each mma tile `m_`, `n_` of a warp, unrolled."""
    loops = ["#pragma unroll", *block_lines("for (int c_ = 0; c_ < 4; ++c_)", body)]
    loops = ["#pragma unroll", *block_lines(f"for (int n_ = 0; n_ < {n_tiles}; ++n_)", loops)]
    return ["#pragma unroll", *block_lines(f"for (int m_ = 0; m_ < {m_tiles}; ++m_)", loops)]
