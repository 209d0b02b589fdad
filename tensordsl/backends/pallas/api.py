"""Every call into `jax.experimental.pallas`: the one module to change when Pallas does.

Pallas' Triton lowering is deprecated upstream since JAX 0.11 (0.12 still ships it), so the
rest of the back end never names Pallas: a second lowering (Triton source, Mosaic GPU) would
replace this module, not the tile programs. It works on JAX 0.10.2 and the newest JAX below
0.13.

`call` runs a kernel on a grid through `jax.lax.platform_dependent`: on the CPU in interpret
mode (exact and slow), elsewhere through Triton (chosen by Triton's `CompilerParams`: the
default GPU lowering, Mosaic GPU, rejects kernels written Triton-style). Lowering for CUDA on
a machine without a GPU (`.lower(lowering_platforms=("cuda",))`, within `lowering_for_gpu`)
takes the Triton branch.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from codegen.tiles.precision import DotPrecision

_LOG = logging.getLogger("tensordsl")
#: Triton launch settings of a kernel whose caller gives none (`codegen.tiles.tuning`'s
#: default rows have the same).
NUM_WARPS, NUM_STAGES = 4, 2
#: The name of the custom call Pallas' Triton lowering leaves in a lowered module.
TRITON_CUSTOM_CALL = "__gpu$xla.gpu.triton"


def program_id(axis: int) -> jax.Array:
    """The position of this program instance along grid axis `axis`."""
    return pl.program_id(axis)


#: Whether the kernel being traced runs in interpret mode (set by `call`).
_INTERPRETING = contextvars.ContextVar("tensordsl_pallas_interpreting", default=False)


def _dot_algorithms() -> dict[str, Any]:
    """`codegen.tiles.precision`'s Triton input precisions as what Pallas' dot takes (its
    Triton lowering turns Precision.HIGHEST into `ieee`, the presets into `tf32`/`tf32x3`)."""
    presets = jax.lax.DotAlgorithmPreset
    return {
        "tf32": presets.TF32_TF32_F32,
        "tf32x3": presets.TF32_TF32_F32_X3,
        "ieee": jax.lax.Precision.HIGHEST,
    }


def add_at(ref: Any, start: Any, values: jax.Array) -> None:
    """`ref[..., start : start + n] += values` on a program instance's own block (leading
    axes of one value): a contiguous slice, each position once (no scatter, no atomics)."""
    index = (*(0 for _ in ref.shape[:-1]), pl.ds(start, values.shape[0]))
    ref[index] = ref[index] + values.astype(ref.dtype)


def dot(left: jax.Array, right: jax.Array, precision: Any = None) -> jax.Array:
    """`left @ right` on two 2-D tiles (Triton's `tl.dot`: tensor cores on a GPU).

    `precision`: a `codegen.tiles.precision.DotPrecision` (its Triton input precision; None
    there: the operands' own type, half types on tensor cores), or what `jax.lax.dot_general`
    takes. In interpret mode every dot is exact float32 (the CPU has no TF32 and rejects
    Triton's algorithms)."""
    if isinstance(precision, DotPrecision):
        if _INTERPRETING.get():
            precision = jax.lax.Precision.HIGHEST
        elif precision.triton is None:
            precision = jax.lax.Precision.DEFAULT
        else:
            precision = _dot_algorithms()[precision.triton]
    return pl_triton.dot(left, right, precision=precision)


def call(
    kernel: Callable[..., None],
    operands: Sequence[jax.Array],
    *,
    grid: tuple[int, ...],
    block: tuple[int, ...],
    shape: tuple[int, ...],
    dtype: Any,
    name: str,
    num_warps: int = NUM_WARPS,
    num_stages: int = NUM_STAGES,
) -> jax.Array:
    """Run `kernel(*operand refs, output ref)` once per point of `grid`; operands are whole
    arrays, the output of `shape` is written one `block` per program instance; on a GPU
    with Triton's `num_warps` and `num_stages`."""
    outputs = [(shape, block, lambda *g: g, dtype)]
    (out,) = call_blocks(
        kernel,
        operands,
        grid=grid,
        outputs=outputs,
        name=name,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


def call_blocks(
    kernel: Callable[..., None],
    operands: Sequence[jax.Array],
    *,
    grid: tuple[int, ...],
    outputs: Sequence[tuple[tuple[int, ...], tuple[int, ...], Callable[..., tuple], Any]],
    name: str,
    num_warps: int = NUM_WARPS,
    num_stages: int = NUM_STAGES,
) -> tuple[jax.Array, ...]:
    """Run `kernel(*operand refs, *output refs)` once per point of `grid`, with several
    outputs, each `(shape, block, index map, dtype)`: the program instance at grid point `g`
    writes the block `index_map(*g)` of it (operands are whole arrays, as in `call`)."""
    if jax.default_backend() == "cpu":
        _say_interpreted()

    def run(*values: jax.Array, interpret: bool) -> tuple[jax.Array, ...]:
        params = None if interpret else pl_triton.CompilerParams(num_warps, num_stages)

        def traced(*refs: Any) -> None:
            # A function of its own per branch (JAX caches a kernel's trace by function),
            # telling `dot` which branch it is traced for.
            token = _INTERPRETING.set(interpret)
            try:
                kernel(*refs)
            finally:
                _INTERPRETING.reset(token)

        return tuple(
            pl.pallas_call(
                traced,
                out_shape=[jax.ShapeDtypeStruct(s, d) for s, _, _, d in outputs],
                grid=grid,
                out_specs=[pl.BlockSpec(b, m) for _, b, m, _ in outputs],
                interpret=interpret,
                compiler_params=params,
                name=name,
            )(*values)
        )

    return jax.lax.platform_dependent(
        *operands,
        cpu=functools.partial(run, interpret=True),
        default=functools.partial(run, interpret=False),
    )


@contextlib.contextmanager
def lowering_for_gpu(version: str = "H100") -> Iterator[None]:
    """Lower for a GPU (`version`, a name of JAX's `GpuVersion`) on a machine without one.

    Since JAX 0.11 the Triton lowering asks `jax._src.gpu_info` for the compute capability
    of the default device, a CPU here; an abstract mesh's device would answer, but nest
    equations need devices during lowering (the C back end's callbacks), so the CPU's kind
    is mapped to `version` in that module's registry while the block runs. JAX 0.10.2 does
    not ask: nothing to do.
    """
    try:
        from jax._src import gpu_info  # type: ignore[attr-defined]  # JAX >= 0.11
    except ImportError:
        yield
        return
    kind = jax.devices()[0].device_kind
    before = gpu_info.registry.get(kind)
    target = gpu_info.GpuVersion[version]
    gpu_info.registry[kind] = lambda: gpu_info.get_gpu_info_from_version(target)
    try:
        yield
    finally:
        if before is None:
            del gpu_info.registry[kind]
        else:
            gpu_info.registry[kind] = before


@functools.cache
def _say_interpreted() -> None:
    """Say once per process that Pallas kernels run in interpret mode here."""
    _LOG.warning(
        "backend='pallas' on a machine without a GPU: Pallas kernels run in interpret mode "
        "(exact, slow); on a GPU they compile through Triton"
    )
