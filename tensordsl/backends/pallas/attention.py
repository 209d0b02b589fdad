"""An `AttentionProgram` (`codegen.tiles.attention`) as one Pallas kernel: FlashAttention's
forward (online softmax) or one of its backward kernels (dK and dV together, dQ).

A program instance holds one row tile (`[R]` rows) for one value of each outer index. It
walks the tiles of the loop index (`[C]` values) between the bounds of its row tile
(`codegen.tiles.program.LoopBound`, computed here for this tile) and, per tile:

1. each nested sum of the weights as a tile dot, `[R x W] @ [W x C]` (`api.dot`: tensor
   cores on a GPU; half types stay half, accumulating in float32), the head dim `W` padded
   to a power of two with zeros;
2. the weights (the score expression, or a gradient nest's weight: the score's derivative
   as the project derived it) as elementwise tile code on `[R x C]`, the reference's
   `Evaluator` run on tiles with the dots standing for the nested sums;
3. the constraints' `where` under a `cond`, on tiles that cross them or the end only; an
   array mask's (the program's guard) on every tile, and a pair it drops left out of the
   products too (`_Tiles.product`: no 0 * NaN from a dropped key's value);
4. online: the running max and sum per row, the accumulator rescaled when the max grows,
   `p @ V`; weighted: `a @ b` per member, into float32 accumulators `[R x E]`.

Every output block is written once by its program instance (no atomics; Pallas' interpret
mode drops repeated-index atomic updates). Every Pallas call is in `api`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import sympy

from codegen.tiles.attention.program import AttentionProgram
from codegen.tiles.program import TileAxis
from tensordsl.backends.pallas import api
from tensordsl.backends.pallas.lower import TileEvaluator, corner
from tensordsl.backends.pallas.partials import add_partial, partial_spec, summed

_HALF = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))


def run_attention(
    program: AttentionProgram,
    operands: Sequence[Any],
    dtype: Any,
    more: Mapping[str, Any] | None = None,
) -> Any:
    """The nest's output (the packed O and logsumexp of a one-pass nest, the packed members
    of a pair) computed by the program's one kernel, its dots rounding as
    `program.precision` says. With `program.partials` (score parameters' gradients, which
    may read the arrays `more` by name too): the output and the partials' arrays, one per
    partial (`tensordsl.backends.pallas.partials`)."""
    nest = program.nest
    more = dict(more or {})
    names = (*nest.operand_names, *more)
    values = [jnp.asarray(v) for v in (*operands, *more.values())]
    scalars = frozenset(n for n, v in zip(names, values) if v.ndim == 0)
    values = [v.reshape((1,)) if v.ndim == 0 else v for v in values]
    dtype = jnp.dtype(dtype)
    specs = [_output_spec(program, member.column, dtype) for member in program.members]
    if program.kind == "online":
        specs.append(_output_spec(program, None, jnp.dtype(program.accumulate)))
    specs += [partial_spec(program, p) for p in program.partials]
    kernel = functools.partial(_kernel, program, program.precision, names, scalars)
    found = api.call_blocks(
        kernel, values, grid=program.grid_shape, outputs=specs, name=f"tdsl_{nest.output}_flash"
    )
    cut = []
    for member, out in zip(program.members, found):
        cut.append(_cut(program, out, member.column.extent))
    if program.kind == "online":
        lse = _cut(program, found[len(program.members)], None)
        cut.append(jnp.expand_dims(lse, -1).astype(dtype))
    out = cut[0] if len(cut) == 1 else jnp.concatenate(cut, axis=-1)
    if not program.partials:
        return out
    rest = found[len(found) - len(program.partials) :]
    return out, tuple(summed(program, p, a) for p, a in zip(program.partials, rest))


def _output_spec(program: AttentionProgram, column: TileAxis | None, dtype: Any) -> tuple:
    """(shape, block, index map, dtype) of an output in the nest's free order; `column`
    None: the row logsumexp (no column axis)."""
    free = [r.index for r in program.nest.free[:-1]]
    outer = [a.index for a in program.outer]
    extents = {a.index: a.extent for a in program.outer}
    shape, block = [], []
    for index in free:
        if index == program.rows.index:
            shape.append(program.rows.count * program.rows.tile)
            block.append(program.rows.tile)
        else:
            shape.append(extents[index])
            block.append(1)
    if column is not None:
        shape.append(column.tile)
        block.append(column.tile)
    positions = [outer.index(i) if i in outer else len(outer) for i in free]
    with_column = column is not None

    def index_map(*g: Any) -> tuple:
        return (*(g[p] for p in positions), *((0,) if with_column else ()))

    return tuple(shape), tuple(block), index_map, dtype


def _cut(program: AttentionProgram, out: jax.Array, width: int | None) -> jax.Array:
    """The padded output cut to the nest's extents."""
    cut = [
        slice(0, program.rows.extent) if r.index == program.rows.index else slice(None)
        for r in program.nest.free[:-1]
    ]
    if width is not None:
        cut.append(slice(0, width))
    return out[tuple(cut)]


