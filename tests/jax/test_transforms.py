"""Kernels as ordinary JAX functions: scan, donation, dtypes, scalars, trace-time errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.c.run import compiler
from tensordsl.errors import RangeError

rng = np.random.default_rng(0)
TOLERANCE = {"float16": 1e-2, "bfloat16": 4e-2, "float32": 1e-5, "float64": 1e-12}


def test_scan_of_24_layers_compiles_each_kernel_once(tmp_path, monkeypatch):
    """A 24-layer MLP under lax.scan: forward, gradients, one build per distinct nest."""
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))  # cold cache: count real builds
    dense = td.kernel("H[b,o] := W[o,i] * X[b,i]", backend="c")
    act = td.kernel("Y[b,o] := tanh(H[b,o] + c[o])", backend="c")
    layers, width, batch = 24, 8, 5
    Ws = rng.uniform(-0.5, 0.5, (layers, width, width))
    cs = rng.uniform(-0.1, 0.1, (layers, width))
    X = rng.uniform(-1, 1, (batch, width))

    def model(dense, act):
        def step(h, params):
            W, c = params
            return act(dense(W, h), c), None

        return lambda Ws, cs, X: jnp.sum(jax.lax.scan(step, X, (Ws, cs))[0] ** 2)

    def dense_jnp(W, X):
        return X @ W.T

    def act_jnp(H, c):
        return jnp.tanh(H + c)

    before = compiler.STATS["compiles"]
    got = jax.jit(jax.value_and_grad(model(dense, act), (0, 1, 2)))(Ws, cs, X)
    builds = compiler.STATS["compiles"] - before
    expected = jax.value_and_grad(model(dense_jnp, act_jnp), (0, 1, 2))(Ws, cs, X)
    np.testing.assert_allclose(float(got[0]), float(expected[0]), rtol=1e-12)
    for g, e in zip(got[1], expected[1]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-10, atol=1e-13)
    # The dense layer and its gradients are pure contractions (XLA's dot, no kernel); the
    # activation and its gradient nests (dH, dc) are built once each for all 24 layers.
    assert builds == 3


def test_donated_input():
    k = td.kernel("Y[i,j] := X[i,j] * s", backend="c")
    X = rng.uniform(-1, 1, (4, 3))
    expected = X * 1.5
    f = jax.jit(lambda X: k(X, 1.5) + 1.0, donate_argnums=0)
    np.testing.assert_allclose(np.asarray(f(jnp.asarray(X))), expected + 1.0, rtol=1e-12)


@pytest.mark.parametrize(
    ("a", "b", "out"),
    [
        ("float16", "float16", "float16"),
        ("bfloat16", "bfloat16", "bfloat16"),
        ("float32", "float64", "float64"),
        ("float16", "float32", "float32"),
        ("bfloat16", "float16", "float32"),
    ],
)
def test_dtype_promotion_follows_jax(a, b, out):
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", backend="c")
    A = jnp.asarray(rng.uniform(-1, 1, (3, 4)), a)
    B = jnp.asarray(rng.uniform(-1, 1, (4, 2)), b)
    got = k(A, B)
    assert got.dtype == jnp.result_type(A, B) == jnp.dtype(out)
    expected = np.asarray(A, np.float64) @ np.asarray(B, np.float64)
    tolerance = TOLERANCE[out]
    np.testing.assert_allclose(
        np.asarray(got, np.float64), expected, rtol=tolerance, atol=tolerance
    )
    gA, gB = jax.grad(lambda A, B: jnp.sum(k(A, B)).astype(jnp.float32), (0, 1))(A, B)
    assert gA.dtype == A.dtype and gB.dtype == B.dtype
    expected_gA = np.ones((3, 2)) @ np.asarray(B, np.float64).T
    loose = 4 * TOLERANCE[a]
    np.testing.assert_allclose(np.asarray(gA, np.float64), expected_gA, rtol=loose, atol=loose)


def test_weak_python_scalar_keeps_the_tensor_dtype():
    k = td.kernel("Y[i] := alpha * X[i]", backend="c")
    X = jnp.asarray(rng.uniform(-1, 1, 6), jnp.float16)
    got = k(2.5, X)
    assert got.dtype == jnp.float16
    np.testing.assert_allclose(
        np.asarray(got, np.float64), 2.5 * np.asarray(X, np.float64), rtol=1e-3
    )


def test_traced_scalar_input_and_its_gradient():
    k = td.kernel("Y[i] := alpha * X[i]^2", backend="c")
    X = rng.uniform(-1, 1, 6)
    f = jax.jit(lambda alpha: jnp.sum(k(alpha, X)))
    np.testing.assert_allclose(float(f(0.75)), 0.75 * np.sum(X**2), rtol=1e-12)
    np.testing.assert_allclose(float(jax.grad(f)(0.75)), np.sum(X**2), rtol=1e-12)


def test_shape_errors_at_trace_time(monkeypatch):
    """A mismatch is reported while tracing, before any kernel is built or run."""
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", backend="c")
    before = dict(compiler.STATS)
    with pytest.raises(RangeError, match="k"):
        jax.eval_shape(
            k, jax.ShapeDtypeStruct((3, 4), "float32"), jax.ShapeDtypeStruct((5, 2), "float32")
        )
    with pytest.raises(RangeError):
        jax.jit(jax.vmap(k, (0, None))).trace(np.ones((2, 3, 4)), np.ones((5, 2)))
    assert before == compiler.STATS
