"""Gathered operands: a table read through index arrays, before the nest that reads it.

`gathered_operands` computes each gathered operand of a statement (`tensordsl/frontend/
gathers.py`) from the call's arrays: the position of every element in the flattened table,
then `gather_p`, a primitive linear in the table:

* forward: one read per element; a position outside the table reads NaN (0 for an integer
  table), as `jnp.take(..., mode="fill")` does. When every input is concrete (an eager call
  outside `jit`, `vmap` and `grad`) such a position is a `RangeError` instead. On the CPU
  the back end's row gather where its record has one (`Backend.row_gather`: the C back
  end's, codegen/c/gathers.py), else XLA's.
* JVP: the gather of the table's tangent (0 where the forward reads outside).
* transpose: the table's cotangent, each element the sum of the cotangents of the positions
  that read it, the same bits on every call (`tensordsl/binding/scatter.py`): on the CPU a
  scatter-add in the order of the positions (the C back end's own, else XLA's), elsewhere a
  sort and a segmented sum; a gather whose positions are distinct by construction
  (`unique`: every index of the gathered operand indexes an axis of the table directly, as
  the row `n` of a one-hot pick `X[n, y[n]]` does) has nothing to sum. The primitive's
  `backend` parameter names the back end whose nests read the gather, `table_shape` the
  table's shape before its axes were flattened into rows (None where unknown): a distinct
  gather's transpose scatters into that shape, so that XLA adds it in place to the table's
  other cotangents (cross-entropy's logits: the softmax part, then the pick's one element
  per row) instead of writing a zero table and adding it.
* batching: a batched table is flattened with its batch axis, the positions offset per
  example; a batched position array just gives a batched result.

Index arrays are integers, so JAX gives them no tangent (float0) and no cotangent. A masked
gather (a one-hot pick, `tensordsl/frontend/one_hot.py`) reads 0 outside the table, eagerly
too, and takes a float index array (a whole number picks, any other value nothing).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sympy
from jax.interpreters import ad, batching, mlir

from codegen.ir.nest import extent_symbol, index_symbol
from tensordsl.backends import table as table_of_backends
from tensordsl.binding import positions, private_jax, scatter
from tensordsl.errors import InputError, RangeError, UnsupportedError
from tensordsl.frontend.gathers import Gather
from tensordsl.frontend.lower import Lowered


def _shape(table: Any, positions: Any, **_: Any) -> tuple[int, ...]:
    return (*positions.shape, table.shape[1])


def _dtype(table: Any, positions: Any, **_: Any) -> Any:
    return table.dtype


def _sharding(table: Any, positions: Any, **_: Any) -> Any:
    sharding = positions.sharding
    return sharding.update(spec=jax.sharding.PartitionSpec(*sharding.spec, None))


gather_p = private_jax.primitive("tensordsl_gather", _shape, _dtype, _sharding)


def _fill(dtype: Any, fill: bool) -> Any:
    if fill and jnp.issubdtype(dtype, jnp.inexact):
        return jnp.array(jnp.nan, dtype)
    return jnp.zeros((), dtype)


def _gather(table: Any, positions: Any, *, fill: bool, unique: bool, backend: str, **_: Any) -> Any:
    """`table[positions]` (rows of a 2-d table), NaN (`fill`) or 0 where a position is -1."""
    inside = (positions >= 0)[..., None]
    if table.shape[0] == 0:
        return jnp.full((*positions.shape, table.shape[1]), _fill(table.dtype, fill))
    read = table[jnp.where(positions >= 0, positions, 0)]
    return jnp.where(inside, read, _fill(table.dtype, fill))


def _gather_on_cpu(
    table: Any, positions: Any, *, fill: bool, unique: bool, backend: str, **_: Any
) -> Any:
    """The back end's row gather where its record has one (and a kernel for these dtypes:
    the C back end's, `codegen/c/gathers.py`), else XLA's."""
    record = table_of_backends.BACKENDS.get(backend)
    if record is not None and record.row_gather is not None:
        flat = positions.reshape(-1)
        found = record.row_gather()(table, flat, fill and jnp.issubdtype(table.dtype, jnp.inexact))
        if found is not None:
            return found.reshape((*positions.shape, table.shape[1]))
    return _gather(table, positions, fill=fill, unique=unique, backend=backend)


mlir.register_lowering(gather_p, mlir.lower_fun(_gather, multiple_results=False))
mlir.register_lowering(
    gather_p, mlir.lower_fun(_gather_on_cpu, multiple_results=False), platform="cpu"
)


def _jvp(primals: Sequence[Any], tangents: Sequence[Any], **params: Any) -> tuple[Any, Any]:
    table, positions = primals
    out = gather_p.bind(table, positions, **params)
    if type(tangents[0]) is ad.Zero:
        return out, ad.Zero(jax.typeof(out).to_tangent_aval())
    return out, gather_p.bind(tangents[0], positions, **{**params, "fill": False})


def _transpose(
    cotangent: Any,
    table: Any,
    positions: Any,
    *,
    fill: bool,
    unique: bool,
    backend: str,
    table_shape: tuple[int, ...] | None,
) -> list[Any]:
    assert ad.is_undefined_primal(table) and not ad.is_undefined_primal(positions)
    aval = table.aval
    if type(cotangent) is ad.Zero:
        return [ad.Zero(aval), None]
    size = aval.shape[0]
    total = scatter.table_cotangent(
        cotangent, positions, size, unique=unique, backend=backend, table_shape=table_shape
    )
    return [total.astype(aval.dtype), None]


def _transpose_total(
    cotangent: Any, rows: Any, positions: Any, *, size: int, backend: str
) -> list[Any]:
    """The transpose of a table's cotangent (`scatter.rows_total_p`): the gather of its
    cotangent, 0 where a position is -1 (grad of grad)."""
    assert ad.is_undefined_primal(rows) and not ad.is_undefined_primal(positions)
    if type(cotangent) is ad.Zero:
        return [ad.Zero(rows.aval), None]
    found = gather_p.bind(
        cotangent, positions, fill=False, unique=False, backend=backend, table_shape=None
    )
    return [found.astype(rows.aval.dtype), None]


ad.primitive_jvps[gather_p] = _jvp
ad.primitive_transposes[gather_p] = _transpose
ad.primitive_transposes[scatter.rows_total_p] = _transpose_total


def _batch(
    args: Sequence[Any], dims: Sequence[Any], *, fill: bool, unique: bool, backend: str, **_: Any
) -> tuple[Any, int]:
    """Batched: the table's own shape is not kept (`table_shape=None`): its transpose
    scatters into the stacked rows."""
    table, positions = args
    table_dim, positions_dim = dims
    params = {"fill": fill, "backend": backend, "table_shape": None}
    if table_dim is None:  # the examples' positions read one table: they may coincide
        found = gather_p.bind(table, positions, unique=False, **params)
        return found, positions_dim
    table = jnp.moveaxis(table, table_dim, 0)
    size, n, width = table.shape
    if positions_dim is None:
        positions = jnp.broadcast_to(positions, (size, *positions.shape))
    else:
        positions = jnp.moveaxis(positions, positions_dim, 0)
    example = jnp.arange(size, dtype=positions.dtype).reshape((size,) + (1,) * (positions.ndim - 1))
    flat = jnp.where(positions >= 0, positions + example * n, -1)
    # each example's positions offset into its own part of the table: distinct as they were
    flat_table = table.reshape(size * n, width)
    return gather_p.bind(flat_table, flat, unique=unique, **params), 0


batching.primitive_batchers[gather_p] = _batch


def range_values(
    ranges: Sequence[Any], extents: Mapping[sympy.Symbol, int]
) -> dict[str, tuple[int, int]]:
    """Every index's `(start, stop)` for these extents."""
    return {
        r.index.name: (int(sympy.sympify(r.start).xreplace(extents)), int(r.stop.xreplace(extents)))
        for r in ranges
    }


