"""A two-operand einsum as the `jax.lax.dot_general` that `jnp.einsum` would emit, without
`jnp.einsum`'s cost at trace time.

`jnp.einsum` searches a contraction path (opt_einsum) and traces an inner `jit` on every call;
for the few hundred dots of a model's first `jit(value_and_grad)` that is a visible part of
the lowering. The strategy ``"xla"`` (`tensordsl.backends.xla_dot`) knows its subscripts
already, and most of them are one product of two operands over distinct axes, for which
`jnp.einsum`'s path is fixed: the operands are swapped (opt_einsum contracts right to left),
then the dot is taken in whichever order gives the output's axes without a transposition,
else the second operand first, then transposed. `einsum_dot` emits that same `dot_general`
and transposition, so XLA sees the same program, from a plan worked out once per subscripts
and shapes (`dot_plan`). Everything else (a letter twice in one operand, one summed within its
operand, an axis of 1 against a longer one, a weakly typed operand) goes to `jnp.einsum`.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

_Pair = tuple[tuple[int, ...], tuple[int, ...]]


class DotPlan(NamedTuple):
    """A two-operand einsum as one `dot_general`: operands taken in `order`, the dimension
    numbers `dimensions`, then the result transposed by `permutation` (None: as it is)."""

    order: tuple[int, int]
    dimensions: tuple[_Pair, _Pair]  # (contracting, batch), each (lhs axes, rhs axes)
    permutation: tuple[int, ...] | None


@functools.lru_cache(maxsize=4096)
def dot_plan(subscripts: str, shapes: tuple[tuple[int, ...], ...]) -> DotPlan | None:
    """The `dot_general` that `jnp.einsum(subscripts, a, b)` emits for operands of `shapes`,
    or None where the einsum is not one product of two operands over distinct axes of equal
    extents (`jnp.einsum` then runs it).

    Args:
        subscripts: an explicit einsum, e.g. ``"hij,hjk->hik"``.
        shapes: the operands' shapes.

    Returns:
        The plan, or None.

    >>> dot_plan("hij,hjk->hik", ((2, 3, 4), (2, 4, 5)))
    DotPlan(order=(0, 1), dimensions=(((2,), (1,)), ((0,), (0,))), permutation=None)
    >>> dot_plan("ij,kj->ki", ((2, 3), (4, 3)))
    DotPlan(order=(1, 0), dimensions=(((1,), (1,)), ((), ())), permutation=None)
    >>> dot_plan("ii,ij->j", ((2, 2), (2, 3))) is None
    True
    """
    if "->" not in subscripts or "." in subscripts:
        return None
    inputs, out = subscripts.split("->")
    parts = inputs.split(",")
    if len(parts) != 2 or len(shapes) != 2 or any(len(p) != len(s) for p, s in zip(parts, shapes)):
        return None
    first, second = parts
    if any(len(set(p)) != len(p) for p in (first, second, out)):
        return None
    if any(letter not in out + other for p, other in zip(parts, parts[::-1]) for letter in p):
        return None  # a letter summed within one operand
    if any(letter not in first + second for letter in out):
        return None
    sizes = [dict(zip(p, s)) for p, s in zip(parts, shapes)]
    if any(sizes[1][letter] != n for letter, n in sizes[0].items() if letter in sizes[1]):
        return None  # an axis of 1 against a longer one: jnp.einsum squeezes it
    contracted = sorted(letter for letter in first if letter in second and letter not in out)
    batch = [letter for letter in out if letter in first and letter in second]
    dropped = set(batch) | set(contracted)
    free = ["".join(letter for letter in p if letter not in dropped) for p in parts]
    names = "".join(batch) + free[0] + free[1]
    order = (0, 1)
    if names != out:
        names, order = "".join(batch) + free[1] + free[0], (1, 0)
    lhs, rhs = (parts[n] for n in order)
    contracting = (tuple(map(lhs.index, contracted)), tuple(map(rhs.index, contracted)))
    batching = (tuple(map(lhs.index, batch)), tuple(map(rhs.index, batch)))
    permutation = None if names == out else tuple(names.index(letter) for letter in out)
    return DotPlan(order, (contracting, batching), permutation)


def einsum_dot(
    subscripts: str,
    tensors: Sequence[jax.Array],
    *,
    precision: Any = None,
    preferred_element_type: Any = None,
) -> jax.Array:
    """`jnp.einsum(subscripts, *tensors, precision=..., preferred_element_type=...)`, as one
    `jax.lax.dot_general` where `dot_plan` has a plan for it (the same program)."""
    plan = None
    if len(tensors) == 2 and not any(_weak(t) for t in tensors):
        plan = dot_plan(subscripts, tuple(tuple(jnp.shape(t)) for t in tensors))
    if plan is None:
        return jnp.einsum(
            subscripts, *tensors, precision=precision, preferred_element_type=preferred_element_type
        )
    wanted = preferred_element_type
    if wanted is None:
        wanted = jnp.result_type(*tensors)
    lhs, rhs = (tensors[n] for n in plan.order)
    found = jax.lax.dot_general(
        lhs, rhs, plan.dimensions, precision, preferred_element_type=jnp.dtype(wanted)
    )
    return found if plan.permutation is None else jax.lax.transpose(found, plan.permutation)


def _weak(tensor: Any) -> bool:
    """Whether `tensor` is weakly typed (a Python scalar's array), or not an array at all."""
    try:
        return bool(jax.typeof(tensor).weak_type)
    except TypeError:
        return True
