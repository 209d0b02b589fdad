"""The reference back end: evaluate any loop nest with jax.numpy.

It materialises each term's whole iteration space (free indices x reduced indices) as
broadcast arrays, masks what the constraints and guard exclude, and reduces. Slow and
memory-hungry on purpose: it is the test oracle, and because it is plain jax.numpy its
`jax.grad` is the ground truth for the generated gradient nests.

>>> import numpy as np, jax.numpy as jnp
>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> nest = lower(parse("C[i,j] := A[i,k] * B[k,j]")).nest
>>> A, B = np.arange(6.0).reshape(2, 3), np.ones((3, 2))
>>> evaluate(nest, {"A": A, "B": B}, {"A": A.shape, "B": B.shape}).tolist()
[[3.0, 3.0], [12.0, 12.0]]
"""

from __future__ import annotations

import functools
import importlib
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sympy

from codegen.ir.extents import evaluate_int, extent_values
from codegen.ir.functions import FUNCTIONS, CeilDiv, Clamp, FloorDiv, Padded, Wrap
from codegen.ir.ieee import IeeeAdd, IeeeDiv, IeeeMul, Shifted
from codegen.ir.nest import LoopNest, Range, Reduce, Term
from codegen.ir.reductions import REDUCTIONS
from tensordsl.errors import UnsupportedError

Shapes = Mapping[str, tuple[int, ...]]


def _resolve(path: str) -> Callable[..., Any]:
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def _kept(operation: Callable[..., Any], a: Any, b: Any) -> Any:
    """`operation(a, b)` as written: under jit, XLA's simplifier would fold `(x*1e30)*1e30`
    to `x*inf` and `x - x` to 0 (codegen/ir/ieee.py); an optimization barrier keeps it."""
    a, b = jax.lax.optimization_barrier((a, b))
    return jax.lax.optimization_barrier(operation(a, b))


# sympy function class -> jax implementation: the language's functions from their table, then
# the operations that only derivations and index arithmetic produce. Pow, Piecewise and the
# arithmetic are handled by `Evaluator`.
_FUNCTIONS: dict[type, Callable[..., Any]] = {
    **{s.function: _resolve(s.reference) for s in FUNCTIONS.values() if s.function is not None},
    sympy.sign: jnp.sign,
    sympy.atan: jnp.arctan,  # atan2(y, x) with a constant x > 0
    FloorDiv: jnp.floor_divide,
    CeilDiv: lambda a, b: -jnp.floor_divide(-a, b),
    sympy.Mod: jnp.mod,
    Wrap: jnp.mod,
    Clamp: lambda e, n: jnp.clip(e, 0, n - 1),
    Padded: lambda e, n: jnp.clip(e, 0, n - 1),
    sympy.Min: lambda *a: functools.reduce(jnp.minimum, a),
    sympy.Max: lambda *a: functools.reduce(jnp.maximum, a),
    sympy.StrictLessThan: jnp.less,
    sympy.LessThan: jnp.less_equal,
    sympy.StrictGreaterThan: jnp.greater,
    sympy.GreaterThan: jnp.greater_equal,
    sympy.Eq: jnp.equal,
    sympy.Ne: jnp.not_equal,
    sympy.And: lambda *a: functools.reduce(jnp.logical_and, a),
    sympy.Or: lambda *a: functools.reduce(jnp.logical_or, a),
    sympy.Not: jnp.logical_not,
    sympy.ITE: jnp.where,
    IeeeAdd: lambda a, b: _kept(jnp.add, a, b),
    IeeeMul: lambda a, b: _kept(jnp.multiply, a, b),
    IeeeDiv: lambda a, b: _kept(jnp.divide, a, b),
    Shifted: jnp.add,  # the score summed first, then the logsumexp subtracted
}

#: The language's functions take their arguments in the body's float type (an index used
#: as a value is an integer, and jax.nn.sigmoid refuses integers).
_REAL_FUNCTIONS = tuple(s.function for s in FUNCTIONS.values() if s.function is not None)


