"""How `nest_p` runs once lowered: the back end's runner, partitioned by the index notation.

The runner is traced into the primitive's lowering (`mlir.lower_fun`), so kernels are built
at trace time and run under `jit`. With operands sharded across devices, the call is wrapped
in `jax.experimental.custom_partitioning` with a rule read off the nest
(`plan_sharding`), so JAX's SPMD partitioner runs the same nest on each device's shard
instead of gathering the operands:

* an axis indexed by a plain free index can be split; the output's axis follows;
* an axis indexed by a plain reduced index can be split when the reduction has a
  cross-device combine (sum: psum; max/min: pmax/pmin; logsumexp: a max-shifted psum);
  prod, argmax and argmin keep reduced axes whole, and so does every reduction under a
  mesh with Explicit axes in context (`_explicit_axes_in_context`);
* an axis indexed by anything else (`X[i+k]`, a repeated index, an index that also
  appears in a bound, constraint, guard or as a value) stays whole: a halo exchange is
  not implemented.

The per-device nest is the same nest: its extents are run-time shapes. Extents that are not
operand shapes (a gradient nest's declared output shape) are divided for split axes.
Inside `shard_map` (all mesh axes manual) and on one device the runner is lowered as is.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> plan = plan_sharding(lower(parse("Y[b,i] := W[i,k] * X[b,k]")).nest)
>>> plan.rule
'i k, b k -> b i'
>>> [(f.name, f.kind) for f in plan.factors]
[('b', 'free'), ('i', 'free'), ('k', 'reduced')]
>>> plan_sharding(lower(parse("Y[i] := X[i+k] * K[k]")).nest).rule  # shifted: all whole
'r0, r1 -> r2'
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sympy
from jax.experimental.custom_partitioning import ArrayMapping, SdyShardingRule, custom_partitioning
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from codegen.ir.extents import output_shape
from codegen.ir.nest import LoopNest, extent_of, extent_symbol
from codegen.ir.reductions import REDUCTIONS
from tensordsl.backends.table import BACKENDS
from tensordsl.binding import one_pass as online

#: The cross-device combines a reduction names (`Reduction.cross_device`): how partial results
#: over split reduced axes combine. Reductions with none keep their reduced axes whole.
COMBINES = {
    "sum": lambda x, axes: jax.lax.psum(x, axes),
    "max": lambda x, axes: _propagating_nan(jax.lax.pmax, x, axes),
    "min": lambda x, axes: _propagating_nan(jax.lax.pmin, x, axes),
    "logsumexp": lambda x, axes: _logsumexp_combine(x, axes),
}

Axis = tuple[int, int]  # (operand position, axis); the output is position -1


@dataclass(frozen=True)
class Factor:
    """One factor of the sharding rule: an index shared by operand axes, or one whole axis.

    `kind` is "free" or "reduced" for a splittable index, "whole" for an axis that must not be
    split. `divide` names a non-operand extent `(tensor, axis)` to divide when split.
    """

    name: str
    kind: str
    axes: tuple[Axis, ...]
    divide: tuple[str, int] | None = None


@dataclass(frozen=True)
class ShardingPlan:
    """How a nest may be split: a factor per operand axis and per output axis."""

    operands: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]
    factors: tuple[Factor, ...]
    reduction: str

    @property
    def rule(self) -> str:
        """The einsum-like `sharding_rule` string."""
        inputs = ", ".join(" ".join(names) for names in self.operands)
        return f"{inputs} -> {' '.join(self.output)}"

    @property
    def splittable(self) -> tuple[Factor, ...]:
        return tuple(f for f in self.factors if f.kind != "whole")

    def sdy_rule(self) -> SdyShardingRule:
        """The rule as Shardy takes it (scalar operands have no factors)."""
        return SdyShardingRule(
            tuple(ArrayMapping(*names) for names in self.operands),
            (ArrayMapping(*self.output),),
            reduction_factors=tuple(f.name for f in self.factors if f.kind == "reduced"),
            need_replication_factors=tuple(f.name for f in self.factors if f.kind == "whole"),
        )


def _occurrences(nest: LoopNest) -> tuple[dict, set, collections.Counter]:
    """Where each index symbol is a plain access index, symbols used anywhere else, and how
    many expressions name each extent symbol."""
    plain: dict[sympy.Symbol, set[tuple[str, int]]] = collections.defaultdict(set)
    other: set[sympy.Symbol] = set()
    per_axis: dict[tuple[str, int], set] = collections.defaultdict(set)  # -> index exprs
    repeated: set[sympy.Symbol] = set()

    def walk(expr: sympy.Basic) -> None:
        if isinstance(expr, sympy.Indexed):
            name = expr.base.name
            seen = collections.Counter(expr.indices)
            for axis, index in enumerate(expr.indices):
                per_axis[name, axis].add(index)
                if isinstance(index, sympy.Symbol) and extent_of(index) is None:
                    plain[index].add((name, axis))
                    if seen[index] > 1:
                        repeated.add(index)
                else:
                    other.update(index.free_symbols)
            return
        if isinstance(expr, sympy.Symbol):
            other.add(expr)
        for arg in expr.args:
            walk(arg)

    uses: collections.Counter = collections.Counter()
    for expr in nest.expressions():
        walk(expr)
        uses.update(s for s in expr.free_symbols if extent_of(s) is not None)
    # An axis reached by two different index expressions cannot follow either index.
    for tensor_axis, indices in per_axis.items():
        if len(indices) > 1:
            other.update(i for i in indices if tensor_axis in plain.get(i, ()))
    return plain, other | repeated, uses


@functools.lru_cache(maxsize=512)
def plan_sharding(nest: LoopNest) -> ShardingPlan:
    """The sharding rule of `nest`: which operand and output axes may be split, and how.

    Args:
        nest: the loop nest.

    Returns:
        A `ShardingPlan`; its `rule` is the einsum-like string for `custom_partitioning`.
    """
    plain, other, uses = _occurrences(nest)
    position = {name: n for n, name in enumerate(nest.operand_names)}
    ranges = {r.index: ("free", r) for r in nest.free}
    if nest.online:  # only rows split: the packed axis and the running max stay whole
        del ranges[nest.free[-1].index]
    else:
        for term in nest.terms:
            for r in term.reduced:
                ranges.setdefault(r.index, ("reduced", r))
    axis_factor: dict[Axis, str] = {}
    factors: list[Factor] = []
    for n, (index, (kind, rng)) in enumerate(ranges.items()):
        sites = sorted((position[t], a) for t, a in plain.get(index, ()) if t in position)
        if kind == "free":
            sites.append((-1, n))
        if not sites:
            continue
        divide = _split_extent(nest, index, kind, rng, sites, other, uses)
        name = str(index) if str(index).isalnum() and str(index)[0].isalpha() else f"x{n}"
        if divide is False:
            continue  # every axis of this index becomes its own whole factor below
        factors.append(Factor(name, kind, tuple(sites), divide if divide is not True else None))
        axis_factor.update(dict.fromkeys(sites, name))
    taken = {f.name for f in factors}
    fresh = (f"r{n}" for n in range(10**6) if f"r{n}" not in taken)

    def factor_of(axis: Axis) -> str:
        if axis not in axis_factor:
            axis_factor[axis] = next(fresh)
            factors.append(Factor(axis_factor[axis], "whole", (axis,)))
        return axis_factor[axis]

    operands = tuple(
        tuple(factor_of((p, a)) for a in range(op.rank)) for p, op in enumerate(nest.operands)
    )
    output = tuple(factor_of((-1, n)) for n in range(len(nest.free)))
    return ShardingPlan(operands, output, tuple(factors), nest.reduction)


def _split_extent(
    nest: LoopNest,
    index: sympy.Symbol,
    kind: str,
    rng: Any,
    sites: list[Axis],
    other: set,
    uses: collections.Counter,
) -> tuple[str, int] | bool:
    """Whether `index` may be split: False, True, or the non-operand extent to divide."""
    bound = extent_of(rng.stop)
    if index in other or rng.start != 0 or bound is None:
        return False
    if kind == "reduced" and (
        len(nest.terms) > 1 or REDUCTIONS[nest.reduction].cross_device is None
    ):
        return False
    if kind == "reduced" and not any(p >= 0 for p, _ in sites):
        return False
    tensor, axis = bound
    names = [nest.operand_names[p] if p >= 0 else nest.output for p, _ in sites]
    split = {extent_symbol(t, a) for t, (_, a) in zip(names, sites)}
    # Extents of split axes change on each device: only this index's bound may name them.
    if any(uses[s] > (s == rng.stop) for s in split) or uses[rng.stop] > 1:
        return False
    if rng.stop in split:
        # A declared output shape is not an operand's: it is divided by hand.
        return (tensor, axis) if tensor == nest.output else True
    if tensor in nest.operand_names or tensor == nest.output:
        return False  # bounded by an axis that does not follow this index
    return (tensor, axis)


def run_nest(
    *operands: jax.Array,
    nest: LoopNest,
    backend: str,
    extents: tuple,
    out_dtype: str,
    schedule: Any,
    precision: Any = None,
    **_: Any,
) -> jax.Array:
    """The lowering of one `nest_p` call: the back end's runner, partitioned when sharded."""

    def run(*values: jax.Array, extents: tuple = extents) -> jax.Array:
        return _run_local(values, nest, backend, extents, out_dtype, schedule, precision)

    # Unsharded operands, all-manual shard_map or nothing to split: the plain call (the
    # partitioner would replicate it), with no extra trace. The devices are looked at first:
    # most calls are on one, and need no plan.
    if not _on_several_devices(operands):
        return run(*operands)
    plan = plan_sharding(nest)
    if not plan.splittable:
        return run(*operands)
    # custom_partitioning resolves every argument to a position: no keywords.
    return _partitioned(run, plan, extents)(*operands)


