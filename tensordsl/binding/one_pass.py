"""A one-pass nest (`codegen.passes.online`: a logsumexp and the softmax-weighted sum that reads it)
run as the two nests it stands for, where no one-pass kernel runs it: the reference back end,
a packed axis longer than a back end's `one_pass_rows` (C: `codegen.c.attention.online`, CUDA:
`codegen.cuda.attention.online`), differentiation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from codegen.ir.nest import LoopNest
from codegen.passes.online import unpair, weights_total

#: Runs one nest: (nest, operands, shapes of every tensor it names) -> its output.
Run = Callable[[LoopNest, Sequence[Any], Mapping[str, tuple[int, ...]]], Any]


def two_nests(
    nest: LoopNest, operands: Sequence[Any], shapes: Mapping[str, tuple[int, ...]], run: Run
) -> tuple[Any, Any]:
    """The weighted sum and the logsumexp of the one-pass `nest`, each nest run by `run`; the
    weighted sum divided by its weights' sum (`codegen.passes.online.weights_total`: 1 but
    for the logsumexp's rounding) where that is positive, normalised as the one-pass
    kernels normalise it (a row that keeps no key stays 0)."""
    lse, weighted = unpair(nest)
    values = dict(zip(nest.operand_names, operands))
    known = dict(shapes)
    found = run(lse, [values[name] for name in lse.operand_names], known)
    values[lse.output], known[lse.output] = found, tuple(np.shape(found))
    out = run(weighted, [values[name] for name in weighted.operand_names], known)
    sums = weights_total(nest)
    total = run(sums, [values[name] for name in sums.operand_names], known)
    total = jnp.expand_dims(jnp.asarray(total, jnp.result_type(out)), -1)
    return jnp.where(total > 0, out / jnp.where(total > 0, total, 1), out), found


def pack(weighted: Any, lse: Any) -> jax.Array:
    """The packed output of a one-pass nest: the weighted sum, then the logsumexp, along the
    last axis."""
    return jnp.concatenate([weighted, jnp.expand_dims(lse, -1).astype(weighted.dtype)], axis=-1)


def unpack(packed: Any) -> tuple[jax.Array, jax.Array]:
    """The weighted sum and the logsumexp of a packed output."""
    return packed[..., :-1], packed[..., -1]
