"""A `TileProgram` as a Pallas kernel function (Triton-style: tiles are values in registers).

Each program instance computes one output tile. A term's tile space is the output tile's
axes then the term's reduced tile axes; every index is a broadcast `iota` over its axis
plus the tile's offset, so an access is a gather from the operand's whole array (clipped:
masked-out positions may address outside it, as in the reference) and the body is the
reference back end's `Evaluator` run on tiles. Loops over reduced tiles are `fori_loop`s
bounded per output tile (`codegen.tiles.program.LoopBound`); the `where` of constraints,
guards and partial tiles runs under a `cond` on boundary tiles only. A dot term loads a
`[rows x reduced]` and a `[reduced x columns]` tile and accumulates `api.dot`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import sympy

from codegen.ir.affine import NotAffine, as_affine
from codegen.ir.reductions import REDUCTIONS
from codegen.tiles.program import TermTiles, TileAxis, TileProgram
from tensordsl.backends.pallas import api
from tensordsl.backends.reference import Evaluator


class TileEvaluator(Evaluator):
    """The reference's evaluator on tiles: operands are Pallas refs, read by gathers."""

    def access(self, access: sympy.Indexed) -> jax.Array:
        ref = self.operands[access.base.name]
        indices = [
            jnp.clip(jnp.asarray(self(i), jnp.int32), 0, n - 1)
            for i, n in zip(access.indices, ref.shape)
        ]
        shape = jnp.broadcast_shapes(*(jnp.shape(i) for i in indices))
        value = ref[tuple(jnp.broadcast_to(i, shape) for i in indices)]
        if jnp.issubdtype(value.dtype, jnp.floating):
            value = value.astype(self.dtype)
        return value

    def nested(self, node: Any) -> Any:
        raise AssertionError("tile_program refuses nested reductions")


def _iota(offset: Any, tile: int, rank: int, axis: int) -> jax.Array:
    shape = [1] * rank
    shape[axis] = tile
    return offset + jax.lax.broadcasted_iota(jnp.int32, tuple(shape), axis)


def _identity(name: str, dtype: Any) -> jax.Array:
    return jnp.asarray(REDUCTIONS[name].identity, dtype)


def _fold(name: str, values: jax.Array, axes: tuple[int, ...], state: Any) -> Any:
    """Fold one tile of values (reduced over `axes`) into the reduction state."""
    if name == "sum":
        return state + values.sum(axis=axes)
    if name == "max":
        return jnp.maximum(state, values.max(axis=axes))
    if name == "min":
        return jnp.minimum(state, values.min(axis=axes))
    if name == "prod":
        return state * values.prod(axis=axes)
    # logsumexp: the running peak and the sum of exponentials below it.
    peak, total = state
    new_peak = jnp.maximum(peak, values.max(axis=axes))
    safe = jnp.where(jnp.isinf(new_peak), 0.0, new_peak)
    grown = jnp.expand_dims(safe, axes) if axes else safe
    total = total * jnp.exp(peak - safe) + jnp.exp(values - grown).sum(axis=axes)
    return new_peak, total


def _start(name: str, shape: tuple[int, ...], dtype: Any) -> Any:
    if name == "logsumexp":
        return jnp.full(shape, -jnp.inf, dtype), jnp.zeros(shape, dtype)
    return jnp.full(shape, _identity(name, dtype), dtype)


def _finish(name: str, state: Any) -> jax.Array:
    if name == "logsumexp":
        peak, total = state
        return jnp.where(jnp.isinf(peak), peak, peak + jnp.log(total))
    return state


def kernel_function(program: TileProgram, precision: Any = None) -> Callable[..., None]:
    """The Pallas kernel of `program`: `kernel(*operand refs, output ref)`; scalar operands
    come as one-element arrays."""
    return functools.partial(_kernel, program, precision)


