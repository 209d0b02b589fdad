"""Nested sums that read a tile's vector lanes (a column statistic's gradient: BatchNorm's
`sum_b dY[b, f]*(X[b, f] - mu[f])` in lanes of `f`) are computed with their loop outside the
lanes (`codegen.c.tiles.lanes.batch_lane_sums`): checked against float64 at sizes that leave
ragged tiles, under a mask, and on what gcc makes of the generated C."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.backends import NEEDS_C_COMPILER
from tests.vectorised import unvectorised_simd_loops

pytestmark = [NEEDS_C_COMPILER, pytest.mark.usefixtures("poisoned_outputs")]

BATCH_NORM = """
    mu[f] := X[b,f] / size(b)
    var[f] := (X[b,f] - mu[f])^2 / size(b)
    Y[b,f] := (X[b,f] - mu[f]) * rsqrt(var[f] + 1e-5) * g[f] + beta[f]
"""


def _batch_norm(X, g, beta):
    mu = X.mean(0)
    return (X - mu) / np.sqrt(((X - mu) ** 2).mean(0) + 1e-5) * g + beta


def _inputs(b, f, dtype):
    rng = np.random.default_rng(b * f)
    X = rng.normal(1.0, 2.0, (b, f))
    return X, rng.normal(size=f), rng.normal(size=f), rng.normal(size=(b, f))


def _gradients_against_float64(fn, reference, args, ct, dtype):
    """Value and gradients of `sum(fn(*args) * ct)` in `dtype` against float64 central
    differences of the numpy `reference` along random directions (relative to the largest
    gradient element)."""
    cast = [np.asarray(a, dtype) for a in args]
    loss, grads = jax.value_and_grad(
        lambda *a: jnp.sum(fn(*a) * ct.astype(dtype)), tuple(range(len(args)))
    )(*cast)
    want = np.sum(reference(*args) * ct)
    rtol = 1e-9 if dtype == np.float64 else 2e-4
    np.testing.assert_allclose(float(loss), want, rtol=rtol, atol=rtol * np.abs(want))
    rng = np.random.default_rng(7)
    for n, grad in enumerate(grads):
        direction = rng.normal(size=np.shape(args[n]))
        h = 1e-6
        up = [a + h * direction if m == n else a for m, a in enumerate(args)]
        down = [a - h * direction if m == n else a for m, a in enumerate(args)]
        numeric = (np.sum(reference(*up) * ct) - np.sum(reference(*down) * ct)) / (2 * h)
        got = float(np.sum(np.asarray(grad, np.float64) * direction))
        scale = np.abs(np.asarray(grad, np.float64)).sum() * np.abs(direction).max()
        assert abs(got - numeric) <= 10 * rtol * scale + 1e-6 * abs(numeric), (n, got, numeric)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize(("b", "f"), [(13, 37), (6, 70), (40, 8)])
def test_batch_norm_s_gradients_match_float64(b, f, dtype):
    X, g, beta, ct = _inputs(b, f, dtype)
    layer = td.program(BATCH_NORM, backend="c")
    got = np.asarray(layer(*(np.asarray(a, dtype) for a in (X, g, beta))))
    np.testing.assert_allclose(got, _batch_norm(X, g, beta), rtol=0, atol=1e-4 * 5)
    _gradients_against_float64(layer, _batch_norm, (X, g, beta), ct, dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_masked_column_sum_s_gradient_matches_float64(dtype):
    # the gradient of a per-column statistic under a triangular mask: the lanes' sums run
    # under the tile's tests, reading only plain accesses
    X, _, _, _ = _inputs(21, 45, dtype)
    W = np.random.default_rng(3).normal(size=(21, 45))
    source = """
        m[f] := where(b <= f, X[b,f], 0) * W[b,f]
        Y[b,f] := tanh(m[f]) * X[b,f]
    """
    layer = td.program(source, backend="c")

    def reference(X, W):
        m = (np.where(np.arange(21)[:, None] <= np.arange(45)[None, :], X, 0) * W).sum(0)
        return np.tanh(m) * X

    ct = np.random.default_rng(4).normal(size=X.shape)
    _gradients_against_float64(layer, reference, (X, W), ct, dtype)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_batch_norm_s_column_sums_are_vectorised(tmp_path):
    # each took 11x the time of its vectorised form at 256 x 1024 (dvar 1.46 -> 0.13 ms)
    layer = td.program(BATCH_NORM, backend="c")
    sources = layer.source("c", {"X": (256, 1024), "g": (1024,), "beta": (1024,)})
    for name in ("dvar", "dmu", "dg"):
        assert "l[w_] +=" in sources[name], name  # the sum in lane arrays
        assert unvectorised_simd_loops(sources[name], tmp_path, reading="l[w_]") == [], name
