"""The few private JAX internals tensordsl relies on, in one place (checked on jax 0.10.2).

A primitive needs an abstract evaluation that carries shardings and, inside `shard_map`,
the varying manual axes of its inputs; JAX's own `standard_primitive` builds exactly that.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import jax
from jax._src import core, dispatch
from jax._src.interpreters import ad, batching
from jax._src.interpreters import partial_eval as pe
from jax._src.lax import utils as lax_utils
from jax.extend.core import Primitive


def primitive(
    name: str, shape_rule: Callable, dtype_rule: Callable, sharding_rule: Callable
) -> Any:
    """A primitive with JAX's standard abstract evaluation and `apply_primitive` as its impl.

    `sharding_rule` gives the output's sharding for explicitly sharded operand types.
    """
    return lax_utils.standard_primitive(
        shape_rule,
        dtype_rule,
        name,
        sharding_rule=sharding_rule,
        vma_rule=partial(core.standard_vma_rule, name),
    )


def multiple_results_primitive(name: str, abstract_eval: Callable) -> Any:
    """A primitive of several results with `apply_primitive` as its impl (jit of itself)."""
    found = Primitive(name)
    found.multiple_results = True
    found.def_impl(partial(dispatch.apply_primitive, found))
    found.def_abstract_eval(abstract_eval)
    return found


def without_dead_code(jaxpr: Any) -> Any:
    """`jaxpr` without the equations that no output depends on (JAX's own dead-code
    elimination, through nested `jit`s)."""
    return pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))[0]


def used_inputs(jaxpr: Any, used_outputs: Sequence[bool]) -> list[bool]:
    """Which inputs of `jaxpr` the outputs marked in `used_outputs` depend on."""
    return pe.dce_jaxpr(jaxpr, list(used_outputs))[1]


def is_variable(atom: Any) -> bool:
    """Whether an equation's argument is a variable (not a literal)."""
    return isinstance(atom, core.Var)


def shaped_like(model: Any, shape: tuple[int, ...], dtype: Any) -> Any:
    """An abstract array of this shape and dtype, replicated on `model`'s mesh and varying
    over its manual axes."""
    sharding = jax.sharding.NamedSharding(model.sharding.mesh, jax.sharding.PartitionSpec())
    return core.ShapedArray(shape, dtype, sharding=sharding, manual_axis_type=model.mat)


def requires_devices_during_lowering(primitive: Any) -> None:
    """Lowering `primitive` gets the device assignment (custom_partitioning inside it needs it)."""
    dispatch.prim_requires_devices_during_lowering.add(primitive)


def _varying(value: Any) -> frozenset:
    return jax.typeof(value).mat.varying


def same_varying_axes(values: Sequence[Any]) -> list[Any]:
    """Cast values to the union of their varying manual axes (a no-op outside shard_map).

    A primitive's inputs must vary over the same mesh axes; its output then varies over them
    too, which is what lets shard_map check `out_specs` and transpose the cast with a psum.
    """
    values = list(values)
    axes = [_varying(v) for v in values]
    union = frozenset().union(*axes)
    if not union:
        return values
    return [
        v if a == union else jax.lax.pcast(v, tuple(sorted(union - a)), to="varying")
        for v, a in zip(values, axes)
    ]


def derivative_order(values: Sequence[Any]) -> int:
    """How many differentiations (`jvp`, `grad`, `linearize`, nested) are tracing `values`
    now: the most forward-mode and linearize tracers with a nonzero tangent wrapped around
    one value, through `vmap`'s tracers (`jax.hessian`). 2 for `jax.jvp` of `jax.grad`."""
    deepest = 0
    for value in values:
        found = 0
        while isinstance(value, core.Tracer):
            if isinstance(value, (ad.JVPTracer, ad.LinearizeTracer)):
                found += type(value.tangent) is not ad.Zero
                value = value.primal
            elif isinstance(value, batching.BatchTracer):
                value = value.val
            else:
                break
        deepest = max(deepest, found)
    return deepest
