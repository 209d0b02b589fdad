"""Loop nests as JAX primitives.

`call_nest` binds `nest_p`, a primitive whose parameters are the nest and how to run it:

* lowering: the back end's runner (compiled C through a host callback, CUDA, or the jnp
  reference), traced into the primitive's lowering, so it works under `jit`;
* batching (`vmap`): the nest is rewritten with a batch index (`codegen.passes.batch`) and one
  kernel runs over the whole batch, for any `in_axes`, nested vmaps included;
* differentiation: the JVP rule returns the output and a `tangent_p` term, linear in the
  perturbed inputs' tangents; its transpose runs the gradient nest of each perturbed input,
  each itself through `nest_p`, so gradients can be differentiated, batched and jitted again.
  `grad` of a vmapped kernel differentiates the batched nest, whose gradient nests reduce
  unbatched inputs' cotangents over the batch inside the nest.
  Forward mode (`jvp`, `jacfwd`, `hessian`) evaluates the tangent term: `tangent_p` is
  lowered, batched and differentiated as its tangent nest (`codegen.passes.jvp`) through
  `nest_p`, so only its transpose is its own.
* inside `shard_map`, operands are cast to the same varying manual axes before binding, so the
  output carries the varying type and `out_specs` are checked.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from codegen.emit.select import selection_count
from codegen.ir.extents import output_shape
from codegen.ir.nest import LoopNest
from codegen.ir.reductions import POSITION_DTYPE, REDUCTIONS
from codegen.passes import grad, gradient_rules, jvp
from codegen.passes.batch import batch_nest
from codegen.recursion import deeply
from tensordsl.backends import table
from tensordsl.binding import grouped, partitioning, private_jax
from tensordsl.binding import one_pass as online
from tensordsl.errors import TensorDSLError, UnsupportedError, check_settings, user_facing

Shapes = Mapping[str, tuple[int, ...]]


def is_differentiable(dtype: Any) -> bool:
    return bool(jnp.issubdtype(dtype, jnp.inexact))


def output_dtype(nest: LoopNest, operands: Sequence[Any]) -> Any:
    """A nest's output dtype: `POSITION_DTYPE` for argmax/argmin (no gradient), else the
    operands' result type, a float where every operand is an integer."""
    if REDUCTIONS[nest.reduction].positional:
        return jnp.dtype(POSITION_DTYPE)
    dtype = jnp.result_type(*operands) if operands else jnp.result_type(float)
    return dtype if jnp.issubdtype(dtype, jnp.inexact) else jnp.result_type(float)


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
    precision: Any = None,
) -> jax.Array:
    """Run `nest` on `operands` (in `nest.operands` order) as a differentiable function.

    Args:
        nest: the loop nest.
        operands: one array per operand.
        backend: a key of `table.BACKENDS`.
        shapes: shapes of the tensors the nest names that are not operands (a gradient
            nest's own output, forward tensors whose extents bound its loops).
        out_dtype: the output dtype.
        nograd: operands that get no gradient (integer operands never do).
        schedule: the schedule of this nest on a compiled back end (its gradient nests use
            the heuristic's).
        precision: of the contractions given to XLA's dot, None (jnp's default) or a
            `jax.lax.Precision`; its gradient nests get the same.

    Returns:
        The output array.
    """
    check_settings()  # a bad TENSORDSL_* value fails here, not inside JAX's lowering
    if REDUCTIONS[nest.reduction].selects and table.backend(backend).emits_code:
        with user_facing():  # a compiled back end keeps at most MAX_SELECTION slots
            selection_count(nest)
    params = _params(nest, shapes, backend, out_dtype, nograd, schedule, precision)
    if not operands:
        # JAX's abstract evaluation needs an operand; with none there is nothing to batch or
        # differentiate, so the runner is traced as is.
        del params["nograd"]
        return partitioning.run_nest(**params)
    return _bind(nest_p, operands, **params)


def _params(
    nest: LoopNest,
    shapes: Shapes,
    backend: str,
    out_dtype: Any,
    nograd: frozenset[str],
    schedule: Any,
    precision: Any = None,
) -> dict[str, Any]:
    """`nest_p`'s parameters (see `call_nest`)."""
    operand_names = set(nest.operand_names)
    extents = _frozen(
        {n: s for n, s in shapes.items() if n in nest.extent_tensors() and n not in operand_names}
    )
    return {
        "nest": nest,
        "backend": backend,
        "extents": extents,
        "out_dtype": jnp.dtype(out_dtype).name,
        "nograd": frozenset(nograd),
        "schedule": schedule,
        "precision": precision,
    }


