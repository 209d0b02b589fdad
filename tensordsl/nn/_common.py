"""What the layers share: kernels built once per configuration, leading dimensions, checks.

Every layer builds its kernels with `build`, an `lru_cache` keyed by the source and the
options, so that a layer called in a loop (or traced again under `jit`) parses nothing twice.
Leading batch dimensions are flattened into one index before the kernel and restored after
(`flatten_leading`, `unflatten_leading`): the kernels see a fixed rank, so one kernel serves
every batch shape.

>>> x = np.zeros((2, 3, 5))
>>> flat, batch = flatten_leading(x, 1)
>>> flat.shape, batch
((6, 5), (2, 3))
>>> unflatten_leading(flat, batch, 1).shape
(2, 3, 5)
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from tensordsl.errors import InputError, OptionError, ShapeError
from tensordsl.kernel import kernel


@functools.lru_cache(maxsize=256)
def build(source: str, backend: str, outputs: tuple[str, ...] | None = None) -> Any:
    """`td.kernel(source, backend=backend)`, made once per (source, backend, outputs)."""
    options: dict[str, Any] = {"backend": backend}
    if outputs is not None:
        options["outputs"] = outputs
    return kernel(source, **options)


def flatten_leading(x: Any, trailing: int) -> tuple[Any, tuple[int, ...]]:
    """`x` with its leading axes (all but the last `trailing`) merged into one axis of
    length `prod(leading)` (1 when there are none); the leading shape, to restore it."""
    batch = tuple(x.shape[: x.ndim - trailing])
    return x.reshape((math.prod(batch), *x.shape[x.ndim - trailing :])), batch


def unflatten_leading(y: Any, batch: tuple[int, ...], trailing: int) -> Any:
    """The inverse of `flatten_leading`: the first axis of `y` split back into `batch`."""
    return y.reshape((*batch, *y.shape[y.ndim - trailing :]))


def as_array(value: Any, layer: str, name: str) -> Any:
    """`value` as an array of real numbers, or an `InputError` naming the layer's argument."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        array = value
    else:
        try:
            array = jnp.asarray(value)
        except (TypeError, ValueError):
            array = None
    if array is None or not (
        jnp.issubdtype(array.dtype, jnp.floating) or jnp.issubdtype(array.dtype, jnp.integer)
    ):
        got = type(value).__name__ if array is None else f"dtype {array.dtype}"
        raise InputError(
            f"{layer}: '{name}' is not an array of real numbers (got {got})",
            expected=f"a float array for '{name}'",
        )
    return array


def as_float_array(value: Any, layer: str, name: str) -> Any:
    array = as_array(value, layer, name)
    if not jnp.issubdtype(array.dtype, jnp.floating):
        raise InputError(
            f"{layer}: '{name}' has dtype {array.dtype}, not a float dtype",
            expected=f"a float array for '{name}' (cast it: {name}.astype(jnp.float32))",
        )
    return array


def as_int_array(value: Any, layer: str, name: str) -> Any:
    array = as_array(value, layer, name)
    if not jnp.issubdtype(array.dtype, jnp.integer):
        raise InputError(
            f"{layer}: '{name}' has dtype {array.dtype}, not an integer dtype",
            expected=f"integer indices for '{name}' (class or token numbers)",
        )
    return array


def check_rank(array: Any, layer: str, name: str, rank: int, layout: str, at_least: bool) -> None:
    """A `ShapeError` unless `array` has `rank` axes (or more, `at_least`)."""
    if array.ndim == rank or (at_least and array.ndim > rank):
        return
    wanted = f"at least {rank}" if at_least else f"exactly {rank}"
    raise ShapeError(
        f"{layer}: '{name}' has shape {tuple(array.shape)}, rank {array.ndim}",
        expected=f"{wanted} axes for '{name}': {layout}",
    )


def check_extent(layer: str, name: str, got: int, other: str, want: int, what: str) -> None:
    """A `ShapeError` unless two extents that must agree do."""
    if got != want:
        raise ShapeError(
            f"{layer}: {what} of '{name}' is {got} but {want} in '{other}'",
            expected=f"the same {what} in '{name}' and '{other}'",
        )


def positive_ints(value: Any, layer: str, option: str, count: int) -> tuple[int, ...]:
    """An int or `count` ints, each >= 1 (a stride, a dilation), as a tuple of `count`."""
    values = (value,) * count if isinstance(value, (int, np.integer)) else value
    try:
        values = tuple(values)
    except TypeError:
        values = ()
    if len(values) != count or not all(
        isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in values
    ):
        raise OptionError(
            f"{layer}: {option}={value!r} is not {count} positive integer(s)",
            expected=f"{option} an int >= 1 or a tuple of {count} such ints",
        )
    return tuple(int(v) for v in values)


def real_in(value: Any, layer: str, option: str, low: float, high: float, closed: bool) -> float:
    """A Python float in [low, high] (`closed`) or [low, high), else an `OptionError`."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    inside = low <= number <= high if closed else low <= number < high
    if not inside:
        bracket = "]" if closed else ")"
        raise OptionError(
            f"{layer}: {option}={value!r} is outside [{low}, {high}{bracket}",
            expected=f"a number in [{low}, {high}{bracket} for {option}",
        )
    return number
