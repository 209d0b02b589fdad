"""Tiles shaped by what they share (`codegen.c.tiles.rules`): a gate computed per row of an
elementwise nest (squeeze-and-excite's `X[n, c, s] * sigmoid(E[n, c])`) gets the wide tile
that computes it once per 64 lanes, as in a reduction; dot products whose reads all read the
row index share nothing across rows (a row sum `sum_s X[n, c, s]`): one row of 4, each row
one contiguous stream. Values against float64 numpy at extents around the tile sizes,
outputs poisoned, float32 and float64."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import tensordsl as td
from codegen.c.schedule import choose_cpu_schedule
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

GATE = "Y[n,c,s] := X[n,c,s] * sigmoid(E[n,c])"
GATE_GRADIENT = "dX[n,c,s] := D[n,c,s] * sigmoid(E[n,c]) + F[n,c] / S"
ROW_MEAN = "z[n,c] := X[n,c,s] / S"
PRODUCT_SUM = "dE[n,c] := X[n,c,s] * D[n,c,s]"
TOLERANCE = {"float32": 2e-5, "float64": 1e-12}


def _schedule(source: str):
    return choose_cpu_schedule(lower(parse(source)).nest, {}, kernel=True)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


@pytest.mark.parametrize("source", [GATE, GATE_GRADIENT])
def test_a_gate_per_row_gets_the_wide_tile(source):
    schedule = _schedule(source)
    assert (schedule.strategy, schedule.row, schedule.vector) == ("tile", "c", "s")
    assert (schedule.rows, schedule.width) == (8, 64)
    narrow = schedule.small  # where s is shorter than 64
    assert (narrow.strategy, narrow.rows, narrow.width) == ("tile", 6, 32)


def test_an_elementwise_nest_without_a_row_function_keeps_the_narrow_tile():
    schedule = _schedule("Y[n,c,s] := X[n,c,s] * E[n,c]")
    assert (schedule.rows, schedule.width) == (6, 32)


@pytest.mark.parametrize("source", [ROW_MEAN, PRODUCT_SUM])
def test_dot_products_that_share_no_read_take_one_row(source):
    schedule = _schedule(source)
    assert (schedule.strategy, schedule.row, schedule.vector) == ("dot", "n", "c")
    assert (schedule.rows, schedule.width) == (1, 4)


def test_dot_products_that_share_a_read_keep_four_rows():
    # a matmul with both operands along j: B[k, j] is read by every row i
    schedule = _schedule("C[i,k] := A[i,j] * B[k,j]")
    assert (schedule.strategy, schedule.rows, schedule.width) == ("dot", 4, 4)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "shape", [(2, 8, 64), (3, 13, 70), (1, 5, 9), (2, 9, 129), (2, 7, 32), (1, 17, 40)]
)
def test_the_wide_gate_tiles_and_their_gradients_compute_the_gate(shape, dtype):
    rng = np.random.default_rng(sum(shape))
    n, c, s = shape
    X = rng.normal(size=shape).astype(dtype)
    E = rng.normal(size=(n, c)).astype(dtype)
    dY = rng.normal(size=shape).astype(dtype)
    x, e, dy = (a.astype(np.float64) for a in (X, E, dY))
    k = td.kernel(GATE, backend="c")
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(k(X, E), x * _sigmoid(e)[..., None], rtol=tol, atol=tol)
    dX, dE = jax.vjp(k, X, E)[1](dY)
    gate = _sigmoid(e)
    np.testing.assert_allclose(dX, dy * gate[..., None], rtol=tol, atol=tol)
    want_dE = (dy * x).sum(-1) * gate * (1 - gate)
    np.testing.assert_allclose(dE, want_dE, rtol=tol * 10, atol=tol * s)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(2, 8, 64), (3, 13, 70), (1, 5, 9), (5, 3, 1)])
def test_row_sums_in_one_row_tiles(shape, dtype):
    rng = np.random.default_rng(sum(shape) + 1)
    X = rng.normal(size=shape).astype(dtype)
    D = rng.normal(size=shape).astype(dtype)
    x, d = X.astype(np.float64), D.astype(np.float64)
    tol = TOLERANCE[dtype]
    mean = td.kernel(ROW_MEAN, backend="c")(X, np.asarray(shape[-1], dtype))
    np.testing.assert_allclose(mean, x.mean(-1), rtol=tol, atol=tol)
    total = td.kernel(PRODUCT_SUM, backend="c")(X, D)
    np.testing.assert_allclose(total, (x * d).sum(-1), rtol=tol, atol=tol * shape[-1])
