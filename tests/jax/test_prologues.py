"""Elementwise prologues and epilogues around contractions: a contraction whose factors are
elementwise functions of its inputs (GELU, tanh, sigmoid, a mask, a scale) evaluates them once
per point of their own indices and hands the product to XLA's dot
(`codegen.ir.contraction.prologue_contraction`); the gradients factor the contraction out of
the elementwise derivative (`codegen.passes.factor.common_factors_out`:
`dH = gelu'(H) * (dY W^T)`). Values and gradients against float64 numpy."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.ir.contraction import xla_plan
from codegen.ir.nest import Reduce
from codegen.passes import grad
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

_erf = np.vectorize(math.erf)


def _gelu(x):
    return 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _gelu_slope(x):
    return 0.5 * (1 + _erf(x / math.sqrt(2))) + x * np.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _sigmoid(x):
    return 1 / (1 + np.exp(-x))


GELU = "Y[b,t,o] := 0.5*H[b,t,u]*(1+erf(H[b,t,u]*0.7071067811865476))*W2[u,o]"

# (source, shapes, forward, vjp: (inputs, cotangent) -> {input: gradient}), float64 numpy.
CASES = {
    "gelu": (
        GELU,
        {"H": (2, 3, 5), "W2": (5, 4)},
        lambda H, W2: _gelu(H) @ W2,
        lambda H, W2, dY: {
            "H": _gelu_slope(H) * (dY @ W2.T),
            "W2": np.einsum("btu,bto->uo", _gelu(H), dY),
        },
    ),
    "tanh": (
        "Y[b,o] := tanh(H[b,u]) * W[u,o]",
        {"H": (4, 6), "W": (6, 3)},
        lambda H, W: np.tanh(H) @ W,
        lambda H, W, dY: {"H": (1 - np.tanh(H) ** 2) * (dY @ W.T), "W": np.tanh(H).T @ dY},
    ),
    "sigmoid, operand first": (
        "Y[o,b] := W[o,u] * sigmoid(H[b,u])",
        {"W": (3, 6), "H": (4, 6)},
        lambda W, H: W @ _sigmoid(H).T,
        lambda W, H, dY: {
            "W": dY @ _sigmoid(H),
            "H": _sigmoid(H) * (1 - _sigmoid(H)) * (dY.T @ W),
        },
    ),
    "mask": (
        "Y[b,o] := where(M[b,u] > 0, X[b,u], 0) * W[u,o]",
        {"M": (4, 6), "X": (4, 6), "W": (6, 3)},
        lambda M, X, W: np.where(M > 0, X, 0) @ W,
        lambda M, X, W, dY: {"X": np.where(M > 0, dY @ W.T, 0), "W": np.where(M > 0, X, 0).T @ dY},
    ),
    "repeated operand": (
        "Y[i,j] := tanh(A[i,k]) * A[k,j]",
        {"A": (5, 5)},
        lambda A: np.tanh(A) @ A,
        lambda A, dY: {"A": (1 - np.tanh(A) ** 2) * (dY @ A.T) + np.tanh(A).T @ dY},
    ),
    "both operands": (
        "Y[i,j] := sin(X[i,k]) * cos(W[k,j])",
        {"X": (4, 5), "W": (5, 3)},
        lambda X, W: np.sin(X) @ np.cos(W),
        lambda X, W, dY: {
            "X": np.cos(X) * (dY @ np.cos(W).T),
            "W": -np.sin(W) * (np.sin(X).T @ dY),
        },
    ),
    "bias and scale inside": (
        "Y[b,o] := tanh(H[b,u] + c[u]) * s[u] * W[u,o]",
        {"H": (4, 6), "c": (6,), "s": (6,), "W": (6, 3)},
        lambda H, c, s, W: (np.tanh(H + c) * s) @ W,
        lambda H, c, s, W, dY: {
            "H": (1 - np.tanh(H + c) ** 2) * s * (dY @ W.T),
            "c": ((1 - np.tanh(H + c) ** 2) * s * (dY @ W.T)).sum(0),
            "s": (np.tanh(H + c) * (dY @ W.T)).sum(0),
            "W": (np.tanh(H + c) * s).T @ dY,
        },
    ),
    "epilogue on the output's indices": (
        "Y[i,j] := (1 - M[i,j]) * A[i,k] * B[k,j]",
        {"M": (3, 4), "A": (3, 5), "B": (5, 4)},
        lambda M, A, B: (1 - M) * (A @ B),
        lambda M, A, B, dY: {
            "M": -dY * (A @ B),
            "A": ((1 - M) * dY) @ B.T,
            "B": A.T @ ((1 - M) * dY),
        },
    ),
}


def _nest(source):
    return lower(parse(source)).nest


def _inputs(shapes, seed):
    rng = np.random.default_rng(seed)
    return {name: rng.normal(size=shape) for name, shape in shapes.items()}


def _hlo(f, *args):
    return jax.jit(f).lower(*args).as_text()


@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradients_match_float64_numpy(name, monkeypatch):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    source, shapes, forward, vjp = CASES[name]
    k = td.kernel(source, backend="c")
    values = _inputs(shapes, seed=len(name))
    args = [values[n] for n in k.inputs]
    want = forward(*args)
    got = k(*args)
    np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-12)
    dY = np.random.default_rng(1).normal(size=want.shape)
    gradients = jax.vjp(k, *args)[1](dY)
    expected = vjp(*args, dY)
    for n, g in zip(k.inputs, gradients):
        if n in expected:
            np.testing.assert_allclose(g, expected[n], rtol=1e-10, atol=1e-12, err_msg=n)
    # The forward and every gradient run as XLA's dots and fused elementwise work, except a
    # vector's gradient summed over several indices (c, s) and a function of the summed
    # index inside a nested sum (sin, cos: `cos(X) * sum_j dY*cos(W)`), which are kernels,
    # as is the mask's gradient (zeros).
    whole = _hlo(lambda *a: (k(*a), jax.vjp(k, *a)[1](dY)), *args)
    kernels = {"both operands": 2, "bias and scale inside": 2, "mask": 1}.get(name, 0)
    assert whole.count("custom_call") == kernels


@pytest.mark.parametrize("name", ["gelu", "tanh", "sigmoid, operand first", "mask"])
def test_the_same_kernels_without_xla_agree(name, monkeypatch):
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    source, shapes, forward, vjp = CASES[name]
    k = td.kernel(source, backend="c")
    values = _inputs(shapes, seed=len(name))
    args = [values[n] for n in k.inputs]
    assert "custom_call" in _hlo(k, *args)
    np.testing.assert_allclose(k(*args), forward(*args), rtol=1e-11, atol=1e-12)
    dY = np.random.default_rng(2).normal(size=forward(*args).shape)
    expected = vjp(*args, dY)
    for n, g in zip(k.inputs, jax.vjp(k, *args)[1](dY)):
        if n in expected:
            np.testing.assert_allclose(g, expected[n], rtol=1e-10, atol=1e-12, err_msg=n)


def test_gelu_is_evaluated_once_per_element_of_h():
    nest = _nest(GELU)
    (dot,) = xla_plan(nest).dots
    assert dot is not None and dot.tensors == (1,)  # W2, and one prologue for the rest
    (prologue,) = dot.prologues
    assert [i.name for i in prologue.indices] == ["b", "t", "u"]
    text = td.kernel(GELU).explain({"H": (4, 64, 512), "W2": (512, 128)})
    assert "evaluated once per (b, t, u): 131072 times, not 16777216 (per (b, t, o, u))" in text
    assert "then XLA's dot: einsum 'dc,abd->abc' of W2, prologue 1" in text


def test_the_gradient_of_h_factors_the_contraction_out():
    """dH = gelu'(H) * sum_o dY*W2: W2 leaves the elementwise derivative, and the nested sum
    is a matrix product that XLA computes."""
    gradient = grad.gradient(_nest(GELU), "H").nest
    (term,) = gradient.terms
    assert term.reduced == ()
    (nested,) = term.body.atoms(Reduce)
    assert str(nested) == "sum_o(W2[u, o]*dY[b, t, o])"
    assert xla_plan(gradient).nested


@pytest.mark.parametrize(
    "source",
    [
        "Y[i] := exp(X[i,k]) * W[k]",  # the function reads every index: nothing to save
        "Y[i,j] := exp(A[i,k] + B[k,j]) * C[k,j]",  # as does this one
        "Y[o,i] := tanh(X[c,i+k]) * W[o,c,k]",  # a shifted access would be unfolded
        "M[b] := X[b,f] / F",  # a sum scaled by a scalar: no dot
    ],
)
def test_no_prologue_where_it_saves_nothing(source):
    plan = xla_plan(_nest(source))
    assert plan is None or all(d is None or not d.prologues for d in plan.dots)


def test_vmap_and_bfloat16():
    k = td.kernel("Y[b,o] := tanh(H[b,u]) * W[u,o]", backend="c")
    rng = np.random.default_rng(3)
    H, W = rng.normal(size=(2, 4, 6)), rng.normal(size=(6, 3))
    np.testing.assert_allclose(jax.vmap(k, (0, None))(H, W), np.tanh(H) @ W, rtol=1e-5)
    half = k(jnp.asarray(H[0], jnp.bfloat16), jnp.asarray(W, jnp.bfloat16))
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(half, np.float64), np.tanh(H[0]) @ W, atol=5e-2)


MLP = "H[b,u] := X[b,f] * W1[f,u]\nY[b,o] := tanh(H[b,u]) * W2[u,o]"


@pytest.mark.parametrize("fuse", [True, False, {"H": "inline"}, {"H": "store"}])
def test_the_mlp_program_with_fuse_forced(fuse):
    """The hidden layer stored or forced inline: the same numbers, and fuse= still decides."""
    k = td.program(MLP, backend="c", fuse=fuse)
    rng = np.random.default_rng(4)
    X, W1, W2 = rng.normal(size=(5, 3)), rng.normal(size=(3, 6)), rng.normal(size=(6, 2))
    hidden = np.tanh(X @ W1)
    dY = rng.normal(size=(5, 2))
    np.testing.assert_allclose(k(X, W1, W2), hidden @ W2, rtol=1e-11)
    dX, dW1, dW2 = jax.vjp(k, X, W1, W2)[1](dY)
    dH = (1 - hidden**2) * (dY @ W2.T)
    np.testing.assert_allclose(dX, dH @ W1.T, rtol=1e-10)
    np.testing.assert_allclose(dW1, X.T @ dH, rtol=1e-10)
    np.testing.assert_allclose(dW2, hidden.T @ dY, rtol=1e-10)
    shapes = {"X": (5, 3), "W1": (3, 6), "W2": (6, 2)}
    text = k.explain(shapes)
    inline = fuse == {"H": "inline"}
    assert ("H recomputed where read" in text) == inline
    assert ("forced by fuse=" in text) == (fuse not in (True,))