def _bind(primitive: Any, operands: Sequence[Any], **params: Any) -> jax.Array:
    return primitive.bind(*private_jax.same_varying_axes(operands), **params)


def _output_shape(*operands: Any, nest: LoopNest, extents: tuple, **_: Any) -> tuple[int, ...]:
    n = len(nest.operands)
    return output_shape(nest, partitioning.tensor_shapes(nest, operands[:n], extents))


def _output_dtype(*operands: Any, out_dtype: str, **_: Any) -> Any:
    return jnp.dtype(out_dtype)


def _nest_output_shape(*operands: Any, **params: Any) -> tuple[int, ...]:
    # Every nest_p equation of a traced function is evaluated abstractly here, before any is
    # lowered: its kernel starts building now, in the background, in parallel with the rest.
    dtypes = [op.dtype for op in operands]
    p = params
    prefetch = table.BACKENDS[p["backend"]].prefetch
    if prefetch is not None:
        prefetch(p["nest"], dtypes, p["out_dtype"], p["schedule"])
    return _output_shape(*operands, **params)


nest_p = private_jax.primitive(
    "tensordsl_nest", _nest_output_shape, _output_dtype, partitioning.output_sharding
)
tangent_p = private_jax.primitive(
    "tensordsl_tangent", _output_shape, _output_dtype, partitioning.output_sharding
)


#: The runner traced into the lowering. A compiler that cannot be run (TENSORDSL_CC) is found
#: only when a kernel builds.
_traced_lowering = mlir.lower_fun(
    user_facing()(deeply(partitioning.run_nest)), multiple_results=False
)


def _lower_nest(ctx: Any, *args: Any, **params: Any) -> Any:
    """`nest_p` lowered: the FFI custom call of its kernel, emitted directly where the back
    end's runner would only make that call (`Backend.ffi_call`), else the runner traced.
    The direct call skips a trace of the runner per equation; it is the same custom call,
    with the same attributes, as `jax.ffi.ffi_call` lowers to."""
    call = _direct_ffi_call(ctx.avals_in, params)
    if call is None:
        return _traced_lowering(ctx, *args, **params)
    return jax.ffi.ffi_lowering(call.target)(ctx, *args, **call.attributes)


@user_facing()
@deeply
def _direct_ffi_call(avals: Sequence[Any], params: dict[str, Any]) -> Any:
    """The back end's FFI call for this equation, or None: no direct call for its back end,
    an operand on a mesh (the partitioner or shard_map decides, `partitioning.run_nest`),
    or a one-pass nest that runs as two (`partitioning._run_local`)."""
    record = table.BACKENDS[params["backend"]]
    if record.ffi_call is None or any(not a.sharding.mesh.empty for a in avals):
        return None
    nest: LoopNest = params["nest"]
    shapes = partitioning.tensor_shapes(nest, avals, params["extents"])
    if partitioning.runs_as_two_nests(nest, shapes, record):
        return None
    return record.ffi_call()(
        nest,
        avals,
        shapes,
        params["out_dtype"],
        params["schedule"],
        precision=params["precision"],
    )


mlir.register_lowering(nest_p, _lower_nest)
private_jax.requires_devices_during_lowering(nest_p)


def _batch(args: Sequence[Any], dims: Sequence[Any], **params: Any) -> tuple[jax.Array, int]:
    nest: LoopNest = params["nest"]
    batched = frozenset(op.name for op, d in zip(nest.operands, dims) if d is not None)
    size = next(np.shape(a)[d] for a, d in zip(args, dims) if d is not None)
    moved = [a if d is None else jnp.moveaxis(a, d, 0) for a, d in zip(args, dims)]
    extents = tuple(
        (name, (size, *shape) if name == nest.output else shape)
        for name, shape in params["extents"]
    )
    new_nest = batch_nest(nest, batched)
    schedule = params["schedule"]
    if schedule is not None:
        batch_index = str(new_nest.free_indices[0])
        schedule = replace(schedule, free_order=(batch_index, *schedule.free_order))
    new_params = dict(params, nest=new_nest, extents=extents, schedule=schedule)
    return _bind(nest_p, moved, **new_params), 0


batching.primitive_batchers[nest_p] = deeply(_batch)


