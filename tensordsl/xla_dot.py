"""The ``"xla"`` strategy: a pure contraction run as XLA's dot (`jnp.einsum`), no kernel.

`codegen.contraction` decides which nests are pure contractions; the schedules pick the
strategy; the CPU and GPU runners call `run_contraction` for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from codegen.contraction import contraction, fits
from codegen.ir import LoopNest


def run_contraction(
    nest: LoopNest,
    operands: Sequence[jax.Array],
    shapes: Mapping[str, tuple[int, ...]],
    dtype: Any,
) -> jax.Array | None:
    """`nest` computed by `jnp.einsum`, or None when it is no pure contraction for these shapes
    (an index whose range is not the whole of every axis it indexes)."""
    plan = contraction(nest)
    all_shapes = dict(shapes)
    all_shapes.update({op.name: tuple(v.shape) for op, v in zip(nest.operands, operands)})
    if plan is None or not fits(nest, all_shapes):
        return None
    out_dtype = jnp.dtype(dtype)
    # Half-precision products accumulate in float32, as the kernels do.
    wide = jnp.float32 if out_dtype.itemsize < 4 else None
    result = jnp.einsum(
        plan.subscripts,
        *(operands[p] for p in plan.tensors),
        precision=jax.lax.Precision.HIGHEST,
        preferred_element_type=wide,
    )
    for p in plan.scalars:
        result = result * operands[p]
    if plan.constant != 1.0:
        result = result * plan.constant
    return result.astype(out_dtype)
