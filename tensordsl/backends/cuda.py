"""The CUDA runner: a generated kernel launched on XLA's stream, or emulated on the CPU.

At trace time (shapes are static) the CUDA is emitted and the host parameters, the grid of
each kernel and the size of its scratch space are computed, then one of three paths runs
it, chosen by `codegen/config.py`:

* `TENSORDSL_GPU_CALL=ffi` (default): `jax.ffi.ffi_call` to the launch handler of
  codegen/cuda/run/ffi.cc. The kernel is compiled by NVRTC to a CUBIN for the device now; XLA
  calls the handler, which loads the CUBIN once per CUDA context and calls `cuLaunchKernel`
  on XLA's stream: no Python and no GIL per call.
* `TENSORDSL_GPU_CALL=callback`: `jax.experimental.buffer_callback`; the callback wraps
  `ctx.stream` as a CuPy stream and launches a CuPy RawKernel compiled now (Python per call).
  Also the fallback when the handler cannot be built.
* `TENSORDSL_CUDA_EMULATE=1` (or `reverse`): the same kernel text runs on the CPU through
  the CUDA emulator (codegen/cuda/emulator/emulate.py), by the same two paths: the handler's
  emulated twin through `ffi_call`, or `buffer_callback` and ctypes. `jit`, `grad` and `vmap` work
  as on a GPU; this is how the CUDA back end is tested and debugged without one.

A source may hold several kernels (the split strategy's two passes), launched one after
another with the same arguments; scratch space they share is an extra output of the call
(`jax.ffi.ffi_call` and `buffer_callback` allocate it with the output), dropped afterwards.
Nothing is compiled, allocated or synchronised per call. CuPy is imported only by the
callback path. A nest of floats with an XLA plan (the "xla" strategy of
`codegen.cuda.schedule`) runs as XLA's dot and fused elementwise work
(`tensordsl.backends.xla_dot`), cuBLAS on a GPU, as on the CPU.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jaxlib import xla_client

from codegen import config
from codegen.cuda.emit import GRID_LIMITS, CudaSource, emit_cuda
from codegen.cuda.emulator import emulate
from codegen.cuda.run import launch as cuda_launch
from codegen.cuda.schedule import GpuSchedule, choose_gpu_schedule
from codegen.cuda.staged.shared import STATIC_SHARED_LIMIT
from codegen.ir.extents import extent_values, output_shape
from codegen.ir.host import host_function
from codegen.ir.magnitude import index_magnitude
from codegen.ir.nest import LoopNest
from codegen.passes.proven import drop_proven
from tensordsl.backends.xla_dot import run_xla
from tensordsl.errors import UnsupportedError

_LOCK = threading.Lock()
_MODULES: dict[tuple[Any, ...], Any] = {}  # (source text, device id) -> cupy.RawModule
#: FFI targets registered with XLA in this process.
REGISTERED: set[str] = set()


Grid = tuple[int, int, int]


@dataclass(frozen=True)
class Launch:
    """Everything a launch needs, computed at trace time."""

    source: CudaSource
    params: tuple[int, ...]
    grids: tuple[Grid, ...]  # one per kernel of `source.passes`; (0, 0, 0): not launched
    result: jax.ShapeDtypeStruct
    dtypes: tuple[str, ...]  # numpy names: the output, then each operand
    workspace: int = 0  # bytes of scratch space: an extra output of the call when not 0

    @property
    def grid(self) -> Grid:
        """The first kernel's grid."""
        return self.grids[0]

    @property
    def passes(self) -> tuple[tuple[str, Grid], ...]:
        """(entry, grid) of each kernel to launch, in order."""
        found = zip(self.source.passes, self.grids, strict=True)
        return tuple((p.entry, grid) for p, grid in found if grid[0] > 0)

    @property
    def outputs(self) -> tuple[jax.ShapeDtypeStruct, ...]:
        """The call's outputs: the result, then the scratch space, if any."""
        scratch = jax.ShapeDtypeStruct((self.workspace,), np.uint8)
        return (self.result, scratch) if self.workspace else (self.result,)

    @property
    def pointer_dtypes(self) -> tuple[str, ...]:
        """numpy names of the kernels' pointer arguments: output, operands, scratch."""
        return (*self.dtypes, *("uint8" for _ in self.outputs[1:]))


