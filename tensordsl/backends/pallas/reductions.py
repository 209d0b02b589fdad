"""Tile reductions: how one tile of values folds into a reduction's state, one row per
reduction that tile programs run (`codegen.tiles.build.TILE_REDUCTIONS`).

A state starts at `start(shape, dtype)` (the output tile's shape), takes tiles in order of
position by `fold(values, mask, positions, axes, state)` (`mask` None: every value counts;
`positions`: each value's flat position over the reduced ranges) and ends as `finish(state)`.
argmax/argmin follow the reference's rule: NaN wins over every number (the first NaN), ties
go to the smaller position, -1 where no value counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from codegen.ir.reductions import REDUCTIONS

#: No position yet (larger than every flat position).
_NO_POSITION = np.iinfo(np.int32).max


@dataclass(frozen=True)
class TileReduction:
    start: Callable[[tuple[int, ...], Any], Any]
    fold: Callable[..., Any]
    finish: Callable[[Any], jax.Array]


def _masked(name: str, values: Any, mask: Any) -> Any:
    if mask is None:
        return values
    return jnp.where(mask, values, jnp.asarray(REDUCTIONS[name].identity, values.dtype))


def _plain(name: str, combine: Callable[[Any, Any, tuple[int, ...]], Any]) -> TileReduction:
    def start(shape: tuple[int, ...], dtype: Any) -> Any:
        return jnp.full(shape, REDUCTIONS[name].identity, dtype)

    def fold(values: Any, mask: Any, positions: Any, axes: tuple[int, ...], state: Any) -> Any:
        return combine(state, _masked(name, values, mask), axes)

    return TileReduction(start, fold, lambda state: state)


def _logsumexp_fold(values: Any, mask: Any, positions: Any, axes: Any, state: Any) -> Any:
    """The running peak and the sum of exponentials below it."""
    values = _masked("logsumexp", values, mask)
    peak, total = state
    new_peak = jnp.maximum(peak, values.max(axis=axes))
    safe = jnp.where(jnp.isinf(new_peak), 0.0, new_peak)
    grown = jnp.expand_dims(safe, axes) if axes else safe
    total = total * jnp.exp(peak - safe) + jnp.exp(values - grown).sum(axis=axes)
    return new_peak, total


def _logsumexp_finish(state: Any) -> jax.Array:
    peak, total = state
    return jnp.where(jnp.isinf(peak), peak, peak + jnp.log(total))


def _position(largest: bool) -> TileReduction:
    """argmax (`largest`) or argmin: the state is (group, value, position), group 0 for a
    NaN, 1 for a number, 2 for none; the best state is the least (group, ±value, position)."""
    worst = -jnp.inf if largest else jnp.inf

    def start(shape: tuple[int, ...], dtype: Any) -> Any:
        return (
            jnp.full(shape, 2, jnp.int32),
            jnp.full(shape, worst, dtype),
            jnp.full(shape, _NO_POSITION, jnp.int32),
        )

    def fold(values: Any, mask: Any, positions: Any, axes: Any, state: Any) -> Any:
        group = jnp.where(jnp.isnan(values), 0, 1).astype(jnp.int32)
        if mask is not None:
            group = jnp.where(mask, group, 2)
        numbers = jnp.where(group == 1, values, worst)
        best_group = group.min(axis=axes)
        best_value = numbers.max(axis=axes) if largest else numbers.min(axis=axes)
        g, v = jnp.expand_dims(best_group, axes), jnp.expand_dims(best_value, axes)
        chosen = (group == g) & ((g != 1) | (values == v))
        best_position = jnp.where(chosen, positions, _NO_POSITION).min(axis=axes)
        old_group, old_value, old_position = state
        beats = (best_value > old_value) if largest else (best_value < old_value)
        same = best_group == old_group
        better = (best_group < old_group) | (same & (best_group == 1) & beats)
        tied = same & ((best_group != 1) | (best_value == old_value))
        better = better | (tied & (best_position < old_position))
        return (
            jnp.where(better, best_group, old_group),
            jnp.where(better, best_value, old_value),
            jnp.where(better, best_position, old_position),
        )

    def finish(state: Any) -> jax.Array:
        group, _, position = state
        return jnp.where(group == 2, -1, position)

    return TileReduction(start, fold, finish)


def _product(values: Any, axes: tuple[int, ...]) -> Any:
    """The product over `axes`: a reshape where they hold one value each (tile programs
    give a prod tiles of one value: Triton's lowering has no product reduction)."""
    if all(values.shape[a] == 1 for a in axes):
        return jnp.squeeze(values, axes)
    return values.prod(axis=axes)


TILE_REDUCTIONS: dict[str, TileReduction] = {
    "sum": _plain("sum", lambda s, v, axes: s + v.sum(axis=axes)),
    "max": _plain("max", lambda s, v, axes: jnp.maximum(s, v.max(axis=axes))),
    "min": _plain("min", lambda s, v, axes: jnp.minimum(s, v.min(axis=axes))),
    "prod": _plain("prod", lambda s, v, axes: s * _product(v, axes)),
    "logsumexp": TileReduction(
        lambda shape, dtype: (jnp.full(shape, -jnp.inf, dtype), jnp.zeros(shape, dtype)),
        _logsumexp_fold,
        _logsumexp_finish,
    ),
    "argmax": _position(largest=True),
    "argmin": _position(largest=False),
}
