"""Elementwise nests of exp run as XLA's fused work (`codegen.ir.xla_elementwise`): a
logsumexp's gradient and a softmax-weighted sum's gradient, both of the scores, computed in
one pass with one exponential, checked against float64 numpy formulas; GELU's tanh keeps
its kernel."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.ir.contraction import xla_plan
from codegen.ir.xla_elementwise import xla_elementwise
from codegen.passes import grad
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse


def _nest(source):
    return lower(parse(source)).nest


@pytest.mark.parametrize(
    ("source", "shared"),
    [
        ("dS[b,i,j] := dL[b,i] * exp(S[b,i,j] - L[b,i])", True),
        ("P[i,j] := where(j <= i, exp(S[i,j] - L[i]), 0)", True),
        ("Y[i,j] := exp(X[j,i])", True),  # a transposed view
        ("Y[i,j] := 0.5 * X[i,j] * (1 + tanh(X[i,j] + c[j]))", False),  # GELU: a kernel
        ("Y[i,j] := rsqrt(X[i,j]) * g[j]", False),  # LayerNorm's kind: a kernel
        ("Y[i] := X[i] + c[i]", False),
        ("Y[i] := exp(X[i+1])", False),  # a shifted access: no view
        ("Y[i] := exp(X[i,i])", False),  # an index twice: a diagonal, no view
        ("Y[i] := exp(X[i,k])", False),  # a reduction
        ("Y[i] := exp(X[i]) * W[i,k]", False),
        ("(max) Y[i] := exp(X[i])", False),  # not a sum (reduces over nothing)
    ],
)
def test_which_nests_run_as_xla_elementwise_work(source, shared):
    nest = _nest(source)
    assert xla_elementwise(nest) is shared
    assert (xla_plan(nest) is not None) is shared


def test_the_logsumexp_gradient_runs_as_xla_elementwise_work():
    nest = _nest("(logsumexp) L[b,i] := S[b,i,j]")
    gradient = grad.gradient(nest, "S").nest
    assert xla_elementwise(gradient)
    assert xla_plan(gradient).dots == (None,)


def _softmax(S):
    top = S.max(-1, keepdims=True)
    top = np.where(np.isfinite(top), top, 0)
    weights = np.exp(S - top)
    total = weights.sum(-1, keepdims=True)
    return np.divide(weights, total, out=np.zeros_like(weights), where=total > 0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_logsumexp_gradient_values_with_masked_rows(dtype):
    """A row all -inf has L = -inf and a zero gradient, not NaN (the rule's guard)."""
    rng = np.random.default_rng(0)
    S = rng.normal(size=(2, 5, 7)) * 3
    S[0, 1] = -np.inf  # a whole row masked
    S[1, 2, :3] = -np.inf
    ct = rng.normal(size=(2, 5))
    k = td.kernel("(logsumexp) L[b,i] := S[b,i,j]", backend="c")
    got = jax.jit(jax.grad(lambda S: jnp.sum(k(S) * ct)))(S.astype(dtype))
    want = ct[..., None] * _softmax(S)
    tol = 1e-12 if dtype == np.float64 else 2e-6
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=tol, atol=tol)


def _attention_kernels():
    lse = td.kernel("(logsumexp) L[b,i] := S[b,i,j]", backend="c")
    weighted = td.kernel(
        "O[b,i,e] := where(j <= i, exp(S[b,i,j] - L[b,i]), 0) * V[b,j,e]", backend="c"
    )
    return lse, weighted


def test_attention_scores_gradient_computes_one_exponential():
    """logsumexp + weighted sum as two kernels: the cotangent of S sums both gradients, XLA
    computes it in one fusion whose exp(S - L) is computed once (the forward's exponentials
    are the kernels')."""
    lse, weighted = _attention_kernels()
    rng = np.random.default_rng(1)
    S, V, ct = rng.normal(size=(2, 6, 6)), rng.normal(size=(2, 6, 3)), rng.normal(size=(2, 6, 3))
    causal = np.arange(6)[None, :] <= np.arange(6)[:, None]
    S = np.where(causal, S, -1e9)

    def loss(S, V):
        return jnp.sum(weighted(S, lse(S), V) * ct)

    f = jax.jit(jax.grad(loss, argnums=(0, 1)))
    text = f.lower(S, V).compile().as_text()
    assert len(re.findall(r"= f64\[[\d,]*\]\S* exponential\(", text)) == 1
    assert not re.findall(r"= f64\[2,6,6\]\S* custom-call\(", text)  # no kernel writes dS
    dS, dV = f(S, V)
    P = np.where(causal, _softmax(S), 0)
    dP = np.einsum("bie,bje->bij", ct, V)
    want_dS = P * (dP - (P * dP).sum(-1, keepdims=True))
    np.testing.assert_allclose(dS, want_dS, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dV, np.einsum("bij,bie->bje", P, ct), rtol=1e-10, atol=1e-12)


def test_without_xla_contractions_the_logsumexp_gradient_is_a_kernel(monkeypatch):
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    k = td.kernel("(logsumexp) L[i] := S[i,j]", backend="c")
    S, ct = np.random.default_rng(2).normal(size=(3, 4)), np.arange(3.0)
    f = jax.grad(lambda S: jnp.sum(k(S) * ct))
    assert jax.jit(f).lower(S).as_text().count("custom_call") == 2  # forward and gradient
    np.testing.assert_allclose(f(S), ct[:, None] * _softmax(S), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gelu_keeps_its_kernels(dtype):
    """GELU (tanh form) as a kernel: its forward and gradient stay generated kernels (tanh is
    not in `FUSED_FUNCTIONS`), values and gradient against float64."""
    c = 0.7978845608028654
    k = td.kernel(
        "A[b,u] := 0.5 * H[b,u] * (1 + tanh(c * (H[b,u] + 0.044715 * H[b,u]^3)))", backend="c"
    )
    rng = np.random.default_rng(3)
    H, ct = rng.normal(size=(5, 7)) * 3, rng.normal(size=(5, 7))
    f = jax.jit(jax.value_and_grad(lambda H: jnp.sum(k(H=H, c=dtype(c)) * ct)))
    assert jax.jit(f).lower(H.astype(dtype)).as_text().count("custom_call") == 2
    value, got = f(H.astype(dtype))
    inner = c * (H + 0.044715 * H**3)
    want = 0.5 * H * (1 + np.tanh(inner))
    slope = 0.5 * (1 + np.tanh(inner)) + 0.5 * H * (1 - np.tanh(inner) ** 2) * c * (
        1 + 3 * 0.044715 * H**2
    )
    tol = 1e-12 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(float(value), np.sum(want * ct), rtol=tol)
    np.testing.assert_allclose(np.asarray(got, np.float64), slope * ct, rtol=tol, atol=tol)
