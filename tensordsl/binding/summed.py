"""A stored intermediate's gradient as the sum of an input's part (`codegen.passes.spread`).

In a statement that reads an input at every one of its indices and a stored intermediate at
some of them, only in a fixed combination (Sinkhorn's `-A[i] - C[i,j]/eps`), the input's part
of the gradient is an elementwise nest; the intermediate's gradient from that statement is
that part summed over the other indices, times a ratio of scalar operands. The backward runs
the part alone and sums it (`tensordsl.binding.program_grad`), so the statement's weights are
computed once, not in two gradient nests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from typing import Any

import jax.numpy as jnp
import numpy as np

from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol, tensor_base
from codegen.passes.spread import Spread, spread
from tensordsl.binding.primitive import is_differentiable


def find(
    nest: LoopNest,
    values: Mapping[str, Any],
    stored: Set[str],
    readers: Mapping[str, int],
    wanted: Set[str],
) -> tuple[str, str, Spread] | None:
    """(an input, a stored intermediate, how the intermediate's gradient is the input's part
    summed) for `nest`, or None. Both differentiable and `wanted` (their gradients needed);
    the intermediate read by this statement alone (its gradient comes from here only)."""
    names = [
        n
        for n in nest.operand_names
        if n in wanted and is_differentiable(jnp.result_type(values[n]))
    ]
    for wrt in (n for n in names if n not in stored):
        for partner in (n for n in names if n in stored and readers[n] == 1):
            how = spread(nest, wrt, partner)
            if how is None:
                continue
            kept = [n for k, n in enumerate(np.shape(values[wrt])) if k not in how.summed]
            if tuple(kept[k] for k in how.order) == np.shape(values[partner]):
                return wrt, partner, how
    return None


def partner_gradient(
    part: Any, found: tuple[str, str, Spread], values: Mapping[str, Any], run: Callable[..., Any]
) -> Any:
    """The gradient of `find`'s intermediate from its input's `part` (the input's shape): the
    ratio times `part` summed over `how.summed`, in the intermediate's order: a nest that
    `run(nest, values, shapes, like)` runs on the program's back end (in C, a vectorised sum
    over the matrix, cheaper than XLA's reduce of it)."""
    _, partner, how = found
    indices = [index_symbol(f"x{k}") for k in range(np.ndim(part))]
    every = [Range(x, 0, extent_symbol(_PART, k)) for k, x in enumerate(indices)]
    kept = [r for k, r in enumerate(every) if k not in how.summed]
    scalars = sorted(s.name for s in how.ratio.free_symbols)
    body = how.ratio * tensor_base(_PART)[tuple(indices)]
    term = Term(body, tuple(every[k] for k in how.summed))
    ops = (Operand(_PART, np.ndim(part)), *(Operand(n, 0) for n in scalars))
    nest = LoopNest(_GRADIENT, tuple(kept[k] for k in how.order), (term,), ops)
    like = values[partner]
    named = {_PART: part, **{n: values[n] for n in scalars}}
    return run(nest, named, {_GRADIENT: np.shape(like)}, like)


#: Names of the summed part and the gradient in the nest that sums it.
_PART, _GRADIENT = "part", "summed"
