"""A program's gradient nests read what its stored statements hold (codegen/passes/reuse.py)
instead of recomputing it: softmax's backward reads P, with no exponential."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.backends import NEEDS_C_COMPILER
from tests.programs import PROGRAMS_BY_NAME

pytestmark = [NEEDS_C_COMPILER, pytest.mark.usefixtures("poisoned_outputs")]


def _nests(f, *args) -> list[str]:
    """The nests `f` runs, as their source text, in the order of its jaxpr."""
    return re.findall(r"^\s*nest=(.*)$", str(jax.make_jaxpr(f)(*args)), re.MULTILINE)


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


@pytest.mark.parametrize("shape", [(5, 9), (1, 3), (13, 40)])
def test_softmax_gradient_reads_the_stored_output(shape):
    k = td.program(PROGRAMS_BY_NAME["softmax"].source, backend="c")
    rng = np.random.default_rng(sum(shape))
    X, ct = 3 * rng.normal(size=shape), rng.normal(size=shape)

    def loss(X):
        return jnp.sum(k(X) * ct)

    nests = _nests(jax.grad(loss), X)
    backward = [n for n in nests if n.startswith("d")]
    # dZ and dX; no argmax and no gradient of the stability max (shift invariant).
    assert [n.split("[")[0] for n in backward] == ["dZ", "dX"], nests
    assert not any("argmax" in n for n in nests)
    for nest in backward:
        assert "exp" not in nest and "P[" in nest, nest
    got = np.asarray(jax.jit(jax.grad(loss))(X))
    P = _softmax(X)  # float64 numpy reference
    np.testing.assert_allclose(
        got, P * (ct - (ct * P).sum(1, keepdims=True)), rtol=1e-9, atol=1e-12
    )


@pytest.mark.parametrize(
    ("source", "reads"),
    [
        # S's gradient needs exp(X), which the output E holds.
        ("E[i,j] := exp(X[i,j]) * 2\nS[i] := exp(X[i,j])", True),
        # E holds exp(X) * W: exp(X) = E / W divides by a value (NaN where W = 0): recomputed.
        ("E[i,j] := exp(X[i,j]) * W[i,j]\nS[i] := exp(X[i,j])", False),
        # E's index is read shifted (its range [-1, 5) by Tullio's rule): not matched, recomputed.
        ("E[i,j] := exp(X[i,j+1]) * 2\nS[i] := exp(X[i,j])", False),
    ],
)
def test_a_gradient_reads_another_output_only_where_it_holds_the_value(source, reads):
    k = td.program(source, outputs=("E", "S"), backend="c")
    rng = np.random.default_rng(7)
    X, W = rng.normal(size=(4, 6)), rng.uniform(0.5, 1.5, size=(4, 6))
    outputs = {"E": rng.normal(size=(4, 6)), "S": rng.normal(size=4)}

    def loss(X):
        E, S = k(X, W) if "W" in k.inputs else k(X)
        return jnp.sum(E * outputs["E"]) + jnp.sum(S * outputs["S"])

    (gradient,) = [n for n in _nests(jax.grad(loss), X) if n.startswith("dX")]
    assert bool(re.search(r"\bE\[", gradient)) == reads, gradient
    assert ("exp" in gradient) != reads, gradient
    # float64 numpy reference of d/dX sum(E * cE) + sum(S * cS)
    cE, cS = outputs["E"], outputs["S"]
    want = np.exp(X) * cS[:, None]
    want = want + (np.exp(X) * W * cE if "W[" in source else 2 * np.exp(X) * cE)
    np.testing.assert_allclose(np.asarray(jax.jit(jax.grad(loss))(X)), want, rtol=1e-9)