def _iota(offset: Any, tile: int, axis: int) -> jax.Array:
    shape = [1, 1]
    shape[axis] = tile
    return offset + jax.lax.broadcasted_iota(jnp.int32, tuple(shape), axis)


class _Evaluator(TileEvaluator):
    """The tile evaluator with each nested sum that a dot computed standing for its tile."""

    def __init__(self, *args: Any, dots: Mapping[Any, jax.Array]) -> None:
        super().__init__(*args)
        self.dots = dots

    def nested(self, node: Any) -> Any:
        if node in self.dots:
            return self.dots[node]
        return super().nested(node)


def _kernel(
    program: AttentionProgram,
    precision: Any,
    names: Sequence[str],
    scalars: frozenset[str],
    *refs: Any,
) -> None:
    inputs, outs = refs[: len(names)], refs[len(names) :]
    operands = {n: ref[0] if n in scalars else ref for n, ref in zip(names, inputs)}
    outer = {a.index: a.start + api.program_id(k) for k, a in enumerate(program.outer)}
    row_start = program.rows.start + api.program_id(len(program.outer)) * program.rows.tile
    tiles = _Tiles(program, operands, outer, row_start, precision)
    tiles.partials = outs[len(outs) - len(program.partials) :] if program.partials else ()
    tiles.write(outs[: len(outs) - len(program.partials)])


