"""The CUDA runner: a generated kernel launched by CuPy on XLA's stream, zero copies.

At trace time (shapes are static): emit the CUDA, compile it with NVRTC through CuPy for the
device, and compute the host parameters and launch grid. Inside the
`jax.experimental.buffer_callback` nothing is compiled, allocated or synchronised: the
callback reads the raw device pointers, wraps `ctx.stream` (XLA's stream for this op) as a
CuPy stream and launches on it. CuPy is imported only when this runner is used.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from codegen.cuda import GRID_LIMITS, CudaSource, emit_cuda
from codegen.cuda_schedule import GpuSchedule
from codegen.extents import output_shape
from codegen.host import host_function
from codegen.ir import LoopNest
from tensordsl.errors import UnsupportedError

_LOCK = threading.Lock()
_KERNELS: dict[tuple[Any, ...], Any] = {}  # (source text, device id) -> cupy.RawKernel


def _cupy() -> Any:
    try:
        import cupy
    except ImportError:
        raise UnsupportedError(
            "the 'cuda' back end needs CuPy",
            expected='pip install "cupy-cuda13x[ctk]" (or cupy-cuda12x)',
        ) from None
    return cupy


class _XlaStream:
    """XLA's stream pointer, exposed through the CUDA stream protocol for CuPy."""

    def __init__(self, pointer: int):
        self.pointer = pointer

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.pointer)


def _raw_kernel(source: CudaSource, device: int) -> Any:
    """The compiled CuPy RawKernel of `source` on `device` (compiled once, thread-safe)."""
    from codegen import nvrtc

    key = (source.text, device)
    with _LOCK:
        kernel = _KERNELS.get(key)
        if kernel is None:
            cupy = _cupy()
            options = ("--std=c++17", *(f"-I{d}" for d in nvrtc.include_dirs()))
            kernel = cupy.RawKernel(source.text, source.entry, options=options, backend="nvrtc")
            with cupy.cuda.Device(device):
                kernel.compile()  # at trace time, never inside the callback
            _KERNELS[key] = kernel
        return kernel


def _gpus() -> list[Any]:
    gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
    if not gpus:
        raise UnsupportedError("the 'cuda' back end needs a CUDA GPU", expected="backend='c'")
    return gpus


def _host_values(source: CudaSource, shapes: Mapping[str, Sequence[int]]) -> tuple[list, tuple]:
    """The int64 parameters and the clamped grid, computed like the C back end does."""
    host = host_function((*source.parameters, *(("grid", g) for g in source.grid)))
    values = host(shapes)
    count = len(source.parameters)
    params = [np.int64(v) for v in values[:count]]
    grid = tuple(max(1, min(int(v), limit)) for v, limit in zip(values[count:], GRID_LIMITS))
    return params, grid


def run_cuda(
    nest: LoopNest,
    operands: Sequence[jax.Array],
    shapes: Mapping[str, Any],
    dtype: Any,
    *,
    schedule: GpuSchedule | None = None,
) -> jax.Array:
    """Run `nest` on the GPU as a buffer_callback (a `runners.Runner`; `schedule` for tests)."""
    from jax.experimental.buffer_callback import buffer_callback

    all_shapes = dict(shapes)
    for op, value in zip(nest.operands, operands, strict=True):
        all_shapes[op.name] = tuple(np.shape(value))
    out_shape = output_shape(nest, all_shapes)
    all_shapes[nest.output] = out_shape
    out_dtype = jnp.dtype(dtype)
    # The operands' own dtypes: result_type would widen a weakly typed int32 to int64.
    dtypes = {op.name: jnp.dtype(v.dtype).name for op, v in zip(nest.operands, operands)}
    dtypes[nest.output] = out_dtype.name
    source = emit_cuda(nest, dtypes=dtypes, schedule=schedule)
    params, grid = _host_values(source, all_shapes)
    # Compiled now, at trace time, for every local GPU: the callback picks the buffers' one.
    kernels = {d.local_hardware_id: _raw_kernel(source, d.local_hardware_id) for d in _gpus()}

    def callback(ctx: Any, out: Any, *args: Any) -> None:
        cupy = _cupy()
        pointers = [np.uint64(b.__cuda_array_interface__["data"][0]) for b in (out, *args)]
        device = out.__dlpack_device__()[1]
        with cupy.cuda.Device(device), cupy.cuda.Stream.from_external(_XlaStream(int(ctx.stream))):
            kernels[device](grid, source.block, (*pointers, *params))

    result = jax.ShapeDtypeStruct(out_shape, out_dtype)
    return buffer_callback(callback, result, vmap_method="sequential")(*operands)