def extents_of(shapes: Mapping[str, tuple[int, ...]]) -> dict[sympy.Symbol, int]:
    return {extent_symbol(n, a): int(e) for n, shape in shapes.items() for a, e in enumerate(shape)}


def gathered_shapes(
    lowered: Lowered, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[int, ...]]:
    """The shape of every gathered operand of a statement for these shapes."""
    ranges = range_values(lowered.ranges, extents_of(shapes))
    return {
        g.name: tuple(max(0, ranges[n][1] - ranges[n][0]) for n in g.indices)
        for g in lowered.gathers
    }


def index_dtypes(
    gathers: Sequence[Gather], given: Mapping[str, Any], dtypes: Mapping[str, Any]
) -> dict[str, Any]:
    """`build`'s dtypes: an index array given by its shape alone is int32, not a float."""
    arrays = {n for g in gathers for n in g.arrays}
    return {
        n: jnp.int32 if n in arrays and not hasattr(given[n], "dtype") else d
        for n, d in dtypes.items()
    }


def check_index_dtypes(gathers: Sequence[Gather], values: Mapping[str, Any], source: str) -> None:
    """An index array must hold integers: a float or bool one is a user error."""
    for g in gathers:
        if g.masked:  # a one-hot pick: an equality, which any number takes
            continue
        for name in g.arrays:
            dtype = jnp.result_type(values[name])
            if dtype == jnp.bool_ or not jnp.issubdtype(dtype, jnp.integer):
                span = next(r.span for a in g.axes for r in a.reads if r.array == name)
                raise InputError(
                    f"index array '{name}' has dtype {dtype}; an index must be an integer",
                    source,
                    span,
                    expected=f"an integer array for '{name}' (int32 or int64)",
                    hint=f"pass {name}.astype(jnp.int32) if its values are whole numbers",
                )


