"""Gradient nests run two at a time as one kernel with two outputs, on a back end whose
record pairs them (`Backend.pairs_gradients`: CUDA's `codegen.cuda.attention.paired`, attention's dK
and dV in one weighted kernel). The pair is a `nest_p` call like any other (batched,
jitted, differentiated again as one); its packed columns are sliced back into the two
gradients. A pair whose kernel also computes the gradients of score parameters
(`Pair.extras`, the pallas back end's per-tile partial sums) runs as one `partials_p` call
(`tensordsl.binding.partials`), returning those gradients too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp

from codegen import config
from codegen.ir.nest import LoopNest
from tensordsl.backends import table
from tensordsl.binding.partials import call_partials


def integer_operands(nest: LoopNest, operands: Sequence[Any]) -> frozenset[str]:
    """The operands of `nest` that hold no floats (index arrays): no gradient flows to them."""
    return frozenset(
        name
        for name, v in zip(nest.operand_names, operands, strict=True)
        if not jnp.issubdtype(jnp.result_type(v), jnp.inexact)
    )


def run_pairs(
    nests: dict[str, LoopNest],
    values: dict[str, Any],
    dtypes: dict[str, str],
    shapes: dict[str, tuple[int, ...]],
    backend: str,
    precision: Any,
    call_nest: Any,
) -> dict[str, jax.Array]:
    """The gradients of the `nests` (by output) that pair, by output; the others are left
    out (their caller runs them). `values`: every operand's array by name; `dtypes`: each
    output's dtype (only nests of one dtype pair)."""
    record = table.backend(backend)
    if record.pairs_gradients is None or not config.pair_gradients() or len(nests) < 2:
        return {}
    pairs = record.pairs_gradients()
    by_dtype: dict[str, dict[str, LoopNest]] = {}
    for output, nest in nests.items():
        by_dtype.setdefault(dtypes[output], {})[output] = nest
    found: dict[str, jax.Array] = {}
    for dtype, alike in by_dtype.items():
        for pair in pairs(alike, shapes, dtype):
            operands = [values[name] for name in pair.nest.operand_names]
            if pair.extras and record.runs_partials is not None:
                packed, extras = call_partials(
                    pair,
                    values,
                    shapes,
                    backend=backend,
                    dtype=dtype,
                    precision=precision,
                    nograd=frozenset(
                        n
                        for x in (pair.nest, *pair.extras)
                        for n in integer_operands(x, [values[m] for m in x.operand_names])
                    ),
                    call_nest=call_nest,
                )
                found.update((extra.output, g) for extra, g in zip(pair.extras, extras))
            else:
                packed = call_nest(
                    pair.nest,
                    operands,
                    backend=backend,
                    shapes=shapes,
                    out_dtype=dtype,
                    nograd=integer_operands(pair.nest, operands),
                    precision=precision,
                )
            first, second = pair.outputs
            found[first], found[second] = packed[..., : pair.split], packed[..., pair.split :]
    return found