class Evaluator:
    """Turns sympy expressions into jax arrays over one term's iteration grid."""

    def __init__(
        self,
        grid: Mapping[sympy.Symbol, jax.Array],
        operands: Mapping[str, Any],
        extents: Mapping[sympy.Symbol, int],
        dtype: Any,
    ):
        self.grid, self.operands, self.extents, self.dtype = grid, operands, extents, dtype

    def __call__(self, expr: sympy.Basic) -> Any:
        if expr.is_Integer:
            # Beyond JAX's integers, an integer can only be a value (a derivative's
            # coefficient, say): `_check_index_width` keeps index arithmetic within them.
            return int(expr) if abs(expr) <= _integer_max() else float(expr)
        if expr.is_Number or expr in (sympy.pi, sympy.E):
            return float(expr)
        if expr is sympy.true or expr is sympy.false:
            return bool(expr)
        if isinstance(expr, sympy.Symbol):
            return self.symbol(expr)
        if isinstance(expr, sympy.Indexed):
            return self.access(expr)
        if isinstance(expr, Reduce):
            return self.nested(expr)
        args = [self(a) for a in expr.args] if not isinstance(expr, sympy.Piecewise) else []
        if isinstance(expr, sympy.Add):
            return functools.reduce(lambda a, b: a + b, args)
        if isinstance(expr, sympy.Mul):
            return functools.reduce(lambda a, b: a * b, args)
        if isinstance(expr, sympy.Pow):
            return self.power(expr, args[0])
        if isinstance(expr, sympy.Piecewise):
            return self.piecewise(expr)
        if isinstance(expr, _REAL_FUNCTIONS):
            args = [jnp.asarray(a, self.dtype) for a in args]
        return _FUNCTIONS[type(expr)](*args)

    def symbol(self, symbol: sympy.Symbol) -> Any:
        if symbol in self.grid:
            return self.grid[symbol]
        if symbol in self.extents:
            return self.extents[symbol]
        return jnp.asarray(self.operands[symbol.name], self.dtype)

    def access(self, access: sympy.Indexed) -> jax.Array:
        array = jnp.asarray(self.operands[access.base.name])
        if jnp.issubdtype(array.dtype, jnp.floating):
            array = array.astype(self.dtype)
        # Masked-out positions may compute indices outside the array: clip them (never wrap).
        indices = tuple(
            jnp.clip(jnp.asarray(self(i)), 0, n - 1) for i, n in zip(access.indices, array.shape)
        )
        return array[indices]

    def power(self, expr: sympy.Pow, base: Any) -> Any:
        exponent = expr.exp
        if exponent == sympy.Rational(1, 2):
            return jnp.sqrt(base)
        if exponent == sympy.Rational(-1, 2):
            return jax.lax.rsqrt(jnp.asarray(base, self.dtype))
        base = jnp.asarray(base, self.dtype)
        if exponent.is_Integer:
            return base ** int(exponent)
        # A power is a value, computed in the body's float type as C's pow is: an integer
        # base with an index-valued exponent (ALiBi's `2^(-(h + 1))`) would otherwise be an
        # integer power, which truncates (and wraps) where IEEE gives 0.5, 0.25, ...
        power = self(exponent)
        if not jnp.issubdtype(jnp.result_type(power), jnp.integer):
            power = jnp.asarray(power, self.dtype)
        return jnp.power(base, power)

    def nested(self, node: Reduce) -> Any:
        """A nested reduction: its body over one more (last) axis for its index, reduced."""
        start, stop = (evaluate_int(x, self.extents) for x in (node.start, node.stop))
        ndim = max((jnp.ndim(a) for a in self.grid.values()), default=0)
        points = {s: jnp.expand_dims(a, -1) for s, a in self.grid.items()}
        index = jnp.arange(start, max(start, stop)).reshape((1,) * ndim + (-1,))
        points[node.index] = index
        body = Evaluator(points, self.operands, self.extents, self.dtype)(node.body)
        shape = jnp.broadcast_shapes(jnp.shape(body), index.shape)
        body = jnp.broadcast_to(jnp.asarray(body, self.dtype), shape)
        return REDUCE[node.reduction](body, jnp.ones(shape, bool), (ndim,))

    def piecewise(self, expr: sympy.Piecewise) -> Any:
        result = None
        for value, condition in reversed(expr.args):
            v = self(value)
            result = v if result is None else jnp.where(self(condition), v, result)
        return result


