"""A fused program's tangent as one linear primitive whose transpose is the fused backward.

JAX refuses forward mode through a `custom_vjp`. A fused program is therefore a
`jax.custom_jvp` whose rule returns the outputs and `program_tangent_p`, a primitive linear
in the input tangents:

* evaluated (`jvp`, `jacfwd`, `linearize`'s linear function), it runs every stored nest's
  tangent nest in turn (`jax.jvp` of the program's nests, `codegen.passes.jvp`);
* transposed (`grad`, `vjp`), it runs the fused backward (`FusedProgram.gradients`): the
  same merged gradient nests as before, from the same saved values, so reverse mode runs
  the kernels it ran under `custom_vjp`;
* batched (`vmap`), it stays one primitive with the batch dimensions of each level kept in
  its parameters, so that a batched tangent is still transposed into batched gradient
  nests (an input the batch does not vary gets its gradient summed over the batch);
* differentiated, it is the JVP of its evaluation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax.interpreters import ad, batching, mlir

from tensordsl.binding import private_jax


def bind(program: Any, values: dict[str, Any], slopes: dict[str, Any]) -> list[Any]:
    """The output tangents of `program` (a `FusedProgram`) for the tangents `slopes` of its
    perturbed inputs, `values` holding every value its forward computed (its residuals)."""
    names, perturbed = tuple(values), tuple(slopes)
    args = private_jax.same_varying_axes([*values.values(), *slopes.values()])
    return program_tangent_p.bind(
        *args, program=program, names=names, perturbed=perturbed, levels=()
    )


def _evaluation(program: Any, names: tuple, perturbed: tuple, levels: tuple) -> Callable:
    """The output tangents as a function of the arguments, under each level's vmap."""

    def base(*args: Any) -> list[Any]:
        values = dict(zip(names, args))
        slopes = dict(zip(perturbed, args[len(names) :]))
        return list(program.tangents(values, slopes))

    function = base
    for dims in levels:
        function = jax.vmap(function, in_axes=dims, out_axes=0)
    return function


def _impl(*args: Any, program: Any, names: tuple, perturbed: tuple, levels: tuple) -> Any:
    return _evaluation(program, names, perturbed, levels)(*args)


def _abstract(*avals: Any, program: Any, names: tuple, levels: tuple, **_: Any) -> list[Any]:
    """The outputs' avals (the tangents are shaped like them) with each level's batch axis
    in front, outermost first; varying over the manual axes of the (cast) arguments."""
    shapes = [tuple(a.shape) for a in avals]
    sizes = []
    for dims in reversed(levels):  # the arguments as they are: outermost level first
        sizes.append(next(s[d] for s, d in zip(shapes, dims) if d is not None))
        shapes = [s if d is None else s[:d] + s[d + 1 :] for s, d in zip(shapes, dims)]
    by_name = dict(zip(names, zip(shapes, avals)))
    return [
        private_jax.shaped_like(avals[0], (*sizes, *by_name[name][0]), by_name[name][1].dtype)
        for name in program.outputs
    ]


program_tangent_p = private_jax.multiple_results_primitive("tensordsl_program_tangent", _abstract)
mlir.register_lowering(program_tangent_p, mlir.lower_fun(_impl, multiple_results=True))


def _batch(args: Sequence[Any], dims: Sequence[Any], **params: Any) -> tuple[Any, list[int]]:
    levels = (*params["levels"], tuple(dims))  # None: not batched
    found = program_tangent_p.bind(*args, **dict(params, levels=levels))
    return found, [0] * len(found)


batching.primitive_batchers[program_tangent_p] = _batch


def _jvp(primals: Sequence[Any], tangents: Sequence[Any], **params: Any) -> Any:
    tangents = [ad.instantiate_zeros(t) for t in tangents]
    return jax.jvp(_evaluation(**params), list(primals), tangents)


ad.primitive_jvps[program_tangent_p] = _jvp


def _transposed(program: Any, names: tuple, perturbed: tuple, levels: tuple) -> Callable:
    """The input gradients as a function of the values and the output cotangents, under
    each level's vmap (an input that a level does not batch: summed over that batch)."""
    if not levels:

        def base(*args: Any) -> list[Any]:
            values = dict(zip(names, args))
            cotangents = args[len(names) :]
            return program.gradients(values, perturbed, cotangents)

        return base
    inner = _transposed(program, names, perturbed, levels[:-1])
    dims = levels[-1]
    value_dims, slope_dims = dims[: len(names)], dims[len(names) :]

    def batched(*args: Any) -> list[Any]:
        cotangent_count = len(args) - len(names)
        in_axes = (*value_dims, *([0] * cotangent_count))
        found = jax.vmap(inner, in_axes=in_axes, out_axes=0)(*args)
        return [g.sum(0) if d is None else jnp.moveaxis(g, 0, d) for g, d in zip(found, slope_dims)]

    return batched


def _transpose(cotangents: Sequence[Any], *args: Any, **params: Any) -> list[Any]:
    names = params["names"]
    values = args[: len(names)]
    slopes = args[len(names) :]
    if all(type(c) is ad.Zero for c in cotangents):
        return [None] * len(args)
    if params["levels"]:
        cotangents = [ad.instantiate_zeros(c) for c in cotangents]
    else:
        cotangents = [None if type(c) is ad.Zero else c for c in cotangents]
    found = _transposed(**params)(*values, *cotangents)
    return [None] * len(values) + [
        g if ad.is_undefined_primal(s) else None for g, s in zip(found, slopes)
    ]


ad.primitive_transposes[program_tangent_p] = _transpose