def gathered(
    lowered: Lowered,
    values: Mapping[str, Any],
    shapes: Mapping[str, tuple[int, ...]],
    source: str,
    backend: str,
) -> dict[str, Any]:
    """The value of every gathered operand of a statement, by name (see the module
    docstring), from the call's arrays and the shapes of every tensor its ranges name;
    `backend` names the back end whose nests read them (its row scatter, where it has one,
    sums their transposes on the CPU: `tensordsl.binding.scatter`)."""
    extents = extents_of(shapes)
    ranges = range_values(lowered.ranges, extents)
    return {g.name: _gathered(g, values, ranges, extents, source, backend) for g in lowered.gathers}


def _row_axes(g: Gather, ranges: Mapping[str, tuple[int, int]], shape: Sequence[int]) -> int:
    """How many trailing axes of the table the gather reads whole (`d` in `W[tok[b,t], d]`):
    each indexed by a bare index over all of it, found nowhere else in the access, in the
    same order at the end of the gathered operand's indices. The gather then moves rows
    of that many axes, and its transpose sorts rows, not elements."""
    count = 0
    for m in range(1, min(len(g.axes), len(g.indices)) + 1):
        axis = g.axes[-m]
        bare = axis.affine.bare_index
        if axis.reads or bare is None or g.indices[-m] != bare.name:
            break
        elsewhere = [
            i
            for other in g.axes[: len(g.axes) - m]
            for i in (
                *other.affine.indices,
                *(x for r in other.reads for a in r.axes for x in a.indices),
            )
        ]
        if bare in elsewhere or ranges[bare.name] != (0, shape[-m]):
            break
        count = m
    return count


def _gathered(
    g: Gather,
    values: Mapping[str, Any],
    ranges: Mapping[str, tuple[int, int]],
    extents: Mapping[sympy.Symbol, int],
    source: str,
    backend: str,
) -> Any:
    table = values[g.table]
    whole = _row_axes(g, ranges, table.shape)
    spans = [max(0, ranges[n][1] - ranges[n][0]) for n in g.indices]
    lead = len(g.indices) - whole  # the indices of the rows' positions
    grid = {
        index_symbol(n): (
            jnp.arange(ranges[n][0], ranges[n][0] + e).reshape(
                (1,) * d + (e,) + (1,) * (lead - d - 1)
            )
        )
        for d, (n, e) in enumerate(zip(g.indices[:lead], spans[:lead]))
    }

    def value_of(affine: Any) -> Any:
        total = jnp.asarray(int(sympy.sympify(affine.constant).xreplace(extents)), flat.dtype)
        for symbol, coefficient in affine.coefficients:
            total = total + coefficient * grid[symbol].astype(flat.dtype)
        return jnp.broadcast_to(total, tuple(spans[:lead]))

    valid = jnp.ones(tuple(spans[:lead]), bool)
    flat = jnp.zeros(tuple(spans[:lead]), jax.dtypes.canonicalize_dtype(jnp.int64))
    # Eager only where no input is traced: under grad (the table or any input traced) an index
    # outside the table reads NaN, as under jit and vmap (docs/language.md).
    concrete = not any(isinstance(v, jax.core.Tracer) for v in values.values())
    for axis, gathered_axis in enumerate(g.axes[: len(g.axes) - whole]):
        n = table.shape[axis]
        bound = _bound(gathered_axis.affine, ranges, extents)
        if not positions.fits_positions(bound, n, flat.dtype):
            _too_large(g, axis, bound, flat.dtype, source)
        base, terms = value_of(gathered_axis.affine), []
        for read in gathered_axis.reads:
            array = values[read.array]
            concrete = concrete and not isinstance(array, jax.core.Tracer)
            at = tuple(
                jnp.clip(value_of(a), 0, max(n - 1, 0)) for a, n in zip(read.axes, array.shape)
            )
            terms.append(
                (read.coefficient, _whole_or_outside(array[at]) if g.masked else array[at])
            )
        position, inside = positions.axis_position(base, bound, terms, n, flat.dtype)
        # Under a trace every value computed here is staged, concrete arrays' included.
        concrete = concrete and not isinstance(inside, jax.core.Tracer)
        if gathered_axis.reads and concrete and not g.masked:
            starts = [ranges[name][0] for name in g.indices]
            _check_inside(g, axis, (base, terms), inside, n, starts, source)
        valid = valid & inside
        flat = flat * n + jnp.where(inside, position, 0).astype(flat.dtype)
    rows_at = jnp.where(valid, flat, -1)
    width = int(np.prod(table.shape[len(table.shape) - whole :], dtype=np.int64))
    count = int(np.prod(table.shape[: len(table.shape) - whole], dtype=np.int64))
    rows = table.reshape(count, width)
    rows, rows_at = private_jax.same_varying_axes([rows, rows_at])
    unique = _distinct(g, lead)
    found = gather_p.bind(
        rows,
        rows_at,
        fill=not g.masked,
        unique=unique,
        backend=backend,
        table_shape=tuple(table.shape),
    )
    return found.reshape(tuple(spans))


