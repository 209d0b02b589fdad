"""The C back end inside JAX: compiled nests called through XLA FFI or `buffer_callback`.

The nest is compiled at trace time (the first call for a dtype combination). Two ways to
call it, chosen by `TENSORDSL_CPU_CALL` (codegen/config.py):

* "ffi" (default): `jax.ffi.ffi_call` to the XLA FFI handler compiled into the kernel's own
  shared object (codegen/c/run/ffi.py). XLA calls C directly: no Python and no GIL per call. The
  int64 `params` array is computed here, at trace time, from the static shapes and passed as
  an attribute.
* "callback": `buffer_callback`, whose Python callback passes XLA's buffers to the kernel
  with ctypes. It holds the GIL for each call, so a busy Python thread slows every call down
  (benchmarks/RESULTS.md, "Call overhead"). It is also the fallback when a kernel has no
  FFI handler (jaxlib's FFI headers missing, or the handler did not build).

Both read inputs where they are and write the output fully in place; nothing is copied.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

from codegen import config
from codegen.c.gathers import CompiledRows, build_rows
from codegen.c.run.build import CompiledNest, build_c
from codegen.c.run.build import optimised_builds as optimised_builds  # `k.build()`: ahead of time
from codegen.c.run.build import prefetch_c as prefetch_kernel
from codegen.c.schedule import Schedule, choose_cpu_schedule
from codegen.ir.extents import output_shape
from codegen.ir.nest import LoopNest
from tensordsl.backends.xla_dot import run_xla

_REGISTER_LOCK = threading.Lock()
#: FFI targets registered with XLA in this process (name -> handler address).
REGISTERED: dict[str, int] = {}


def register_ffi_target(compiled: CompiledNest | CompiledRows) -> str:
    """Register the FFI handler of `compiled` with XLA once; return the target name.

    Thread-safe and idempotent: the name carries the library's digest, so one name always
    means one handler, and a name is registered at most once per process.
    """
    if compiled.ffi_handler is None:
        raise ValueError(f"{compiled.name} was built without an FFI handler")
    name = compiled.ffi_target
    with _REGISTER_LOCK:
        if name not in REGISTERED:
            capsule = jax.ffi.pycapsule(compiled.ffi_handler)
            jax.ffi.register_ffi_target(name, capsule, platform="cpu", api_version=1)
            REGISTERED[name] = _address(compiled)
    return name


def _address(compiled: CompiledNest | CompiledRows) -> int:
    return int(ctypes.cast(compiled.ffi_handler, ctypes.c_void_p).value or 0)


def kernel_dtypes(nest: LoopNest, operand_dtypes: Sequence[Any], dtype: Any) -> dict[str, str]:
    """The dtype name of every operand and of the output: the operands' own dtypes
    (`jnp.result_type` would widen a weakly typed int32 to int64)."""
    dtypes = {op.name: jnp.dtype(d).name for op, d in zip(nest.operands, operand_dtypes)}
    dtypes[nest.output] = jnp.dtype(dtype).name
    return dtypes


@functools.lru_cache(maxsize=4096)
def _heuristic(nest: LoopNest, dtypes: tuple[tuple[str, str], ...], xla: bool) -> Schedule:
    """The heuristic's schedule, chosen once per nest, dtypes and XLA-contraction setting."""
    return choose_cpu_schedule(nest, dict(dtypes), kernel=not xla)


def _schedule(nest: LoopNest, dtypes: Mapping[str, str], schedule: Schedule | None) -> Schedule:
    items = tuple(sorted(dtypes.items()))
    return schedule or _heuristic(nest, items, config.xla_contractions())


def prefetch_c(
    nest: LoopNest, operand_dtypes: Sequence[Any], dtype: Any, schedule: Schedule | None
) -> None:
    """Start building the kernel `run_c` will need for `nest`, in the background
    (`codegen.c.run.build.prefetch_c`); nothing for the "xla" strategy."""
    dtypes = kernel_dtypes(nest, operand_dtypes, dtype)
    schedule = _schedule(nest, dtypes, schedule)
    if schedule.strategy != "xla":
        prefetch_kernel(nest, dtypes=dtypes, schedule=schedule)


def run_c(
    nest: LoopNest,
    operands: Sequence[jax.Array],
    shapes: Mapping[str, tuple[int, ...]],
    dtype: Any,
    schedule: Schedule | None = None,
    *,
    precision: Any = None,
) -> jax.Array:
    """Run `nest` on the CPU (compiled C, or XLA for the "xla" strategy, its dots at
    `precision`); `shapes` covers every tensor the nest names."""
    own = [v.dtype if hasattr(v, "dtype") else jnp.result_type(v) for v in operands]
    dtypes = kernel_dtypes(nest, own, dtype)
    schedule = _schedule(nest, dtypes, schedule)
    if schedule.strategy == "xla":
        found = run_xla(nest, operands, shapes, dtype, precision=precision, minor_contraction=True)
        if found is not None:
            return found
        schedule = _heuristic(nest, tuple(sorted(dtypes.items())), False)
    compiled, result, params = _kernel_call(nest, dtypes, schedule, operands, shapes, dtype)
    if config.cpu_call() == "ffi" and compiled.ffi_handler is not None:
        return _call_ffi(compiled, operands, result, params)
    return _call_callback(compiled, operands, result, params, config.poison_outputs())


