"""topk / argtopk (issue 28, KeOps' argKmin): `(topk 5) V[i,r] := body` keeps the 5 largest
values of the body over the reduced indices along the new last index `r`, `(argtopk 5)`
their flat positions. Checked against float64 numpy (`np.argsort`, stable: ties to the lower
position) on random inputs at odd sizes, on the reference, C and CUDA back ends (the CUDA
emulator where there is no GPU), with gradients, under jit, vmap and forward mode."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.backends import BACKENDS, generated_kernels  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.usefixtures("generated_kernels"), pytest.mark.optimised]


def _x(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


def _order(values):
    """Positions along the last axis, largest first, NaN first, ties to the lower position."""
    key = np.where(np.isnan(values), -np.inf, -values)
    return np.argsort(key, axis=-1, kind="stable")


def _top(values, k):
    positions = _order(values)[..., :k]
    return np.take_along_axis(values, positions, -1), positions


@pytest.mark.parametrize("backend", BACKENDS)
def test_values_and_positions_as_numpy(backend):
    X, w = _x((7, 13)), _x(13, seed=1)
    V = td.kernel("(topk 5) V[i,r] := X[i,j] * w[j]", backend=backend)
    N = td.kernel("(argtopk 5) N[i,r] := X[i,j] * w[j]", backend=backend)
    want, positions = _top(X * w, 5)
    np.testing.assert_allclose(np.asarray(V(X, w)), want, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.jit(V)(X, w)), want, rtol=1e-12)
    got = N(X, w)
    assert got.dtype == jnp.int32 and got.shape == (7, 5)
    np.testing.assert_array_equal(np.asarray(got), positions)
    np.testing.assert_array_equal(np.asarray(jax.jit(N)(X, w)), positions)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradient_flows_through_the_selected_positions(backend):
    X, w, C = _x((7, 13), seed=2), _x(13, seed=3), _x((7, 4), seed=4)
    V = td.kernel("(topk 4) V[i,r] := X[i,j] * w[j]", backend=backend)
    gX, gw = jax.grad(lambda X, w: jnp.sum(V(X, w) * C), (0, 1))(X, w)
    _, positions = _top(X * w, 4)
    want_X, want_w = np.zeros_like(X), np.zeros_like(w)
    for i in range(7):
        for r in range(4):
            j = positions[i, r]
            want_X[i, j] += C[i, r] * w[j]
            want_w[j] += C[i, r] * X[i, j]
    np.testing.assert_allclose(np.asarray(gX), want_X, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(np.asarray(gw), want_w, rtol=1e-12, atol=1e-14)
    # forward mode: the tangent at the selected positions
    tX = _x((7, 13), seed=5)
    _, tangent = jax.jvp(lambda X: V(X, w), (X,), (tX,))
    np.testing.assert_allclose(
        np.asarray(tangent), np.take_along_axis(tX * w, positions, -1), rtol=1e-12
    )
    # vmap: a leading batch index
    batched = jax.vmap(V, in_axes=(0, None))(np.stack([X, -X]), w)
    np.testing.assert_allclose(np.asarray(batched[1]), _top(-X * w, 4)[0], rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_ties_go_to_the_lower_position_and_nan_first(backend):
    X = np.random.default_rng(6).integers(0, 3, size=(5, 11)).astype(float)  # many ties
    X[3, 4] = np.nan
    N = td.kernel("(argtopk 6) N[i,r] := X[i,j]", backend=backend)
    V = td.kernel("(topk 6) V[i,r] := X[i,j]", backend=backend)
    want, positions = _top(X, 6)
    np.testing.assert_array_equal(np.asarray(N(X)), positions)
    np.testing.assert_array_equal(np.asarray(V(X)), want)  # NaN in row 3, first
    assert positions[3, 0] == 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_one_is_max_and_argmax_and_k_whole_is_a_sort(backend):
    X = _x((6, 9), seed=7)
    top1 = td.kernel("(topk 1) V[i,r] := X[i,j]", backend=backend)
    arg1 = td.kernel("(argtopk 1) V[i,r] := X[i,j]", backend=backend)
    np.testing.assert_array_equal(np.asarray(top1(X))[:, 0], X.max(1))
    np.testing.assert_array_equal(np.asarray(arg1(X))[:, 0], X.argmax(1))
    whole = td.kernel("(topk 9) V[i,r] := X[i,j]", backend=backend)
    np.testing.assert_array_equal(np.asarray(whole(X)), -np.sort(-X, axis=1))
    # over two reduced indices: a flat row-major position, as argmax's
    Y = _x((3, 4, 5), seed=8)
    N = td.kernel("(argtopk 7) N[i,r] := Y[i,j,k]", backend=backend)
    np.testing.assert_array_equal(np.asarray(N(Y)), _top(Y.reshape(3, -1), 7)[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_k_nearest_neighbours_never_store_the_distances(backend):
    X, Y = _x((9, 3), seed=9), _x((14, 3), seed=10)
    knn = td.kernel("D[i,j] := (X[i,d] - Y[j,d])^2; (argtopk 3) N[i,r] := -D[i,j]", backend=backend)
    near = td.kernel("D[i,j] := (X[i,d] - Y[j,d])^2; (topk 3) V[i,r] := -D[i,j]", backend=backend)
    D = ((X[:, None, :] - Y[None, :, :]) ** 2).sum(-1)
    want, positions = _top(-D, 3)
    np.testing.assert_array_equal(np.asarray(knn(X, Y)), positions)
    np.testing.assert_allclose(np.asarray(near(X, Y)), want, rtol=1e-12)
    for k in (knn, near):
        assert "D recomputed where read, never stored" in k.explain({"X": X.shape, "Y": Y.shape})
    C = _x((9, 3), seed=11)
    gX, gY = jax.grad(lambda X, Y: jnp.sum(near(X, Y) * C), (0, 1))(X, Y)
    want_X, want_Y = np.zeros_like(X), np.zeros_like(Y)
    for i in range(9):
        for r in range(3):
            j = positions[i, r]
            want_X[i] -= 2 * C[i, r] * (X[i] - Y[j])
            want_Y[j] += 2 * C[i, r] * (X[i] - Y[j])
    np.testing.assert_allclose(np.asarray(gX), want_X, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.asarray(gY), want_Y, rtol=1e-10, atol=1e-12)


def test_positions_have_no_gradient():
    X = _x((4, 6), seed=12)
    N = td.kernel("(argtopk 2) N[i,r] := X[i,j]")
    with pytest.raises(TypeError, match="real-valued outputs"):
        jax.grad(lambda X: N(X).sum())(X)


@pytest.mark.parametrize("backend", BACKENDS)
def test_masked_values_leave_empty_slots(backend):
    # a causal mask: row i has i + 1 values; the slots past them are -inf (position -1)
    S = _x((5, 5), seed=13)
    V = td.kernel("(topk 3) V[i,r] := where(j <= i, S[i,j], -inf)", backend=backend)
    N = td.kernel("(argtopk 3) N[i,r] := where(j <= i, S[i,j], -inf)", backend=backend)
    masked = np.where(np.tril(np.ones((5, 5), bool)), S, -np.inf)
    want, positions = _top(masked, 3)
    np.testing.assert_array_equal(np.asarray(V(S)), want)
    assert np.isneginf(np.asarray(V(S))[0, 1:]).all()
    # argtopk: a -inf value written in the body is a value like any other (its position,
    # the lower first), as np.argsort gives; the values' own gradient leaves such slots out
    np.testing.assert_array_equal(np.asarray(N(S)), positions)
    dS = jax.grad(lambda S: jnp.sum(jnp.where(jnp.isfinite(V(S)), V(S), 0)))(S)
    np.testing.assert_array_equal(np.asarray(dS)[0], [1, 0, 0, 0, 0])


# -- errors ------------------------------------------------------------------------------


def test_k_larger_than_the_reduced_range_is_an_error_at_call_time():
    k = td.kernel("(topk 5) V[i,r] := X[i,j]")
    with pytest.raises(td.RangeError, match=r"keeps 5 values of 'V' but reduces over 3") as info:
        k(_x((2, 3)))
    assert "k at most 3" in str(info.value) and "(topk 5)" in str(info.value)


@pytest.mark.parametrize(
    "source, error, match",
    [
        ("(topk 0) V[i,r] := X[i,j]", td.ReductionError, "'0' is not a count of values"),
        ("(topk 2.5) V[i,r] := X[i,j]", td.ReductionError, "'2.5' is not a count"),
        ("(topk) V[i,r] := X[i,j]", td.ReductionError, "needs the number of values to keep"),
        ("(max 3) V[i] := X[i,j]", td.ReductionError, "only topk and argtopk take a count"),
        ("(topk 3) V := X[i,j]", td.IndexExpressionError, "the left side has none"),
        ("(topk 3) V[i] := X[i,j]", td.IndexExpressionError, "the body reads 'i'"),
        ("(topk 3) V[i,r] := X[i,r]", td.IndexExpressionError, "the body reads 'r'"),
        ("(topk 3) V[i,r,r] := X[i,j]", td.IndexExpressionError, "is repeated on the left"),
    ],
)
def test_mistakes_in_a_top_k_statement(source, error, match):
    with pytest.raises(error, match=match):
        td.kernel(source)


def test_k_from_ranges_and_a_disagreeing_count():
    k = td.kernel("V[i,r] := X[i,j]", reduce="topk", ranges={"r": 2}, backend="reference")
    X = _x((3, 5), seed=14)
    np.testing.assert_array_equal(np.asarray(k(X)), _top(X, 2)[0])
    with pytest.raises(td.ReductionError, match=r"keeps 3 values but ranges= gives 'r' 2"):
        td.kernel("(topk 3) V[i,r] := X[i,j]", ranges={"r": 2})


def test_a_large_k_runs_on_the_reference_and_is_refused_by_compiled_back_ends():
    X = _x((2, 70), seed=15)
    source = "(topk 65) V[i,r] := X[i,j]"
    np.testing.assert_array_equal(
        np.asarray(td.kernel(source, backend="reference")(X)), _top(X, 65)[0]
    )
    with pytest.raises(td.UnsupportedError, match=r"keeps 65 values.*at most 64"):
        td.kernel(source, backend="c")(X)


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_rows_in_chunks_with_a_mask_and_two_reduced_indices(backend):
    # the C back end computes values in chunks of 256: several chunks, a partial last one
    X = _x((3, 1001), seed=16)
    V = td.kernel("(topk 7) V[i,r] := X[i,j]", backend=backend)
    np.testing.assert_array_equal(np.asarray(V(X)), _top(X, 7)[0])
    masked = td.kernel("(argtopk 7) N[i,r] := where(j >= 300, X[i,j], -inf)", backend=backend)
    positions = _order(X[:, 300:])[:, :7] + 300
    np.testing.assert_array_equal(np.asarray(masked(X)), positions)
    Y = _x((2, 5, 301), seed=17)
    N = td.kernel("(argtopk 9) N[i,r] := Y[i,k,j]", backend=backend)
    np.testing.assert_array_equal(np.asarray(N(Y)), _top(Y.reshape(2, -1), 9)[1])


ROUTER = """
    R[t,e] := X[t,d] * Wr[d,e]
    (logsumexp) L[t] := R[t,e]
    P[t,e] := exp(R[t,e] - L[t])
    (topk K) G[t,r] := P[t,e]