def _jvp(primals: Sequence[Any], tangents: Sequence[Any], **params: Any) -> tuple[Any, Any]:
    nest: LoopNest = params["nest"]
    if nest.online:
        return _jvp_two_nests(primals, tangents, params)
    output = _bind(nest_p, primals, **params)
    perturbed = tuple(
        op.name
        for op, value, tangent in zip(nest.operands, primals, tangents)
        if type(tangent) is not ad.Zero
        and is_differentiable(jnp.result_type(value))
        and op.name not in params["nograd"]
    )
    if not perturbed or not is_differentiable(params["out_dtype"]):
        return output, ad.Zero(jax.typeof(output).to_tangent_aval())
    auxiliary = _auxiliaries(nest, primals, params)
    by_name = dict(zip(nest.operand_names, tangents))
    linear_in = [by_name[name] for name in perturbed]
    reads_output = _reads_output(nest, perturbed)
    tangent = _bind(
        tangent_p,
        [*primals, *([output] if reads_output else []), *auxiliary.values(), *linear_in],
        **params,
        perturbed=perturbed,
        roles=tuple(auxiliary),
        reads_output=reads_output,
    )
    return output, tangent


@functools.lru_cache(maxsize=4096)
def _reads_output(nest: LoopNest, perturbed: tuple[str, ...]) -> bool:
    """Whether the tangent nest or a gradient nest of `perturbed` reads the nest's output.

    A tangent term takes the output as an argument only then: else an output that nothing
    else reads would stay alive in the jaxpr for its tangent's sake alone (`jax.jvp` of
    `jax.grad` keeping every first-order gradient nest though only their tangents are read).
    The tangent nest reads it only through its reduction's scale
    (`gradient_rules.reads_output`), so it is not derived here: reverse mode never builds it.
    A gradient nest may read it also where it reuses the saved sum (`grad.py`); the gradients
    are the ones reverse mode transposes with. A gradient that cannot be formed keeps the
    output (its transpose then says why). Decided once per nest and perturbed set (a model
    of many layers asks again per layer).
    """
    try:
        with user_facing():
            if gradient_rules.reads_output(nest):
                return True
            roles = [role for w in perturbed for _, role in grad.gradient(nest, w).roles]
    except TensorDSLError:
        return True
    return gradient_rules.OUTPUT in roles


ad.primitive_jvps[nest_p] = deeply(_jvp)


def _linear_transpose(*_: Any, **__: Any) -> Any:
    """Reached only by `jax.linear_transpose` (reverse mode transposes `tangent_p`)."""
    raise UnsupportedError(
        "jax.linear_transpose of a tensordsl kernel is not supported",
        hint="use jax.vjp (its cotangent function is the transpose of a linear kernel)",
    )


ad.primitive_transposes[nest_p] = _linear_transpose


def _jvp_two_nests(
    primals: Sequence[Any], tangents: Sequence[Any], params: dict
) -> tuple[Any, Any]:
    """The JVP of a one-pass nest: that of its two nests in turn (`tensordsl.binding.one_pass`)."""
    nest: LoopNest = params["nest"]
    slopes = dict(zip(nest.operand_names, tangents))
    shapes = partitioning.tensor_shapes(nest, primals, params["extents"])

    def run(part: LoopNest, values: Sequence[Any], known: Shapes) -> Any:
        nograd = params["nograd"] & set(part.operand_names)
        p = _params(
            part, known, params["backend"], params["out_dtype"], nograd, None, params["precision"]
        )
        found, slopes[part.output] = _jvp(
            private_jax.same_varying_axes(values), [slopes[n] for n in part.operand_names], **p
        )
        return found

    weighted, lse = online.two_nests(nest, primals, shapes, run)
    slope = [ad.instantiate_zeros(slopes[name]) for name in (nest.output, nest.online)]
    return online.pack(weighted, lse), online.pack(*slope)


def _auxiliaries(nest: LoopNest, values: Sequence[Any], params: dict) -> dict[str, jax.Array]:
    """Run the nests that the gradients of a max/min/prod reduction need."""
    found = {}
    for role, aux in gradient_rules.auxiliary_nests(nest).items():
        positional = REDUCTIONS[aux.reduction].positional
        found[role] = call_nest(
            aux,
            values,
            backend=params["backend"],
            shapes=dict(params["extents"]),
            out_dtype=POSITION_DTYPE if positional else params["out_dtype"],
            precision=params["precision"],
        )
    return found


