"""An input's gradient as a stored intermediate's cotangent summed onto its elements
(`codegen.passes.mirror.summed_through`).

A relative-bias table read beside the stored scores in every statement that reads them
(`s_[b,h,i,j] + R[h, i - j + T - 1]` in the logsumexp and in the weighted sum) has as
gradient the scores' cotangent `dS`, summed onto the table's elements: `dR[h, p] = sum_b,j
dS[b, h, j + p - T + 1, j]`. The backward computes `dS` anyway (one nest for all the
scores' readers, `tensordsl.binding.program_grad`), so the table's gradient is a pass over
it, not a gradient nest that recomputes every score, weight and `dO . v` once more. Every
element of the table's gradient is written once, by the thread of its element (no atomics).
ALiBi's learnt slopes (`s_[b,h,i,j] + A[h] * (j - i)`) likewise: `dA[h] = sum dS * (j - i)`,
as per-row partial sums summed by XLA (`codegen.passes.partials`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from typing import Any

import jax.numpy as jnp
import numpy as np

from codegen.ir.nest import LoopNest
from codegen.passes import grad, gradient_rules
from codegen.passes.mirror import Through, summed_through, through_nest
from codegen.passes.partials import row_partials
from tensordsl.binding.primitive import is_differentiable


def find(
    nest: LoopNest,
    wrt: str,
    stored: Sequence[LoopNest],
    values: Mapping[str, Any],
    wanted: Set[str],
) -> tuple[str, Through] | None:
    """(a stored intermediate that `nest` reads and several stored statements read, each
    only beside `wrt` as `summed_through` says, how), or None. Both differentiable and
    `wanted` (their gradients needed), `wrt` an input; then every reader's part of `wrt`'s
    gradient is in the intermediate's cotangent, and none is run on its own."""
    outputs = {each.output for each in stored}
    if wrt in outputs or not _wanted(wrt, values, wanted):
        return None
    for name in sorted(nest.operand_names):
        readers = [each for each in stored if name in each.operand_names]
        if name not in outputs or len(readers) < 2 or not _wanted(name, values, wanted):
            continue
        through = summed_through(readers, wrt, name)
        if through is not None:
            return name, through
    return None


def _wanted(name: str, values: Mapping[str, Any], wanted: Set[str]) -> bool:
    return name in wanted and is_differentiable(jnp.result_type(values[name]))


def gradient(
    wrt: str,
    partner: str,
    through: Through,
    cotangent: Any,
    values: Mapping[str, Any],
    call: Callable[..., Any],
) -> Any:
    """`wrt`'s gradient from the intermediate `partner`'s `cotangent`: the gradient nest of
    `through_nest` (a sum over the intermediate's axes that `wrt`'s element does not fix),
    run by `call(nest, values, shapes, like)`."""
    like = values[wrt]
    nest = through_nest(partner, np.ndim(values[partner]), wrt, np.ndim(like), through)
    found = grad.gradient(nest, wrt)
    named = {
        name: cotangent if role == gradient_rules.COTANGENT else values[name]
        for name, role in found.roles
    }
    shapes = {name: tuple(np.shape(v)) for name, v in (*values.items(), *named.items())}
    shapes[found.nest.output] = tuple(np.shape(like))
    # A few elements, each a sum over every pair (ALiBi's slopes): per-row partial sums,
    # summed by XLA in a fixed order, in parallel and rounded as jax.numpy's sum.
    rows = row_partials(found.nest, shapes)
    if rows is None:
        return call(found.nest, named, shapes, like)
    partial = call(rows.nest, named, shapes, like)
    return jnp.sum(partial, axis=rows.summed, dtype=jnp.result_type(like))
