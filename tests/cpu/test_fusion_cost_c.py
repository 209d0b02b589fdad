"""Programs whose fusion the cost model decides differently (tests/unit/test_fusion_cost.py):
values and gradients on the C back end against the same program run statement by statement
(`TENSORDSL_FUSE=0`, every intermediate stored), and against the `fuse=` choices forced."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.backends import NEEDS_C_COMPILER
from tests.programs import PROGRAMS_BY_NAME
from tests.unit.test_fusion_cost import MLP, MOE, TRIPLET

pytestmark = NEEDS_C_COMPILER

CASES = {
    "mlp": (MLP, {"X": (6, 4), "W1": (4, 7), "W2": (7, 3)}),
    "moe": (MOE, {"X": (16, 4), "W": (3, 4, 5), "G": (16, 3)}),
    "triplet": (TRIPLET, {"X": (6, 3), "same": (6, 6), "margin": ()}),
}


def run(source: str, inputs: dict, **options):
    """The output and the gradient of every input of `sum(output * cotangent)`."""
    k = td.program(source, backend="c", **options)
    values = [jnp.asarray(inputs[name]) for name in k.inputs]
    out = k(*values)
    cotangent = np.random.default_rng(5).normal(size=np.shape(out))
    grads = jax.grad(lambda *v: jnp.sum(k(*v) * cotangent), tuple(range(len(values))))(*values)
    return np.asarray(out), [np.asarray(g) for g in grads]


def inputs_for(shapes: dict) -> dict:
    rng = np.random.default_rng(3)
    found = {name: rng.uniform(-1.5, 1.5, size=shape) for name, shape in shapes.items()}
    if "same" in found:  # a 0/1 mask of pairs of the same class
        labels = rng.integers(0, 2, size=shapes["same"][0])
        found["same"] = (labels[:, None] == labels[None, :]).astype(np.float64)
    return found


@pytest.mark.parametrize("name", sorted(CASES))
def test_fused_as_decided_matches_the_statements_run_in_order(name, monkeypatch):
    source, shapes = CASES[name]
    inputs = inputs_for(shapes)
    out, grads = run(source, inputs)
    monkeypatch.setenv("TENSORDSL_FUSE", "0")
    want_out, want_grads = run(source, inputs)
    np.testing.assert_allclose(out, want_out, rtol=1e-10, atol=1e-12)
    for got, want in zip(grads, want_grads):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("fuse", [{"H": "inline"}, False])
def test_forced_choices_compute_the_same(fuse):
    source, shapes = CASES["mlp"]
    inputs = inputs_for(shapes)
    out, grads = run(source, inputs, fuse=fuse)
    X, W1, W2 = inputs["X"], inputs["W1"], inputs["W2"]
    np.testing.assert_allclose(out, np.tanh(X @ W1) @ W2, rtol=1e-10)
    want_out, want_grads = run(source, inputs)
    for got, want in zip(grads, want_grads):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)


def test_softmax_runs_no_gradient_nest_for_its_stability_max():
    source = PROGRAMS_BY_NAME["softmax"].source
    k = td.program(source, backend="c")
    assert list(k.source("c", {"X": (5, 7)})) == ["M", "Z", "P", "dZ", "dX"]
    X = np.random.default_rng(0).normal(size=(5, 7))
    ct = np.random.default_rng(1).normal(size=(5, 7))
    got = jax.grad(lambda x: jnp.sum(k(x) * ct))(X)
    P = np.exp(X - X.max(1, keepdims=True))
    P /= P.sum(1, keepdims=True)
    want = P * (ct - (ct * P).sum(1, keepdims=True))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)


#: Normalisations whose reader factors the intermediate out of its own sum (issue 36.6: the
#: cost model's derivative met the factored `sum_d` and raised a raw NotImplementedError).
NORMALISATIONS = {
    "row norm": (
        "N[i] := X[i,d]; Y[i] := X[i,d] * rsqrt(N[i])",
        lambda X: X.sum(1) / jnp.sqrt(X.sum(1)),
    ),
    "k-means update": (
        "N[c] := X[i,c]; M[c,d] := X[i,d] / N[c]",
        lambda X: X.sum(0)[None, :] / X.sum(0)[:, None],
    ),
}


@pytest.mark.parametrize("fuse", [None, {"N": "inline"}, {"N": "store"}])
@pytest.mark.parametrize("backend", ["reference", "c"])
@pytest.mark.parametrize("name", sorted(NORMALISATIONS))
def test_normalisation_by_a_factored_sum_runs_with_its_gradient(name, backend, fuse):
    source, reference = NORMALISATIONS[name]
    X = np.random.default_rng(7).uniform(0.5, 2.0, size=(6, 5))
    k = td.program(source, backend=backend, fuse=fuse)
    cotangent = np.random.default_rng(8).normal(size=np.shape(reference(X)))
    np.testing.assert_allclose(np.asarray(k(X)), reference(X), rtol=1e-12)
    got = jax.grad(lambda x: jnp.sum(k(x) * cotangent))(X)
    want = jax.grad(lambda x: jnp.sum(reference(x) * cotangent))(X)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)


def _attention64(Q, K, scale, V, weights):
    s = jnp.einsum("hid,hjd->hij", Q, K) * scale
    return jnp.einsum("hij,hje->hie", weights(s), V)


ZOO3 = {  # issue 37's third zoo: natural layers whose fusion changed
    "cross-attention": (
        "CROSS_ATTENTION",
        lambda s: jax.nn.softmax(s, -1),
    ),
    "squared-ReLU attention": (
        "RELU2_ATTENTION",
        lambda s: jax.nn.relu(s) ** 2 / s.shape[-1],
    ),
}


@pytest.mark.parametrize("name", sorted(ZOO3))
def test_zoo3_attention_against_a_float64_reference(name):
    """Queries and keys of different lengths (5 and 7, neither a tile's multiple); the
    scores stored (cross-attention: no mask spares any) or read through relu, a function of
    the value it keeps, not a guard."""
    from benchmarks import natural

    source, weights = getattr(natural, ZOO3[name][0]), ZOO3[name][1]
    rng = np.random.default_rng(11)
    Q, K, V = (rng.uniform(-1.5, 1.5, size=(2, n, 4)) for n in (5, 7, 7))
    inputs = {"Q": Q, "K": K, "V": V, "scale": 0.7}
    out, grads = run(source, inputs)
    want = _attention64(Q, K, 0.7, V, weights)
    cotangent = np.random.default_rng(5).normal(size=want.shape)
    want_grads = jax.grad(
        lambda Q, K, V: jnp.sum(_attention64(Q, K, 0.7, V, weights) * cotangent), (0, 1, 2)
    )(Q, K, V)
    np.testing.assert_allclose(out, want, rtol=1e-10, atol=1e-12)
    k = td.program(source, backend="c")
    by_name = dict(zip(k.inputs, grads))
    for got, expected in zip([by_name[n] for n in "QKV"], want_grads):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-11)
