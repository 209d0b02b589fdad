"""The pallas runner: a nest's tile program as one Pallas kernel, inside JAX.

At trace time (shapes are static) the nest becomes a `TileProgram`
(`codegen.tiles.build.tile_program`, its tiles from the tuning table, its dots rounding as
the kernel's `precision=` says: `precision_mode`), then a kernel (`lower.kernel_function`),
called on a grid of whole output tiles (`api.call`: interpret mode on the CPU, Triton on a
GPU with the tuning row's warps and stages); the padded output is cut to the nest's. An
attention kernel (a one-pass nest, a gradient nest of attention, a pair of them:
`codegen.tiles.attention.build.attention_program`) runs as one FlashAttention-style kernel
(`attention.run_attention`); a one-pass nest of another form as its two nests. A nest the
tile builder does not handle raises an `UnsupportedError` that names it: never a fallback
that would hide it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp

from codegen.errors import Unsupported
from codegen.ir.extents import output_shape
from codegen.ir.nest import LoopNest
from codegen.passes.online import unpair
from codegen.tiles.attention.build import attention_program
from codegen.tiles.attention.partials import partial_of
from codegen.tiles.attention.program import AttentionProgram
from codegen.tiles.build import tile_program
from codegen.tiles.program import TileProgram
from tensordsl.backends import reference
from tensordsl.backends.pallas import api
from tensordsl.backends.pallas.attention import run_attention
from tensordsl.backends.pallas.lower import kernel_function
from tensordsl.errors import UnsupportedError

#: `jax_default_matmul_precision` names that are no `jax.lax.Precision` (dot algorithms),
#: as the mode nearest to them; any other algorithm name is taken as "default".
_ALGORITHM_MODES = {"F32_F32_F32": "highest", "TF32_TF32_F32_X3": "highest"}


def precision_mode(precision: Any = None) -> str:
    """The tile dots' mode (a key of `codegen.tiles.precision.MODES`) of a kernel's
    `precision=`: a `jax.lax.Precision`, or None for jnp's default, the
    `jax_default_matmul_precision` in effect now (at trace time), as `jnp.dot` reads it.

    >>> import jax
    >>> precision_mode(jax.lax.Precision.HIGHEST), precision_mode(None)
    ('highest', 'default')
    """
    if precision is None:
        configured = jax.config.jax_default_matmul_precision  # type: ignore[attr-defined]
        if configured is None:
            return "default"
        try:
            precision = jax.lax.Precision(configured)
        except ValueError:
            return _ALGORITHM_MODES.get(str(configured).upper(), "default")
    return str(jax.lax.Precision(precision).name).lower()


def nest_program(
    nest: LoopNest,
    shapes: Mapping[str, Sequence[int]],
    dtypes: Mapping[str, str],
    precision: str = "default",
) -> TileProgram:
    """The tile program of `nest`, or an `UnsupportedError` naming the nest and why."""
    frozen_shapes = tuple(sorted((n, tuple(int(d) for d in s)) for n, s in shapes.items()))
    return _program(nest, frozen_shapes, tuple(sorted(dtypes.items())), precision)


@functools.lru_cache(maxsize=1024)
def _program(nest: LoopNest, shapes: tuple, dtypes: tuple, precision: str) -> TileProgram:
    try:
        return tile_program(nest, dict(shapes), dict(dtypes), precision=precision)
    except Unsupported as error:
        raise UnsupportedError(
            f"the pallas back end cannot run '{nest.label}' ({nest}): {error.what}",
            expected=error.expected or "backend='c', 'cuda' or 'reference' for this kernel",
            hint=error.hint,
        ) from None


def nest_attention(
    nest: LoopNest,
    shapes: Mapping[str, Sequence[int]],
    dtypes: Mapping[str, str],
    precision: str = "default",
) -> AttentionProgram | None:
    """The attention tile program of `nest` for these shapes, or None."""
    frozen_shapes = tuple(sorted((n, tuple(int(d) for d in s)) for n, s in shapes.items()))
    return _attention(nest, frozen_shapes, tuple(sorted(dtypes.items())), precision)


@functools.lru_cache(maxsize=1024)
def _attention(
    nest: LoopNest, shapes: tuple, dtypes: tuple, precision: str
) -> AttentionProgram | None:
    return attention_program(nest, dict(shapes), dict(dtypes), precision=precision)


def run_pallas(
    nest: LoopNest,
    operands: Sequence[Any],
    shapes: Mapping[str, tuple[int, ...]],
    dtype: Any,
    schedule: Any = None,
    *,
    precision: Any = None,
) -> jax.Array:
    """Run `nest` as a Pallas kernel; `shapes` covers every tensor the nest names (the
    schedule is not used: tile programs choose their own tiles); its dots at `precision`
    (`precision_mode`)."""
    all_shapes = dict(shapes)
    values = []
    for op, value in zip(nest.operands, operands, strict=True):
        value = jnp.asarray(value)
        all_shapes[op.name] = tuple(value.shape)
        values.append(value.reshape((1,)) if op.is_scalar else value)
    all_shapes.setdefault(nest.output, output_shape(nest, all_shapes))
    if any(0 in tuple(all_shapes[name]) for name in (*nest.operand_names, nest.output)):
        if nest.online:  # the reference evaluates each of the two nests, not the pair
            return _two_nests(nest, operands, all_shapes, dtype, precision)
        return _empty(nest, operands, all_shapes, dtype)
    dtypes = {op.name: v.dtype.name for op, v in zip(nest.operands, values)}
    dtypes[nest.output] = jnp.dtype(dtype).name
    mode = precision_mode(precision)
    flash = nest_attention(nest, all_shapes, dtypes, mode)
    if flash is not None:
        return run_attention(flash, operands, dtype)
    if nest.online:
        return _two_nests(nest, operands, all_shapes, dtype, precision)
    program = nest_program(nest, all_shapes, dtypes, mode)
    return run_program(program, values, dtype)


def _empty(nest: LoopNest, operands: Sequence[Any], shapes: Mapping[str, Any], dtype: Any):
    """A nest with an axis of length 0 (no output tile, or a reduced range with no tile):
    there is no grid to launch (Pallas cannot gather a tile from an empty operand), and the
    result is the empty output or the reduction's identity everywhere, which the reference
    evaluator gives with jax.numpy's rules (also for positions and `mean`)."""
    values = dict(zip(nest.operand_names, operands))
    return reference.evaluate(nest, values, shapes, dtype)


