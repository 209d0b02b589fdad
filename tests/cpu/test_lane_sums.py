"""A nested sum inside a vectorised nested reduction (`codegen.emit.lane_sums`): ChebyKAN
written as one statement, whose X gradient sums a feature map of X against a contraction
(`sum_d g(X[b,i], d) * sum_o C[i,o,d]*dY[b,o]`), computed for chunks of `d` in lane
arrays. Forward and every gradient against float64 jax.numpy on random inputs, outputs
poisoned, at degrees below, at and above one chunk (8 floats, 4 doubles)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.backends import NEEDS_C_COMPILER

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

CHEBYKAN = "Y[b,o] := cos(d * acos(tanh(X[b,i]))) * C[i,o,d]"
#: a sum over d of a feature map times a nested sum over o, no function of d
POLYNOMIAL = "Y[b,o] := X[b,i]^d * C[i,o,d]"


def _chebykan(X, C):
    t = jnp.tanh(X)[..., None]
    degrees = jnp.arange(C.shape[-1], dtype=X.dtype)
    return jnp.einsum("bid,iod->bo", jnp.cos(degrees * jnp.arccos(t)), C)


def _polynomial(X, C):
    degrees = jnp.arange(C.shape[-1], dtype=X.dtype)
    return jnp.einsum("bid,iod->bo", X[..., None] ** degrees, C)


def test_the_x_gradient_sums_in_lane_arrays():
    k = td.kernel(CHEBYKAN, backend="c")
    text = k.source("c")["grad_X"]
    assert "_l[8] = {0};" in text  # the lane array of the inner sums, one vector of floats
    assert "#pragma omp simd reduction(+:" in text


@pytest.mark.parametrize("backend", ["reference", pytest.param("c", marks=NEEDS_C_COMPILER)])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("degrees", [3, 4, 8, 11, 17])
@pytest.mark.parametrize(
    ("source", "reference"), [(CHEBYKAN, _chebykan), (POLYNOMIAL, _polynomial)]
)
def test_feature_maps_forward_and_gradients_match_float64(
    source, reference, degrees, dtype, backend
):
    rng = np.random.default_rng(degrees)
    X = 0.8 * rng.normal(size=(13, 6))
    C = rng.normal(size=(6, 5, degrees)) / degrees
    k = td.kernel(source, backend=backend)
    got, vjp = jax.vjp(k, X.astype(dtype), C.astype(dtype))
    want, want_vjp = jax.vjp(reference, X, C)
    tol = 1e-11 if dtype == "float64" else 1e-4
    scale = float(np.max(np.abs(want)))
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)
    cotangent = rng.normal(size=want.shape)
    for grad, expected in zip(vjp(cotangent.astype(dtype)), want_vjp(cotangent), strict=True):
        scale = float(np.max(np.abs(expected)))
        np.testing.assert_allclose(grad, expected, rtol=tol, atol=tol * scale)
