"""Emit a loop nest as a CUDA kernel under a `GpuSchedule` (codegen/cuda_schedule.py).

Calling convention of the generated kernel (what `tensordsl.gpu` passes, in this order)::

    extern "C" __global__ void tdsl_<output>_<role>_<hash8>(
        OUT *out_, const T0 *in_0, ..., long long P0_, long long P1_, ...);

* `out_`: the C-contiguous output buffer, fully written;
* one pointer per operand in `nest.operands` order (a scalar operand is a pointer to its one
  element on the device); never written;
* one 64-bit integer per entry of `CudaSource.parameters`: the same host parameters as the
  C back end computes (hoisted extent expressions, strides), from `codegen.c_emitter`.

Pointers and parameters are all 64-bit scalars (`.param .u64` in PTX). The launch grid is
`CudaSource.grid` (expressions of extents, evaluated and clamped on the host) and the block
is `CudaSource.block`. Half-precision inputs are read as float (`__half2float`,
`__bfloat162float`); accumulation is in float, or double when float64 is involved.

>>> from tensordsl.lower import lower
>>> from tensordsl.parse import parse
>>> src = emit_cuda(lower(parse("C[i,j] := A[i,k] * B[k,j]")).nest,
...                 dtypes={"A": "float32", "B": "float32", "C": "float32"})
>>> src.entry.startswith("tdsl_C_forward_"), src.block
(True, (16, 16, 1))
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import sympy

from codegen.c_emitter import (
    Emitter,
    accumulation_type,
    block_lines,
    c_name,
    check_dtypes,
    entry_name,
    indent_lines,
)
from codegen.cuda_schedule import (
    INDEX_TYPES,
    SMEM_THREADS,
    GpuSchedule,
    choose_gpu_schedule,
    split_contraction,
    validate_gpu,
)
from codegen.ir import LoopNest
from codegen.printer import CPrinter

STORAGE = {
    "float32": "float",
    "float64": "double",
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "int32": "int",
    "int64": "long long",
}
GRID_LIMITS = (2**31 - 1, 65535, 65535)

Lines = list[str]


class CudaPrinter(CPrinter):
    """The C printer with CUDA spellings: device helpers, `idx_t` index arithmetic."""

    int_type = "idx_t"
    inline = "static __device__ __forceinline__"


@dataclass(frozen=True)
class CudaSource:
    """Generated CUDA for one nest: text, entry point, host parameters and launch shape."""

    text: str
    entry: str
    parameters: tuple[tuple[str, sympy.Expr], ...]  # (name, expression of extents)
    grid: tuple[sympy.Expr, sympy.Expr, sympy.Expr]  # expressions of extents, clamped on host
    block: tuple[int, int, int]
    operands: tuple[str, ...]  # pointer arguments after the output, in order
    schedule: GpuSchedule

    @property
    def argument_count(self) -> int:
        """Kernel arguments: output, operands, parameters."""
        return 1 + len(self.operands) + len(self.parameters)


class _CudaEmitter(Emitter):
    """The C emitter's parameters and reduction templates with CUDA types and printer."""

    HALF_TO_FLOAT = {"float16": "__half2float", "bfloat16": "__bfloat162float"}
    FLOAT_TO_HALF = {"float16": "__float2half_rn", "bfloat16": "__float2bfloat16_rn"}
    STORAGE_TYPES = STORAGE

    def __init__(self, nest: LoopNest, dtypes: Mapping[str, str], schedule: GpuSchedule):
        super().__init__(nest, dtypes, schedule)  # type: ignore[arg-type]
        self.gpu = schedule
        old = self.printer
        self.printer = CudaPrinter(self.f, tensors=old.tensors, scalars=old.scalars)

    def state_types(self) -> tuple[str, str]:
        return self.f, "long long" if self.reducer.int_state else self.f

    def declare(self, base: str = "acc_", dims: str = "") -> Lines:
        lines = []
        for kind, name, init in zip(
            self.state_types(), self.names(base), self.reducer.init, strict=False
        ):
            lines.append(f"{kind} {name}{dims};" if dims else f"{kind} {name} = {init};")
        return lines

    def term_body(self, n: int, sub: str) -> Lines:
        return [
            line.replace("const int64_t ", "const idx_t ") for line in super().term_body(n, sub)
        ]

    def reduced_loops(
        self, n: int, inner: Lines, stop_at: int | None = None, step: tuple[str, str] | None = None
    ) -> Lines:
        """Term `n`'s reduced loops around `inner`; with `step`, the innermost is strided."""
        order = self.term_order(n)
        bounds = self.bounds[n]
        end = len(order) if stop_at is None else stop_at
        lines = inner
        for depth in reversed(range(end)):
            r = order[depth]
            lo, hi = self.idx(bounds.starts[r]), self.idx(bounds.stops[r])
            name = self.printer.index(r)
            if step is not None and depth == len(order) - 1:
                head = f"for (idx_t {name} = {lo} + {step[0]}; {name} < {hi}; {name} += {step[1]})"
            else:
                head = f"for (idx_t {name} = {lo}; {name} < {hi}; ++{name})"
            lines = block_lines(head, lines)
        return lines

    def term_order(self, n: int) -> tuple[sympy.Symbol, ...]:
        by_name = {s.name: s for s in self.nest.terms[n].reduced_indices}
        return tuple(by_name[name] for name in self.gpu.reduced_order[n])

    def free_by_name(self) -> dict[str, Any]:
        return {r.index.name: r for r in self.nest.free}

    def length(self, name: str) -> str:
        r = self.free_by_name()[name]
        return self.idx(sympy.Max(r.stop - r.start, 0))

    def decode(self, flat: str, names: Sequence[str], tiles: Mapping[str, int]) -> Lines:
        """Declare the free indices `names` from the flat counter (the last varies fastest)."""
        lines = [f"idx_t q_ = {flat};"]
        for pos, name in enumerate(reversed(names)):
            r = self.free_by_name()[name]
            sym = self.printer.index(r.index)
            size = self.length(name)
            if name in tiles:
                size = f"tdsl_ceildiv({size}, {tiles[name]})"
            digit = "q_" if pos == len(names) - 1 else f"q_ % {size}"
            scale = f"*{tiles[name]}" if name in tiles else ""
            var = f"{sym}0_" if name in tiles else sym
            lines.append(f"const idx_t {var} = {self.idx(r.start)} + ({digit}){scale};")
            if pos != len(names) - 1:
                lines.append(f"q_ /= {size};")
        return lines

    def count(self, names: Sequence[str], tiles: Mapping[str, int]) -> sympy.Expr:
        """The number of (tiled) points over `names`, as an expression of extents."""
        from codegen.functions import CeilDiv

        total = sympy.Integer(1)
        for name in names:
            r = self.free_by_name()[name]
            size = sympy.Max(r.stop - r.start, 0)
            total *= CeilDiv(size, tiles[name]) if name in tiles else size
        return total