class FfiCall(NamedTuple):
    """The XLA FFI custom call that runs a kernel: its target and its attributes."""

    target: str
    attributes: dict[str, Any]


def ffi_call_c(
    nest: LoopNest,
    operands: Sequence[Any],
    shapes: Mapping[str, tuple[int, ...]],
    dtype: Any,
    schedule: Schedule | None = None,
    *,
    precision: Any = None,
) -> FfiCall | None:
    """The FFI call `run_c` makes for `nest` on operands of these types (anything with a
    `shape` and a `dtype`), for `nest_p`'s lowering to emit without tracing `run_c`; None
    where `run_c` does anything else (the "xla" strategy, the callback). `precision` is that
    of XLA's dots: a kernel has none."""
    dtypes = kernel_dtypes(nest, [a.dtype for a in operands], dtype)
    schedule = _schedule(nest, dtypes, schedule)
    if schedule.strategy == "xla" or config.cpu_call() != "ffi":
        return None
    compiled, _, params = _kernel_call(nest, dtypes, schedule, operands, shapes, dtype)
    if compiled.ffi_handler is None:
        return None
    return FfiCall(register_ffi_target(compiled), ffi_attributes(params))


def ffi_attributes(params: Any) -> dict[str, Any]:
    """The attributes of every FFI call to a generated handler: the int64 parameter array
    and the poisoning flag (`TENSORDSL_POISON_OUTPUTS`) as an int32."""
    return {
        "params": np.asarray(params, dtype=np.int64),
        "poison": np.int32(config.poison_outputs()),
    }


def _kernel_call(
    nest: LoopNest,
    dtypes: Mapping[str, str],
    schedule: Schedule,
    operands: Sequence[Any],
    shapes: Mapping[str, tuple[int, ...]],
    dtype: Any,
) -> tuple[CompiledNest, jax.ShapeDtypeStruct, np.ndarray]:
    """The kernel of `nest` (built or loaded), its result's type and its parameter array."""
    compiled = build_c(nest, dtypes=dtypes, schedule=schedule)
    result = jax.ShapeDtypeStruct(output_shape(nest, shapes), jnp.dtype(dtype))
    extents = {name: shape for name, shape in shapes.items() if name not in dtypes}
    # Shapes are static per trace, so the kernel's parameter array is a constant of the call.
    full = compiled.all_extents([np.shape(a) for a in operands], result.shape, extents)
    return compiled, result, compiled.host_parameters(full)


def scatter_rows(rows: jax.Array, positions: jax.Array, size: int) -> jax.Array | None:
    """The table's cotangent of a gather (`tensordsl.binding.scatter`): `rows` (`count x
    width`) summed into `size` rows, row `i` into row `positions[i]` in the order of `i`
    (codegen/c/gathers.py: one thread, the same bits on every call), a position outside
    `[0, size)` dropped. None where the C kernel has no build for these dtypes."""
    count, width = rows.shape
    return _rows("scatter", rows, positions, (size, width), (count, size, width))


def gather_rows(table: jax.Array, positions: jax.Array, fill: bool) -> jax.Array | None:
    """The rows of `table` (`size x width`) at `positions` (1-d; codegen/c/gathers.py), NaN
    (`fill`) or 0 where a position is outside `[0, size)`. None where the C kernel has no
    build for these dtypes."""
    size, width = table.shape
    count = positions.shape[0]
    return _rows("gather", table, positions, (count, width), (count, size, width, int(fill)))


def _rows(
    kind: str, values: jax.Array, positions: jax.Array, shape: tuple[int, ...], params: tuple
) -> jax.Array | None:
    compiled = build_rows(kind, jnp.dtype(values.dtype).name, jnp.dtype(positions.dtype).name)
    if compiled is None:
        return None
    result = jax.ShapeDtypeStruct(shape, values.dtype)
    call = jax.ffi.ffi_call(register_ffi_target(compiled), result, vmap_method="sequential")
    return call(values, positions, **ffi_attributes(params))


def _call_ffi(
    compiled: CompiledNest,
    operands: Sequence[jax.Array],
    result: jax.ShapeDtypeStruct,
    params: np.ndarray,
) -> jax.Array:
    """`ffi_call` to the kernel's handler, `params` passed as an attribute."""
    target = register_ffi_target(compiled)
    # "sequential": a batched call is a loop of unbatched ones, so `params` stays right.
    call = jax.ffi.ffi_call(target, result, vmap_method="sequential")
    return call(*operands, **ffi_attributes(params))


def _call_callback(
    compiled: CompiledNest,
    operands: Sequence[jax.Array],
    result: jax.ShapeDtypeStruct,
    params: np.ndarray,
    poison: bool,
) -> jax.Array:
    """`buffer_callback` and ctypes: the fallback (holds the GIL per call).

    The callback only passes pointers (XLA's buffers are C-contiguous, its default layout).
    """
    count = max(len(operands), 1)

    def callback(ctx: Any, out: Any, *args: Any) -> None:
        target = np.asarray(out)
        if poison:
            target.fill(np.nan if np.issubdtype(target.dtype, np.inexact) else -1)
        pointers = (ctypes.c_void_p * count)(*(np.asarray(a).ctypes.data for a in args))
        compiled.function(target.ctypes.data, pointers, params.ctypes.data)

    call = buffer_callback(callback, result, vmap_method="sequential")
    return call(*operands)