class Points(Mapping[sympy.Symbol, jax.Array]):
    """A grid's index arrays by index symbol, one broadcastable array per range, each made
    when first read: an index read only by plain accesses, which the XLA path takes as
    views (`tensordsl.backends.xla_dot`), needs none traced."""

    def __init__(self, spans: dict[sympy.Symbol, tuple[int, int, int]], ndim: int):
        self._spans, self._ndim = spans, ndim  # index -> (axis, start, length)
        self._made: dict[sympy.Symbol, jax.Array] = {}

    def __getitem__(self, index: sympy.Symbol) -> jax.Array:
        found = self._made.get(index)
        if found is None:
            axis, start, length = self._spans[index]
            shape = [1] * self._ndim
            shape[axis] = length
            found = self._made[index] = jnp.arange(start, start + length).reshape(shape)
        return found

    @property
    def spans(self) -> Mapping[sympy.Symbol, tuple[int, int, int]]:
        """Each index's `(axis, start, length)` on the grid."""
        return self._spans

    def __contains__(self, index: object) -> bool:
        return index in self._spans

    def __iter__(self) -> Iterator[sympy.Symbol]:
        return iter(self._spans)

    def __len__(self) -> int:
        return len(self._spans)


def grid(ranges: tuple[Range, ...], extents: Mapping[sympy.Symbol, int]) -> tuple[Points, tuple]:
    """One broadcastable index array per range (made when first read), and the shape of
    the whole grid."""
    spans, lengths = {}, []
    for axis, r in enumerate(ranges):
        start, stop = evaluate_int(r.start, extents), evaluate_int(r.stop, extents)
        lengths.append(max(0, stop - start))
        spans[r.index] = (axis, start, lengths[-1])
    return Points(spans, len(ranges)), tuple(lengths)


def term_values(
    nest: LoopNest,
    term: Term,
    operands: Mapping[str, Any],
    extents: Mapping[sympy.Symbol, int],
    dtype: Any,
    evaluator: Callable[..., Evaluator] = Evaluator,
) -> tuple[Any, Any]:
    """The body over the term's whole grid, and the mask of iterations that count;
    `evaluator(grid, operands, extents, dtype)` evaluates the expressions."""
    ranges = nest.free + term.reduced
    points, shape = grid(ranges, extents)
    evaluate = evaluator(points, operands, extents, dtype)
    mask = jnp.broadcast_to(jnp.asarray(evaluate(term.guard), bool), shape)
    for constraint in term.constraints:
        mask = mask & (jnp.asarray(evaluate(constraint)) >= 0)
    body = jnp.broadcast_to(jnp.asarray(evaluate(term.body), dtype), shape)
    return body, mask


def _position(pick: Callable[..., Any], fill: float) -> Callable[..., Any]:
    """argmax/argmin as a flat position over the reduced axes; -1 where none counts."""

    def reduce(body: Any, mask: Any, axes: tuple[int, ...]) -> Any:
        free_shape = body.shape[: body.ndim - len(axes)]
        flat = body.reshape(free_shape + (-1,))
        flat_mask = mask.reshape(free_shape + (-1,))
        if flat.shape[-1] == 0:
            return jnp.full(free_shape, -1, jnp.int32)
        position = pick(jnp.where(flat_mask, flat, fill), axis=-1).astype(jnp.int32)
        return jnp.where(flat_mask.any(axis=-1), position, -1)

    return reduce


