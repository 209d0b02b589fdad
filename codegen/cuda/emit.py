"""Emit a loop nest as a CUDA kernel under a `GpuSchedule` (codegen/cuda/schedule.py).

Calling convention of the generated kernel (what `tensordsl.backends.cuda` passes, in this order)::

    extern "C" __global__ void tdsl_<output>_<role>_<hash8>(
        OUT *out_, const T0 *in_0, ..., [unsigned char *ws_,] long long P0_, ...);

* `out_`: the C-contiguous output buffer, fully written;
* one pointer per operand in `nest.operands` order (a scalar operand is a pointer to its one
  element on the device); never written;
* `ws_`, only where `CudaSource.workspace` is not 0: that many bytes of scratch space, which
  the launch declares as an extra output (never allocated per call);
* one 64-bit integer per entry of `CudaSource.parameters`: the same host parameters as the
  C back end computes (hoisted extent expressions, strides), from `codegen.emit.emitter`.

Pointers and parameters are all 64-bit scalars (`.param .u64` in PTX). A source holds one
kernel per `CudaSource.passes` (two for the split strategy: `<entry>` then
`<entry>_combine`), launched in that order on one stream with the same arguments, each with
its own grid (expressions of extents, evaluated and clamped on the host; a pass after the
first whose grid has no block is not launched); the block is `CudaSource.block`.
Half-precision inputs are read as float (`__half2float`,
`__bfloat162float`); accumulation is in float, or double when float64 is involved.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> src = emit_cuda(lower(parse("C[i,j] := A[i,k] * B[k,j]")).nest,
...                 dtypes={"A": "float32", "B": "float32", "C": "float32"})
>>> src.entry.startswith("tdsl_C_forward_"), src.block
(True, (16, 16, 1))
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sympy

from codegen.cuda.dialect import STORAGE, CudaEmitter, CudaPrinter
from codegen.cuda.schedule import (
    INDEX_TYPES,
    GpuSchedule,
    choose_gpu_schedule,
    validate_gpu,
)
from codegen.cuda.strategies import BY_NAME, Grid
from codegen.emit.emitter import Lines, block_lines
from codegen.emit.printer import c_name
from codegen.emit.signature import accumulation_type, check_dtypes, entry_name
from codegen.ir.nest import LoopNest, default_dtypes

GRID_LIMITS = (2**31 - 1, 65535, 65535)


@dataclass(frozen=True)
class Pass:
    """One kernel of a source: its entry point and launch grid (expressions of extents)."""

    entry: str
    grid: Grid


@dataclass(frozen=True)
class CudaSource:
    """Generated CUDA for one nest: text, kernels, host parameters, launch shape, scratch."""

    text: str
    passes: tuple[Pass, ...]  # launched in order, with the same arguments and block
    parameters: tuple[tuple[str, sympy.Expr], ...]  # (name, expression of extents)
    block: tuple[int, int, int]
    operands: tuple[str, ...]  # pointer arguments after the output, in order
    schedule: GpuSchedule
    workspace: sympy.Expr = sympy.Integer(0)  # bytes of scratch space (`ws_`); 0: none
    shared: int = 0  # bytes of dynamic shared memory per block (`extern __shared__`); 0: none

    @property
    def entry(self) -> str:
        """The first kernel's entry point."""
        return self.passes[0].entry

    @property
    def grid(self) -> Grid:
        """The first kernel's grid."""
        return self.passes[0].grid

    @property
    def argument_count(self) -> int:
        """Kernel arguments: output, operands, workspace (if any), parameters."""
        scratch = 0 if self.workspace == 0 else 1
        return 1 + len(self.operands) + scratch + len(self.parameters)