"""


def _router_reference(X, Wr, C, k):
    """A mixture of experts' router in float64: the top k of the softmax of `X @ Wr`, and
    the gradients of `sum(G * C)` with respect to X and Wr."""
    logits = X @ Wr
    P = np.exp(logits - logits.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    values, positions = _top(P, k)
    dP = np.zeros_like(P)
    np.put_along_axis(dP, positions, C, -1)
    dlogits = P * (dP - (P * dP).sum(-1, keepdims=True))
    return values, X.T @ dlogits, dlogits @ Wr.T


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("experts", "k", "dtype"), [(16, 2, np.float32), (37, 3, np.float64)])
def test_a_router_s_gradient_sums_its_ranks_in_vector_lanes(backend, experts, k, dtype):
    # Fused, the gradient nests of R sum the ranks of each row inside the experts' vector
    # lanes (`sum_r where(e == G_argument[t, r], dG[t, r], 0)`); 16 experts fill half a
    # C tile, 37 leave a ragged one
    X, Wr, C = _x((45, 11), seed=20), _x((11, experts), seed=21), _x((45, k), seed=22)
    router = td.program(ROUTER.replace("K", str(k)), backend=backend)
    want, want_Wr, want_X = _router_reference(X, Wr, C, k)
    x, w, c = (a.astype(dtype) for a in (X, Wr, C))
    got, (g_X, g_Wr) = jax.value_and_grad(lambda x, w: jnp.sum(router(x, w) * c), (0, 1))(x, w)
    rtol = 1e-10 if dtype == np.float64 else 2e-5
    np.testing.assert_allclose(float(got), float(np.sum(want * C)), rtol=rtol)
    scale = np.abs(want_X).max(), np.abs(want_Wr).max()
    np.testing.assert_allclose(np.asarray(g_X), want_X, rtol=0, atol=rtol * scale[0])
    np.testing.assert_allclose(np.asarray(g_Wr), want_Wr, rtol=0, atol=rtol * scale[1])
