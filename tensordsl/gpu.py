"""The CUDA runner: a generated kernel launched on XLA's stream, or emulated on the CPU.

At trace time (shapes are static) the CUDA is emitted and the host parameters and launch
grid are computed, then one of three paths runs it, chosen by `codegen/config.py`:

* `TENSORDSL_GPU_CALL=ffi` (default): `jax.ffi.ffi_call` to the launch handler of
  codegen/cuda_ffi.cc. The kernel is compiled by NVRTC to a CUBIN for the device now; XLA
  calls the handler, which loads the CUBIN once per CUDA context and calls `cuLaunchKernel`
  on XLA's stream: no Python and no GIL per call.
* `TENSORDSL_GPU_CALL=callback`: `jax.experimental.buffer_callback`; the callback wraps
  `ctx.stream` as a CuPy stream and launches a CuPy RawKernel compiled now (Python per call).
  Also the fallback when the handler cannot be built.
* `TENSORDSL_CUDA_EMULATE=1` (or `reverse`): the same kernel text runs on the CPU through
  the CUDA emulator (codegen/emulate.py), by the same two paths: the handler's emulated
  twin through `ffi_call`, or `buffer_callback` and ctypes. `jit`, `grad` and `vmap` work as
  on a GPU; this is how the CUDA back end is tested and debugged without one.

Nothing is compiled, allocated or synchronised per call. CuPy is imported only by the
callback path.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from codegen import config, cuda_launch, emulate
from codegen.cuda import GRID_LIMITS, CudaSource, emit_cuda
from codegen.cuda_schedule import GpuSchedule
from codegen.extents import output_shape
from codegen.host import host_function
from codegen.ir import LoopNest
from tensordsl.errors import UnsupportedError

_LOCK = threading.Lock()
_KERNELS: dict[tuple[Any, ...], Any] = {}  # (source text, device id) -> cupy.RawKernel
#: FFI targets registered with XLA in this process.
REGISTERED: set[str] = set()


@dataclass(frozen=True)
class Launch:
    """Everything a launch needs, computed at trace time."""

    source: CudaSource
    params: tuple[int, ...]
    grid: tuple[int, int, int]
    result: jax.ShapeDtypeStruct
    dtypes: tuple[str, ...]  # numpy names: the output, then each operand


def prepare(
    nest: LoopNest,
    operands: Sequence[Any],
    shapes: Mapping[str, Any],
    dtype: Any,
    schedule: GpuSchedule | None = None,
) -> Launch:
    """Emit `nest` for the operands' dtypes and compute its parameters and grid.

    `operands` only need `.shape` and `.dtype` (arrays, tracers or `jax.ShapeDtypeStruct`).
    """
    all_shapes = dict(shapes)
    for op, value in zip(nest.operands, operands, strict=True):
        all_shapes[op.name] = tuple(np.shape(value))
    out_shape = output_shape(nest, all_shapes)
    all_shapes[nest.output] = out_shape
    out_dtype = jnp.dtype(dtype)
    dtypes = {op.name: jnp.dtype(v.dtype).name for op, v in zip(nest.operands, operands)}
    dtypes[nest.output] = out_dtype.name
    source = emit_cuda(nest, dtypes=dtypes, schedule=schedule)
    params, grid = _host_values(source, all_shapes)
    order = (out_dtype.name, *(dtypes[op.name] for op in nest.operands))
    return Launch(source, params, grid, jax.ShapeDtypeStruct(out_shape, out_dtype), order)


def _host_values(
    source: CudaSource, shapes: Mapping[str, Sequence[int]]
) -> tuple[tuple[int, ...], tuple[int, int, int]]:
    """The int64 parameters and the clamped grid, computed like the C back end does."""
    host = host_function((*source.parameters, *(("grid", g) for g in source.grid)))
    values = host(shapes)
    count = len(source.parameters)
    params = tuple(int(v) for v in values[:count])
    grid = tuple(max(1, min(int(v), limit)) for v, limit in zip(values[count:], GRID_LIMITS))
    return params, grid  # type: ignore[return-value]


def run_cuda(
    nest: LoopNest,
    operands: Sequence[jax.Array],
    shapes: Mapping[str, Any],
    dtype: Any,
    *,
    schedule: GpuSchedule | None = None,
) -> jax.Array:
    """Run `nest` with CUDA (a `runners.Runner`; `schedule` for tests)."""
    launch = prepare(nest, operands, shapes, dtype, schedule)
    order = config.cuda_emulate()
    if order is not None:
        return _run_emulated(launch, operands, order)
    if config.gpu_call() == "ffi":
        reason = cuda_launch.unavailable_reason()
        if reason is None:
            return _run_ffi(launch, operands)
        warnings.warn(
            f"tensordsl: no FFI launch handler ({reason}); using buffer_callback",
            stacklevel=2,
        )
    return _run_callback(launch, operands)


def _register(name: str, platform: str) -> str:
    """Register launch handler `name` with XLA for `platform` once; return the target."""
    target = cuda_launch.target_name(name)
    with _LOCK:
        if target not in REGISTERED:
            capsule = jax.ffi.pycapsule(cuda_launch.handler(name))
            jax.ffi.register_ffi_target(target, capsule, platform=platform, api_version=1)
            REGISTERED.add(target)
    return target


def _ffi_call(
    target: str, launch: Launch, operands: Sequence[jax.Array], image: bytes, order: int = 0
) -> jax.Array:
    attributes = cuda_launch.launch_attributes(
        image,
        launch.source.entry,
        grid=launch.grid,
        block=launch.source.block,
        params=launch.params,
        dtypes=launch.dtypes,
        poison=config.poison_outputs(),
        order=order,
    )
    # "sequential": a batched call is a loop of unbatched ones, so the attributes stay right.
    call = jax.ffi.ffi_call(target, launch.result, vmap_method="sequential")
    return call(*operands, **attributes)


def _run_emulated(launch: Launch, operands: Sequence[jax.Array], order: str) -> jax.Array:
    """The kernel on the CPU through the emulator (FFI handler, or callback and ctypes)."""
    kernel = emulate.kernel(launch.source.text, launch.source.entry)
    code = emulate.ORDERS[order]
    if config.gpu_call() == "ffi" and cuda_launch.unavailable_reason() is None:
        target = _register("tdsl_cuda_launch_emulated", "cpu")
        return _ffi_call(target, launch, operands, str(kernel.library).encode(), code)
    poison = config.poison_outputs()
    params = [np.int64(p) for p in launch.params]

    def callback(ctx: Any, out: Any, *args: Any) -> None:
        target = np.asarray(out)
        if poison:
            target.fill(np.nan if np.issubdtype(target.dtype, np.inexact) else -1)
        arrays = [np.asarray(a) for a in args]
        kernel(launch.grid, launch.source.block, (target, *arrays, *params), order=order)

    from jax.experimental.buffer_callback import buffer_callback

    return buffer_callback(callback, launch.result, vmap_method="sequential")(*operands)


def _gpus() -> list[Any]:
    gpus = [d for d in jax.local_devices() if d.platform == "gpu"]
    if not gpus:
        raise UnsupportedError(
            "the 'cuda' back end needs a CUDA GPU",
            expected="backend='c', or TENSORDSL_CUDA_EMULATE=1 to emulate CUDA on the CPU",
        )
    return gpus


def _image(source: CudaSource, gpus: Sequence[Any]) -> bytes:
    """NVRTC's CUBIN for the GPUs' architecture (PTX for the oldest one when they differ)."""
    from codegen import nvrtc

    archs = sorted({str(d.compute_capability).replace(".", "") for d in gpus})
    if len(archs) == 1:
        return nvrtc.compile_source(source.text, arch=f"sm_{archs[0]}").binary
    return nvrtc.compile_source(source.text, arch=f"compute_{archs[0]}").binary + b"\0"


def _run_ffi(launch: Launch, operands: Sequence[jax.Array]) -> jax.Array:
    """`ffi_call` to the CUDA launch handler with the kernel's CUBIN, built now."""
    image = _image(launch.source, _gpus())
    return _ffi_call(_register("tdsl_cuda_launch", "CUDA"), launch, operands, image)


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


def _run_callback(launch: Launch, operands: Sequence[jax.Array]) -> jax.Array:
    """`buffer_callback` launching a CuPy RawKernel on XLA's stream (Python per call)."""
    from jax.experimental.buffer_callback import buffer_callback

    source = launch.source
    kernels = {d.local_hardware_id: _raw_kernel(source, d.local_hardware_id) for d in _gpus()}
    params = [np.int64(p) for p in launch.params]
    poison = config.poison_outputs()

    def callback(ctx: Any, out: Any, *args: Any) -> None:
        cupy = _cupy()
        pointers = [np.uint64(b.__cuda_array_interface__["data"][0]) for b in (out, *args)]
        device = out.__dlpack_device__()[1]
        with cupy.cuda.Device(device), cupy.cuda.Stream.from_external(_XlaStream(int(ctx.stream))):
            if poison:
                size = int(np.prod(launch.result.shape)) * launch.result.dtype.itemsize
                cupy.cuda.runtime.memsetAsync(int(pointers[0]), 0xFF, size, int(ctx.stream))
            kernels[device](launch.grid, source.block, (*pointers, *params))

    return buffer_callback(callback, launch.result, vmap_method="sequential")(*operands)