def emit_cuda(
    nest: LoopNest,
    *,
    dtypes: Mapping[str, str],
    schedule: GpuSchedule | None = None,
    role: str = "forward",
    counting: bool = False,
) -> CudaSource:
    """Generate CUDA for `nest` (see the module docstring for the calling convention).

    Args:
        nest: the loop nest.
        dtypes: numpy dtype name of each operand and of `nest.output`.
        schedule: the thread mapping; `choose_gpu_schedule(..., kernel=True)` when None (a
            pure contraction gets a kernel too: the "xla" strategy is the runner's).
        role: the nest's role in its kernel ("forward", "grad_A", ...), used in the name.
        counting: write the CUDA emulator's `TDSL_COUNT_FMA` hooks at each body evaluation
            (codegen/cuda/emulator/counting.h): text for the emulator only, never NVRTC.

    Returns:
        The `CudaSource`.

    Raises:
        ValueError: when the schedule does not fit the nest, generates no kernel ("xla") or
            a dtype is unsupported.
    """
    check_dtypes(nest, dtypes, STORAGE)
    schedule = schedule or choose_gpu_schedule(nest, dtypes, kernel=True)
    validate_gpu(nest, schedule)
    strategy = BY_NAME[schedule.strategy]
    if strategy.body is None or strategy.launch is None:
        raise ValueError(f"the {schedule.strategy} strategy generates no kernel")
    e = CudaEmitter(nest, dtypes, schedule)
    e.count_fmas = counting
    entry = entry_name(nest, dtypes, schedule, role)
    grid, block = strategy.launch(e)
    kernels = [(Pass(entry, grid), strategy.body(e))]
    if strategy.second_pass is not None:
        body, second_grid = strategy.second_pass
        kernels.append((Pass(f"{entry}_combine", second_grid(e)), body(e)))
    params = [(sym.name, expr) for expr, sym in e.params.items()] + e.named
    text = _assemble(e, [(p.entry, lines) for p, lines in kernels], params, block)
    passes = tuple(p for p, _ in kernels)
    operands = nest.operand_names
    return CudaSource(
        text, passes, tuple(params), block, operands, schedule, e.workspace, e.dynamic_shared
    )


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


def _prelude(macros: set[str]) -> Lines:
    """NVRTC has no <math.h>: define INFINITY and the M_* constants the printer printed."""
    lines = ["#ifndef INFINITY", "#define INFINITY __int_as_float(0x7f800000)", "#endif"]
    for name, value in _MATH_CONSTANTS.items():
        if name in macros:
            lines += [f"#ifndef {name}", f"#define {name} {value}", "#endif"]
    return lines


def _assemble(
    e: CudaEmitter,
    kernels: list[tuple[str, Lines]],
    params: list[tuple[str, sympy.Expr]],
    block: Any,
) -> str:
    """The source: the header, then each (entry, body) kernel with the same arguments."""
    head = e.header()
    if "float16" in e.dtypes.values():
        head.append("#include <cuda_fp16.h>")
    if "bfloat16" in e.dtypes.values():
        head.append("#include <cuda_bf16.h>")
    head += [
        *_prelude(e.printer.macros),
        f"typedef {INDEX_TYPES[e.schedule.index_type]} idx_t;",
        "",
        e.printer.helpers(),
        *(device(e) if (device := BY_NAME[e.schedule.strategy].device_functions) else []),
    ]
    lines = head
    for entry, body in kernels:
        lines += ["", *_kernel(e, entry, params, body, block)]
    return "\n".join([*lines, ""])


def _kernel(
    e: CudaEmitter, entry: str, params: list[tuple[str, sympy.Expr]], body: Lines, block: Any
) -> Lines:
    """One `__global__` function: the arguments, the parameters as `idx_t`, the body."""
    nest = e.nest
    arguments = [f"{STORAGE[e.dtypes[nest.output]]} *__restrict__ out_"]
    prologue: Lines = []
    for op in nest.operands:
        ctype, name = STORAGE[e.dtypes[op.name]], f"in_{c_name(op.name)}"
        if op.is_scalar:
            pointer = f"ptr_{c_name(op.name)}"  # generated: outside the users' in_ names
            arguments.append(f"const {ctype} *__restrict__ {pointer}")
            prologue.append(f"const {e.f} {name} = {e.load(op.name).format(pointer + '[0]')};")
        else:
            arguments.append(f"const {ctype} *__restrict__ {name}")
    if e.workspace != 0:
        arguments.append("unsigned char *__restrict__ ws_")
    arguments += [f"long long {name}_" for name, _ in params]
    prologue += [f"const idx_t {name} = (idx_t){name}_;" for name, _ in params]
    threads = block[0] * block[1] * block[2]
    resident = BY_NAME[e.schedule.strategy].resident_threads
    bounds = f"{threads}, {max(resident // threads, 1)}" if resident else f"{threads}"
    signature = (
        f'extern "C" __global__ void __launch_bounds__({bounds}) {entry}(\n    '
        + ",\n    ".join(arguments)
        + ")"
    )
    return block_lines(signature, [*prologue, *body])


def cuda_source(
    nest: LoopNest, dtypes: Mapping[str, str] | None = None, role: str = "forward"
) -> str:
    """The generated CUDA of `nest` (float32 by default), as `k.source("cuda")` shows it."""
    return emit_cuda(nest, dtypes=dtypes or default_dtypes(nest), role=role).text


__all__ = ["CudaPrinter", "CudaSource", "Pass", "accumulation_type", "cuda_source", "emit_cuda"]
