"""Call-time shape checks: concrete shapes against a lowered statement.

Ranks, agreeing extents for every index used unshifted, non-empty ranges of free indices,
index arithmetic within int64, an output whose size in bytes fits int64, and every read
inside its array; each failure names the index, the extents and where they came from.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> low = lower(parse("Y[i] := X[i+k] * W[k]"))
>>> check_shapes(low, {"X": (5,), "W": (2,)})
{X.shape[0]: 5, W.shape[0]: 2}
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from typing import Any

import sympy

from codegen.ir.affine import INDEX_LIMIT, Affine
from codegen.ir.nest import extent_symbol
from tensordsl.errors import RangeError, ShapeError, UnsupportedError
from tensordsl.frontend.lower import Lowered
from tensordsl.frontend.selections import check_count

__all__ = ["check_shapes"]


def _constant(affine: Affine, extents: Mapping[sympy.Symbol, int]) -> int:
    """The constant of `affine` for these shapes (`D[i,end]` has `D.shape[1] - 1`)."""
    return int(sympy.sympify(affine.constant).xreplace(extents))


def _interval(
    affine: Affine, values: Mapping[str, tuple[int, int]], extents: Mapping[sympy.Symbol, int]
) -> tuple[int, int] | None:
    """Smallest and largest value of `affine` over the index ranges; None if one is empty."""
    low = high = _constant(affine, extents)
    for index, c in affine.coefficients:
        start, stop = values[index.name]
        if stop <= start:
            return None
        low += c * (start if c > 0 else stop - 1)
        high += c * (stop - 1 if c > 0 else start)
    return low, high


def concrete_shapes(
    shapes: Mapping[str, tuple[Any, ...]], source: str
) -> dict[str, tuple[int, ...]]:
    """`shapes` with every dimension an int.

    Raises:
        UnsupportedError: a symbolic dimension (`jax.export` with `symbolic_shape`): kernels
            are specialised to concrete shapes when traced.
    """
    for name, shape in shapes.items():
        for axis, n in enumerate(shape):
            if not isinstance(n, numbers.Integral):
                raise UnsupportedError(
                    f"axis {axis} of input '{name}' has the symbolic dimension {n!r}",
                    source,
                    expected="concrete shapes: kernels are specialised to the shapes they are "
                    "traced with",
                    hint="export with concrete shapes (jax.ShapeDtypeStruct((4, 8), ...)), one "
                    "export per shape",
                )
    return {name: tuple(int(n) for n in shape) for name, shape in shapes.items()}


def _check_ranks(
    lowered: Lowered, shapes: Mapping[str, tuple[int, ...]]
) -> dict[sympy.Symbol, int]:
    src = lowered.statement.source
    spans = {a.tensor: a.span for a in reversed(lowered.accesses)}
    spans = {**dict(lowered.operand_spans), **spans}
    extents: dict[sympy.Symbol, int] = {}
    for op in lowered.nest.operands:
        if op.name in lowered.gathered:
            continue  # computed by the call from the table and index arrays
        span = spans.get(op.name)
        if op.name not in shapes:
            raise ShapeError(
                f"no array given for '{op.name}'",
                src,
                span,
                expected=f"an argument for every input: {lowered.nest.operand_names}",
            )
        shape = tuple(int(n) for n in shapes[op.name])
        if len(shape) != op.rank:
            role = "a scalar" if op.is_scalar else f"a tensor of rank {op.rank}"
            raise ShapeError(
                f"'{op.name}' is {role} in the statement but got shape {shape}",
                src,
                span,
                expected=f"an array of rank {op.rank} for '{op.name}'",
            )
        extents.update({extent_symbol(op.name, axis): n for axis, n in enumerate(shape)})
    return extents


def _check_agreement(lowered: Lowered, extents: Mapping[sympy.Symbol, int]) -> None:
    src = lowered.statement.source
    for r in lowered.ranges:
        name = r.index.name
        uses = lowered.unshifted_uses(name)
        if name in lowered.explicit or not uses or len(uses) != lowered.constraining_uses(name):
            continue  # shifted or explicit: the range is an intersection, checked by reads
        (first, axis), *rest = uses
        n = extents[extent_symbol(first.tensor, axis)]
        for access, other in rest:
            m = extents[extent_symbol(access.tensor, other)]
            if m != n:
                raise RangeError(
                    f"index '{name}' has extent {n} from axis {axis} of '{first.tensor}' "
                    f"but {m} from axis {other} of '{access.tensor}'",
                    src,
                    access.axis_spans[other],
                    expected=f"the same extent on every axis that '{name}' indexes",
                )


def _evaluate_ranges(
    lowered: Lowered, extents: Mapping[sympy.Symbol, int]
) -> dict[str, tuple[int, int]]:
    src = lowered.statement.source
    values: dict[str, tuple[int, int]] = {}
    for r in lowered.ranges:
        start, stop = (int(e.xreplace(extents)) for e in (r.start, r.stop))
        values[r.index.name] = (start, stop)
        plain = r.start == 0 and r.stop.is_Symbol
        if r not in lowered.reduced_ranges and (stop < start or (stop == start and not plain)):
            used = sorted(str(s) for s in (r.start.free_symbols | r.stop.free_symbols))
            given = ", ".join(
                f"{s} = {extents[sympy.Symbol(s, integer=True, nonnegative=True)]}" for s in used
            )
            raise RangeError(
                f"index '{r.index}' has an empty range [{start}, {stop}) for these shapes",
                src,
                lowered.index_span(r.index.name),
                expected=f"at least one value: '{r.index}' runs over [{r.start}, {r.stop})"
                + (f" where {given}" if given else ""),
            )
    return values


_INT64 = (
    "index values and index arithmetic of magnitude at most 2**63 - 1 "
    "(generated code computes indices in int64)"
)


def _magnitude(
    affine: Affine, values: Mapping[str, tuple[int, int]], extents: Mapping[sympy.Symbol, int]
) -> int:
    """The largest magnitude the int64 arithmetic of `affine` can reach over the ranges: that
    of each term, and of the partial sums in whatever order C adds them (with two terms, the
    sum is the whole expression; with more, the sum of the terms' magnitudes bounds it)."""
    terms = [abs(_constant(affine, extents))]
    for index, c in affine.coefficients:
        start, stop = values[index.name]
        terms.append(0 if stop <= start else abs(c) * max(abs(start), abs(stop - 1)))
    if len(terms) > 2:
        return sum(terms)
    interval = _interval(affine, values, extents) or (0, 0)
    return max(*terms, *map(abs, interval))


def _check_int64(
    lowered: Lowered, extents: Mapping[sympy.Symbol, int], values: Mapping[str, tuple[int, int]]
) -> None:
    src = lowered.statement.source
    for name, (start, stop) in values.items():
        if max(abs(start), abs(stop)) > INDEX_LIMIT:
            raise RangeError(
                f"index '{name}' runs over [{start}, {stop}) for these shapes, beyond int64",
                src,
                lowered.index_span(name),
                expected=_INT64,
            )
    for access in lowered.accesses:
        for affine in access.axes:
            magnitude = _magnitude(affine, values, extents)
            if magnitude > INDEX_LIMIT:
                text = src[access.span[0] : access.span[1]]
                raise RangeError(
                    f"the index arithmetic of '{text}' may leave int64 for these shapes: "
                    f"its terms add up to {magnitude} in magnitude",
                    src,
                    access.span,
                    expected=_INT64,
                )


#: The most elements an output may hold: its size in bytes (8 a value at most) must fit
#: int64, or XLA aborts the process ("overflow in static extent product") rather than raise.
OUTPUT_LIMIT = INDEX_LIMIT // 8


def _check_output_size(lowered: Lowered, values: Mapping[str, tuple[int, int]]) -> None:
    free = [r.index.name for r in lowered.ranges[: len(lowered.nest.free)]]
    shape = tuple(max(values[n][1] - values[n][0], 0) for n in free)
    count = math.prod(shape)
    if count > OUTPUT_LIMIT:
        statement = lowered.statement
        raise RangeError(
            f"the output '{lowered.nest.output}' would have shape {shape}: {count} elements",
            statement.source,
            lowered.index_span(free[0]),
            expected=f"at most {OUTPUT_LIMIT} elements (an array's size in bytes must fit int64)",
            hint="narrow ranges= or the inputs' shapes",
        )


def _check_reads(
    lowered: Lowered, extents: Mapping[sympy.Symbol, int], values: Mapping[str, tuple[int, int]]
) -> None:
    src = lowered.statement.source
    for access in lowered.accesses:
        for axis, affine in enumerate(access.axes):
            if axis in access.gathered:
                continue
            widths = access.widths(axis)
            n = extents[extent_symbol(access.tensor, axis)]
            interval = _interval(affine, values, extents)
            if not access.plain(axis) and n == 0 and interval is not None:
                raise RangeError(
                    f"'{src[access.span[0] : access.span[1]]}' wraps, clamps or pads into "
                    f"axis {axis} of '{access.tensor}', which is empty",
                    src,
                    access.span,
                    expected="a nonempty axis under mod, clamp and pad",
                )
            if widths is None:
                continue  # mod, clamp, pad(e): every value reads inside the array or zero
            if interval is None or (interval[0] >= -widths[0] and interval[1] < n + widths[1]):
                continue
            names = [index.name for index in affine.indices]
            where = ", ".join(f"{k} in [{values[k][0]}, {values[k][1]})" for k in names)
            explicit = [k for k in names if k in lowered.explicit]
            text = src[access.span[0] : access.span[1]]
            raise RangeError(
                f"'{text}' reads axis {axis} of '{access.tensor}' at "
                f"{interval[0]}..{interval[1]}, outside [{-widths[0]}, {n + widths[1]})",
                src,
                access.span,
                expected="every read inside the array" + (f" for {where}" if where else ""),
                hint=f"narrow or drop ranges= for {', '.join(explicit)}" if explicit else None,
            )


def check_shapes(
    lowered: Lowered, shapes: Mapping[str, tuple[int, ...]]
) -> dict[sympy.Symbol, int]:
    """Check concrete shapes against a lowered statement.

    Args:
        lowered: from `lower`.
        shapes: the shape of every operand by name (a scalar's shape is `()`).

    Returns:
        Every extent symbol of every operand axis, mapped to its value.

    Raises:
        ShapeError: an operand is missing or has the wrong rank.
        RangeError: extents that disagree, an empty range of a free index, index arithmetic
            beyond int64, a read out of bounds, a top-k keeping more values than it reduces.

    >>> from tensordsl.frontend.lower import lower
    >>> from tensordsl.frontend.parse import parse
    >>> low = lower(parse("C[i,j] := A[i,k] * B[k,j]"))
    >>> check_shapes(low, {"A": (2, 3), "B": (4, 5)})
    Traceback (most recent call last):
    ...
    tensordsl.errors.RangeError: index 'k' has extent 3 from axis 1 of 'A' but 4 from axis 0 of 'B'
    ...
    """
    shapes = concrete_shapes(shapes, lowered.statement.source)
    extents = _check_ranks(lowered, shapes)
    _check_agreement(lowered, extents)
    values = _evaluate_ranges(lowered, extents)
    _check_int64(lowered, extents, values)
    _check_output_size(lowered, values)
    check_count(lowered, values)
    _check_reads(lowered, extents, values)
    return extents
