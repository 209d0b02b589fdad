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
import numpy as np
import sympy

from codegen.ir.affine import NotAffine, as_affine
from codegen.ir.extents import evaluate_int
from codegen.ir.magnitude import index_magnitude
from codegen.ir.reductions import REDUCTIONS
from codegen.tiles.program import TermTiles, TileAxis, TileProgram
from tensordsl.backends.pallas import api
from tensordsl.backends.pallas.reductions import TILE_REDUCTIONS
from tensordsl.backends.reference import Evaluator
from tensordsl.errors import UnsupportedError


class TileEvaluator(Evaluator):
    """The reference's evaluator on tiles: operands are Pallas refs, read by gathers; loop
    indices are `index_dtype` (`index_dtype(program)`)."""

    index_dtype: Any = jnp.int32

    def access(self, access: sympy.Indexed) -> jax.Array:
        value = self.load(access)
        if jnp.issubdtype(value.dtype, jnp.floating):
            value = value.astype(self.dtype)
        return value

    def load(self, access: sympy.Indexed) -> jax.Array:
        """The tile of `access` in the operand's own dtype."""
        ref = self.operands[access.base.name]
        indices = [
            jnp.clip(jnp.asarray(self(i), self.index_dtype), 0, n - 1).astype(jnp.int32)
            for i, n in zip(access.indices, ref.shape)
        ]
        shape = jnp.broadcast_shapes(*(jnp.shape(i) for i in indices))
        return ref[tuple(jnp.broadcast_to(i, shape) for i in indices)]

    def nested(self, node: Any) -> Any:
        """A nested reduction over its whole range at once, on one more (last) axis, padded
        to a power of two (`tile_program` bounds its length)."""
        start, stop = (evaluate_int(x, self.extents) for x in (node.start, node.stop))
        length = max(0, stop - start)
        padded = 1 << max(0, length - 1).bit_length()
        rank = max((jnp.ndim(a) for a in self.grid.values()), default=0) + 1
        points = {s: jnp.expand_dims(a, -1) for s, a in self.grid.items()}
        points[node.index] = _iota(start, padded, rank, rank - 1, self.index_dtype)
        inner = TileEvaluator(points, self.operands, self.extents, self.dtype)
        inner.index_dtype = self.index_dtype
        body = jnp.asarray(inner(node.body), self.dtype)
        shape = jnp.broadcast_shapes(jnp.shape(body), jnp.shape(points[node.index]))
        body = jnp.broadcast_to(body, shape)
        mask = jnp.broadcast_to(points[node.index] < stop, shape)
        rule = TILE_REDUCTIONS[node.reduction]
        state = rule.start(shape[:-1], self.dtype)
        positions = jnp.broadcast_to(points[node.index] - start, shape)
        return rule.finish(rule.fold(body, mask, positions, (rank - 1,), state))


def _iota(offset: Any, tile: int, rank: int, axis: int, dtype: Any = jnp.int32) -> jax.Array:
    shape = [1] * rank
    shape[axis] = tile
    return jnp.asarray(offset, dtype) + jax.lax.broadcasted_iota(dtype, tuple(shape), axis)


def index_dtype(program: TileProgram) -> Any:
    """int32, or int64 where the index arithmetic (offsets, range starts, the arguments of
    mod and clamp) leaves int32 (`codegen.ir.magnitude`): `X[mod(i + 2^40)]` wrapped."""
    largest = index_magnitude(program.nest, dict(program.extents))
    if largest <= np.iinfo(np.int32).max:
        return jnp.int32
    if jax.dtypes.canonicalize_dtype(np.int64) != np.int64:  # no jax_enable_x64
        raise UnsupportedError(
            f"the pallas back end computes '{program.nest.output}' with index values of "
            f"magnitude up to {largest}, beyond JAX's 32-bit integers",
            expected="jax.config.update('jax_enable_x64', True), or backend='c'",
        )
    return jnp.int64


def _identity(name: str, dtype: Any) -> jax.Array:
    return jnp.asarray(REDUCTIONS[name].identity, dtype)


