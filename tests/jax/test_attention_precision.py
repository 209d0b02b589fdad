"""Attention with scores beyond float precision (issue 36.12; docs/nn.md, "Scores beyond
float precision"): with float64 scores near 1e200 every softmax row is one-hot. Unfused, the
reference back end stores the scores once and gives jax.numpy's gradients exactly (0 for q
and k); fused, float64 gradients take `sum_e dO * (v - O)` for FlashAttention's `dP - D`
and are exact on every back end, against numpy float64."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl import nn
from tests.backends import BACKENDS, generated_kernels  # noqa: F401 (a fixture)


def test_one_hot_rows_give_jax_numpys_gradients_unfused_on_the_reference(monkeypatch):
    monkeypatch.setenv("TENSORDSL_FUSE", "0")
    B, T, H, E = 1, 6, 1, 4
    rng = np.random.default_rng(0)
    q, k = rng.normal(size=(B, T, H, E)) * 1e100, rng.normal(size=(B, T, H, E)) * 1e100
    v, ct = rng.normal(size=(B, T, H, E)), rng.normal(size=(B, T, H, E))

    def theirs(q, k, v):
        s = jnp.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(E)
        return jnp.einsum("bhij,bjhe->bihe", jax.nn.softmax(s, -1), v)

    def ours(q, k, v):
        return nn.attention(q, k, v, backend="reference")

    np.testing.assert_array_equal(np.asarray(ours(q, k, v)), np.asarray(theirs(q, k, v)))
    got = jax.grad(lambda *a: jnp.sum(ours(*a) * ct), (0, 1, 2))(q, k, v)
    want = jax.grad(lambda *a: jnp.sum(theirs(*a) * ct), (0, 1, 2))(q, k, v)
    for name, g, w in zip("qkv", got, want, strict=True):
        np.testing.assert_allclose(
            np.asarray(g), np.asarray(w), rtol=1e-12, atol=1e-12, err_msg=name
        )
    assert not np.asarray(got[0]).any() and not np.asarray(got[1]).any()


# -- fused gradients: `dP - D` exact at a one-hot row (float64) ---------------------------

#: A program form of attention (docs/nn.md): the scores never stored, fused by default.
ATTENTION = """
s[b,h,i,j] := q[b,i,h,d] * k[b,j,h,d] * scale
(logsumexp) lse[b,h,i] := s[b,h,i,j]
out[b,h,i,e] := exp(s[b,h,i,j] - lse[b,h,i]) * v[b,j,h,e]
"""


def _numpy_gradients(q, k, v, ct, scale, causal=False, lse_ct=None):
    """dq, dk, dv of `sum(out * ct) + sum(lse * lse_ct)` in numpy float64, head by head,
    with the softmax's backward as jax.numpy writes it: `P * (dP - sum_j P * dP + dL)`
    (exactly 0 at a one-hot row: the sum adds dP's one kept value to zeros)."""
    B, T, H, _ = q.shape
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for b in range(B):
        for h in range(H):
            s = q[b, :, h] @ k[b, :, h].T * scale
            if causal:
                s = np.where(np.tril(np.ones((T, k.shape[1]), bool)), s, -np.inf)
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            dp = ct[b, :, h] @ v[b, :, h].T
            dl = 0.0 if lse_ct is None else lse_ct[b, h][:, None]
            ds = p * (dp - (p * dp).sum(-1, keepdims=True) + dl)
            dv[b, :, h] = p.T @ ct[b, :, h]
            dq[b, :, h] = ds @ k[b, :, h] * scale
            dk[b, :, h] = ds.T @ q[b, :, h] * scale
    return dq, dk, dv


def _one_hot_inputs(q_size, k_size, T=70, B=2, H=2, E=4, seed=1):
    """Queries and keys whose scores are near `q_size * k_size` (one key takes each row's
    whole weight), values and cotangents near 1."""
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, T, H, E)) * q_size
    k = rng.normal(size=(B, T, H, E)) * k_size
    v, ct = rng.normal(size=(B, T, H, E)), rng.normal(size=(B, T, H, E))
    return q, k, v, ct


def _check(got, want):
    for name, g, w in zip("qkv", got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), w, rtol=1e-12, atol=1e-12, err_msg=f"d{name}")


ONE_HOT_BACKENDS = [*BACKENDS, "pallas"]


