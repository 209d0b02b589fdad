"""rsqrt and x**(3/2) on the C back end (issue 26): printed as sqrt with a division or a
product, not powf (twice as fast per call), with pow's values, -0 included."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import tensordsl as td
from tests.backends import NEEDS_C_COMPILER

pytestmark = [NEEDS_C_COMPILER, pytest.mark.usefixtures("poisoned_outputs")]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_rsqrt_values_and_gradient_against_numpy(dtype):
    k = td.kernel("Y[b,f] := X[b,f] * rsqrt(V[b])", backend="c")
    rng = np.random.default_rng(26)
    X = rng.normal(size=(5, 7)).astype(dtype)
    V = rng.uniform(0.1, 3.0, size=5).astype(dtype)
    ct = rng.normal(size=(5, 7))
    want = X.astype(np.float64) / np.sqrt(V.astype(np.float64))[:, None]
    rtol = 1e-6 if dtype == "float32" else 1e-13
    np.testing.assert_allclose(np.asarray(k(X, V)), want, rtol=rtol)
    dV = jax.grad(lambda V: (k(X, V) * ct).sum())(V)  # reads V**(-3/2)
    want_dV = -0.5 * (ct * X).sum(1) / V.astype(np.float64) ** 1.5
    np.testing.assert_allclose(np.asarray(dV), want_dV, rtol=10 * rtol)
    source = "".join(k.source("c").values())  # forward and gradient nests
    assert "pow" not in source and "sqrt" in source


def test_rsqrt_and_three_halves_at_zero_as_pow():
    # pow(-0, -1/2) is +inf (C and numpy's power), 1/sqrt(-0) would be -inf; pow(0, 3/2) = 0
    k = td.kernel("Y[i] := rsqrt(X[i]) + X[i]^1.5 * 0", backend="c")
    X = np.array([-0.0, 0.0, 4.0, -1.0])
    got = np.asarray(k(X))
    np.testing.assert_array_equal(got[:3], [np.inf, np.inf, 0.5])
    assert np.isnan(got[3])
    three_halves = td.kernel("Y[i] := X[i]^1.5", backend="c")
    np.testing.assert_allclose(
        np.asarray(three_halves(np.array([-0.0, 0.0, 4.0, 2.5]))), [0, 0, 8, 2.5**1.5], rtol=1e-14
    )
