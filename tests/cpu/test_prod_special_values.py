"""The prod reduction's gradient with zeros, infinities and NaN, against `jax.grad` of
`jnp.prod` (the product of the other factors), on the reference and C back ends."""

from __future__ import annotations

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen import config

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

BACKENDS = [
    "reference",
    pytest.param(
        "c",
        marks=pytest.mark.skipif(
            shutil.which(config.c_compiler()) is None,
            reason=f"no C compiler {config.c_compiler()!r} (set TENSORDSL_CC)",
        ),
    ),
]
INF, NAN = np.inf, np.nan
#: One row per case; every row is reduced (prod over j).
ROWS = [
    [2.0, INF, 1.0],  # issue 13: jnp gives [inf, 2, inf]
    [2.0, -INF, 3.0],
    [INF, INF, 2.0],
    [-INF, 3.0, INF],
    [0.0, INF, 3.0],
    [0.0, 0.0, INF],
    [INF, 0.0, -2.0],
    [0.0, 5.0, 3.0],
    [0.0, 0.0, 3.0],
    [0.0, 2.0, NAN],
    [1.5, NAN, 4.0],
    [NAN, NAN, 2.0],
    [-0.75, 4.0, -2.0],
]


def jnp_gradient(X: np.ndarray, cotangent: np.ndarray) -> np.ndarray:
    return np.array(jax.grad(lambda x: jnp.vdot(jnp.prod(x, axis=1), cotangent))(X))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_prod_gradient_matches_jnp_with_zeros_and_infinities(backend: str, dtype: str) -> None:
    X = np.array(ROWS, dtype)
    cotangent = np.random.default_rng(0).uniform(0.5, 2.0, len(ROWS)).astype(dtype)
    k = td.kernel("(prod) Y[i] := X[i,j]", backend=backend)
    with np.errstate(invalid="ignore"):  # 0 * inf
        np.testing.assert_allclose(np.asarray(k(X)), np.prod(X, axis=1), rtol=1e-6)
    got = np.asarray(jax.grad(lambda x: jnp.vdot(k(x), cotangent))(X))
    expected = jnp_gradient(X, cotangent)
    # Documented difference: a NaN factor's own gradient is NaN (jnp: the product of the
    # others), because the product of the others is the product of all divided by it.
    expected[np.isnan(X)] = np.nan
    np.testing.assert_allclose(got, expected, rtol=1e-6, equal_nan=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prod_gradient_of_a_body_with_infinities(backend: str) -> None:
    # The factor is a function of the input: its infinities come from the body, not X.
    X = np.array([[0.5, 800.0, 2.0], [1.0, -1.0, 800.0]])
    cotangent = np.array([1.25, -0.5])
    k = td.kernel("(prod) Y[i] := exp(X[i,j])", backend=backend)

    def truth(x):
        return jnp.vdot(jnp.prod(jnp.exp(x), axis=1), cotangent)

    got = np.asarray(jax.grad(lambda x: jnp.vdot(k(x), cotangent))(X))
    np.testing.assert_allclose(got, np.asarray(jax.grad(truth)(X)), rtol=1e-12, equal_nan=True)