def _per_element(e: _CudaEmitter, flat: str, stride: str, body: Lines, tiles=None) -> Lines:
    tiles = tiles or {}
    total = e.idx(e.count(e.gpu.free_order, tiles))
    head = f"for (idx_t e_ = {flat}; e_ < {total}; e_ += {stride})"
    return block_lines(head, [*e.decode("e_", e.gpu.free_order, tiles), *body])


def _thread(e: _CudaEmitter) -> Lines:
    body = [*e.declare()]
    for n in range(len(e.nest.terms)):
        body += e.guarded(n, e.reduced_loops(n, e.term_body(n, "")))
    body.append(e.store_line(""))
    flat = "(idx_t)blockIdx.x*(idx_t)blockDim.x + (idx_t)threadIdx.x"
    return _per_element(e, flat, "(idx_t)gridDim.x*(idx_t)blockDim.x", body)


def _tile(e: _CudaEmitter) -> Lines:
    s = e.gpu
    rn = s.row or ""
    r = e.free_by_name()[rn]
    row = e.printer.index(r.index)
    stop = e.idx(r.stop)
    dims, sub = f"[{s.rows}]", "[r_]"

    def lanes(inner: Lines, clamp: bool) -> Lines:
        value = f"tdsl_imin({row}0_ + r_, {stop} - 1)" if clamp else f"{row}0_ + r_"
        return ["#pragma unroll"] + block_lines(
            f"for (int r_ = 0; r_ < {s.rows}; ++r_)", [f"const idx_t {row} = {value};", *inner]
        )

    body = [*e.declare(dims=dims), *lanes(e.init(sub), False)]
    for n in range(len(e.nest.terms)):
        body += e.guarded(n, e.reduced_loops(n, lanes(e.term_body(n, sub), True)))
    body += lanes(block_lines(f"if ({row} < {stop})", [e.store_line(sub)]), False)
    flat = "(idx_t)blockIdx.x*(idx_t)blockDim.x + (idx_t)threadIdx.x"
    return _per_element(e, flat, "(idx_t)gridDim.x*(idx_t)blockDim.x", body, {rn: s.rows})