def run_program(program: TileProgram, values: Sequence[jax.Array], dtype: Any) -> jax.Array:
    """Run a built tile program on its operands (scalars as one-element arrays): the
    kernel, its launch, the output cut to the nest's shape."""
    nest, row = program.nest, program.tuning
    launch = {} if row is None else {"num_warps": row.num_warps, "num_stages": row.num_stages}
    out = api.call(
        kernel_function(program, program.precision),
        values,
        grid=program.grid_shape,
        block=program.block,
        shape=program.padded_shape,
        dtype=jnp.dtype(dtype),
        name=f"tdsl_{nest.output}_tiles",
        **launch,
    )
    if not program.grid:
        return out.reshape(())
    return out[tuple(slice(0, a.extent) for a in program.grid)]


def _two_nests(
    nest: LoopNest, operands: Sequence[Any], shapes: Mapping[str, Any], dtype: Any, precision: Any
) -> jax.Array:
    """A one-pass nest that is not an attention kernel, as its two nests (packed)."""
    lse, weighted = unpair(nest)
    values = dict(zip(nest.operand_names, operands))
    known = dict(shapes)
    known.pop(nest.output, None)
    found = run_pallas(
        lse, [values[n] for n in lse.operand_names], known, dtype, precision=precision
    )
    values[lse.output], known[lse.output] = found, tuple(found.shape)
    out = run_pallas(
        weighted, [values[n] for n in weighted.operand_names], known, dtype, precision=precision
    )
    return jnp.concatenate([out, jnp.expand_dims(found, -1).astype(out.dtype)], axis=-1)


def run_partials(
    nest: LoopNest,
    extras: Sequence[LoopNest],
    values: Mapping[str, Any],
    shapes: Mapping[str, tuple[int, ...]],
    dtype: Any,
    *,
    precision: Any = None,
) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    """The packed gradients of the pair `nest` and the gradients `extras` (score parameters)
    from one attention kernel. `values`: every operand's array by name."""
    known = {n: tuple(s) for n, s in shapes.items()}
    known.update({n: tuple(jnp.shape(v)) for n, v in values.items()})
    known.setdefault(nest.output, output_shape(nest, known))
    dtypes = {n: jnp.asarray(values[n]).dtype.name for n in nest.operand_names}
    dtypes[nest.output] = jnp.dtype(dtype).name
    program = nest_attention(nest, known, dtypes, precision_mode(precision))
    assert program is not None, "a pair with partials is an attention kernel"
    partials = tuple(partial_of(program, extra, known) for extra in extras)
    assert all(p is not None for p in partials), "the pairing matched every extra"
    program = replace(program, partials=partials)
    more = {
        n: values[n] for extra in extras for n in extra.operand_names if n not in nest.operand_names
    }
    operands = [values[n] for n in nest.operand_names]
    out, found = run_attention(program, operands, dtype, more)
    return out, tuple(f.astype(dtype) for f in found)