def prepare(
    nest: LoopNest,
    operands: Sequence[Any],
    shapes: Mapping[str, Any],
    dtype: Any,
    schedule: GpuSchedule | None = None,
    *,
    counting: bool = False,
) -> Launch:
    """Emit `nest` for the operands' dtypes and compute its parameters and grid.

    `operands` only need `.shape` and `.dtype` (arrays, tracers or `jax.ShapeDtypeStruct`).
    `counting`: the text has the CUDA emulator's counting hooks (`emit_cuda`), for
    `emulate.build(..., counting=True)` only.
    """
    all_shapes = dict(shapes)
    for op, value in zip(nest.operands, operands, strict=True):
        all_shapes[op.name] = tuple(np.shape(value))
    out_shape = output_shape(nest, all_shapes)
    all_shapes[nest.output] = out_shape
    dtypes = _dtypes(nest, operands, dtype)
    extents = extent_values(nest, all_shapes)
    nest = drop_proven(nest, extents=extents)  # tests true here
    source = emit_cuda(nest, dtypes=dtypes, schedule=schedule, counting=counting)
    params, grids, workspace = _host_values(source, all_shapes)
    if source.schedule.index_type == "int32" and (
        needs_64bit_indices(all_shapes.values(), params, grids, source.block)
        or index_magnitude(nest, extents) >= INT32_SAFE  # offsets, range starts, mod(i + c)
    ):
        wide = dataclasses.replace(source.schedule, index_type="int64")
        source = emit_cuda(nest, dtypes=dtypes, schedule=wide, counting=counting)
        params, grids, workspace = _host_values(source, all_shapes)
    order = (dtypes[nest.output], *(dtypes[op.name] for op in nest.operands))
    result = jax.ShapeDtypeStruct(out_shape, jnp.dtype(dtype))
    return Launch(source, params, grids, result, order, workspace)


#: 32-bit index arithmetic is safe while every tensor, parameter and grid has fewer elements,
#: threads or units than this: an index below it plus a grid-stride step below it stays
#: below 2^31.
INT32_SAFE = 2**30


def needs_64bit_indices(
    shapes: Iterable[Sequence[int]],
    params: Sequence[int],
    grids: Sequence[Grid],
    block: Sequence[int],
) -> bool:
    """Whether a kernel needs 64-bit index arithmetic (`idx_t` of `long long`) for these
    shapes, host parameters and grids: some tensor size, parameter or grid's thread count
    reaches `INT32_SAFE`.

    >>> needs_64bit_indices([(1024, 1024)], [1024], [(4096, 1, 1)], (256, 1, 1))
    False
    >>> needs_64bit_indices([(2**31 - 1,)], [2**31 - 1], [(2**23, 1, 1)], (256, 1, 1))
    True
    """
    threads = math.prod(block)
    return (
        any(math.prod(shape) >= INT32_SAFE for shape in shapes)
        or any(abs(p) >= INT32_SAFE for p in params)
        or any(math.prod(grid) * threads >= INT32_SAFE for grid in grids)
    )


def _dtypes(nest: LoopNest, operands: Sequence[Any], dtype: Any) -> dict[str, str]:
    """numpy dtype names of the operands and the output."""
    found = {op.name: jnp.dtype(v.dtype).name for op, v in zip(nest.operands, operands)}
    found[nest.output] = jnp.dtype(dtype).name
    return found