def _block_reduce(e: _CudaEmitter) -> Lines:
    s = e.gpu
    body = [*e.declare()]
    for n, term in enumerate(e.nest.terms):
        if not term.reduced:
            body += block_lines("if (threadIdx.x == 0)", e.guarded(n, e.term_body(n, "")))
            continue
        body += e.guarded(
            n,
            e.reduced_loops(
                n, e.term_body(n, ""), step=("(idx_t)threadIdx.x", "(idx_t)blockDim.x")
            ),
        )
    a, b = e.names()
    ta, tb = e.state_types()
    states = len(e.reducer.init)
    shared = [f"sa_[threadIdx.x] = {a};"] + ([f"sb_[threadIdx.x] = {b};"] if states > 1 else [])
    combine = e.fmt(e.reducer.combine, (a, b), ("sa_[threadIdx.x + h_]", "sb_[threadIdx.x + h_]"))
    body += [
        *shared,
        "__syncthreads();",
        *block_lines(
            f"for (int h_ = {s.threads // 2}; h_ > 0; h_ >>= 1)",
            [*block_lines("if (threadIdx.x < h_)", [combine, *shared]), "__syncthreads();"],
        ),
        *block_lines("if (threadIdx.x == 0)", [e.store_line("")]),
        "__syncthreads(); /* sa_ is reused by the next output element */",
    ]
    decls = [f"__shared__ {ta} sa_[{s.threads}];"]
    if states > 1:
        decls.append(f"__shared__ {tb} sb_[{s.threads}];")
    return decls + _per_element(e, "(idx_t)blockIdx.x", "(idx_t)gridDim.x", body)