def _distinct(g: Gather, lead: int) -> bool:
    """Whether the positions of the gather are distinct by construction: each index of the
    rows' positions (the first `lead` of the gathered operand's) is the bare index of an
    axis of the table read without an index array. Two elements with the same position have
    the same value on that axis, so the same index: the same element."""
    direct = {
        axis.affine.bare_index.name
        for axis in g.axes[: len(g.axes) - (len(g.indices) - lead)]
        if not axis.reads and axis.affine.bare_index is not None
    }
    return all(name in direct for name in g.indices[:lead])


def _whole_or_outside(values: Any) -> Any:
    """An index array of a one-hot pick as positions: a float that is a whole number in
    int32's range picks it, any other (a fraction, NaN, inf) equals no index: -1, outside."""
    if jnp.issubdtype(values.dtype, jnp.integer):
        return values
    if values.dtype == jnp.bool_:
        return values.astype(jnp.int32)
    whole = (values == jnp.floor(values)) & (jnp.abs(values) < 2**31 - 1)
    return jnp.where(whole, values, -1)


def _bound(
    affine: Any, ranges: Mapping[str, tuple[int, int]], extents: Mapping[sympy.Symbol, int]
) -> int:
    """The largest magnitude of `affine` over the ranges of its indices."""
    total = abs(int(sympy.sympify(affine.constant).xreplace(extents)))
    for symbol, coefficient in affine.coefficients:
        start, stop = ranges[symbol.name]
        total += abs(coefficient) * max(abs(start), abs(stop - 1), 0)
    return total


def _too_large(g: Gather, axis: int, bound: int, dtype: Any, source: str) -> None:
    kind = np.dtype(dtype).name
    raise UnsupportedError(
        f"the position on axis {axis} of '{g.table}' reaches {bound} in magnitude before its "
        f"index arrays are added, too large for the {kind} positions JAX computes in",
        source,
        g.span,
        expected=f"index arithmetic well inside {kind}",
        hint="enable 64-bit integers with jax.config.update('jax_enable_x64', True)"
        if kind == "int32"
        else None,
    )


def _check_inside(
    g: Gather, axis: int, parts: Any, inside: Any, n: int, starts: list[int], source: str
) -> None:
    """Eagerly, an index array that points outside the table is a `RangeError` naming the
    true position; `parts` are the affine part's values and the index-array terms."""
    bad = ~np.asarray(inside)
    if not bad.any():
        return
    where = tuple(int(w[0]) for w in np.nonzero(bad))
    gathered_axis = g.axes[axis]
    named = {i.name for i in gathered_axis.affine.indices} | {
        i.name for r in gathered_axis.reads for a in r.axes for i in a.indices
    }
    at = ", ".join(
        f"{name}={w + s}" for name, w, s in zip(g.indices, where, starts) if name in named
    )
    value = positions.exact_position(*parts, where)  # the true value: nothing wrapped
    arrays = ", ".join(f"'{a}'" for a in g.arrays)
    why = f"outside [0, {n})"
    if 0 <= value < n:  # terms that cancel, each too large (tensordsl/binding/positions.py)
        kind = np.dtype(parts[0].dtype).name
        why = f"from terms too large for {kind} positions (each must fit its share)"
    raise RangeError(
        f"index array {arrays} points to {value} on axis {axis} of '{g.table}' (at {at}), {why}",
        source,
        g.span,
        expected=f"index values inside [0, {n}) for axis {axis} of '{g.table}'",
        hint="under jax.jit an index outside the table reads NaN instead",
    )
