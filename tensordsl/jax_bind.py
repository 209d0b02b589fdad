"""Loop nests as differentiable JAX functions.

`call_nest` runs one nest on a back end inside a `jax.custom_vjp`: the forward runs the
nest (and, when some input is perturbed, the auxiliary nests its gradients need); the
backward runs the gradient nest of each perturbed input, each itself through `call_nest`,
so gradients can be differentiated again (reverse over reverse).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from codegen.ir import LoopNest
from tensordsl import grad, reference

Shapes = Mapping[str, tuple[int, ...]]
#: A runner executes a nest without differentiation:
#: (nest, operands, shapes, out dtype, schedule or None).
Runner = Callable[[LoopNest, Sequence[jax.Array], Shapes, Any, Any], jax.Array]


def run_reference(
    nest: LoopNest, operands: Sequence[jax.Array], shapes: Shapes, dtype: Any, schedule: Any = None
) -> jax.Array:
    """The reference back end as a runner."""
    return reference.evaluate(nest, dict(zip(nest.operand_names, operands)), shapes, dtype)


def _run_c(
    nest: LoopNest, operands: Sequence[jax.Array], shapes: Shapes, dtype: Any, schedule: Any = None
) -> jax.Array:
    from tensordsl.cpu import run_c

    return run_c(nest, operands, shapes, dtype, schedule)


def _run_cuda(
    nest: LoopNest, operands: Sequence[jax.Array], shapes: Shapes, dtype: Any, schedule: Any = None
) -> jax.Array:
    from tensordsl.gpu import run_cuda

    return run_cuda(nest, operands, shapes, dtype, schedule=schedule)


RUNNERS: dict[str, Runner] = {"reference": run_reference, "c": _run_c, "cuda": _run_cuda}


def is_differentiable(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.inexact))


def _frozen(shapes: Shapes) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple(sorted((name, tuple(int(n) for n in shape)) for name, shape in shapes.items()))


def call_nest(
    nest: LoopNest,
    operands: Sequence[Any],
    *,
    backend: str,
    shapes: Shapes,
    out_dtype: Any,
    nograd: frozenset[str] = frozenset(),
    schedule: Any = None,
) -> jax.Array:
    """Run `nest` on `operands` (in `nest.operands` order) as a differentiable function.

    Args:
        nest: the loop nest.
        operands: one array per operand.
        backend: a key of `RUNNERS`.
        shapes: shapes of the tensors the nest names that are not operands (a gradient
            nest's own output, forward tensors whose extents bound its loops).
        out_dtype: the output dtype.
        nograd: operands that get no gradient (integer operands never do).
        schedule: the schedule of this nest on a compiled back end (its gradient nests use
            the heuristic's).

    Returns:
        The output array.
    """
    operands = tuple(operands)
    all_shapes = dict(shapes)
    for op, value in zip(nest.operands, operands):
        all_shapes[op.name] = tuple(np.shape(value))
    needed = nest.extent_tensors() | set(nest.operand_names)
    key_shapes = _frozen({n: s for n, s in all_shapes.items() if n in needed})
    dtypes = tuple(jnp.dtype(jnp.result_type(v)).name for v in operands)
    function = _differentiable(
        nest, backend, key_shapes, jnp.dtype(out_dtype).name, dtypes, nograd, schedule
    )
    return function(*operands)


@functools.lru_cache(maxsize=4096)
def _differentiable(
    nest: LoopNest,
    backend: str,
    shapes: tuple,
    out_dtype: str,
    dtypes: tuple[str, ...],
    nograd: frozenset[str],
    schedule: Any,
) -> Callable[..., jax.Array]:
    runner = RUNNERS[backend]
    shape_map = dict(shapes)
    wants_gradient = tuple(
        is_differentiable(dtype) and op.name not in nograd
        for op, dtype in zip(nest.operands, dtypes)
    )

    @jax.custom_vjp
    def function(*operands: jax.Array) -> jax.Array:
        return runner(nest, operands, shape_map, out_dtype, schedule)

    def forward(*primals: Any) -> tuple[jax.Array, Any]:
        values = tuple(p.value for p in primals)
        output = function(*values)
        perturbed = tuple(p.perturbed and w for p, w in zip(primals, wants_gradient))
        auxiliary = {}
        if any(perturbed):
            auxiliary = _auxiliaries(nest, values, backend, shape_map, out_dtype)
        # Which inputs need a gradient is static: encode it in the pytree structure.
        marks = tuple(() if p else None for p in perturbed)
        return output, (values, output, auxiliary, marks)

    def backward(residuals: Any, cotangent: Any) -> tuple[Any, ...]:
        values, output, auxiliary, marks = residuals
        if isinstance(cotangent, jax.custom_derivatives.SymbolicZero):
            return tuple(None for _ in values)
        by_role = dict(auxiliary)
        by_role[grad.COTANGENT] = cotangent
        by_role[grad.OUTPUT] = output
        gradients: list[jax.Array | None] = []
        for op, value, mark in zip(nest.operands, values, marks):
            if mark is None:
                gradients.append(None)
                continue
            gradients.append(
                _gradient(
                    nest,
                    op.name,
                    values,
                    by_role,
                    backend,
                    shape_map,
                    tuple(np.shape(output)),
                    value,
                )
            )
        return tuple(gradients)

    function.defvjp(forward, backward, symbolic_zeros=True)
    return function


def _auxiliaries(
    nest: LoopNest, values: tuple, backend: str, shapes: Shapes, out_dtype: str
) -> dict[str, jax.Array]:
    """Run the nests that the gradients of a max/min/prod reduction need."""
    found = {}
    for role, aux in grad.auxiliary_nests(nest).items():
        if aux.reduction in ("argmax", "argmin"):
            # An integer position has no derivative: cut its inputs out of differentiation.
            constants = [jax.lax.stop_gradient(v) for v in values]
            found[role] = RUNNERS[backend](aux, constants, shapes, "int32", None)
        else:
            found[role] = call_nest(
                aux, values, backend=backend, shapes=shapes, out_dtype=out_dtype
            )
    return found


def _gradient(
    nest: LoopNest,
    wrt: str,
    values: tuple,
    by_role: dict,
    backend: str,
    shapes: Shapes,
    output_shape: tuple[int, ...],
    value: jax.Array,
) -> jax.Array:
    """Run the gradient nest of operand `wrt`."""
    gradient = grad.gradient(nest, wrt)
    names = dict(zip(nest.operand_names, values))
    operands = []
    for name, role in gradient.roles:
        operands.append(names[name] if role == "input" else by_role[role])
    cotangent_name = next(n for n, r in gradient.roles if r == grad.COTANGENT)
    g_shapes = dict(shapes)
    g_shapes[nest.output] = output_shape
    g_shapes[cotangent_name] = output_shape
    g_shapes[gradient.nest.output] = tuple(np.shape(value))
    for op, v in zip(nest.operands, values):
        g_shapes[op.name] = tuple(np.shape(v))
    integer = frozenset(
        name
        for name, v in zip(gradient.nest.operand_names, operands)
        if not is_differentiable(jnp.result_type(v))
    )
    result = call_nest(
        gradient.nest,
        operands,
        backend=backend,
        shapes={n: s for n, s in g_shapes.items() if n in gradient.nest.extent_tensors()},
        out_dtype=jnp.result_type(value),
        nograd=integer,
    )
    return result