def _smem(e: _CudaEmitter) -> Lines:
    s, t = e.gpu, SMEM_THREADS
    rn, vn = s.row or "", s.vector or ""
    tm, tn, tk = t * s.rows, t * s.cols, s.tile_k
    a_part, b_part = split_contraction(e.nest, rn, vn)  # type: ignore[misc]
    free = e.free_by_name()
    row, col = e.printer.index(free[rn].index), e.printer.index(free[vn].index)
    row_stop, col_stop = e.idx(free[rn].stop), e.idx(free[vn].stop)
    order = e.term_order(0)
    k = e.printer.index(order[-1])
    bounds = e.bounds[0]
    k_lo, k_hi = e.idx(bounds.starts[order[-1]]), e.idx(bounds.stops[order[-1]])

    def stage(part: sympy.Expr, array: str, width: int, index: str, stop: str) -> Lines:
        """Load a `tk x width` tile of `part` into shared memory (zero outside the ranges)."""
        contiguous_k = any(
            order[-1] in access.indices[-1].free_symbols for access in part.atoms(sympy.Indexed)
        )
        kk, xx = ("t_ % {tk}", "t_ / {tk}") if contiguous_k else ("t_ / {w}", "t_ % {w}")
        value = e.printer.doprint(e.hoist(part))
        inner = [
            f"const int t_ = tid_ + {t * t}*l_;",
            f"const int kk_ = {kk.format(tk=tk, w=width)}, xx_ = {xx.format(tk=tk, w=width)};",
            f"const idx_t {index} = {index}0_ + xx_;",
            f"const idx_t {k} = {k}0_ + kk_;",
            f"{array}[kk_][xx_] = ({index} < {stop} && {k} < hi_) ? ({value}) : ({e.f})0;",
        ]
        count = -(-tk * width // (t * t))
        guard = block_lines(f"if (t_ < {tk * width})", inner[1:])
        return ["#pragma unroll"] + block_lines(
            f"for (int l_ = 0; l_ < {count}; ++l_)", [inner[0], *guard]
        )

    product = [
        *(f"a_[{r}] = As_[kk_][ty_ + {t * r}];" for r in range(s.rows)),
        *(f"b_[{c}] = Bs_[kk_][tx_ + {t * c}];" for c in range(s.cols)),
        *(f"acc_[{r}][{c}] += a_[{r}]*b_[{c}];" for r in range(s.rows) for c in range(s.cols)),
    ]
    k_loop = block_lines(
        f"for (idx_t {k}0_ = lo_; {k}0_ < hi_; {k}0_ += {tk})",
        [
            *stage(a_part, "As_", tm, row, row_stop),
            *stage(b_part, "Bs_", tn, col, col_stop),
            "__syncthreads();",
            "#pragma unroll",
            *block_lines(f"for (int kk_ = 0; kk_ < {tk}; ++kk_)", product),
            "__syncthreads();",
        ],
    )
    inner = ["{", *indent_lines([f"const idx_t lo_ = {k_lo}, hi_ = {k_hi};", *k_loop]), "}"]
    reduction = e.reduced_loops(0, inner, stop_at=len(order) - 1)
    stores = []
    for r in range(s.rows):
        for c in range(s.cols):
            stores += [
                "{",
                *indent_lines(
                    [
                        f"const idx_t {row} = {row}0_ + ty_ + {t * r};",
                        f"const idx_t {col} = {col}0_ + tx_ + {t * c};",
                        *block_lines(
                            f"if ({row} < {row_stop} && {col} < {col_stop})",
                            [e.store_line(f"[{r}][{c}]")],
                        ),
                    ]
                ),
                "}",
            ]
    tile = [
        f"const idx_t {row}0_ = {e.idx(free[rn].start)} + by_*{tm};",
        f"const idx_t {col}0_ = {e.idx(free[vn].start)} + bx_*{tn};",
        f"{e.f} acc_[{s.rows}][{s.cols}];",
        *block_lines(
            f"for (int r_ = 0; r_ < {s.rows}; ++r_)",
            block_lines(f"for (int c_ = 0; c_ < {s.cols}; ++c_)", ["acc_[r_][c_] = 0;"]),
        ),
        f"{e.f} a_[{s.rows}], b_[{s.cols}];",
        *e.guarded(0, reduction),
        *stores,
    ]
    batch = [name for name in s.free_order if name not in (rn, vn)]
    ntm = e.idx(e.count([rn], {rn: tm}))
    ntn = e.idx(e.count([vn], {vn: tn}))
    loops = block_lines(f"for (idx_t bx_ = blockIdx.x; bx_ < {ntn}; bx_ += gridDim.x)", tile)
    loops = block_lines(f"for (idx_t by_ = blockIdx.y; by_ < {ntm}; by_ += gridDim.y)", loops)
    nbatch = e.idx(e.count(batch, {}))
    loops = block_lines(
        f"for (idx_t bz_ = blockIdx.z; bz_ < {nbatch}; bz_ += gridDim.z)",
        [*(e.decode("bz_", batch, {}) if batch else []), *loops],
    )
    return [
        f"__shared__ {e.f} As_[{tk}][{tm + 1}];",
        f"__shared__ {e.f} Bs_[{tk}][{tn + 1}];",
        "const int tx_ = threadIdx.x, ty_ = threadIdx.y, tid_ = ty_*16 + tx_;",
        *loops,
    ]


STRATEGY_EMITTERS: dict[str, Callable[[_CudaEmitter], Lines]] = {
    "thread": _thread,
    "tile": _tile,
    "smem": _smem,
    "block": _block_reduce,
}


def _launch(e: _CudaEmitter) -> tuple[tuple[sympy.Expr, sympy.Expr, sympy.Expr], tuple[int, ...]]:
    from codegen.functions import CeilDiv

    s, one = e.gpu, sympy.Integer(1)
    rn, vn = s.row or "", s.vector or ""
    if s.strategy == "smem":
        t = SMEM_THREADS
        batch = [n for n in s.free_order if n not in (rn, vn)]
        grid = (
            e.count([vn], {vn: t * s.cols}),
            e.count([rn], {rn: t * s.rows}),
            e.count(batch, {}),
        )
        return grid, (t, t, 1)
    tiles = {rn: s.rows} if s.strategy == "tile" else {}
    total = e.count(s.free_order, tiles)
    x = total if s.strategy == "block" else CeilDiv(total, s.threads)
    return (x, one, one), (s.threads, 1, 1)


def emit_cuda(
    nest: LoopNest,
    *,
    dtypes: Mapping[str, str],
    schedule: GpuSchedule | None = None,
    role: str = "forward",
) -> CudaSource:
    """Generate CUDA for `nest` (see the module docstring for the calling convention).

    Args:
        nest: the loop nest.
        dtypes: numpy dtype name of each operand and of `nest.output`.
        schedule: the thread mapping; `choose_gpu_schedule` when None.
        role: the nest's role in its kernel ("forward", "grad_A", ...), used in the name.

    Returns:
        The `CudaSource`.

    Raises:
        ValueError: when the schedule does not fit the nest or a dtype is unsupported.
    """
    check_dtypes(nest, dtypes, STORAGE)
    schedule = schedule or choose_gpu_schedule(nest, dtypes)
    validate_gpu(nest, schedule)
    e = _CudaEmitter(nest, dtypes, schedule)
    body = STRATEGY_EMITTERS[schedule.strategy](e)
    grid, block = _launch(e)
    params = [(sym.name, expr) for expr, sym in e.params.items()] + e.named
    entry = entry_name(nest, dtypes, schedule, role)
    text = _assemble(e, entry, params, body, block)
    return CudaSource(text, entry, tuple(params), grid, block, nest.operand_names, schedule)  # type: ignore[arg-type]


_MATH_CONSTANTS = {
    "M_E": "2.718281828459045235360",
    "M_LOG2E": "1.442695040888963407360",
    "M_LOG10E": "0.434294481903251827651",
    "M_LN2": "0.693147180559945309417",
    "M_LN10": "2.302585092994045684018",
    "M_PI": "3.141592653589793238463",
    "M_PI_2": "1.570796326794896619231",
    "M_PI_4": "0.785398163397448309616",
    "M_1_PI": "0.318309886183790671538",
    "M_2_PI": "0.636619772367581343076",
    "M_2_SQRTPI": "1.128379167095512573896",
    "M_SQRT2": "1.414213562373095048802",
    "M_SQRT1_2": "0.707106781186547524401",
}


def _prelude(body: str) -> Lines:
    """NVRTC has no <math.h>: define INFINITY and the M_* constants the body uses."""
    lines = ["#ifndef INFINITY", "#define INFINITY __int_as_float(0x7f800000)", "#endif"]
    for name, value in _MATH_CONSTANTS.items():
        if re.search(rf"\b{name}\b", body):
            lines += [f"#ifndef {name}", f"#define {name} {value}", "#endif"]
    return lines


def _assemble(
    e: _CudaEmitter, entry: str, params: list[tuple[str, sympy.Expr]], body: Lines, block: Any
) -> str:
    nest = e.nest
    source = str(nest).replace("*/", "* /")
    dtypes = ", ".join(f"{k}: {v}" for k, v in sorted(e.dtypes.items()))
    head = [
        "/* Generated by tensordsl. Do not edit.",
        *(f" *   {line}" for line in source.splitlines()),
        f" * reduction: {nest.reduction}; dtypes: {dtypes}; accumulate in {e.f}",
        f" * schedule: {e.gpu.describe()}",
        " */",
    ]
    if "float16" in e.dtypes.values():
        head.append("#include <cuda_fp16.h>")
    if "bfloat16" in e.dtypes.values():
        head.append("#include <cuda_bf16.h>")
    head += [
        *_prelude("\n".join(body)),
        f"typedef {INDEX_TYPES[e.gpu.index_type]} idx_t;",
        "",
        e.printer.helpers(),
    ]
    arguments = [f"{STORAGE[e.dtypes[nest.output]]} *__restrict__ out_"]
    prologue: Lines = []
    for op in nest.operands:
        ctype, name = STORAGE[e.dtypes[op.name]], f"in_{c_name(op.name)}"
        if op.is_scalar:
            arguments.append(f"const {ctype} *__restrict__ {name}_ptr_")
            prologue.append(f"const {e.f} {name} = {e.load(op.name).format(name + '_ptr_[0]')};")
        else:
            arguments.append(f"const {ctype} *__restrict__ {name}")
    arguments += [f"long long {name}_" for name, _ in params]
    prologue += [f"const idx_t {name} = (idx_t){name}_;" for name, _ in params]
    threads = block[0] * block[1] * block[2]
    signature = (
        f'extern "C" __global__ void __launch_bounds__({threads}) {entry}(\n    '
        + ",\n    ".join(arguments)
        + ")"
    )
    return "\n".join([*head, "", *block_lines(signature, [*prologue, *body]), ""])


def default_dtypes(nest: LoopNest, dtype: str = "float32") -> dict[str, str]:
    """`dtype` for every operand and the output (int32 for an argmax/argmin output)."""
    dtypes = {name: dtype for name in nest.operand_names}
    dtypes[nest.output] = "int32" if nest.reduction in ("argmax", "argmin") else dtype
    return dtypes


def cuda_source(
    nest: LoopNest, dtypes: Mapping[str, str] | None = None, role: str = "forward"
) -> str:
    """The generated CUDA of `nest` (float32 by default), as `k.source("cuda")` shows it."""
    return emit_cuda(nest, dtypes=dtypes or default_dtypes(nest), role=role).text


__all__ = ["CudaPrinter", "CudaSource", "accumulation_type", "cuda_source", "emit_cuda"]