def _host_values(
    source: CudaSource, shapes: Mapping[str, Sequence[int]]
) -> tuple[tuple[int, ...], tuple[Grid, ...], int]:
    """The int64 parameters, each kernel's clamped grid and the scratch bytes, computed like
    the C back end does. The first kernel gets at least one block; a later one whose grid
    is empty is not launched (all zeros)."""
    grids = [("grid", g) for p in source.passes for g in p.grid]
    host = host_function((*source.parameters, *grids, ("workspace", source.workspace)))
    values = [int(v) for v in host(shapes)]
    count = len(source.parameters)
    found: list[Grid] = []
    for n in range(len(source.passes)):
        grid = values[count + 3 * n : count + 3 * n + 3]
        if n and min(grid) < 1:
            found.append((0, 0, 0))
            continue
        x, y, z = (max(1, min(v, top)) for v, top in zip(grid, GRID_LIMITS, strict=True))
        found.append((x, y, z))
    return tuple(values[:count]), tuple(found), values[-1]


def run_cuda(
    nest: LoopNest,
    operands: Sequence[jax.Array],
    shapes: Mapping[str, Any],
    dtype: Any,
    *,
    schedule: GpuSchedule | None = None,
    precision: Any = None,
) -> jax.Array:
    """Run `nest` with CUDA, or XLA for the "xla" strategy at `precision` (a
    `runners.Runner`; `schedule` for tests)."""
    order = config.cuda_emulate()
    if order is None:
        _gpus()  # no GPU is an error, also where XLA would run the nest
    picked = schedule or choose_gpu_schedule(nest, _dtypes(nest, operands, dtype))
    if picked.strategy == "xla":
        found = run_xla(nest, operands, shapes, dtype, precision=precision)
        if found is not None:
            return found
    # None: the heuristic's kernel for the nest without the tests its shapes prove (`prepare`;
    # a matmul's dB holds `k + 1 <= A.shape[1]`, which bounds k and hides its smem tile).
    launch = prepare(nest, operands, shapes, dtype, schedule)
    _check_shared(launch.source, EMULATED_SHARED_LIMIT if order is not None else None)
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
            # A call enqueues the same launches every time: XLA may capture it in a CUDA graph
            # (as the handler's metadata also says, codegen/cuda/run/ffi.cc).
            jax.ffi.register_ffi_target(
                target,
                capsule,
                platform=platform,
                api_version=1,
                traits=xla_client.CustomCallTargetTraits.COMMAND_BUFFER_COMPATIBLE,
            )
            REGISTERED.add(target)
    return target


def _ffi_call(
    target: str, launch: Launch, operands: Sequence[jax.Array], image: bytes, order: int = 0
) -> jax.Array:
    attributes = cuda_launch.launch_attributes(
        image,
        launch.passes,
        block=launch.source.block,
        params=launch.params,
        dtypes=launch.pointer_dtypes,
        scratch=len(launch.outputs) - 1,
        shared=launch.source.shared,
        poison=config.poison_outputs(),
        order=order,
    )
    # "sequential": a batched call is a loop of unbatched ones, so the attributes stay right.
    call = jax.ffi.ffi_call(target, launch.outputs, vmap_method="sequential")
    return call(*operands, **attributes)[0]


def _buffer_call(callback: Any, launch: Launch, operands: Sequence[jax.Array]) -> jax.Array:
    """`buffer_callback` with the launch's outputs; `callback(ctx, outputs, *args)`."""
    from jax.experimental.buffer_callback import buffer_callback

    call = buffer_callback(callback, launch.outputs, vmap_method="sequential")
    return call(*operands)[0]


def _run_emulated(launch: Launch, operands: Sequence[jax.Array], order: str) -> jax.Array:
    """The kernels on the CPU through the emulator (FFI handler, or callback and ctypes)."""
    text = launch.source.text
    built = emulate.build([(text, p.entry) for p in launch.source.passes])  # one library
    code = emulate.ORDERS[order]
    if config.gpu_call() == "ffi" and cuda_launch.unavailable_reason() is None:
        target = _register("tdsl_cuda_launch_emulated", "cpu")
        return _ffi_call(target, launch, operands, str(built[0].library).encode(), code)
    kernels = {k.entry: k for k in built}
    poison = config.poison_outputs()
    params = [np.int64(p) for p in launch.params]

    def callback(ctx: Any, outputs: Any, *args: Any) -> None:
        out, *scratch = (np.asarray(o) for o in outputs)
        if poison:
            for array in (out, *scratch):
                array.reshape(-1).view(np.uint8).fill(0xFF)  # NaN, or -1
        arguments = (out, *(np.asarray(a) for a in args), *scratch, *params)
        for entry, grid in launch.passes:
            kernels[entry](
                grid, launch.source.block, arguments, order=order, shared_mem=launch.source.shared
            )

    return _buffer_call(callback, launch, operands)