def _selection(positions: bool) -> Callable[..., Any]:
    """topk/argtopk: along the last free axis (the rank, of length k), the k largest values
    (their flat positions) in descending order, argmax's order between two (NaN first, ties
    to the smaller position); -inf (position -1) past the values that count."""

    def reduce(body: Any, mask: Any, axes: tuple[int, ...]) -> Any:
        rank_axis = body.ndim - len(axes) - 1
        k = body.shape[rank_axis]
        values, counts = jnp.take(body, 0, rank_axis), jnp.take(mask, 0, rank_axis)
        flat = math.prod(values.shape[rank_axis:])  # not -1: a reshape of no rows divides by 0
        values = values.reshape(values.shape[:rank_axis] + (flat,))
        counts = counts.reshape(values.shape)
        group = jnp.where(counts, jnp.where(jnp.isnan(values), 0, 1), 2)
        key = jnp.where(group == 1, -values, 0)
        pad = max(k - values.shape[-1], 0)
        if pad:  # fewer values than k (a call's checks refuse it): empty slots at the end
            widths = [(0, 0)] * (values.ndim - 1) + [(0, pad)]
            values, key = jnp.pad(values, widths), jnp.pad(key, widths)
            group = jnp.pad(group, widths, constant_values=2)
        if values.size == 0:  # no rows, or no values (lexsort divides by the row count)
            shape = values.shape[:-1] + (k,)
            if positions:
                return jnp.full(shape, -1, jnp.int32)
            return jnp.full(shape, -jnp.inf, values.dtype)
        order = jnp.lexsort((key, group), axis=-1)[..., :k]  # stable: ties keep position order
        empty = jnp.take_along_axis(group, order, -1) == 2
        if positions:
            return jnp.where(empty, -1, order).astype(jnp.int32)
        return jnp.where(empty, -jnp.inf, jnp.take_along_axis(values, order, -1))

    return reduce


def _masked(name: str, reduce: Callable[..., Any]) -> Callable[..., Any]:
    """Reduction `name` of the body where `mask` holds (elsewhere the reduction's identity)."""
    identity = REDUCTIONS[name].identity
    return lambda body, mask, axes: reduce(jnp.where(mask, body, identity), axes)


def _sum(values: Any, axes: tuple[int, ...]) -> Any:
    """The sum over `axes`; floating values as a dot product with ones. jaxlib 0.10.2's
    YNNPACK fusion on the CPU miscomputes, with no error, a reduce of a broadcast product
    followed by a scalar factor (`s * (K[None] * Q[:, None]).sum(-1)`: the rows past 255 in
    float32), which is what scaled scores with a nested sum are (docs/backends.md)."""
    if not axes or not jnp.issubdtype(values.dtype, jnp.inexact):
        return values.sum(axis=axes)
    kept = values.ndim - len(axes)
    moved = jnp.moveaxis(values, axes, tuple(range(kept, values.ndim)))
    length = int(np.prod(moved.shape[kept:]))
    flat = moved.reshape((*moved.shape[:kept], length))
    ones = jnp.ones((length,), flat.dtype)
    return jnp.dot(flat, ones, precision=jax.lax.Precision.HIGHEST)


def _logsumexp(values: Any, axes: tuple[int, ...]) -> Any:
    return jax.scipy.special.logsumexp(values, axis=axes) if axes else values


#: One entry per row of `codegen.ir.reductions.REDUCTIONS`: (body, mask, reduced axes) -> result.
REDUCE: dict[str, Callable[..., Any]] = {
    "sum": _masked("sum", _sum),
    "max": _masked("max", lambda v, axes: v.max(axis=axes, initial=-np.inf)),
    "min": _masked("min", lambda v, axes: v.min(axis=axes, initial=np.inf)),
    "prod": _masked("prod", lambda v, axes: v.prod(axis=axes)),
    "logsumexp": _masked("logsumexp", _logsumexp),
    "argmax": _position(jnp.argmax, -np.inf),
    "argmin": _position(jnp.argmin, np.inf),
    "topk": _selection(positions=False),
    "argtopk": _selection(positions=True),
}


