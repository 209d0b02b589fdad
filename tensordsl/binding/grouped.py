"""The gradients of several inputs of one nest: those that share their loops run as one
multi-output nest (`codegen.passes.group`), the others each as its own gradient nest.

Only on a back end whose record says it computes multi-output nests together
(`Backend.groups_gradients`, the C back end's ``members`` strategy); elsewhere each
gradient nest runs alone. One input's gradient split into members (`dX[i, p]` read at
constant `p`) is a group of its own: one nest for the positions, cheaper than `dX` as
written, which computes the positions' common work once per position; a single input whose
gradient does not split runs only its own nest, never the others of a group (cheaper). A
gradient nest whose own schedule is faster stays alone (`_keeps_its_own`): XLA's dot, a
register tile of several rows over a free axis, a nested reduction. The group is a `nest_p`
call like any other, so it is batched, jitted and differentiated again as one.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from codegen import config
from codegen.ir.nest import LoopNest, Reduce
from codegen.passes import grad, gradient_rules
from codegen.passes.group import Group, group_gradients, split_members
from tensordsl.backends import table
from tensordsl.binding import paired
from tensordsl.errors import user_facing

#: Runs one gradient nest: (gradient, operands, shapes, out dtype, nograd) -> its array.
CallNest = Callable[..., jax.Array]


def gradient_shapes(
    nest: LoopNest,
    gradients: Sequence[grad.Gradient],
    values: dict[str, Any],
    params: dict,
    output_shape: tuple[int, ...],
) -> dict[str, tuple[int, ...]]:
    """The shape of every tensor the gradient nests of `nest` name."""
    shapes = dict(params["extents"])
    shapes[nest.output] = output_shape
    for gradient in gradients:
        cotangent = next(n for n, r in gradient.roles if r == gradient_rules.COTANGENT)
        shapes[cotangent] = output_shape
        shapes[gradient.nest.output] = tuple(np.shape(values[gradient.wrt]))
    for name, value in values.items():
        shapes[name] = tuple(np.shape(value))
    return shapes


def operands_of(gradient_roles: dict[str, str], nest: LoopNest, values: dict, by_role: dict):
    """The arrays of `nest`'s operands: forward inputs by name, the others by role."""
    return [
        values[name] if gradient_roles[name] == "input" else by_role[gradient_roles[name]]
        for name in nest.operand_names
    ]


def run_gradients(
    nest: LoopNest,
    perturbed: Sequence[str],
    values: dict[str, Any],
    by_role: dict[str, Any],
    params: dict,
    output_shape: tuple[int, ...],
    call_nest: CallNest,
) -> list[jax.Array]:
    """The gradient of each input in `perturbed`, in order (see the module docstring)."""
    with user_facing():
        gradients = [grad.gradient(nest, wrt) for wrt in perturbed]
    shapes = gradient_shapes(nest, gradients, values, params, output_shape)
    roles = {name: role for g in gradients for name, role in g.roles}
    wrt_of = {g.nest.output: g.wrt for g in gradients}
    found: dict[str, Any] = {}
    for group in plan_groups(gradients, values, shapes, params):
        operands = operands_of(roles, group.nest, values, by_role)
        dtype = jnp.result_type(values[wrt_of[group.members[0].output]])
        packed = call_nest(
            group.nest,
            operands,
            backend=params["backend"],
            shapes=shapes,
            out_dtype=dtype,
            nograd=paired.integer_operands(group.nest, operands),
            precision=params["precision"],
        )
        found |= unpack(group, packed, shapes)
    results = []
    for gradient in gradients:
        if gradient.nest.output in found:
            results.append(found[gradient.nest.output])
            continue
        operands = operands_of(dict(gradient.roles), gradient.nest, values, by_role)
        results.append(
            call_nest(
                gradient.nest,
                operands,
                backend=params["backend"],
                shapes=shapes,
                out_dtype=jnp.result_type(values[gradient.wrt]),
                nograd=paired.integer_operands(gradient.nest, operands),
                precision=params["precision"],
            )
        )
    return results


def plan_groups(
    gradients: Sequence[grad.Gradient], values: dict, shapes: dict, params: dict
) -> tuple[Group, ...]:
    """The groups to run: none unless the back end groups gradients."""
    nests = {g.nest.output: g.nest for g in gradients}
    dtypes = {g.nest.output: jnp.dtype(jnp.result_type(values[g.wrt])).name for g in gradients}
    return groups_for(nests, dtypes, shapes, params["backend"])


def groups_for(
    nests: dict[str, LoopNest], dtypes: dict[str, str], shapes: dict, backend: str
) -> tuple[Group, ...]:
    """The groups of gradient `nests` (by output, each output's dtype in `dtypes`) on
    `backend`: nests of the same dtype, never one that runs faster alone. Formed once per
    process for the same nests, dtypes and shapes (a model of many layers calls the same
    kernels again and again)."""
    record = table.backend(backend)
    if not nests or not record.groups_gradients or not config.group_gradients():
        return ()
    known = tuple(sorted((name, tuple(int(n) for n in shape)) for name, shape in shapes.items()))
    items, kinds = tuple(nests.items()), tuple(sorted(dtypes.items()))
    return _groups(items, kinds, known, backend, config.xla_contractions())


