"""Score parameters' gradients as per-tile partial sums of the dK+dV kernel
(`codegen.tiles.attention.partials`), on the pallas back end.

Each program instance owns one block of a partials array per parameter: `(outer indices, row
tile, positions)`, zeroed first. On every tile it visits, the tile's contributions (the
gradient nest's body on `[R x C]`, the nested sums the kernel's dots, the pairs the kernel
leaves out zeroed) are summed per position of the parameter's local axis over the window the
tile reaches: one masked tile sum per position, no scatter (Pallas' interpret mode drops
updates at repeated indices; Triton would need atomics), then added to the instance's own
block at the window's offset (`api.add_at`: a contiguous slice, every index once). After the
kernel the partials are summed over the row tiles and the outer indices the parameter does
not have, in a fixed order: deterministic.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from codegen.tiles.attention.partials import ParamPartial
from tensordsl.backends.pallas import api


def partial_spec(program: Any, partial: ParamPartial) -> tuple:
    """(shape, block, index map, dtype) of a partials array: one block of `partial.length`
    positions per program instance."""
    grid = program.grid_shape
    shape = (*grid, partial.length)
    block = (*(1 for _ in grid), partial.length)

    def index_map(*g: Any) -> tuple:
        return (*g, 0)

    return shape, block, index_map, jnp.dtype(program.accumulate)


def add_partial(
    partial: ParamPartial,
    ref: Any,
    evaluate: Any,
    kept: Any,
    low: Any,
    tile: tuple[int, int],
    dtype: Any,
) -> None:
    """Add one tile's contributions to the instance's block: `low` is the least position
    the tile reaches, `kept` the pairs the kernel keeps (None: all)."""
    weight = jnp.broadcast_to(jnp.asarray(evaluate(partial.weight), dtype), tile)
    if kept is not None:
        weight = jnp.where(kept, weight, jnp.zeros((), dtype))
    position = jnp.broadcast_to(jnp.asarray(evaluate(partial.local), jnp.int32), tile) - low
    slots = jax.lax.broadcasted_iota(jnp.int32, (partial.window,), 0)

    def one(k: Any, acc: jax.Array) -> jax.Array:
        total = jnp.where(position == k, weight, jnp.zeros((), dtype)).sum()
        return acc + jnp.where(slots == k, total, jnp.zeros((), dtype))

    window = jax.lax.fori_loop(0, partial.window, one, jnp.zeros((partial.window,), dtype))
    # A window wholly outside the axis holds zeros only: clipped, it adds nothing.
    start = jnp.clip(low + partial.window, 0, partial.extent + partial.window)
    api.add_at(ref, start, window)


def summed(program: Any, partial: ParamPartial, partials: jax.Array) -> jax.Array:
    """The parameter's gradient from the partials array: the local axis cut out, summed
    over the row tiles and the outer indices the parameter does not have, in the
    parameter's axis order."""
    outer = [a.index for a in program.outer]
    found = partials[..., partial.window : partial.window + partial.extent]
    found = found.sum(axis=len(outer))
    mapped = [s for s in partial.outer if s is not None]
    dropped = tuple(k for k, s in enumerate(outer) if s not in mapped)
    found = found.sum(axis=dropped) if dropped else found
    kept = [s for s in outer if s in mapped]  # the axes left, then the local ones
    found = found.reshape((*found.shape[:-1], *partial.local_shape))
    order, local = [], len(kept)
    for s in partial.outer:
        if s is None:
            order.append(local)
            local += 1
        else:
            order.append(kept.index(s))
    return jnp.transpose(found, order).reshape(partial.shape).astype(partials.dtype)