def _on_several_devices(operands: Sequence[jax.Array]) -> bool:
    """Whether some array operand lives on a mesh of several devices that the partitioner
    (not shard_map's manual axes) splits."""
    for value in operands:
        mesh = jax.typeof(value).sharding.mesh
        automatic = any(kind != AxisType.Manual for kind in mesh.axis_types)
        if np.ndim(value) and not mesh.empty and mesh.size > 1 and automatic:
            return True
    return False


def _run_local(
    operands: Sequence[jax.Array],
    nest: LoopNest,
    backend: str,
    extents: tuple,
    out_dtype: str,
    schedule: Any,
    precision: Any = None,
) -> jax.Array:
    """The back end's runner on the operands as given (whole, or one device's shards); a
    one-pass nest as its two nests where the back end does not run it as one
    (`Backend.one_pass_rows`, `tensordsl.binding.one_pass`)."""
    shapes = tensor_shapes(nest, operands, extents)
    record = BACKENDS[backend]
    runner = record.run
    if runs_as_two_nests(nest, shapes, record):

        def run(part: LoopNest, values: Sequence[Any], known: Any) -> jax.Array:
            return runner(part, values, known, out_dtype, None, precision=precision)

        return online.pack(*online.two_nests(nest, operands, shapes, run))
    return runner(nest, operands, shapes, out_dtype, schedule, precision=precision)


