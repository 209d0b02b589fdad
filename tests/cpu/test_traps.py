"""Traps in the notation (issue 27): a bias inside a sum, `end`/`begin`, `ranges=` that
narrowed another index, typo-like index names, an index used only as a value, and the span
of a quoted sub-expression. Reference and C back ends; the bias under the CUDA emulator too."""

from __future__ import annotations

import shutil
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen import config
from codegen.cuda.emulator import emulate

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

HAVE_CC = shutil.which(config.c_compiler()) is not None
BACKENDS = [
    "reference",
    pytest.param("c", marks=pytest.mark.skipif(not HAVE_CC, reason="no C compiler")),
]


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(seed)


# -- a term without a summed index is added once ------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("xla", ["0", "1"])
def test_a_bias_is_added_once_with_its_gradient(backend, xla, monkeypatch):
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", xla)
    rng = _rng(0)
    X, W, c = rng.normal(size=(3, 8)), rng.normal(size=(8, 4)), rng.normal(size=4)
    k = td.kernel("Y[b,o] := X[b,i] * W[i,o] + c[o]", backend=backend)
    np.testing.assert_allclose(k(X, W, c), X @ W + c, rtol=1e-5, atol=1e-5)
    dY = rng.normal(size=(3, 4))
    grads = jax.grad(lambda X, W, c: jnp.sum(k(X, W, c) * dY), argnums=(0, 1, 2))(X, W, c)
    for got, want in zip(grads, (dY @ W.T, X.T @ dY, dY.sum(axis=0)), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_scores_plus_a_bias_and_a_mask(backend):
    rng = _rng(1)
    Q, K, B = rng.normal(size=(5, 3)), rng.normal(size=(6, 3)), rng.normal(size=(5, 6))
    k = td.kernel("S[i,j] := Q[i,d] * K[j,d] + B[i,j] - 2", backend=backend)
    np.testing.assert_allclose(k(Q, K, B), Q @ K.T + B - 2, rtol=1e-5, atol=1e-5)
    masked = td.kernel("S[i,j] := Q[i,d] * K[j,d] + where(j <= i, 0, -inf)", backend=backend)
    want = np.where(np.arange(6)[None, :] <= np.arange(5)[:, None], Q @ K.T, -np.inf)
    np.testing.assert_allclose(masked(Q, K), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_only_top_level_terms_without_a_summed_index_leave_the_sum(backend):
    rng = _rng(2)
    X, c = rng.normal(size=(3, 4)), rng.normal(size=3)

    def run(source, *args):
        return np.asarray(td.kernel(source, backend=backend)(*args), dtype=np.float64)

    np.testing.assert_allclose(run("Y[b] := X[b,i] - c[b]", X, c), X.sum(1) - c, rtol=1e-5)
    np.testing.assert_allclose(run("Y[b] := -(c[b] - X[b,i])", c, X), X.sum(1) - c, rtol=1e-5)
    # Products distribute over sums first (issue 36, Einstein's rule term by term): c[b]
    # reads no summed index, so 2*c[b] is added once.
    np.testing.assert_allclose(
        run("Y[b] := 2 * (X[b,i] + c[b])", X, c), 2 * (X.sum(1) + c), rtol=1e-5
    )
    # Inside a function the argument is not a top-level sum: c[b] is summed once per i,
    # also where sympy simplifies the call into a sum (abs of a positive sum, expm1).
    np.testing.assert_allclose(
        run("Y[b] := tanh(X[b,i] + c[b])", X, c), np.tanh(X + c[:, None]).sum(1), rtol=1e-5
    )
    np.testing.assert_allclose(
        run("Y[b] := 2 * abs(1 + X[b,i]^2)", X), 2 * (1 + X**2).sum(1), rtol=1e-5
    )
    np.testing.assert_allclose(run("Y[b] := expm1(X[b,i])", X), np.expm1(X).sum(1), rtol=1e-5)
    # Other reductions reduce the whole body.
    np.testing.assert_allclose(run("(max) Y[b] := X[b,i] + c[b]", X, c), X.max(1) + c, rtol=1e-5)
    np.testing.assert_allclose(
        run("(prod) Y[b] := X[b,i] + c[b]", X, c), np.prod(X + c[:, None], 1), rtol=1e-5
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_bias_inside_a_fused_program(backend):
    rng = _rng(3)
    X, W, c, V = (rng.normal(size=s) for s in [(3, 5), (5, 4), (4,), (4, 2)])
    source = "H[b,o] := X[b,i] * W[i,o] + c[o]\nY[b,p] := tanh(H[b,o]) * V[o,p]"
    k = td.kernel(source, backend=backend)
    want = np.tanh(X @ W + c) @ V
    np.testing.assert_allclose(k(X, W, c, V), want, rtol=1e-5, atol=1e-5)
    dY = rng.normal(size=(3, 2))
    dc = jax.grad(lambda c: jnp.sum(k(X, W, c, V) * dY))(c)
    want_dc = ((dY @ V.T) * (1 - np.tanh(X @ W + c) ** 2)).sum(0)
    np.testing.assert_allclose(dc, want_dc, rtol=1e-5, atol=1e-5)


def test_explain_shows_where_the_sum_ends():
    text = td.kernel("Y[b,o] := X[b,i] * W[i,o] + c[o]").explain()
    assert "  Y[b, o] = (sum_i X[b, i]*W[i, o])\n          + c[o]\n" in text
    assert "  dc[o] = sum_b dY[b, o]\n" in text


@pytest.mark.skipif(not emulate.available(), reason="no CUDA emulator")
def test_a_bias_is_added_once_on_emulated_cuda(monkeypatch):
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    rng = _rng(4)
    X, W, c = rng.normal(size=(3, 8)), rng.normal(size=(8, 4)), rng.normal(size=4)
    k = td.kernel("Y[b,o] := X[b,i] * W[i,o] + c[o]", backend="cuda")
    np.testing.assert_allclose(k(X, W, c), X @ W + c, rtol=1e-5, atol=1e-5)
    dY = rng.normal(size=(3, 4))
    dc = jax.grad(lambda c: jnp.sum(k(X, W, c) * dY))(c)
    np.testing.assert_allclose(dc, dY.sum(axis=0), rtol=1e-5, atol=1e-5)


# -- `end` and `begin` ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_end_and_begin_are_positions_of_the_axis(backend):
    rng = _rng(5)
    D = rng.normal(size=(4, 6))
    k = td.kernel("F[i] := D[i,end] - D[i,begin] * D[i,end-1]", backend=backend)
    assert k.inputs == ("D",)
    np.testing.assert_allclose(k(D), D[:, -1] - D[:, 0] * D[:, -2], rtol=1e-5)
    weights = rng.normal(size=4)
    got = jax.grad(lambda D: jnp.sum(k(D) * weights))(D)
    want = np.zeros_like(D)
    want[:, -1] += weights
    want[:, 0] -= weights * D[:, -2]
    want[:, -2] -= weights * D[:, 0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_end_is_not_an_index_name():
    with pytest.raises(td.IndexExpressionError, match="'end' is a position, not an index name"):
        td.kernel("Y[end] := X[end]")


# -- ranges= does not narrow an index used alone -------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_ranges_do_not_narrow_an_index_used_alone(backend):
    rng = _rng(6)
    X, W = rng.normal(size=10), rng.normal(size=3)
    k = td.kernel("Y[i] := X[i+k] * W[k]", ranges={"i": 10}, backend=backend)
    with pytest.raises(td.RangeError, match=r"'X\[i\+k\]' reads axis 0 of 'X' at 0\.\.11"):
        k(X, W)
    fits = td.kernel("Y[i] := X[i+k] * W[k]", ranges={"i": 8}, backend=backend)
    np.testing.assert_allclose(fits(X, W), np.correlate(X, W, "valid"), rtol=1e-5)


# -- typo-like index names -----------------------------------------------------------------


def test_typo_like_summed_indices_warn():
    with pytest.warns(td.IndexNameWarning, match="index 'kk' appears once") as caught:
        td.kernel("C[i,j] := A[i,k] * B[kk,j]")
    text = str(caught[0].message)
    assert "  C[i,j] := A[i,k] * B[kk,j]\n                       ~~\n" in text
    assert text.endswith("hint: did you mean 'k'?")
    assert issubclass(td.IndexNameWarning, UserWarning)


@pytest.mark.parametrize(
    "source",
    [
        "C[i,j] := A[i,k] * B[k,j]",  # no typo
        "s := x[i] * y[j]",  # two letters: a product of sums, on purpose
        "s := x[k1] * y[k2]",  # a digit apart
        "s := x[kk] + y[k]",  # not factors of one product
        "s := x[k, kk] * y[k]",  # kk in the same factor as k
    ],
)
def test_deliberate_index_names_do_not_warn(source):
    with warnings.catch_warnings():
        warnings.simplefilter("error", td.IndexNameWarning)
        td.kernel(source)


# -- an index given by ranges= is an index, even used only as a value ----------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_used_only_as_a_value_is_an_index(backend):
    k = td.kernel("s := (i >= 3)", ranges={"i": 10}, backend=backend)
    assert k.inputs == ()
    assert float(k()) == 7.0
    weighted = td.kernel("Y[j] := X[j] * (i >= j)", ranges={"i": 4}, backend=backend)
    assert weighted.inputs == ("X",)
    np.testing.assert_allclose(weighted(np.array([1.0, 2.0, 3.0])), [4.0, 6.0, 6.0])


# -- the quoted source of an error keeps its parentheses -----------------------------------


def test_error_quotes_a_parenthesised_operand_whole():
    # `1/(X[i]*0)` itself is no longer an error: it gives inf or NaN, as in jnp (IEEE
    # values kept, issue 27); a constant division by zero still is, quoted whole.
    with pytest.raises(td.ExpressionError) as caught:
        td.kernel("Y[i] := X[i] + 1/(2*0)")
    text = str(caught.value)
    assert text.startswith("'1/(2*0)' is not a finite real number\n")
    assert "  Y[i] := X[i] + 1/(2*0)\n                 ~~~~~~~\n" in text