@functools.lru_cache(maxsize=1024)
def _groups(
    nests: tuple[tuple[str, LoopNest], ...],
    dtypes: tuple[tuple[str, str], ...],
    shapes: tuple[tuple[str, tuple[int, ...]], ...],
    backend: str,
    xla: bool,
) -> tuple[Group, ...]:
    """`groups_for`, on hashable arguments; `xla`: `TENSORDSL_XLA_CONTRACTIONS`, which the
    schedules that keep a gradient alone read."""
    choose = table.backend(backend).scheduler
    choose = choose() if choose is not None else None
    by_dtype: dict[str, dict[str, LoopNest]] = {}
    of = dict(dtypes)
    for output, nest in nests:
        dtype = of[output]
        kernel_dtypes = {n: dtype for n in (*nest.operand_names, nest.output)}
        alone = choose(nest, kernel_dtypes) if choose is not None else None
        if alone is None or _keeps_its_own(nest, alone):
            continue
        by_dtype.setdefault(dtype, {})[output] = nest
    known = dict(shapes)
    return tuple(group for found in by_dtype.values() for group in group_gradients(found, known))


def run_together(
    items: dict[str, tuple[LoopNest, dict[str, Any], dict[str, tuple[int, ...]], Any]],
    backend: str,
    precision: Any,
    call_nest: CallNest,
) -> dict[str, jax.Array]:
    """The gradient nests of `items` (key -> nest, its operands' values by name, shapes of
    the tensors it names, an array of the gradient's shape and dtype) that group, run as
    groups; by key. A nest in no group is left out (its caller runs it)."""
    shapes: dict[str, tuple[int, ...]] = {}
    values: dict[str, Any] = {}
    nests, dtypes, by_output = {}, {}, {}
    for key, (nest, named, known, like) in items.items():
        if any(values.get(n, v) is not v for n, v in named.items()):
            continue  # a name that means another array in a nest already taken: alone
        if any(shapes.get(n, v) != v for n, v in known.items()) or nest.output in nests:
            continue
        shapes |= known
        shapes[nest.output] = tuple(np.shape(like))
        values |= named
        nests[nest.output], by_output[nest.output] = nest, key
        dtypes[nest.output] = jnp.dtype(jnp.result_type(like)).name
    found: dict[str, Any] = {}
    for group in groups_for(nests, dtypes, shapes, backend):
        operands = [values[name] for name in group.nest.operand_names]
        packed = call_nest(
            group.nest,
            operands,
            backend=backend,
            shapes=shapes,
            out_dtype=dtypes[group.members[0].output],
            nograd=paired.integer_operands(group.nest, operands),
            precision=precision,
        )
        found |= {by_output[k]: v for k, v in unpack(group, packed, shapes).items()}
    left = {output: nest for output, nest in nests.items() if by_output[output] not in found}
    for output, value in paired.run_pairs(
        left, values, dtypes, shapes, backend, precision, call_nest
    ).items():
        found[by_output[output]] = value
    return found


def _keeps_its_own(nest: LoopNest, schedule: Any) -> bool:
    """Whether a gradient nest runs faster alone than in a group (whose kernel puts the
    innermost reduced index or the last free one in vector lanes, `codegen.c.attention.members`):
    XLA's dot; a register tile of several rows over a free axis it keeps (not over the
    constant positions that split it, the Gaussian kernel's `dX[i, p]`); a nested
    reduction, which a tile computes once for all its lanes and the group once per row."""
    if schedule.strategy == "xla" or any(t.body.atoms(Reduce) for t in nest.terms):
        return True
    if schedule.strategy != "tile" or schedule.row is None:  # a tile of one row: so is the group's
        return False
    axis = split_members(nest.output, nest)[0].axis
    return axis is None or nest.free[axis].index.name != schedule.vector


def unpack(group: Group, packed: Any, shapes: dict) -> dict[str, jax.Array]:
    """Each gradient of `group` from its packed output (a split gradient's positions put
    back along their axis, zeros at the positions no member computes)."""
    columns: dict[str, dict[int, Any]] = {}
    axes: dict[str, int | None] = {}
    for k, member in enumerate(group.members):
        columns.setdefault(member.output, {})[member.position] = packed[..., k]
        axes[member.output] = member.axis
    found = {}
    for output, by_position in columns.items():
        axis = axes[output]
        if axis is None:
            found[output] = by_position[0]
            continue
        extent = shapes[output][axis]
        positions = sorted(by_position)
        if positions == list(range(len(positions))):  # the first positions: stack, pad
            stacked = jnp.stack([by_position[p] for p in positions], axis=axis)
            pad = [(0, 0)] * stacked.ndim
            pad[axis] = (0, extent - len(positions))
            found[output] = jnp.pad(stacked, pad) if extent > len(positions) else stacked
            continue
        zero = jnp.zeros_like(by_position[positions[0]])
        found[output] = jnp.stack([by_position.get(p, zero) for p in range(extent)], axis=axis)
    return found