def _kernel(program: TileProgram, precision: Any, *refs: Any) -> None:
    *inputs, out_ref = refs
    nest = program.nest
    operands = {op.name: ref[0] if op.is_scalar else ref for op, ref in zip(nest.operands, inputs)}
    starts = [a.start + api.program_id(n) * a.tile for n, a in enumerate(program.grid)]
    block = tuple(a.tile for a in program.grid)
    result = None
    for term in program.terms:
        lower = _TermLowering(program, term, operands, starts, precision)
        value = lower.dot_value() if term.dot is not None else lower.value()
        value = jnp.broadcast_to(value, block)
        result = value if result is None else result + value
    assert result is not None
    out_ref[...] = result.reshape(program.block).astype(out_ref.dtype)


class _TermLowering:
    """The tile code of one term in one program instance."""

    def __init__(
        self,
        program: TileProgram,
        term: TermTiles,
        operands: Mapping[str, Any],
        starts: list[Any],
        precision: Any,
    ) -> None:
        self.program, self.term, self.operands = program, term, operands
        self.starts, self.precision = starts, precision
        self.dtype = jnp.dtype(program.accumulate)
        self.extents = dict(program.extents)
        self.rank = len(program.grid) + len(term.reduced)

    def evaluator(self, points: dict[sympy.Symbol, Any]) -> TileEvaluator:
        return TileEvaluator(points, self.operands, self.extents, self.dtype)

    def free_points(self) -> dict[sympy.Symbol, Any]:
        return {
            a.index: _iota(s, a.tile, self.rank, n)
            for n, (a, s) in enumerate(zip(self.program.grid, self.starts))
        }

    # ------------------------------------------------------------------ elementwise terms
    def value(self) -> jax.Array:
        name = self.program.reduction
        shape = tuple(a.tile for a in self.program.grid)
        axes = tuple(range(len(self.program.grid), self.rank))

        def step(offsets: tuple[Any, ...], state: Any) -> Any:
            values = self.tile(offsets)
            return _fold(name, values, axes, state)

        state = self.loops(step, _start(name, shape, self.dtype))
        return _finish(name, state)

    def tile(self, offsets: tuple[Any, ...]) -> jax.Array:
        """The body on one tile, the reduction's identity where it does not count."""
        points = self.free_points()
        base = len(self.program.grid)
        for n, (axis, offset) in enumerate(zip(self.term.reduced, offsets)):
            points[axis.index] = _iota(offset, axis.tile, self.rank, base + n)
        evaluate = self.evaluator(points)
        shape = tuple(a.tile for a in (*self.program.grid, *self.term.reduced))
        body = jnp.broadcast_to(jnp.asarray(evaluate(self.term.term.body), self.dtype), shape)
        if not self.term.masked:
            return body
        identity = _identity(self.program.reduction, self.dtype)

        def masked(body: jax.Array) -> jax.Array:
            mask = jnp.asarray(evaluate(self.term.term.guard), bool)
            for constraint in self.term.term.constraints:
                mask = mask & (jnp.asarray(evaluate(constraint)) >= 0)
            for axis in self.term.reduced:
                mask = mask & (points[axis.index] < axis.start + axis.extent)
            return jnp.where(mask, body, identity)

        interior = self.interior(offsets)
        if interior is None:
            return masked(body)
        return jax.lax.cond(interior, lambda b: b, masked, body)

    def interior(self, offsets: tuple[Any, ...]) -> Any:
        """Whether no `where` is needed on this tile (None: always needed)."""
        term = self.term.term
        if term.guard is not sympy.true:
            return None
        box = self.box(offsets)
        inside = jnp.asarray(True)
        for axis, offset in zip(self.term.reduced, offsets):
            inside = inside & (offset + axis.tile <= axis.start + axis.extent)
        for constraint in term.constraints:
            least = _least(constraint.xreplace(self.extents), box)
            if least is None:
                return None
            inside = inside & (least >= 0)
        return inside

    def box(self, offsets: tuple[Any, ...]) -> dict[sympy.Symbol, tuple[Any, Any]]:
        """Each loop index's first and last value on this tile."""
        box = {a.index: (s, s + a.tile - 1) for a, s in zip(self.program.grid, self.starts)}
        for axis, offset in zip(self.term.reduced, offsets):
            box[axis.index] = (offset, offset + axis.tile - 1)
        return box

    def loops(self, step: Callable[[tuple[Any, ...], Any], Any], state: Any) -> Any:
        """`step(offsets, state)` over every tile of the reduced indices, within bounds."""
        reduced = self.term.reduced

        def nest(level: int, offsets: tuple[Any, ...], state: Any) -> Any:
            if level == len(reduced):
                return step(offsets, state)
            axis = reduced[level]
            first, stop = self.tile_range(axis)

            def body(n: Any, state: Any) -> Any:
                return nest(level + 1, (*offsets, axis.start + n * axis.tile), state)

            return jax.lax.fori_loop(first, stop, body, state)

        return nest(0, (), state)

    def tile_range(self, axis: TileAxis) -> tuple[Any, Any]:
        """The first and past-the-last tile of `axis` this output tile needs."""
        first: Any = 0
        stop: Any = axis.count
        box = {a.index: (s, s + a.tile - 1) for a, s in zip(self.program.grid, self.starts)}
        for bound in self.term.bounds:
            if bound.index != axis.index:
                continue
            most = _most(bound.rest, box)  # the largest `rest` over the output tile
            c = bound.coefficient
            if c > 0:  # index >= ceil(-rest / c): from the least such index's tile
                lowest = -jnp.floor_divide(most, c)
                first = jnp.maximum(first, jnp.floor_divide(lowest - axis.start, axis.tile))
            else:  # index <= floor(rest / -c)
                highest = jnp.floor_divide(most, -c)
                stop = jnp.minimum(stop, jnp.floor_divide(highest - axis.start, axis.tile) + 1)
        first = jnp.asarray(first, jnp.int32)
        return first, jnp.maximum(first, jnp.asarray(stop, jnp.int32))

    # ------------------------------------------------------------------ dot terms
    def dot_value(self) -> jax.Array:
        dot = self.term.dot
        assert dot is not None
        grid = self.program.grid
        rows, columns = grid[-2], grid[-1]
        row_start, column_start = self.starts[-2], self.starts[-1]
        (axis,) = self.term.reduced
        single = {a.index: jnp.asarray(s) for a, s in zip(grid[:-2], self.starts[:-2])}

        def step(offsets: tuple[Any, ...], total: jax.Array) -> jax.Array:
            (offset,) = offsets
            k_row = _iota(offset, axis.tile, 2, 1)
            left_points = {**single, rows.index: _iota(row_start, rows.tile, 2, 0)}
            left = self.evaluator({**left_points, dot.reduced: k_row})(dot.left)
            left = jnp.broadcast_to(jnp.asarray(left, self.dtype), (rows.tile, axis.tile))
            if axis.partial:
                left = jnp.where(k_row < axis.start + axis.extent, left, 0)
            right_points = {**single, columns.index: _iota(column_start, columns.tile, 2, 1)}
            k_column = _iota(offset, axis.tile, 2, 0)
            right = self.evaluator({**right_points, dot.reduced: k_column})(dot.right)
            right = jnp.broadcast_to(jnp.asarray(right, self.dtype), (axis.tile, columns.tile))
            product = api.dot(left, right, self.precision)
            return total + product.astype(self.dtype)

        total = self.loops(step, jnp.zeros((rows.tile, columns.tile), self.dtype))
        scale = self.evaluator(self.free_points())(dot.scale)
        block = tuple(a.tile for a in grid)
        return jnp.asarray(scale, self.dtype) * total.reshape(block)


def _corner(expr: sympy.Expr, box: Mapping[sympy.Symbol, tuple[Any, Any]], most: bool) -> Any:
    """The least (or largest) value of the affine `expr` over `box`; None if not affine."""
    try:
        form = as_affine(expr, tuple(box))
    except NotAffine:
        return None
    if not form.constant.is_Integer:
        return None
    value: Any = jnp.asarray(int(form.constant), jnp.int32)
    for index, c in form.coefficients:
        lo, hi = box[index]
        value = value + c * (hi if (c > 0) == most else lo)
    return value


def _least(expr: sympy.Expr, box: Mapping[sympy.Symbol, tuple[Any, Any]]) -> Any:
    return _corner(expr, box, most=False)


def _most(expr: sympy.Expr, box: Mapping[sympy.Symbol, tuple[Any, Any]]) -> Any:
    found = _corner(expr, box, most=True)
    assert found is not None, "tile_program keeps only affine bounds"
    return found
