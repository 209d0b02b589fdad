"""The transpose of a gather: a table's cotangent, each row the sum of the cotangents of
the elements read from it, the same bits on every call (`tensordsl/binding/gather.py`).

`rows_total_p` (rows, positions -> the table's cotangent) is lowered per platform:

* on the CPU, one scatter-add in the order of the positions, deterministic because it is
  serial: the back end's own row scatter where its record has one (`Backend.row_scatter`:
  the C back end's, `codegen/c/gathers.py`, the same bits as XLA's, faster and steadier on a
  busy machine), else XLA's
  scatter-add (`scatter_total`), which also runs serially on the CPU;
* elsewhere (GPUs, where a scatter-add is atomic and its order varies) without atomics: the
  positions sorted once (a stable argsort), a segmented scan summing each run of equal
  positions in a fixed order, the end of each run written to its row (`segment_total`).

Positions distinct by construction (`unique`) need no sum: each cotangent row is written to
its row as it is (`scatter_distinct`). `rows_total_p` is linear in the rows: its tangent is
itself on the tangent rows, its transpose the gather of the cotangent
(`tensordsl/binding/gather.py` registers it, beside `gather_p`); batched, the examples'
tables are stacked into one, the positions offset per example.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.interpreters import ad, batching, mlir

from tensordsl.backends import table
from tensordsl.binding import private_jax


def _shape(rows: Any, positions: Any, *, size: int, backend: str) -> tuple[int, ...]:
    return (size, rows.shape[1])


def _dtype(rows: Any, positions: Any, **_: Any) -> Any:
    return rows.dtype


def _sharding(rows: Any, positions: Any, **_: Any) -> Any:
    return rows.sharding.update(spec=jax.sharding.PartitionSpec(None, None))


#: `rows_total_p(rows, positions, size=, backend=)`: `rows` (`count x width`) summed into
#: `size` rows, row `i` into row `positions[i]` (-1: nowhere), for the nests of `backend`.
rows_total_p = private_jax.primitive("tensordsl_rows_total", _shape, _dtype, _sharding)


def table_cotangent(
    cotangent: Any,
    positions: Any,
    size: int,
    *,
    unique: bool,
    backend: str,
    table_shape: tuple[int, ...] | None = None,
) -> Any:
    """The cotangent of a table of `size` rows read at `positions` (-1: read outside, adds
    nothing), from the `cotangent` of what was read (the shape of `positions` and one more
    axis, a row), summed as the module docstring says for the back end named `backend`.
    `table_shape`: the table's own shape, whose leading axes were flattened into the `size`
    rows (None: unknown); distinct positions are scattered into it (`scatter_distinct`).

    >>> rows = jnp.array([[1.0], [2.0], [4.0], [8.0]])
    >>> at = jnp.array([2, 0, 2, -1])
    >>> table_cotangent(rows, at, 4, unique=False, backend="reference").tolist()
    [[2.0], [0.0], [5.0], [0.0]]
    """
    if unique:
        return scatter_distinct(cotangent, positions, size, table_shape)
    width = cotangent.shape[-1]
    rows, at = private_jax.same_varying_axes([cotangent.reshape(-1, width), positions.reshape(-1)])
    return rows_total_p.bind(rows, at, size=size, backend=backend)


def _on_cpu(rows: Any, positions: Any, *, size: int, backend: str) -> Any:
    """The back end's row scatter, else (or for dtypes it has no kernel for) XLA's."""
    record = table.BACKENDS.get(backend)
    if record is not None and record.row_scatter is not None:
        found = record.row_scatter()(rows, positions, size)
        if found is not None:
            return found
    return scatter_total(rows, positions, size)


def _elsewhere(rows: Any, positions: Any, *, size: int, backend: str) -> Any:
    return segment_total(rows, positions, size)


mlir.register_lowering(rows_total_p, mlir.lower_fun(_elsewhere, multiple_results=False))
mlir.register_lowering(
    rows_total_p, mlir.lower_fun(_on_cpu, multiple_results=False), platform="cpu"
)


def _jvp(
    primals: Sequence[Any], tangents: Sequence[Any], *, size: int, backend: str
) -> tuple[Any, Any]:
    rows, positions = primals
    out = rows_total_p.bind(rows, positions, size=size, backend=backend)
    if type(tangents[0]) is ad.Zero:
        return out, ad.Zero(jax.typeof(out).to_tangent_aval())
    return out, rows_total_p.bind(tangents[0], positions, size=size, backend=backend)


ad.primitive_jvps[rows_total_p] = _jvp


def _batch(args: Sequence[Any], dims: Sequence[Any], *, size: int, backend: str) -> tuple[Any, int]:
    """Examples' tables stacked into one of `examples * size` rows, each example's
    positions offset into its own part (-1 stays -1)."""
    rows, positions = args
    examples = next(a.shape[d] for a, d in zip(args, dims) if d is not None)
    rows = (
        jnp.broadcast_to(rows, (examples, *rows.shape))
        if dims[0] is None
        else jnp.moveaxis(rows, dims[0], 0)
    )
    positions = (
        jnp.broadcast_to(positions, (examples, *positions.shape))
        if dims[1] is None
        else jnp.moveaxis(positions, dims[1], 0)
    )
    offset = (jnp.arange(examples, dtype=positions.dtype) * size)[:, None]
    flat = jnp.where(positions >= 0, positions + offset, -1).reshape(-1)
    width = rows.shape[-1]
    total = rows_total_p.bind(rows.reshape(-1, width), flat, size=examples * size, backend=backend)
    return total.reshape(examples, size, width), 0


batching.primitive_batchers[rows_total_p] = _batch


def segment_total(cotangent: Any, positions: Any, size: int) -> Any:
    """`out[r] = sum of the rows of cotangent where positions == r`, deterministic, without a
    scatter: `cotangent` has the shape of `positions` and one more axis (a row).

    >>> rows = jnp.array([[1.0], [2.0], [4.0], [8.0]])
    >>> segment_total(rows, jnp.array([2, 0, 2, -1]), 4).tolist()
    [[2.0], [0.0], [5.0], [0.0]]
    """
    width = cotangent.shape[-1]
    positions, cotangent = positions.reshape(-1), cotangent.reshape(-1, width)
    if positions.size == 0:
        return jnp.zeros((size, width), cotangent.dtype)
    order = jnp.argsort(positions, stable=True)
    keys, values = positions[order], cotangent[order]
    starts = jnp.concatenate([jnp.ones((1,), bool), keys[1:] != keys[:-1]])[:, None]

    def add(a: Any, b: Any) -> Any:  # a segmented sum: a run restarts where b starts one
        return a[0] | b[0], jnp.where(b[0], b[1], a[1] + b[1])

    _, sums = jax.lax.associative_scan(add, (jnp.broadcast_to(starts, values.shape), values))
    # The end of each run holds its total: written to its row, each row at most once (the
    # ends' keys are distinct), positions outside the table (-1) dropped.
    ends = jnp.concatenate([keys[1:] != keys[:-1], jnp.ones((1,), bool)])
    target = jnp.where(ends & (keys >= 0) & (keys < size), keys, size)
    out = jnp.zeros((size, width), cotangent.dtype)
    return out.at[target].set(sums, mode="drop", unique_indices=True)


def scatter_distinct(
    cotangent: Any, positions: Any, size: int, table_shape: tuple[int, ...] | None = None
) -> Any:
    """`segment_total` where no two positions inside `[0, size)` are equal: each row added
    to a zero row at its position (nothing to sum), the others dropped.

    With the table's own shape (`table_shape`, its leading axes flattened into the `size`
    rows), the rows are scattered into a zero table of that shape, the positions unravelled
    over its leading axes, and the result flattened as the rows are. Reshaped back, the
    scatter then meets the table's other cotangents directly, and XLA rewrites
    `other + scatter-add(zeros)` as one scatter-add into `other`, in place: no zero table
    written, no second pass to add it.

    >>> rows = jnp.array([[1.0], [2.0], [4.0]])
    >>> scatter_distinct(rows, jnp.array([2, -1, 0]), 4).tolist()
    [[4.0], [0.0], [1.0], [0.0]]
    >>> scatter_distinct(rows, jnp.array([3, -1, 0]), 4, (2, 2)).tolist()
    [[4.0], [0.0], [0.0], [1.0]]
    """
    width = cotangent.shape[-1]
    positions, cotangent = positions.reshape(-1), cotangent.reshape(-1, width)
    inside = (positions >= 0) & (positions < size)
    lead = _leading_axes(table_shape, size, width)
    if lead is None:
        target = jnp.where(inside, positions, size)
        out = jnp.zeros((size, width), cotangent.dtype)
        return out.at[target].add(cotangent, mode="drop", unique_indices=True)
    shape = tuple(table_shape)
    at = list(jnp.unravel_index(jnp.where(inside, positions, 0), shape[:lead]))
    at[0] = jnp.where(inside, at[0], shape[0])  # outside the table: dropped
    rows = cotangent.reshape((-1, *shape[lead:]))
    out = jnp.zeros(shape, cotangent.dtype)
    out = out.at[tuple(at)].add(rows, mode="drop", unique_indices=True)
    return out.reshape(size, width)


def _leading_axes(table_shape: tuple[int, ...] | None, size: int, width: int) -> int | None:
    """How many leading axes of `table_shape` were flattened into `size` rows of `width`
    (the fewest that multiply to `size`), or None: no shape, an empty table, or no split."""
    if table_shape is None or size == 0 or width == 0:
        return None
    product = 1
    for count, extent in enumerate(table_shape, start=1):
        product *= extent
        if product == size:
            rest = int(np.prod(table_shape[count:], dtype=np.int64))
            return count if rest == width else None
    return None


def scatter_total(cotangent: Any, positions: Any, size: int) -> Any:
    """`segment_total` as one scatter-add in the order of the positions: deterministic where
    the scatter runs serially (XLA's CPU scatter), so used on the CPU only.

    >>> rows = jnp.array([[1.0], [2.0], [4.0], [8.0]])
    >>> scatter_total(rows, jnp.array([2, 0, 2, -1]), 4).tolist()
    [[2.0], [0.0], [5.0], [0.0]]
    """
    width = cotangent.shape[-1]
    positions, cotangent = positions.reshape(-1), cotangent.reshape(-1, width)
    target = jnp.where((positions >= 0) & (positions < size), positions, size)
    out = jnp.zeros((size, width), cotangent.dtype)
    return out.at[target].add(cotangent, mode="drop")
