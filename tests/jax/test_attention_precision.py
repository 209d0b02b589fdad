"""Attention with scores beyond float precision (issue 36.12; docs/nn.md, "Scores beyond
float precision"): with float64 scores near 1e200 every softmax row is one-hot. Unfused, the
reference back end stores the scores once and gives jax.numpy's gradients exactly (0 for q
and k); the fused and the c and cuda gradients' rounding residue is documented there."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from tensordsl import nn


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