def runs_as_two_nests(nest: LoopNest, shapes: dict, record: Any) -> bool:
    """Whether a one-pass nest runs as its two nests on the back end `record`: its packed
    row is longer than the back end runs in one pass (`Backend.one_pass_rows`)."""
    return nest.online and output_shape(nest, shapes)[-1] > record.one_pass_rows


def tensor_shapes(nest: LoopNest, operands: Sequence[Any], extents: tuple) -> dict:
    """The shape of every tensor `nest` names: the static `extents` and the operands'."""
    shapes = dict(extents)
    for op, value in zip(nest.operands, operands):
        shapes[op.name] = tuple(np.shape(value))
    return shapes


def _partitioned(run: Any, plan: ShardingPlan, extents: tuple) -> Any:
    """`run` wrapped in `custom_partitioning` with the rule of `plan`."""
    wrapped = custom_partitioning(lambda *operands: run(*operands))

    def infer_sharding_from_operands(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        split = _choose(plan, mesh, arg_shapes, result_shape, extents)
        return _sharding(mesh, plan.output, split)

    def partition(mesh: Any, arg_shapes: Any, result_shape: Any) -> Any:
        split = _choose(plan, mesh, arg_shapes, result_shape, extents)
        local_extents = _local_extents(plan, mesh, split, extents)
        reduced = tuple(
            axis for f in plan.factors if f.kind == "reduced" for axis in split.get(f.name, ())
        )

        def per_device(*operands: jax.Array) -> jax.Array:
            out = run(*operands, extents=local_extents)
            if not reduced:
                return out
            return COMBINES[REDUCTIONS[plan.reduction].cross_device or ""](out, reduced)

        operand_shardings = tuple(_sharding(mesh, names, split) for names in plan.operands)
        return mesh, per_device, _sharding(mesh, plan.output, split), operand_shardings

    wrapped.def_partition(
        partition=partition,
        infer_sharding_from_operands=infer_sharding_from_operands,
        sharding_rule=plan.sdy_rule(),
    )
    return wrapped


def _mesh_axes(shape: Any, ndim: int) -> tuple[tuple[str, ...], ...]:
    """The mesh axes splitting each array axis of `shape` (none when unknown)."""
    sharding = getattr(shape, "sharding", None)
    if not isinstance(sharding, NamedSharding):
        return ((),) * ndim
    spec = tuple(sharding.spec) + (None,) * (ndim - len(sharding.spec))
    return tuple(() if s is None else (s,) if isinstance(s, str) else tuple(s) for s in spec)


def _choose(
    plan: ShardingPlan, mesh: Any, arg_shapes: Sequence[Any], result_shape: Any, extents: tuple
) -> dict[str, tuple[str, ...]]:
    """Mesh axes for each split factor: taken from the operands' (then the result's)
    shardings, each mesh axis used once, only where every split axis divides evenly."""
    if getattr(mesh, "empty", True):
        return {}  # no named mesh: no axis names for the combine, so nothing is split
    shapes = [*arg_shapes, result_shape]
    axes = [_mesh_axes(s, len(s.shape)) for s in shapes]
    declared = dict(extents)
    used: set[str] = set()
    chosen = {}
    keep_reduced = _explicit_axes_in_context()
    for factor in plan.splittable:
        if factor.kind == "reduced" and keep_reduced:
            continue
        sizes = {shapes[p].shape[a] for p, a in factor.axes}
        if factor.divide is not None:
            sizes.add(declared[factor.divide[0]][factor.divide[1]])
        if len(sizes) != 1:
            continue  # an access that does not cover the whole axis: keep it whole
        for names in (axes[p][a] for p, a in sorted(factor.axes, key=lambda x: x[0] < 0)):
            count = math.prod(mesh.shape[name] for name in names)
            if names and not used & set(names) and next(iter(sizes)) % count == 0:
                chosen[factor.name] = names
                used.update(names)
                break
    return chosen


def _explicit_axes_in_context() -> bool:
    """Whether the mesh in context (`jax.set_mesh`) has Explicit axes. The per-device
    function is traced under it; from jax 0.11 on, a cross-device combine then lowers its
    reducer with a sharding annotation that XLA rejects ("Unsupported reduction
    computation"), so under such a mesh reduced indices stay whole (their operands are
    gathered instead of the partial results combined)."""
    mesh = jax.sharding.get_abstract_mesh()
    return not mesh.empty and any(kind == AxisType.Explicit for kind in mesh.axis_types)


def _sharding(mesh: Any, names: Sequence[str], split: dict) -> Any:
    spec = [split.get(n) for n in names]
    return NamedSharding(
        mesh, PartitionSpec(*(s if s is None or len(s) > 1 else s[0] for s in spec))
    )


def _local_extents(plan: ShardingPlan, mesh: Any, split: dict, extents: tuple) -> tuple:
    """Non-operand extents (a declared output shape) as one device sees them."""
    shapes = {name: list(shape) for name, shape in extents}
    for factor in plan.splittable:
        if factor.divide is not None and factor.name in split:
            tensor, axis = factor.divide
            shapes[tensor][axis] //= math.prod(mesh.shape[n] for n in split[factor.name])
    return tuple((name, tuple(shape)) for name, shape in shapes.items())


def _propagating_nan(reduce: Any, x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """`reduce` (pmax or pmin) with jnp's rule that NaN propagates: XLA's cross-device max and
    min drop NaN (so does jnp.max of a sharded array on CPU), so NaN travels as a flag."""
    any_nan = jax.lax.pmax(jnp.isnan(x).astype(jnp.int32), axes) > 0
    return jnp.where(any_nan, jnp.nan, reduce(x, axes))


def _logsumexp_combine(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """log(sum(exp(x))) across devices, shifted by the largest finite partial result."""
    top = jax.lax.pmax(x, axes)
    shift = jnp.where(jnp.isfinite(top), top, jnp.zeros_like(top))
    return shift + jnp.log(jax.lax.psum(jnp.exp(x - shift), axes))


def output_sharding(*avals: Any, nest: LoopNest, extents: tuple, **_: Any) -> NamedSharding:
    """The output's sharding for operands of explicitly sharded types (`AxisType.Explicit`):
    split free indices keep their operands' mesh axes; everything else is replicated, as the
    partitioned call produces it. Extra avals after the nest's operands are ignored (the
    tangent primitive's)."""
    operands = avals[: len(nest.operands)]
    mesh = next((a.sharding.mesh for a in operands if not a.sharding.mesh.empty), None)
    if mesh is None:
        mesh = avals[0].sharding.mesh if avals else jax.sharding.get_abstract_mesh()
        return NamedSharding(mesh, PartitionSpec())
    plan = plan_sharding(nest)
    shapes = {name: shape for name, shape in extents}
    for op, aval in zip(nest.operands, operands):
        shapes[op.name] = aval.shape
    result = jax.ShapeDtypeStruct(output_shape(nest, shapes), jnp.float32)
    return _sharding(mesh, plan.output, _choose(plan, mesh, operands, result, extents))