#: Dynamic shared memory per block the emulator offers (codegen/cuda/emulator/runtime.h), as
#: an H100.
EMULATED_SHARED_LIMIT = 227 * 1024


def shared_limit() -> int:
    """The most shared memory a block of the first GPU may opt in to (CuPy's device
    attribute; without CuPy, sm_90's 227 KB, and the FFI handler's opt-in says if not)."""
    try:
        import cupy

        return int(cupy.cuda.Device(0).attributes["MaxSharedMemoryPerBlockOptin"])
    except Exception:  # no CuPy, or no device attribute
        return EMULATED_SHARED_LIMIT


def _check_shared(source: CudaSource, limit: int | None) -> None:
    """Refuse a kernel whose tiles need more shared memory than the device gives a block."""
    if source.shared <= STATIC_SHARED_LIMIT:
        return
    limit = shared_limit() if limit is None else limit
    if source.shared > limit:
        raise UnsupportedError(
            f"the {source.schedule.strategy} tile of {source.entry} needs {source.shared} "
            f"bytes of shared memory per block; this device allows {limit}",
            expected="a smaller tile (tile_k, rows, cols of the GpuSchedule)",
        )


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
    from codegen.cuda.run import nvrtc

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


def _raw_kernels(source: CudaSource, device: int) -> dict[str, Any]:
    """The compiled CuPy kernel of each pass of `source` on `device`, by entry (compiled
    once per source and device, thread-safe)."""
    from codegen.cuda.run import nvrtc

    key = (source.text, device)
    with _LOCK:
        module = _MODULES.get(key)
        if module is None:
            cupy = _cupy()
            options = ("--std=c++17", *(f"-I{d}" for d in nvrtc.include_dirs()))
            module = cupy.RawModule(code=source.text, options=options, backend="nvrtc")
            with cupy.cuda.Device(device):
                module.compile()  # at trace time, never inside the callback
            _MODULES[key] = module
        with _cupy().cuda.Device(device):
            found = {p.entry: module.get_function(p.entry) for p in source.passes}
            if source.shared > STATIC_SHARED_LIMIT:  # opt in to more than the default
                for kernel in found.values():
                    kernel.max_dynamic_shared_size_bytes = source.shared
            return found


def _run_callback(launch: Launch, operands: Sequence[jax.Array]) -> jax.Array:
    """`buffer_callback` launching CuPy kernels on XLA's stream (Python per call)."""
    source = launch.source
    kernels = {d.local_hardware_id: _raw_kernels(source, d.local_hardware_id) for d in _gpus()}
    params = [np.int64(p) for p in launch.params]
    poison = config.poison_outputs()
    sizes = [int(np.prod(o.shape)) * o.dtype.itemsize for o in launch.outputs]

    def callback(ctx: Any, outputs: Any, *args: Any) -> None:
        cupy = _cupy()
        out, *scratch = (_pointer(o) for o in outputs)
        device = outputs[0].__dlpack_device__()[1]
        stream = int(ctx.stream)
        with cupy.cuda.Device(device), cupy.cuda.Stream.from_external(_XlaStream(stream)):
            if poison:
                for pointer, size in zip((out, *scratch), sizes, strict=True):
                    cupy.cuda.runtime.memsetAsync(int(pointer), 0xFF, size, stream)
            arguments = (out, *(_pointer(a) for a in args), *scratch, *params)
            for entry, grid in launch.passes:
                kernels[device][entry](grid, source.block, arguments, shared_mem=source.shared)

    return _buffer_call(callback, launch, operands)


def _pointer(buffer: Any) -> np.uint64:
    return np.uint64(buffer.__cuda_array_interface__["data"][0])
