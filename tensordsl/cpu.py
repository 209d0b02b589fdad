"""The C back end inside JAX: compiled nests called through `buffer_callback`.

The nest is compiled at trace time (the first call for a dtype combination); the callback
passes XLA's buffers to the compiled function in place: inputs are read where they are,
the output is written fully, nothing is copied.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

from codegen import config
from codegen.build import build_c
from codegen.ir import LoopNest
from codegen.schedule import Schedule
from tensordsl import reference


def run_c(
    nest: LoopNest,
    operands: Sequence[jax.Array],
    shapes: Mapping[str, tuple[int, ...]],
    dtype: Any,
    schedule: Schedule | None = None,
) -> jax.Array:
    """Run `nest` with compiled C on the CPU; `shapes` covers every tensor the nest names."""
    dtypes = {op.name: jnp.dtype(jnp.result_type(v)).name for op, v in zip(nest.operands, operands)}
    dtypes[nest.output] = jnp.dtype(dtype).name
    compiled = build_c(nest, dtypes=dtypes, schedule=schedule)
    out_shape = reference.output_shape(nest, shapes)
    extents = {name: shape for name, shape in shapes.items() if name not in dtypes}

    poison = config.poison_outputs()

    def callback(ctx: Any, out: Any, *args: Any) -> None:
        target = np.asarray(out)
        if poison:
            target.fill(np.nan if np.issubdtype(target.dtype, np.inexact) else -1)
        compiled(target, [np.asarray(a) for a in args], extents)

    call = buffer_callback(
        callback, jax.ShapeDtypeStruct(out_shape, jnp.dtype(dtype)), vmap_method="sequential"
    )
    return call(*operands)
