"""The one-pass logsumexp and softmax-weighted sum (`codegen.passes.online`,
`codegen.c.attention.online`).

Every check compares with float64 numpy that runs the statements in order (the scores
materialised, `exp(S - L)` as written, so `exp(-inf - -inf)` is NaN there as in the program's
semantics). Rows longer than a chunk of 256 scores test the rescaling between chunks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest

import tensordsl as td
from codegen.ir.nest import LoopNest
from codegen.passes.online import pair, pair_stored, unpair
from tensordsl.binding.programs import compiled_statements
from tests.programs import PROGRAMS_BY_NAME

CAUSAL = PROGRAMS_BY_NAME["causal_attention"].source

# Scores with a data mask M (any value: NaN, +-inf): the dot products are stored (XLA's
# dot), M is added inside the one-pass nest.
MASKED = """
    P[i,j] := Q[i,d] * K[j,d]
    S[i,j] := P[i,j] + M[i,j]
    (logsumexp) L[i] := S[i,j]
    O[i,e] := exp(S[i,j] - L[i]) * V[j,e]
"""


def _statements(source: str, values: dict, outputs: tuple[str, ...]) -> tuple[LoopNest, ...]:
    k = td.kernel(source, outputs=outputs)
    return compiled_statements(k.program, values, "c")


def _in_order(S: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """O and L of the statements run in order, in float64 (S: the scores, -inf masked)."""
    with np.errstate(invalid="ignore", over="ignore"):
        L = np.asarray(jax.nn.logsumexp(jnp.asarray(S, jnp.float64), axis=-1))
        O = np.einsum("...ij,...je->...ie", np.exp(S - L[..., None]), V)
    return O, L


def _causal_scores(Q: np.ndarray, K: np.ndarray, scale: float) -> np.ndarray:
    S = np.einsum("...id,...jd->...ij", Q, K) * scale
    T = S.shape[-1]
    return np.where(np.tril(np.ones((T, T), bool)), S, -np.inf)


def test_attention_pairs_its_logsumexp_and_weighted_sum():
    rng = np.random.default_rng(0)
    values = {n: rng.normal(size=(1, 2, 9, 4)) for n in "QKV"} | {"scale": 0.5}
    stored = _statements(CAUSAL, values, ("O", "L"))
    (one,) = pair_stored(stored)
    assert one.online == "L" and one.output == "O"
    assert [n.terms for n in unpair(one)] == [n.terms for n in stored]
    assert one.free[-1].stop == stored[1].free[-1].stop + 1  # O's last axis, then L
    shapes = {name: np.shape(v) for name, v in values.items()}
    text = td.kernel(CAUSAL, outputs=("O", "L")).explain(shapes)
    assert "  forward O+L  one pass over each row's scores with a running max" in text


@pytest.mark.parametrize(
    "source",
    [
        # the weights read another row statistic
        "(logsumexp) L[i] := X[i,j]; O[i,e] := exp(X[i,j] - L[i]) * V[j,e] * L[i]",
        # other scores in the weights than in the logsumexp
        "(logsumexp) L[i] := X[i,j]; O[i,e] := exp(2*X[i,j] - L[i]) * V[j,e]",
        # another reduction
        "(max) L[i] := X[i,j]; O[i,e] := exp(X[i,j] - L[i]) * V[j,e]",
        # other bounds
        "(logsumexp) L[i] := X[i,j]; O[i,e] := exp(X[i,j] - L[i]) * V[j,e] * (j <= i)",
        # weights that read the row (a block of rows shares each weight)
        "(logsumexp) L[i] := X[i,j]; O[i,e] := exp(X[i,j] - L[i]) * V[j,e] * X[i,e]",
    ],
)
def test_other_shapes_are_not_paired(source):
    rng = np.random.default_rng(1)
    values = {"X": rng.normal(size=(5, 5)), "V": rng.normal(size=(5, 3))}
    lse, weighted = _statements(source, values, ("O", "L"))
    assert pair(lse, weighted) is None
    assert pair_stored((lse, weighted)) == (lse, weighted)


def test_a_logsumexp_read_in_between_is_not_paired():
    rng = np.random.default_rng(1)
    source = """
        (logsumexp) L[i] := X[i,j]
        C[i] := L[i] * 2
        O[i,e] := exp(X[i,j] - L[i]) * V[j,e] * C[i]
    """
    values = {"X": rng.normal(size=(5, 5)), "V": rng.normal(size=(5, 3))}
    stored = _statements(source, values, ("O",))
    assert pair_stored(stored) == stored


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("T", [1, 7, 600])
def test_causal_attention_in_one_pass(dtype, T):
    # T = 600: three chunks of scores per late row, the largest score anywhere among them.
    rng = np.random.default_rng(T)
    Q, K, V = (rng.normal(size=(2, 1, T, 12)) for _ in range(3))
    k = td.kernel(CAUSAL, outputs=("O", "L"), backend="c")
    cast = [np.asarray(a, dtype) for a in (Q, K, V)]
    O, L = jax.jit(k)(cast[0], cast[1], np.asarray(0.4, dtype), cast[2])
    want_O, want_L = _in_order(_causal_scores(Q, K, 0.4), V)
    tolerance = 2e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(np.asarray(L, np.float64), want_L, atol=tolerance * 10)
    np.testing.assert_allclose(np.asarray(O, np.float64), want_O, atol=tolerance)


def _masked_values(T: int, rng: np.random.Generator, specials: dict) -> dict:
    M = rng.normal(size=(T, T))
    for (i, j), value in specials.items():
        M[i, j] = value
    return {
        "Q": rng.normal(size=(T, 3)),
        "K": rng.normal(size=(T, 3)),
        "M": M,
        "V": rng.normal(size=(T, 5)),
    }


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_special_scores_as_the_statements_in_order(dtype):
    T = 530  # rows of three chunks: 256, 256, 18
    rng = np.random.default_rng(3)
    M = {}
    M.update({(0, j): -np.inf for j in range(T)})  # every score -inf: O NaN, L -inf
    M.update({(1, j): -np.inf for j in range(300)})  # a chunk of -inf, then finite ones
    M[(2, 400)] = np.nan  # NaN in a later chunk
    M[(3, 10)] = np.inf  # +inf: L +inf, O NaN
    M[(4, 520)] = 60.0  # the largest score in the last chunk: a rescale late
    M[(5, 3)] = 60.0  # the largest score first, far above the rest: weights underflow
    values = _masked_values(T, rng, M)
    k = td.kernel(MASKED, outputs=("O", "L"), backend="c")
    stored = compiled_statements(k.program, values, "c")
    assert [n.online for n in pair_stored(stored)] == ["", "L"]  # the scores, then one pass
    args = {n: np.asarray(v, dtype) for n, v in values.items()}
    O, L = k(**args)
    S = values["Q"] @ values["K"].T + values["M"]
    want_O, want_L = _in_order(S, values["V"])
    tolerance = 1e-4 if dtype == "float32" else 1e-11
    for got, want in ((L, want_L), (O, want_O)):
        got = np.asarray(got, np.float64)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        finite = np.isfinite(want)
        np.testing.assert_array_equal(
            got[~finite & ~np.isnan(want)], want[~finite & ~np.isnan(want)]
        )
        np.testing.assert_allclose(got[finite], want[finite], rtol=tolerance, atol=tolerance)
    assert np.isnan(np.asarray(O)[0]).all() and np.asarray(L)[0] == -np.inf
    assert np.isfinite(np.asarray(O)[1]).all() and np.isnan(np.asarray(L)[2])
    assert np.asarray(L)[3] == np.inf and np.isnan(np.asarray(O)[3]).all()


def test_long_rows_run_as_two_nests():
    # Rows longer than the C kernel's per-row accumulators take (tensordsl.binding.one_pass).
    rng = np.random.default_rng(6)
    Q, K = rng.normal(size=(1, 1, 3, 2)), rng.normal(size=(1, 1, 3, 2))
    V = rng.normal(size=(1, 1, 3, 1100))
    O, L = td.kernel(CAUSAL, outputs=("O", "L"), backend="c")(Q, K, 0.7, V)
    want_O, want_L = _in_order(_causal_scores(Q, K, 0.7), V)
    np.testing.assert_allclose(np.asarray(O), want_O, atol=1e-12)
    np.testing.assert_allclose(np.asarray(L), want_L, atol=1e-12)


def test_vmap_and_second_order_through_the_one_pass_nest():
    rng = np.random.default_rng(8)
    Q, K, V = (rng.normal(size=(3, 1, 1, 6, 2)) for _ in range(3))
    k = td.kernel(CAUSAL, outputs=("O", "L"), backend="c")
    O, L = jax.vmap(lambda q, k_, v: k(q, k_, 0.6, v))(Q, K, V)
    want_O, want_L = _in_order(_causal_scores(Q, K, 0.6), V)
    np.testing.assert_allclose(np.asarray(O), want_O, atol=1e-12)
    np.testing.assert_allclose(np.asarray(L), want_L, atol=1e-12)

    def loss(q, k_, v):
        O, L = k(q, k_, 0.6, v)
        return jnp.sum(jnp.sin(O)) + jnp.sum(L**2)

    args = [a[0] for a in (Q, K, V)]
    jax.test_util.check_grads(jax.jit(loss), args, order=2, modes=["rev"], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype, tolerance", [("bfloat16", 3e-2), ("float16", 4e-3)])
def test_half_precision_inputs(dtype, tolerance):
    # Stored in 16 bits, computed in float32: within a few of the storage type's ulps.
    rng = np.random.default_rng(9)
    Q, K, V = (rng.normal(size=(1, 2, 40, 8)) for _ in range(3))
    k = td.kernel(CAUSAL, outputs=("O", "L"), backend="c")
    cast = [jnp.asarray(a, dtype) for a in (Q, K, V)]
    scale = jnp.asarray(0.3, dtype)
    O, L = k(cast[0], cast[1], scale, cast[2])
    assert O.dtype == L.dtype == jnp.dtype(dtype)
    exact = [np.asarray(a.astype(jnp.float32), np.float64) for a in (*cast, scale)]
    want_O, want_L = _in_order(_causal_scores(exact[0], exact[1], exact[3]), exact[2])
    np.testing.assert_allclose(np.asarray(O, np.float64), want_O, atol=tolerance)
    np.testing.assert_allclose(np.asarray(L, np.float64), want_L, atol=tolerance * 4)
