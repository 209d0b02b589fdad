"""Inputs that once reached a raw Python exception (issue 36.7): an index fixed at a constant
through `mod`/`clamp`, a top-k of no rows, attention heads of width 0, the CUDA report of a
wrapped access. Each runs on every back end against float64 NumPy."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.backends import BACKENDS, generated_kernels  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("generated_kernels")

#: An index fixed at a constant outside the axis: mod wraps it, clamp holds it at the edge.
CONSTANT_INDICES = {
    "Y[i] := X[mod(7)] * X[i]": lambda X: X[7 % len(X)] * X,
    "Y[i] := X[clamp(end+3)] * X[i]": lambda X: X[-1] * X,
    "Y[i] := X[clamp(-2)] + X[i]": lambda X: X[0] + X,
}


@pytest.mark.parametrize("source", sorted(CONSTANT_INDICES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_fixed_at_a_wrapped_or_clamped_constant(source, backend):
    X = np.random.default_rng(0).normal(size=5)
    got = td.kernel(source, backend=backend)(X)
    np.testing.assert_allclose(np.asarray(got), CONSTANT_INDICES[source](X), rtol=1e-12)


@pytest.mark.parametrize("reduction", ["topk", "argtopk"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_top_k_of_no_rows_is_empty(reduction, backend):
    got = td.kernel(f"({reduction} 2) Y[i,r] := X[i,j]", backend=backend)(np.zeros((0, 5)))
    assert got.shape == (0, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_with_heads_of_width_0_weighs_every_kept_key_alike(backend):
    q = np.zeros((2, 4, 3, 0))
    v = np.random.default_rng(1).normal(size=(2, 4, 3, 5))
    got = td.nn.attention(q, q, v, causal=True, backend=backend)
    want = np.cumsum(v, axis=1) / np.arange(1, 5)[None, :, None, None]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    cotangent = np.random.default_rng(2).normal(size=v.shape)
    dv = jax.grad(
        lambda v: jnp.sum(td.nn.attention(q, q, v, causal=True, backend=backend) * cotangent)
    )(v)
    want_dv = np.cumsum(cotangent[:, ::-1] / np.arange(1, 5)[::-1, None, None], axis=1)[:, ::-1]
    np.testing.assert_allclose(np.asarray(dv), want_dv, rtol=1e-12)


@pytest.mark.parametrize("access", ["mod(i+1)", "clamp(i+1)", "pad(i+1)"])
def test_the_cuda_report_of_a_wrapped_or_clamped_access(access):
    k = td.kernel(f"Y[i] := X[{access}]", ranges={"i": 5})
    text = k.explain({"X": (5,)}, target="cuda")
    assert "X[" in text


#: A reduction over a range of no values: the identity (docs/language.md, "Reductions").
EMPTY_IDENTITIES = {"sum": 0.0, "mean": 0.0, "max": -np.inf, "min": np.inf, "prod": 1.0}
EMPTY_IDENTITIES["logsumexp"] = -np.inf


@pytest.mark.parametrize("backend", [*BACKENDS, "pallas"])
def test_an_axis_of_length_0_gives_an_empty_output_or_the_identity(backend):
    """No output tile, or a reduced range with no tile: on pallas these once reached Pallas'
    gather of a tile from an empty operand (a raw TypeError)."""
    rng = np.random.default_rng(5)
    matmul = td.kernel("C[i,j] := A[i,k] * B[k,j]", backend=backend)
    no_rows = matmul(np.zeros((0, 5)), rng.normal(size=(5, 6)))
    assert no_rows.shape == (0, 6)
    A, B = rng.normal(size=(3, 0)), rng.normal(size=(0, 2))
    np.testing.assert_array_equal(np.asarray(matmul(A, B)), np.zeros((3, 2)))
    dA, dB = jax.grad(lambda A, B: jnp.sum(matmul(A, B) * rng.normal(size=(3, 2))), (0, 1))(A, B)
    assert dA.shape == (3, 0) and dB.shape == (0, 2)
    X = np.zeros((4, 0))
    for reduction, identity in EMPTY_IDENTITIES.items():
        got = td.kernel(f"({reduction}) M[i] := X[i,j] * 2", backend=backend)(X)
        np.testing.assert_array_equal(np.asarray(got), np.full(4, identity), err_msg=reduction)
    q = rng.normal(size=(2, 3, 2, 4))
    for dtype in (np.float32, np.float64):  # float64: the one-pass nest of out_ and lse_
        no_keys = np.zeros((2, 0, 2, 4), dtype)
        out = td.nn.attention(q.astype(dtype), no_keys, no_keys, backend=backend)
        np.testing.assert_array_equal(np.asarray(out), np.zeros((2, 3, 2, 4)))  # no key: 0
