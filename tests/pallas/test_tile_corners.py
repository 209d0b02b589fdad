"""`corner`: the least and largest value of an affine bound over a tile's box, shared by the
tile-program lowering and the attention kernel (tensordsl/backends/pallas/lower.py), checked
against every integer point of the box."""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from codegen.ir.nest import index_symbol
from tensordsl.backends.pallas.lower import corner

I, J, K = (index_symbol(n) for n in "ijk")


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [jnp.int32, jnp.int64])
def test_a_corner_is_the_extreme_over_every_point_of_the_box(seed, dtype) -> None:
    rng = np.random.default_rng(seed)
    coefficients = rng.integers(-5, 6, size=3)
    constant = int(rng.integers(-20, 21))
    expr = constant + sum(int(c) * x for c, x in zip(coefficients, (I, J, K)))
    lows = rng.integers(-10, 10, size=3)
    box = {x: (int(lo), int(lo + rng.integers(0, 9))) for x, lo in zip((I, J, K), lows)}
    values = [
        constant + int(np.dot(coefficients, point))
        for point in itertools.product(*(range(lo, hi + 1) for lo, hi in box.values()))
    ]

    def both(bounds):  # traced bounds, as a kernel's tile offsets are
        traced = dict(zip(box, bounds))
        least = corner(expr, traced, most=False, dtype=dtype)
        most = corner(expr, traced, most=True, dtype=dtype)
        return least, most

    bounds = [tuple(jnp.asarray(b, dtype) for b in pair) for pair in box.values()]
    least, most = jax.jit(both)(bounds)  # (the suite runs with x64 on: tests/conftest.py)
    assert (int(least), int(most)) == (min(values), max(values))
    assert least.dtype == most.dtype == jnp.dtype(dtype)


def test_a_bound_that_is_not_affine_has_no_corner() -> None:
    box = {I: (0, 3), J: (0, 3)}
    assert corner(I * J, box, most=True, dtype=jnp.int32) is None
    assert corner(I / 2 + J, box, most=True, dtype=jnp.int32) is None