@pytest.mark.usefixtures("generated_kernels")
@pytest.mark.parametrize("backend", ONE_HOT_BACKENDS)
def test_one_hot_rows_give_exact_fused_gradients(backend):
    q, k, v, ct = _one_hot_inputs(1e100, 1e100)
    want = _numpy_gradients(q, k, v, ct, 0.5)
    assert not want[0].any() and not want[1].any() and want[2].any()  # one-hot rows

    def loss(q, k, v):
        return jnp.sum(nn.attention(q, k, v, backend=backend) * ct)

    _check(jax.grad(loss, (0, 1, 2))(q, k, v), want)


@pytest.mark.usefixtures("generated_kernels")
@pytest.mark.parametrize("backend", ONE_HOT_BACKENDS)
def test_one_hot_rows_give_exact_causal_gradients(backend):
    """Scores near 1e200 from large queries alone: the issue's dK of 3e182 (jax.numpy: 0)."""
    q, k, v, ct = _one_hot_inputs(1e200, 1.0, T=40)
    want = _numpy_gradients(q, k, v, ct, 0.5, causal=True)
    assert not want[0].any() and not want[1].any()

    def loss(q, k, v):
        return jnp.sum(nn.attention(q, k, v, causal=True, backend=backend) * ct)

    _check(jax.grad(loss, (0, 1, 2))(q, k, v), want)


@pytest.mark.usefixtures("generated_kernels")
@pytest.mark.parametrize("backend", ONE_HOT_BACKENDS)
def test_one_hot_rows_with_a_logsumexp_cotangent(backend):
    """A cotangent on the returned logsumexp: dq and dk are then `dL * k` and `dL * q`."""
    q, k, v, ct = _one_hot_inputs(1e200, 1.0, T=40, seed=6)
    lse_ct = np.random.default_rng(2).normal(size=(2, 2, 40))
    want = _numpy_gradients(q, k, v, ct, 0.5, causal=True, lse_ct=lse_ct)

    def loss(q, k, v):
        out, lse = nn.attention(q, k, v, causal=True, return_lse=True, backend=backend)
        return jnp.sum(out * ct) + jnp.sum(lse * lse_ct)

    _check(jax.grad(loss, (0, 1, 2))(q, k, v), want)


@pytest.mark.usefixtures("generated_kernels")
@pytest.mark.parametrize("backend", ONE_HOT_BACKENDS)
def test_one_hot_rows_give_exact_gradients_as_a_program(backend):
    q, k, v, ct = _one_hot_inputs(1e100, 1e100, seed=3)
    program = td.program(ATTENTION, backend=backend)
    want = _numpy_gradients(q, k, v, ct, 0.5)
    ct_heads = np.swapaxes(ct, 1, 2)  # out is (b, h, i, e)

    def loss(q, k, v):
        return jnp.sum(program(q=q, k=k, v=v, scale=0.5) * ct_heads)

    _check(jax.grad(loss, (0, 1, 2))(q, k, v), want)


@pytest.mark.usefixtures("generated_kernels")
@pytest.mark.parametrize("backend", ONE_HOT_BACKENDS)
def test_float64_fused_gradients_of_ordinary_scores(backend):
    """The exact form is the whole softmax's gradient at any scores, masked rows included."""
    q, k, v, ct = _one_hot_inputs(1.0, 1.0, T=37, seed=4)
    lse_ct = np.random.default_rng(5).normal(size=(2, 2, 37))
    want = _numpy_gradients(q, k, v, ct, 0.5, causal=True, lse_ct=lse_ct)

    def loss(q, k, v):
        out, lse = nn.attention(q, k, v, causal=True, return_lse=True, backend=backend)
        return jnp.sum(out * ct) + jnp.sum(lse * lse_ct)

    _check(jax.grad(loss, (0, 1, 2))(q, k, v), want)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", ONE_HOT_BACKENDS)
def test_one_hot_rows_give_exact_gradients_with_the_scores_stored(backend, monkeypatch):
    """Contractions as XLA's dot (the default): at head width 64 the scores are stored, the
    statements run apart, and their float64 gradients are still the whole softmax's."""
    if jax.default_backend() != "gpu":
        monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    q, k, v, ct = _one_hot_inputs(1e100 / 4, 1e100 / 4, T=40, B=1, E=64, seed=7)
    want = _numpy_gradients(q, k, v, ct, 0.125)
    assert not want[0].any() and not want[1].any()

    def loss(q, k, v):
        return jnp.sum(nn.attention(q, k, v, backend=backend) * ct)

    _check(jax.grad(loss, (0, 1, 2))(q, k, v), want)
