"""Masks in attention nests, forward and every gradient, on every back end, fused and not:

* a position a mask leaves out contributes nothing, even where an operand holds NaN or inf
  there (issue 36: the one-pass kernel weighted the masked keys of a boundary tile by 0,
  and 0 * NaN is NaN);
* a query row whose mask keeps no key gives 0 and zero gradients, as FlexAttention does,
  whether the mask reads arrays or compares indices (issue 38: the gradient of k was NaN
  for every key of that batch row).

The reference is jax.numpy in float64 with the masks applied to every operand of each
(query, key) pair (`where` before the product, not a product with 0), so a left-out
position contributes exactly nothing to it either.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl import nn
from tests.backends import (
    BACKENDS,
    generated_kernels,  # noqa: F401 (a fixture)
)

pytestmark = pytest.mark.usefixtures("generated_kernels")

TOLERANCE = {"float64": 1e-9, "float32": 3e-4}
B, T, H, E = 2, 40, 2, 8


def masked_attention_jnp(q, k, v, keep, scale):
    """Softmax attention on (B, T, H, E) arrays with `keep` (B, H, T, S) applied to every
    operand of each pair; a row that keeps no key gives 0."""
    pair = keep[..., None]  # (B, H, T, S, 1)
    qp = jnp.where(pair, jnp.einsum("bihd->bhid", q)[:, :, :, None], 0)
    kp = jnp.where(pair, jnp.einsum("bjhd->bhjd", k)[:, :, None], 0)
    vp = jnp.where(pair, jnp.einsum("bjhd->bhjd", v)[:, :, None], 0)
    s = jnp.where(keep, jnp.sum(qp * kp, -1) * scale, -jnp.inf)
    any_key = jnp.any(keep, -1, keepdims=True)
    p = jnp.where(any_key, jax.nn.softmax(jnp.where(any_key, s, 0), -1), 0)
    p = jnp.where(keep, p, 0)
    return jnp.einsum("bhij,bhije->bihe", p, vp)


@functools.partial(jax.jit, static_argnames="scale")
def _reference_and_gradients(q, k, v, keep, ct, *, scale):
    """The reference and its gradients for q, k, v, jitted once for the module: eagerly each
    jnp operation compiles alone, and one jitted function of `keep` and `ct` is compiled once
    per shape for every test, where a jitted closure over them was compiled in each
    (docs/testing.md)."""

    def weighted(q, k, v):
        return jnp.sum(masked_attention_jnp(q, k, v, keep, scale) * ct)

    out = masked_attention_jnp(q, k, v, keep, scale)
    return out, jax.grad(weighted, (0, 1, 2))(q, k, v)


def _close(got, want, dtype):
    tol = TOLERANCE[dtype]
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    finite = want[np.isfinite(want)]
    scale = max(float(np.max(np.abs(finite))), 1.0) if finite.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def _check(ours, keep, q, k, v, dtype, cotangent_mask=None):
    """Values and the gradients of `sum(out * ct)` for q, k, v against the float64 jnp
    reference on the same (rounded) inputs."""
    scale = 1 / math.sqrt(E)
    q64, k64, v64 = (jnp.asarray(x, jnp.float64) for x in (q, k, v))
    ct = jnp.asarray(np.random.default_rng(7).normal(size=(B, T, H, E)))
    if cotangent_mask is not None:
        ct = jnp.where(cotangent_mask, ct, 0)
    got = ours(q, k, v)
    assert got.dtype == jnp.dtype(dtype)
    expected, want = _reference_and_gradients(q64, k64, v64, jnp.asarray(keep), ct, scale=scale)
    _close(got, expected, dtype)
    grads = jax.grad(lambda *a: jnp.sum(ours(*a) * ct.astype(dtype)), (0, 1, 2))(q, k, v)
    for name, g, w in zip("qkv", grads, want):
        assert g.dtype == jnp.dtype(dtype), name
        _close(g, w, dtype)


def _inputs(dtype, keys=T, seed=0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, T, H, E))
    k, v = rng.normal(size=(B, keys, H, E)), rng.normal(size=(B, keys, H, E))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _causal(keys=T):
    return jnp.asarray(np.tril(np.ones((T, keys), bool))[None, None])


#: name: (which operand, which position along its sequence axis, the value put there).
SPECIALS = {
    "nan-v-last-key": ("v", -1, np.nan),  # seen by the last query only
    "inf-v-last-key": ("v", -1, np.inf),
    "nan-q-first-query": ("q", 0, np.nan),  # sees the first key only
    "nan-k-last-key": ("k", -1, np.nan),
}


def _poison(arrays, which, at, value):
    arrays = dict(zip("qkv", arrays))
    x = arrays[which].copy()
    x[:, at] = value
    arrays[which] = x
    return arrays["q"], arrays["k"], arrays["v"]


#: Fused, the scores are recomputed inside each nest under the mask's bounds; unfused
#: (`TENSORDSL_FUSE=0`) they are stored, a product over every pair as in jax.numpy, so a NaN
#: in q or k reaches every gradient there as it does in jax.numpy: only v is checked unfused.
FUSIONS = [
    *((special, "fused") for special in sorted(SPECIALS)),
    *((special, "unfused") for special in sorted(SPECIALS) if SPECIALS[special][0] == "v"),
]


def _fuse(monkeypatch, fusion):
    if fusion == "unfused":
        monkeypatch.setenv("TENSORDSL_FUSE", "0")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("special", "fusion"), FUSIONS)
def test_a_special_value_at_a_causally_masked_pair_stays_out(
    backend, dtype, special, fusion, monkeypatch
):
    """Issue 36: causal attention with NaN or inf in one row: only the rows that see it."""
    _fuse(monkeypatch, fusion)
    q, k, v = _poison(_inputs(dtype), *SPECIALS[special])
    ours = lambda q, k, v: nn.attention(q, k, v, causal=True, backend=backend)  # noqa: E731
    _check(ours, _causal(), q, k, v, dtype)


PROGRAM = """
    S[b,h,i,j] := Q[b,h,i,e] * K[b,h,j,e] * scale + where(j <= i, 0, -inf)
    (logsumexp) L[b,h,i] := S[b,h,i,j]
    O[b,h,i,e] := exp(S[b,h,i,j] - L[b,h,i]) * V[b,h,j,e]