def _transpose(cotangent: Any, *args: Any, **params: Any) -> list[Any]:
    nest: LoopNest = params["nest"]
    perturbed, roles = params["perturbed"], params["roles"]
    n = len(nest.operands)
    first_role = n + params["reads_output"]
    primals = args[:n]
    linear_in = args[first_role + len(roles) :]
    nonlinear = [None] * (first_role + len(roles))
    if type(cotangent) is ad.Zero:
        return [*nonlinear, *(None for _ in linear_in)]
    by_role = dict(zip(roles, args[first_role : first_role + len(roles)]))
    by_role[gradient_rules.COTANGENT] = cotangent
    if params["reads_output"]:
        by_role[gradient_rules.OUTPUT] = args[n]
    values = dict(zip(nest.operand_names, primals))
    shape = _output_shape(*args, **params)
    gradients = grouped.run_gradients(nest, perturbed, values, by_role, params, shape, call_nest)
    return [*nonlinear, *gradients]


ad.primitive_transposes[tangent_p] = deeply(_transpose)


def _tangent_call(args: Sequence[Any], params: dict) -> tuple[LoopNest, list[int], dict]:
    """The tangent nest of a `tangent_p` call, which of the call's arguments each of its
    operands is, and its `nest_p` parameters (`codegen.passes.jvp`)."""
    nest: LoopNest = params["nest"]
    perturbed, roles = params["perturbed"], params["roles"]
    n = len(nest.operands)
    with user_facing():
        found = jvp.tangent(nest, tuple(perturbed))
    position = {("input", name): i for i, name in enumerate(nest.operand_names)}
    first_role = n + params["reads_output"]
    if params["reads_output"]:
        position[(gradient_rules.OUTPUT, "")] = n
    position |= {(role, ""): first_role + i for i, role in enumerate(roles)}
    first_slope = first_role + len(roles)
    position |= {(jvp.TANGENT, name): first_slope + i for i, name in enumerate(perturbed)}
    tangent_of = dict(found.tangent_of)
    positions = []
    for name, role in found.roles:
        key = name if role == "input" else tangent_of.get(name, "")
        positions.append(position[(role, key)])
    shapes = partitioning.tensor_shapes(nest, args[:n], params["extents"])
    shapes[nest.output] = shapes[found.nest.output] = _output_shape(*args, **params)
    for name, i in zip(found.nest.operand_names, positions):
        shapes[name] = tuple(np.shape(args[i]))
    integer = frozenset(
        name
        for name, i in zip(found.nest.operand_names, positions)
        if not is_differentiable(jnp.result_type(args[i]))
    )
    nest_params = _params(found.nest, shapes, params["backend"], params["out_dtype"], integer, None)
    return found.nest, positions, nest_params


def evaluate_tangent(*args: Any, **params: Any) -> jax.Array:
    """`tangent_p` evaluated: its tangent nest, run like any nest."""
    nest, positions, nest_params = _tangent_call(args, params)
    operands = [args[i] for i in positions]
    if not operands:  # the output does not depend on the perturbed inputs
        return jnp.zeros(_output_shape(*args, **params), params["out_dtype"])
    return _bind(nest_p, operands, **nest_params)


def _batch_tangent(
    args: Sequence[Any], dims: Sequence[Any], **params: Any
) -> tuple[jax.Array, int | None]:
    """`tangent_p` batched: its tangent nest, batched like any nest (`jacfwd`). The tangent
    nest and its parameters (extents, the output's shape) are made from one batch element's
    shapes: made from the batched arguments, they would count the batch axis as one of the
    nest's (a wrong output shape, or wrong numbers, under `vmap` of `jvp`)."""
    element = [
        a if d is None else jax.ShapeDtypeStruct(np.delete(np.shape(a), d), jnp.result_type(a))
        for a, d in zip(args, dims)
    ]
    _, positions, nest_params = _tangent_call(element, params)
    if all(dims[i] is None for i in positions):  # it reads nothing the batch varies
        return evaluate_tangent(
            *[jnp.take(a, 0, d) if d is not None else a for a, d in zip(args, dims)], **params
        ), None
    return _batch([args[i] for i in positions], [dims[i] for i in positions], **nest_params)


def _jvp_tangent(primals: Sequence[Any], tangents: Sequence[Any], **params: Any) -> Any:
    """`tangent_p` differentiated: its tangent nest's JVP (forward over forward, HVPs)."""
    _, positions, nest_params = _tangent_call(primals, params)
    if not positions:
        output = evaluate_tangent(*primals, **params)
        return output, ad.Zero(jax.typeof(output).to_tangent_aval())
    return _jvp([primals[i] for i in positions], [tangents[i] for i in positions], **nest_params)


mlir.register_lowering(tangent_p, mlir.lower_fun(evaluate_tangent, multiple_results=False))
private_jax.requires_devices_during_lowering(tangent_p)
batching.primitive_batchers[tangent_p] = _batch_tangent
ad.primitive_jvps[tangent_p] = _jvp_tangent
