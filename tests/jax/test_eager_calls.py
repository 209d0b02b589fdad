"""Kernels called eagerly (outside `jit`): run directly, with no XLA program compiled for the
nest, for the first calls of each signature; then through JAX's dispatch (tensordsl.binding.eager).
"""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl.binding import eager

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

rng = np.random.default_rng(7)


@pytest.fixture
def nest_compiles(caplog: pytest.LogCaptureFixture):
    """How many XLA programs of a tensordsl primitive alone JAX compiled (`jax.log_compiles`)."""

    def count() -> int:
        return sum(
            "Finished XLA compilation of jit(tensordsl_" in record.getMessage()
            for record in caplog.records
        )

    caplog.set_level(logging.WARNING, logger="jax._src.dispatch")
    with jax.log_compiles(True):
        yield count


def _pairwise(W: np.ndarray, X: np.ndarray) -> np.ndarray:
    return ((W[:, :, None] - X[:, None, :]) ** 2).sum(0)


def test_eager_call_and_gradient_compile_no_program(nest_compiles):
    k = td.kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend="c")
    W, X = rng.uniform(-1, 1, (6, 5)), rng.uniform(-1, 1, (6, 7))
    C = rng.uniform(-1, 1, (5, 7))
    np.testing.assert_allclose(np.asarray(k(W, X)), _pairwise(W, X), rtol=1e-12)
    dW, dX = jax.grad(lambda W, X: jnp.sum(k(W, X) * C), argnums=(0, 1))(W, X)
    diff = W[:, :, None] - X[:, None, :]  # float64 reference: d/dW = 2 (W - X) C
    np.testing.assert_allclose(np.asarray(dW), (2 * diff * C).sum(2), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(dX), (-2 * diff * C).sum(1), rtol=1e-12)
    assert nest_compiles() == 0


def test_eager_results_are_the_jitted_results_bit_for_bit():
    k = td.kernel("Y[b,o] := tanh(W[o,i] * X[b,i] + c[o])", backend="c")
    args = [rng.standard_normal(s).astype(np.float32) for s in [(9, 13), (4, 13), (9,)]]
    eager_out = k(*args)
    jitted = jax.jit(k)(*args)
    assert eager_out.dtype == jitted.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(eager_out), np.asarray(jitted))
    W, X, c = (a.astype(np.float64) for a in args)  # Y[b,o] sums tanh(...) over i
    reference = np.tanh(W[None, :, :] * X[:, None, :] + c[None, :, None]).sum(2)
    np.testing.assert_allclose(np.asarray(eager_out), reference, rtol=2e-5, atol=2e-6)


def test_forward_mode_eager(nest_compiles):
    k = td.kernel("Y[i] := exp(X[i,j]) * V[j]", backend="c")
    X, V = rng.uniform(-1, 1, (4, 6)), rng.uniform(-1, 1, 6)
    tX, tV = rng.uniform(-1, 1, (4, 6)), rng.uniform(-1, 1, 6)
    value, tangent = jax.jvp(k, (X, V), (tX, tV))
    np.testing.assert_allclose(np.asarray(value), np.exp(X) @ V, rtol=1e-12)
    np.testing.assert_allclose(
        np.asarray(tangent), (np.exp(X) * tX) @ V + np.exp(X) @ tV, rtol=1e-12
    )
    assert nest_compiles() == 0


def test_numbers_integers_and_numpy_inputs_are_not_modified():
    k = td.kernel("Y[i] := X[i, idx[i]] * s", backend="c")
    X = rng.uniform(-1, 1, (5, 4))
    idx = rng.integers(0, 4, 5)
    kept = X.copy(), idx.copy()
    np.testing.assert_allclose(np.asarray(k(X, idx, 2.5)), X[np.arange(5), idx] * 2.5)
    np.testing.assert_array_equal(X, kept[0])
    np.testing.assert_array_equal(idx, kept[1])


def test_after_the_direct_calls_jax_dispatch_compiles_once(nest_compiles):
    k = td.kernel("Y[i] := X[i,j] * X[i,j]", backend="c")
    X = jnp.asarray(rng.uniform(-1, 1, (3, 11)))  # a shape no other test calls
    for _ in range(eager.DIRECT_CALLS + 3):
        np.testing.assert_allclose(np.asarray(k(X)), (np.asarray(X) ** 2).sum(1), rtol=1e-12)
    assert nest_compiles() == 1


def test_operands_on_several_devices_go_through_jax(nest_compiles):
    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("needs two devices (tests/conftest.py asks XLA for four CPU devices)")
    k = td.kernel("Y[i,j] := X[i,j] * 3 + 1", backend="c")
    mesh = jax.sharding.Mesh(np.array(devices[:2]), ("x",))
    X = rng.uniform(-1, 1, (4, 6))
    sharded = jax.device_put(X, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x")))
    out = k(sharded)
    np.testing.assert_allclose(np.asarray(out), X * 3 + 1, rtol=1e-12)
    assert nest_compiles() == 1


def test_debug_nans_still_raises():
    k = td.kernel("Y[i] := log(X[i])", backend="c")
    with jax.debug_nans(True), pytest.raises(FloatingPointError):
        k(np.array([1.0, -2.0, 3.0]))
    np.testing.assert_allclose(np.asarray(k(np.array([1.0, 2.0]))), np.log([1.0, 2.0]))