"""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("special", sorted(SPECIALS))
def test_a_special_value_stays_out_of_a_head_major_program(backend, dtype, special):
    """The same in the layout (B, H, T, E), whose gradient nests tile over queries or keys
    (fused only: unfused, the stored `S` is -inf at a masked pair, not left out, and its
    gradient there is 0 * dP, NaN next to an infinite V, in jax.numpy too)."""
    q, k, v = _poison(_inputs(dtype), *SPECIALS[special])
    kernel = td.kernel(PROGRAM, backend=backend)
    scale = np.asarray(1 / math.sqrt(E), dtype)

    def ours(q, k, v):
        heads = [jnp.einsum("bthe->bhte", x) for x in (q, k, v)]
        out = kernel(Q=heads[0], K=heads[1], V=heads[2], scale=scale)
        return jnp.einsum("bhte->bthe", out)

    _check(ours, _causal(), q, k, v, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_keys_no_query_sees_may_hold_nan(backend, dtype):
    """Padding keys past the last query (causal, S = T + 3) never count, NaN or not: every
    output and gradient is finite, and the padding's gradients are 0 (fused only: unfused,
    the stored scores are a product over every pair)."""
    q, k, v = _inputs(dtype, keys=T + 3)
    k[:, T:], v[:, T:] = np.nan, np.inf
    ours = lambda q, k, v: nn.attention(q, k, v, causal=True, backend=backend)  # noqa: E731
    _check(ours, _causal(T + 3), q, k, v, dtype)


def _offsets():
    return np.array([0, -3], np.int32)  # batch row 1: queries 0, 1, 2 keep no key


def _padding():
    keep = (np.random.default_rng(3).random((B, T)) > 0.3).astype(np.int32)
    keep[1] = 0  # batch row 1 is all padding: every query keeps no key
    return keep


#: name: (mask_mod, mod_args, the kept pairs (B, 1, T, S)).
EMPTY_ROWS = {
    "array-offset": (
        "i + off[b] >= j",
        {"off": _offsets()},
        np.arange(T)[None, :, None] + _offsets()[:, None, None] >= np.arange(T)[None, None],
    ),
    "index-offset": (
        "i - 3 >= j",
        {},
        np.broadcast_to(np.arange(T)[:, None] - 3 >= np.arange(T)[None], (B, T, T)),
    ),
    "padding-ids": (
        "M[b, j] > 0",
        {"M": _padding()},
        np.broadcast_to(_padding()[:, None, :] > 0, (B, T, T)),
    ),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fusion", ["fused", "unfused"])
@pytest.mark.parametrize("mask", sorted(EMPTY_ROWS))
def test_a_query_that_keeps_no_key_gives_zero_and_zero_gradients(
    backend, fusion, mask, monkeypatch
):
    """Issue 38: a row whose mask keeps no key gives 0, and q, k, v get finite gradients
    (zero from that row), whether the mask reads arrays or compares indices."""
    _fuse(monkeypatch, fusion)
    mask_mod, mod_args, keep = EMPTY_ROWS[mask]
    q, k, v = _inputs("float64", seed=5)

    def ours(q, k, v):
        return nn.attention(q, k, v, mask_mod=mask_mod, mod_args=mod_args, backend=backend)

    _check(ours, jnp.asarray(keep)[:, None], q, k, v, "float64")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_dropped_padded_row_leaves_the_gradients_finite(backend):
    """Issue 38's training loss: the padded rows dropped with `jnp.where`; every gradient
    finite and as jax.numpy's on the rows kept."""
    mask_mod, mod_args, keep = EMPTY_ROWS["array-offset"]
    q, k, v = _inputs("float32", seed=6)
    valid = jnp.asarray(keep.any(-1))[:, :, None, None]  # (B, T, 1, 1)
    _check(
        lambda q, k, v: jnp.where(
            valid, nn.attention(q, k, v, mask_mod=mask_mod, mod_args=mod_args, backend=backend), 0
        ),
        jnp.asarray(keep)[:, None],
        q,
        k,
        v,
        "float32",
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("special", ["nan-q-first-query", "nan-v-last-key"])
def test_a_special_value_stays_out_of_a_band(backend, dtype, special):
    """A band `|i - j| <= 4` bounds the keys on both sides: the first and last tiles are
    boundary tiles of both kinds."""
    q, k, v = _poison(_inputs(dtype), *SPECIALS[special])
    band = np.abs(np.arange(T)[:, None] - np.arange(T)[None]) <= 4
    ours = lambda q, k, v: nn.attention(  # noqa: E731
        q, k, v, mask_mod="abs(i - j) <= 4", backend=backend
    )
    _check(ours, jnp.asarray(band)[None, None], q, k, v, dtype)


#: What a NaN at a key that an array mask drops reaches (docs/nn.md): nothing. The mask is the
#: term's guard (`codegen.passes.guards.guard_masks`), so a dropped pair is never weighted,
#: as with a mask that compares indices. Batch row 0 holds the NaN; (output, dq, dk, dv) NaN
#: in every row of batch row 0, or nowhere.
ARRAY_MASKED_NAN = {"k": (False,) * 4, "v": (False,) * 4}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", sorted(ARRAY_MASKED_NAN))
def test_a_nan_at_a_key_an_array_mask_drops(backend, which):
    """As docs/nn.md says, on every back end as on the reference: a NaN in k or v at a key
    the mask drops reaches no output and no gradient; every value is the reference's."""
    keep = (np.random.default_rng(4).random((B, T)) > 0.3).astype(np.int32)
    drop = int(np.nonzero(keep[0] == 0)[0][-1])
    arrays = dict(zip("qkv", _inputs("float64", seed=8)))
    arrays[which][0, drop] = np.nan  # batch row 0 only
    q, k, v = arrays["q"], arrays["k"], arrays["v"]

    def run(backend):
        def ours(q, k, v):
            mod = {"mask_mod": "M[b, j] > 0", "mod_args": {"M": keep}}
            return nn.attention(q, k, v, **mod, backend=backend)

        out, ct = ours(q, k, v), np.random.default_rng(9).normal(size=(B, T, H, E))
        return (out, *jax.grad(lambda *a: jnp.sum(ours(*a) * ct), (0, 1, 2))(q, k, v))

    got, want = run(backend), run("reference")
    for name, g, w, nan in zip(("out", "dq", "dk", "dv"), got, want, ARRAY_MASKED_NAN[which]):
        g, w = np.asarray(g), np.asarray(w)
        assert np.isnan(g[0]).all() == nan and not np.isnan(g[1]).any(), name
        assert nan or np.isfinite(g).all(), name
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=name)
        np.testing.assert_allclose(g[1], w[1], rtol=1e-9, atol=1e-9, err_msg=name)


def _documents(order, seed):
    """(B, T) document ids: sorted runs of random lengths (packed sequences), or the same ids
    shuffled (a mask no key range bounds)."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.integers(0, 5, size=(B, T)), axis=1)
    if order == "unsorted":
        ids = rng.permuted(ids, axis=1)
    return ids.astype(np.int32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("order", ["sorted", "unsorted"])
def test_a_document_mask_keeps_each_query_to_its_own_document(backend, causal, order):
    """Issue 38: a document mask over id arrays runs in one pass that visits each block of
    queries' own documents' keys only (`codegen.c.attention.online`); forward and every gradient as
    the float64 reference, whether the ids are sorted or not."""
    doc = _documents(order, seed=11)
    q, k, v = _inputs("float64", seed=12)
    keep = doc[:, :, None] == doc[:, None, :]
    if causal:
        keep = keep & np.tril(np.ones((T, T), bool))

    def ours(q, k, v):
        return nn.attention(
            q,
            k,
            v,
            causal=causal,
            mask_mod="doc[b, i] == doc[b, j]",
            mod_args={"doc": doc},
            backend=backend,
        )

    _check(ours, jnp.asarray(keep)[:, None], q, k, v, "float64")