class _Tiles:
    """The tile code of one program instance."""

    def __init__(
        self,
        program: AttentionProgram,
        operands: Mapping[str, Any],
        outer: Mapping[sympy.Symbol, Any],
        row_start: Any,
        precision: Any,
    ) -> None:
        self.program, self.operands, self.outer = program, operands, dict(outer)
        self.row_start, self.precision = row_start, precision
        self.dtype = jnp.dtype(program.accumulate)
        self.extents = dict(program.extents)
        self.R, self.C = program.rows.tile, program.loop.tile
        #: The partials' output refs (`program.partials`), added to on every tile.
        self.partials: Sequence[Any] = ()

    def evaluator(self, points: dict, dots: Mapping[Any, jax.Array] | None = None) -> Any:
        return _Evaluator(points, self.operands, self.extents, self.dtype, dots=dots or {})

    def side(self, expr: sympy.Expr, points: dict, shape: tuple[int, int]) -> jax.Array:
        """A dot's operand tile: a lone access of a half type stays half (tensor cores
        take it); anything else is computed in the accumulation type."""
        evaluate = self.evaluator(points)
        value = evaluate.load(expr) if isinstance(expr, sympy.Indexed) else evaluate(expr)
        value = jnp.asarray(value)
        if value.dtype not in _HALF:
            value = value.astype(self.dtype)
        return jnp.broadcast_to(value, shape)

    def dot(self, left: jax.Array, right: jax.Array) -> jax.Array:
        if left.dtype != right.dtype:
            left, right = left.astype(self.dtype), right.astype(self.dtype)
        return api.dot(left, right, self.precision).astype(self.dtype)

    # ---------------------------------------------------------------- one loop tile
    def step(self, singles: dict, offset: Any, state: Any) -> Any:
        program = self.program
        base = {**self.outer, **singles}
        rows = _iota(self.row_start, self.R, 0)
        points = {**base, program.rows.index: rows, program.loop.index: _iota(offset, self.C, 1)}
        evaluate = self.evaluator(points, self.dots(base, rows, offset, points))
        weights = tuple(
            jnp.broadcast_to(jnp.asarray(evaluate(m.weight), self.dtype), (self.R, self.C))
            for m in program.members
        )
        weights, kept = self.masked(weights, points, offset)
        for partial, ref in zip(program.partials, self.partials):
            box = {index: (v, v) for index, v in base.items()}
            box[program.rows.index] = (self.row_start, self.row_start + self.R - 1)
            box[program.loop.index] = (offset, offset + self.C - 1)
            low = corner(partial.local, box, most=False, dtype=jnp.int32)
            add_partial(partial, ref, evaluate, kept, low, (self.R, self.C), self.dtype)
        values = []
        for member in program.members:
            column = member.column
            at = {**base, program.loop.index: _iota(offset, self.C, 0)}
            at[column.index] = _iota(column.start, column.tile, 1)
            values.append(self.side(member.value, at, (self.C, column.tile)))
        if program.kind == "online":
            return self.online(weights[0], values[0], state, kept)
        return tuple(
            acc + self.product(a.astype(b.dtype) if b.dtype in _HALF else a, b, kept)
            for acc, a, b in zip(state, weights, values)
        )

    def product(self, weights: jax.Array, values: jax.Array, kept: Any) -> jax.Array:
        """`weights @ values`; with `kept` (the `[R x C]` pairs a guard, a constraint or the
        loop's end keeps), a pair left out contributes nothing even where `values` holds NaN
        or inf (0 * NaN is NaN): the dot when the value tile is finite, else
        `where(kept, w * v, 0)` summed one key at a time (2-D tiles only: no `[R x C x E]`
        tensor for Triton to hold)."""
        if kept is None:
            return self.dot(weights, values)

        def one_key_at_a_time(operands: tuple) -> jax.Array:
            w, v, kept = operands
            w, v = w.astype(self.dtype), v.astype(self.dtype)
            of_w = jax.lax.broadcasted_iota(jnp.int32, w.shape, 1)
            of_v = jax.lax.broadcasted_iota(jnp.int32, v.shape, 0)

            def key(n: Any, acc: jax.Array) -> jax.Array:
                weight = jnp.where(of_w == n, w, 0.0).sum(axis=1)
                keeps = jnp.where((of_w == n) & kept, 1.0, 0.0).sum(axis=1) > 0
                value = jnp.where(of_v == n, v, 0.0).sum(axis=0)
                return acc + jnp.where(keeps[:, None], weight[:, None] * value[None, :], 0.0)

            zero = jnp.zeros((w.shape[0], v.shape[1]), self.dtype)
            return jax.lax.fori_loop(0, w.shape[1], key, zero)

        finite = jnp.where(jnp.isfinite(values), 0.0, 1.0).sum() == 0  # no reduce_and
        return jax.lax.cond(
            finite, lambda o: self.dot(o[0], o[1]), one_key_at_a_time, (weights, values, kept)
        )

    def dots(self, base: dict, rows: Any, offset: Any, points: dict) -> dict[Any, jax.Array]:
        """Each nested sum of the weights on this `[R x C]` tile: `[R x W] @ [W x C]`, the
        padded head dim zeroed on both sides."""
        loop, found = self.program.loop, {}
        for d in self.program.dots:
            w = d.width
            at = {**base, self.program.rows.index: rows, w.index: _iota(w.start, w.tile, 1)}
            left = self.side(d.rows, at, (self.R, w.tile))
            at = {**base, loop.index: _iota(offset, self.C, 1), w.index: _iota(w.start, w.tile, 0)}
            right = self.side(d.keys, at, (w.tile, self.C))
            if w.tile != w.extent:
                left = jnp.where(_iota(w.start, w.tile, 1) < w.start + w.extent, left, 0)
                right = jnp.where(_iota(w.start, w.tile, 0) < w.start + w.extent, right, 0)
            scale = jnp.asarray(self.evaluator(points)(d.scale), self.dtype)
            found[d.node] = self.dot(left, right) * scale
        return found

    def online(self, scores: jax.Array, value: jax.Array, state: Any, kept: Any) -> Any:
        """The online softmax update of the running max `m`, sum `s` and accumulator."""
        m, s, acc = state
        grown = jnp.maximum(m, scores.max(axis=1))
        safe = jnp.where(jnp.isneginf(grown), 0.0, grown)
        alpha = jnp.exp(m - safe)
        p = jnp.exp(scores - safe[:, None])
        s = s * alpha + p.sum(axis=1)
        p = p.astype(value.dtype) if value.dtype in _HALF else p
        return grown, s, acc * alpha[:, None] + self.product(p, value, kept)

    def masked(self, weights: tuple, points: dict, offset: Any) -> tuple[tuple, Any]:
        """The weights with the constraints' `where` (and the loop's end), on the tiles
        that cross them only (with a guard, on every tile), and the `[R x C]` pairs kept
        (None when every pair counts): `product` leaves the others out of `a @ b` too."""
        program, loop = self.program, self.program.loop
        guarded = program.guard != sympy.true
        if not program.constraints and not loop.partial and not guarded:
            return weights, None
        fill = -jnp.inf if program.kind == "online" else 0.0

        def mask() -> Any:
            evaluate = self.evaluator(points)
            mask = points[loop.index] < loop.start + loop.extent
            for constraint in program.constraints:
                mask = mask & (jnp.asarray(evaluate(constraint)) >= 0)
            if guarded:
                mask = mask & jnp.asarray(evaluate(program.guard), bool)
            return jnp.broadcast_to(mask, (self.R, self.C))

        def where(weights: tuple) -> tuple:
            kept = mask()
            return tuple(jnp.where(kept, w, jnp.asarray(fill, w.dtype)) for w in weights), kept

        if guarded:
            return where(weights)
        box = {index: (v, v) for index, v in self.outer.items()}
        box[program.rows.index] = (self.row_start, self.row_start + self.R - 1)
        box[loop.index] = (offset, offset + self.C - 1)
        inside = offset + self.C <= loop.start + loop.extent
        for constraint in program.constraints:
            least = corner(constraint, box, most=False, dtype=jnp.int32)
            if least is None:
                return where(weights)
            inside = inside & (least >= 0)
        every = jnp.ones((self.R, self.C), bool)
        return jax.lax.cond(inside, lambda w: (w, every), where, weights)

    # ---------------------------------------------------------------- the loops
    def tile_range(self, singles: dict) -> tuple[Any, Any]:
        """The first and past-the-last loop tile this row tile visits."""
        program, loop = self.program, self.program.loop
        box = {index: (v, v) for index, v in {**self.outer, **singles}.items()}
        box[program.rows.index] = (self.row_start, self.row_start + self.R - 1)
        first: Any = 0
        stop: Any = loop.count
        for bound in program.bounds:
            most = corner(bound.rest, box, most=True, dtype=jnp.int32)
            c = bound.coefficient
            if c > 0:
                lowest = -jnp.floor_divide(most, c)
                first = jnp.maximum(first, jnp.floor_divide(lowest - loop.start, loop.tile))
            else:
                highest = jnp.floor_divide(most, -c)
                stop = jnp.minimum(stop, jnp.floor_divide(highest - loop.start, loop.tile) + 1)
        live = jnp.asarray(True)
        for constraint in program.constraints:
            if constraint.free_symbols <= set(box) - {loop.index}:
                most = corner(constraint, box, most=True, dtype=jnp.int32)
                if most is not None:
                    live = live & (most >= 0)
        first = jnp.asarray(first, jnp.int32)
        stop = jnp.where(live, jnp.asarray(stop, jnp.int32), first)
        return first, jnp.maximum(first, stop)

    def walk(self, singles: dict, state: Any) -> Any:
        loop = self.program.loop
        first, stop = self.tile_range(singles)

        def body(n: Any, state: Any) -> Any:
            return self.step(singles, loop.start + n * loop.tile, state)

        return jax.lax.fori_loop(first, stop, body, state)

    def accumulate(self, state: Any) -> Any:
        """`walk` for every value of the single reduced indices."""

        def nest(level: int, singles: dict, state: Any) -> Any:
            if level == len(self.program.singles):
                return self.walk(singles, state)
            axis = self.program.singles[level]

            def body(n: Any, state: Any) -> Any:
                return nest(level + 1, {**singles, axis.index: axis.start + n}, state)

            return jax.lax.fori_loop(0, axis.extent, body, state)

        return nest(0, {}, state)

    def write(self, outs: Sequence[Any]) -> None:
        program = self.program
        for ref in self.partials:
            ref[...] = jnp.zeros(ref.shape, ref.dtype)
        accs = tuple(jnp.zeros((self.R, m.column.tile), self.dtype) for m in program.members)
        if program.kind == "online":
            m0 = jnp.full((self.R,), -jnp.inf, self.dtype)
            m, s, acc = self.accumulate((m0, jnp.zeros((self.R,), self.dtype), accs[0]))
            some = s != 0  # a row that keeps no key: 0; a NaN sum (NaN in k) stays NaN
            out = jnp.where(some[:, None], acc / jnp.where(some, s, 1.0)[:, None], 0.0)
            lse = jnp.where(some, m + jnp.log(jnp.where(some, s, 1.0)), -jnp.inf)
            found = (out, lse)
        else:
            found = self.accumulate(accs)
        for ref, value in zip(outs, found):
            ref[...] = value.reshape(ref.shape).astype(ref.dtype)