def kernel_function(program: TileProgram, precision: Any = None) -> Callable[..., None]:
    """The Pallas kernel of `program`: `kernel(*operand refs, output ref)`; scalar operands
    come as one-element arrays."""
    return functools.partial(_kernel, program, precision)


def _kernel(program: TileProgram, precision: Any, *refs: Any) -> None:
    *inputs, out_ref = refs
    nest = program.nest
    operands = {op.name: ref[0] if op.is_scalar else ref for op, ref in zip(nest.operands, inputs)}
    wide = index_dtype(program)
    starts = [
        jnp.asarray(a.start, wide) + api.program_id(n).astype(wide) * a.tile
        for n, a in enumerate(program.grid)
    ]
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
        self.index = index_dtype(program)

    def evaluator(self, points: dict[sympy.Symbol, Any]) -> TileEvaluator:
        evaluator = TileEvaluator(points, self.operands, self.extents, self.dtype)
        evaluator.index_dtype = self.index
        return evaluator

    def iota(self, offset: Any, tile: int, rank: int, axis: int) -> jax.Array:
        return _iota(offset, tile, rank, axis, self.index)

    def free_points(self, rank: int | None = None) -> dict[sympy.Symbol, Any]:
        """Each free index on the output tile, over `rank` axes (default: the term's)."""
        return {
            a.index: self.iota(s, a.tile, rank or self.rank, n)
            for n, (a, s) in enumerate(zip(self.program.grid, self.starts))
        }

    # ------------------------------------------------------------------ elementwise terms
    def value(self) -> jax.Array:
        name = self.program.reduction
        rule = TILE_REDUCTIONS[name]
        positional = REDUCTIONS[name].positional
        shape = tuple(a.tile for a in self.program.grid)
        axes = tuple(range(len(self.program.grid), self.rank))

        def step(offsets: tuple[Any, ...], state: Any) -> Any:
            points = self.tile_points(offsets)
            evaluate = self.evaluator(points)
            full = tuple(a.tile for a in (*self.program.grid, *self.term.reduced))
            body = jnp.broadcast_to(jnp.asarray(evaluate(self.term.term.body), self.dtype), full)
            if not positional:
                return rule.fold(self.where(body, points, offsets), None, None, axes, state)
            mask = self.mask(points) if self.term.masked else None
            return rule.fold(body, mask, self.positions(points), axes, state)

        return rule.finish(self.loops(step, rule.start(shape, self.dtype)))

    def tile_points(self, offsets: tuple[Any, ...]) -> dict[sympy.Symbol, Any]:
        """Every loop index over the tile space of the reduced tiles at `offsets`."""
        points = self.free_points()
        base = len(self.program.grid)
        for n, (axis, offset) in enumerate(zip(self.term.reduced, offsets)):
            points[axis.index] = self.iota(offset, axis.tile, self.rank, base + n)
        return points

    def positions(self, points: Mapping[sympy.Symbol, Any]) -> Any:
        """Each value's flat position over the reduced ranges (row-major, from 0)."""
        position: Any = jnp.asarray(0, jnp.int32)
        for axis in self.term.reduced:
            position = position * axis.extent + (points[axis.index] - axis.start)
        return position

    def mask(self, points: Mapping[sympy.Symbol, Any]) -> Any:
        """Where the values of a tile count: guard, constraints, inside the ranges."""
        evaluate = self.evaluator(dict(points))
        mask = jnp.asarray(evaluate(self.term.term.guard), bool)
        for constraint in self.term.term.constraints:
            mask = mask & (jnp.asarray(evaluate(constraint)) >= 0)
        for axis in self.term.reduced:
            mask = mask & (points[axis.index] < axis.start + axis.extent)
        return mask

    def where(self, body: jax.Array, points: Any, offsets: tuple[Any, ...]) -> jax.Array:
        """The body with the reduction's identity where it does not count, computed on
        boundary tiles only."""
        if not self.term.masked:
            return body
        identity = _identity(self.program.reduction, self.dtype)

        def masked(body: jax.Array) -> jax.Array:
            return jnp.where(self.mask(points), body, identity)

        interior = self.interior(offsets)
        if interior is None:
            return masked(body)
        return jax.lax.cond(interior, lambda b: b, masked, body)

    def interior(self, offsets: tuple[Any, ...], *, reduced: bool = True) -> Any:
        """Whether no `where` is needed on this tile (None: always needed); `reduced=False`:
        on the output tile (a dot's result), whatever the reduced tiles."""
        term = self.term.term
        if term.guard is not sympy.true:
            return None
        box = self.box(offsets)
        inside = jnp.asarray(True)
        for axis, offset in zip(self.term.reduced if reduced else (), offsets):
            inside = inside & (offset + axis.tile <= axis.start + axis.extent)
        for constraint in term.constraints:
            least = corner(constraint.xreplace(self.extents), box, most=False, dtype=self.index)
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
            most = corner(bound.rest, box, most=True, dtype=self.index)  # the largest over the tile
            assert most is not None, "tile_program keeps only affine bounds"
            c = bound.coefficient
            if c > 0:  # index >= ceil(-rest / c): from the least such index's tile
                lowest = -jnp.floor_divide(most, c)
                first = jnp.maximum(first, (lowest - axis.start) // axis.tile)
            else:  # index <= floor(rest / -c)
                highest = jnp.floor_divide(most, -c)
                stop = jnp.minimum(stop, (highest - axis.start) // axis.tile + 1)
        first = jnp.asarray(first).astype(jnp.int32)
        stop = jnp.where(self.output_tile_live(), jnp.asarray(stop).astype(jnp.int32), first)
        return first, jnp.maximum(first, stop)

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
            left_points = {**single, rows.index: self.iota(row_start, rows.tile, 2, 0)}
            left_points[dot.reduced] = self.iota(offset, axis.tile, 2, 1)
            left = self.side(dot.left, left_points, (rows.tile, axis.tile))
            right_points = {**single, columns.index: self.iota(column_start, columns.tile, 2, 1)}
            right_points[dot.reduced] = self.iota(offset, axis.tile, 2, 0)
            right = self.side(dot.right, right_points, (axis.tile, columns.tile))
            if left.dtype != right.dtype:
                left, right = left.astype(self.dtype), right.astype(self.dtype)
            return total + self.masked_dot(left, right, left_points, right_points, offset)

        total = self.loops(step, jnp.zeros((rows.tile, columns.tile), self.dtype))
        points = self.free_points(len(grid))
        block = tuple(a.tile for a in grid)
        value = jnp.asarray(self.evaluator(points)(dot.scale), self.dtype) * total.reshape(block)
        if not self.term.masked:
            return value

        on_tiles = {*dot.left_masks, *dot.right_masks}
        on_output = [c for c in self.term.term.constraints if c not in on_tiles]
        if not on_output and self.term.term.guard is sympy.true:
            return value

        def masked(value: jax.Array) -> jax.Array:
            evaluate = self.evaluator(points)
            mask = jnp.asarray(evaluate(self.term.term.guard), bool)
            for constraint in on_output:
                mask = mask & (jnp.asarray(evaluate(constraint)) >= 0)
            return jnp.where(mask, value, 0)

        interior = self.interior((), reduced=False)
        if interior is None:
            return masked(value)
        return jax.lax.cond(interior, lambda v: v, masked, value)

    def side(self, expr: sympy.Expr, points: Any, shape: tuple[int, ...]) -> jax.Array:
        """One side of a dot on its tile: a lone access of a half type stays in that type
        (tensor cores take it, accumulating in float32); anything else is computed in the
        accumulation type."""
        evaluate = self.evaluator(points)
        value = evaluate.load(expr) if isinstance(expr, sympy.Indexed) else evaluate(expr)
        value = jnp.asarray(value)
        if value.dtype not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
            value = value.astype(self.dtype)
        return jnp.broadcast_to(value, shape)

    def masked_dot(
        self, left: jax.Array, right: jax.Array, left_points: Any, right_points: Any, offset: Any
    ) -> jax.Array:
        """`left @ right` of one reduced tile. On a tile that the end of the reduced range or
        a constraint of either side crosses, the pairs left out contribute exactly nothing:
        `where` on the products, never a product with 0 (0 * NaN is NaN: a NaN or inf at a
        key that a causal mask or the partial last tile leaves out reached every row of the
        tile, where the reference adds nothing). Interior tiles take the dot."""
        dot, (axis,) = self.term.dot, self.term.reduced
        assert dot is not None
        end = axis.start + axis.extent

        def plain(pair: tuple[jax.Array, jax.Array]) -> jax.Array:
            return api.dot(pair[0], pair[1], self.precision).astype(self.dtype)

        if not axis.partial and not dot.left_masks and not dot.right_masks:
            return plain((left, right))

        def masked(pair: tuple[jax.Array, jax.Array]) -> jax.Array:
            keep_left = self.keep(dot.left_masks, left_points, left.shape)
            keep_left = keep_left & (left_points[dot.reduced] < end)
            keep_right = self.keep(dot.right_masks, right_points, right.shape)
            keep_right = keep_right & (right_points[dot.reduced] < end)
            kept = keep_left[:, :, None] & keep_right[None, :, :]
            products = pair[0].astype(self.dtype)[:, :, None] * pair[1].astype(self.dtype)[None]
            return jnp.sum(jnp.where(kept, products, 0), axis=1)

        box = {s: (jnp.min(p), jnp.max(p)) for s, p in {**left_points, **right_points}.items()}
        inside = offset + axis.tile <= end
        for constraint in (*dot.left_masks, *dot.right_masks):
            least = corner(constraint.xreplace(self.extents), box, most=False, dtype=self.index)
            if least is None:
                return masked((left, right))
            inside = inside & (least >= 0)
        return jax.lax.cond(inside, plain, masked, (left, right))

    def keep(self, masks: Any, points: dict[sympy.Symbol, Any], shape: tuple[int, ...]) -> Any:
        """Where every constraint of `masks` holds on a dot side's tile."""
        evaluate = self.evaluator(points)
        kept = [jnp.asarray(evaluate(c)) >= 0 for c in masks]
        return jnp.broadcast_to(functools.reduce(jnp.logical_and, kept, jnp.asarray(True)), shape)

    def output_tile_live(self) -> Any:
        """False when the constraints that read free indices only exclude this whole output
        tile (its loops are then skipped); True when none can tell."""
        box = self.box(())
        live = jnp.asarray(True)
        for constraint in self.term.term.constraints:
            constraint = constraint.xreplace(self.extents)
            if constraint.free_symbols <= set(box):
                most = corner(constraint, box, most=True, dtype=self.index)
                if most is not None:
                    live = live & (most >= 0)
        return live


def corner(
    expr: sympy.Expr, box: Mapping[sympy.Symbol, tuple[Any, Any]], *, most: bool, dtype: Any
) -> Any:
    """The least (`most=False`) or largest value of the affine `expr` over `box` (each
    index's least and largest value, traced or not), in `dtype`; None if not affine: a tile's
    corner where a bound or a constraint is tightest.

    >>> from codegen.ir.nest import index_symbol
    >>> i, j = index_symbol("i"), index_symbol("j")
    >>> box = {i: (0, 7), j: (16, 31)}
    >>> int(corner(j - i + 1, box, most=False, dtype=jnp.int32))
    10
    >>> int(corner(j - i + 1, box, most=True, dtype=jnp.int32))
    32
    >>> corner(i * j, box, most=True, dtype=jnp.int32) is None
    True
    """
    try:
        form = as_affine(expr, tuple(box))
    except NotAffine:
        return None
    if not form.constant.is_Integer:
        return None
    value: Any = jnp.asarray(int(form.constant), dtype)
    for index, c in form.coefficients:
        lo, hi = box[index]
        value = value + c * (hi if (c > 0) == most else lo)
    return value