def compute_dtype(dtype: Any) -> Any:
    """The dtype the reference computes in: half types are computed in float32."""
    dtype = jnp.dtype(dtype)
    if dtype in (jnp.dtype(jnp.float16), jnp.dtype(jnp.bfloat16)):
        return jnp.float32
    return dtype


def evaluate(
    nest: LoopNest, operands: Mapping[str, Any], shapes: Shapes, dtype: Any = None
) -> jax.Array:
    """Evaluate `nest` on named operands with jax.numpy.

    Args:
        nest: the loop nest.
        operands: an array (or scalar) for each of `nest.operands`, by name.
        shapes: the shape of every tensor the nest's ranges refer to (operands included;
            gradient nests also name their output and the forward tensors).
        dtype: the output dtype (default: the promoted dtype of the floating operands).

    Returns:
        The output array.
    """
    values_dtype = jnp.result_type(*[operands[op.name] for op in nest.operands], jnp.float32)
    if not jnp.issubdtype(values_dtype, jnp.inexact):
        values_dtype = jnp.result_type(float)
    if dtype is None:
        dtype = values_dtype
    # The body is computed in the output's type, except for argmax/argmin (an int output).
    work = values_dtype if REDUCTIONS[nest.reduction].positional else dtype
    shapes = dict(shapes)
    values = []
    for op in nest.operands:
        value = jnp.asarray(operands[op.name])
        shapes.setdefault(op.name, tuple(value.shape))
        values.append(value)
    needed = nest.extent_tensors()
    frozen = tuple(sorted((n, tuple(int(d) for d in s)) for n, s in shapes.items() if n in needed))
    _check_index_width(nest, extent_values(nest, dict(frozen)))
    return _evaluate(nest, frozen, jnp.dtype(dtype).name, jnp.dtype(work).name, *values)


def _integer_max() -> int:
    """The largest integer of JAX's integer type: int64 with `jax_enable_x64`, else int32."""
    return int(np.iinfo(jax.dtypes.canonicalize_dtype(np.int64)).max)


def _check_index_width(nest: LoopNest, extents: Mapping[sympy.Symbol, int]) -> None:
    """Raise UnsupportedError when the index arithmetic needs integers that JAX's default
    32-bit integers (without `jax_enable_x64`) cannot hold."""
    if _integer_max() > np.iinfo(np.int32).max:
        return  # int64: the call-time shape checks keep index arithmetic within it
    bounds = [r.start for r in nest.free] + [r.stop for r in nest.free]
    bounds += [b for term in nest.terms for r in term.reduced for b in (r.start, r.stop)]
    largest = max((abs(evaluate_int(b, extents)) for b in bounds), default=0)
    for term in nest.terms:
        reads = [i for read in term.body.atoms(sympy.Indexed) for i in read.indices]
        for expr in (*reads, term.guard, *term.constraints):
            largest = max([largest, *(abs(int(n)) for n in expr.atoms(sympy.Integer))])
    if largest > np.iinfo(np.int32).max:
        raise UnsupportedError(
            f"the reference back end computes indices with JAX's 32-bit integers, and "
            f"'{nest.output}' needs index values of magnitude {largest}",
            expected="jax.config.update('jax_enable_x64', True), or backend='c'",
        )


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _evaluate(
    nest: LoopNest, shapes: tuple, dtype: str, work_dtype: str, *values: jax.Array
) -> jax.Array:
    """`evaluate`, compiled once per nest, shapes and dtype."""
    operands = dict(zip(nest.operand_names, values))
    extents = extent_values(nest, dict(shapes))
    work = compute_dtype(work_dtype)
    result = None
    for term in nest.terms:
        body, mask = term_values(nest, term, operands, extents, work)
        axes = tuple(range(len(nest.free), len(nest.free) + len(term.reduced)))
        value = REDUCE[nest.reduction](body, mask, axes)
        result = value if result is None else result + value
    if REDUCTIONS[nest.reduction].positional:
        return jnp.asarray(result)
    return jnp.asarray(result).astype(dtype)
