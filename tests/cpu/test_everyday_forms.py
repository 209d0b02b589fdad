"""Everyday forms (issue 28): `mean`, `argmax`/`argmin`, `size(j)` inside an expression,
`...` in kernels and programs, and the hints for top-k's other spellings (topk itself:
test_topk.py), against float64 numpy on random
inputs, on the reference, C and CUDA back ends (the CUDA emulator where there is no GPU),
under jit, grad and vmap."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.backends import BACKENDS, generated_kernels  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("generated_kernels")  # every test: generated kernels


def _x(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


def _grad_close(f, g, *args, argnums=0):
    """`jax.grad` of two scalar functions agree (f: tensordsl, g: jnp reference, jitted:
    eagerly each of its operations is compiled alone)."""
    got = jax.grad(f, argnums)(*args)
    want = jax.jit(jax.grad(g, argnums))(*args)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


# -- mean --------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_mean_as_reduce_and_as_prefix(backend):
    X, c = _x((5, 7)), _x(5, seed=1)
    by_option = td.kernel("M[i] := X[i,j] + c[i]", reduce="mean", backend=backend)
    by_prefix = td.kernel("(mean) M[i] := X[i,j] + c[i]", backend=backend)
    want = X.mean(1) + c  # c is read by every j: its mean is itself
    np.testing.assert_allclose(np.asarray(by_option(X, c)), want, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(jax.jit(by_prefix)(X, c)), want, rtol=1e-12)
    _grad_close(
        lambda X, c: jnp.sum(by_option(X, c) ** 2),
        lambda X, c: jnp.sum((X.mean(1) + c) ** 2),
        X,
        c,
        argnums=(0, 1),
    )
    batched = jax.vmap(by_option, in_axes=(0, None))(np.stack([X, 2 * X]), c)
    np.testing.assert_allclose(np.asarray(batched[1]), 2 * X.mean(1) + c, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_mean_over_two_axes_and_a_mask(backend):
    X = _x((3, 4, 5), seed=2)
    k = td.kernel("M[i] := X[i,j,k]", reduce="mean", backend=backend)
    np.testing.assert_allclose(np.asarray(k(X)), X.mean((1, 2)), rtol=1e-12)
    # a mask zeroes values; the count is still every j, as jnp.mean of a jnp.where
    causal = td.kernel("M[i] := where(j <= i, S[i,j], 0)", reduce="mean", backend=backend)
    S = _x((6, 6), seed=3)
    np.testing.assert_allclose(np.asarray(causal(S)), np.tril(S).mean(1), rtol=1e-12)
    _grad_close(lambda S: jnp.sum(causal(S) ** 3), lambda S: jnp.sum(jnp.tril(S).mean(1) ** 3), S)


@pytest.mark.parametrize("backend", BACKENDS)
def test_layer_norm_with_mean_statements(backend):
    X = _x((4, 6), seed=4)
    ln = td.kernel(
        """
        (mean) mu[i] := X[i,j]
        (mean) v[i] := (X[i,j] - mu[i])^2
        Y[i,j] := (X[i,j] - mu[i]) * rsqrt(v[i] + 1e-5)
        """,
        backend=backend,
    )

    def ref(X):
        mu = X.mean(1, keepdims=True)
        return (X - mu) / jnp.sqrt(((X - mu) ** 2).mean(1, keepdims=True) + 1e-5)

    np.testing.assert_allclose(np.asarray(ln(X)), np.asarray(ref(X)), rtol=1e-10)
    _grad_close(lambda X: jnp.sum(ln(X) * X**2), lambda X: jnp.sum(ref(X) * X**2), X)


# -- size(j) -----------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_size_of_an_index_inside_an_expression(backend):
    X = _x((5, 7), seed=5)
    centred = td.kernel("Y[i,j] := X[i,j] - X[i,k] / size(k)", backend=backend)

    def ref(X):
        return X - X.mean(1, keepdims=True)

    np.testing.assert_allclose(np.asarray(centred(X)), np.asarray(ref(X)), atol=1e-12)
    _grad_close(lambda X: jnp.sum(centred(X) ** 3), lambda X: jnp.sum(ref(X) ** 3), X)
    batched = jax.jit(jax.vmap(centred))(np.stack([X, X[:, ::-1]]))
    np.testing.assert_allclose(np.asarray(batched[1]), np.asarray(ref(X[:, ::-1])), atol=1e-12)
    # a free index's size, and a shifted range's: i runs over X.shape[0] - 2 values
    k = td.kernel("Y[i] := X[i+t,0] * size(i) + size(t)", ranges={"t": 3}, backend=backend)
    want = sum(X[t : t + 3, 0] for t in range(3)) * 3 + 3
    np.testing.assert_allclose(np.asarray(k(X)), want, rtol=1e-12)


def test_size_errors():
    with pytest.raises(td.ExpressionError, match=r"'size\(q\)' does not name an index"):
        td.kernel("Y[i] := X[i,j] / size(q)")
    with pytest.raises(td.UnknownNameError, match=r"the extent of an index is size\(j\)"):
        td.kernel("Y[i] := X[i,j] / len(j)")


# -- argmax / argmin ---------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reduction", ["argmax", "argmin"])
def test_argmax_argmin_first_of_ties_as_numpy(backend, reduction):
    X = _x((6, 9), seed=6)
    X[1, 2] = X[1, 7] = X[1].max() + 1  # a tie for the max: the first wins
    X[2, 3] = X[2, 8] = X[2].min() - 1  # and for the min
    k = td.kernel("A[i] := X[i,j]", reduce=reduction, backend=backend)
    want = getattr(np, reduction)(X, axis=1)
    got = k(X)
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(np.asarray(got), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(k)(X)), want)
    batched = jax.vmap(k)(np.stack([X, -X]))
    np.testing.assert_array_equal(np.asarray(batched[1]), getattr(np, reduction)(-X, axis=1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_argmax_over_two_axes_is_a_flat_position(backend):
    X = _x((3, 4, 5), seed=7)
    k = td.kernel("(argmax) A[i] := X[i,j,k]", backend=backend)
    np.testing.assert_array_equal(np.asarray(k(X)), np.argmax(X.reshape(3, -1), axis=1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_argmax_has_no_gradient_and_reads_as_a_value(backend):
    X, W = _x((4, 6), seed=8), _x(4, seed=9)
    k = td.kernel("(argmax) A[i] := X[i,j]", backend=backend)
    with pytest.raises(TypeError, match="real-valued outputs"):
        jax.grad(lambda X: k(X).sum())(X)
    # an integer output used as a value: its tangent is zero, as jnp.argmax's
    _grad_close(
        lambda X: jnp.sum(k(X) * X[:, 0] ** 2),
        lambda X: jnp.sum(jnp.argmax(X, 1) * X[:, 0] ** 2),
        X,
    )
    program = td.kernel("(argmax) A[i] := X[i,j]; Y[i] := A[i] * W[i] + X[i,j]", backend=backend)

    def ref(X, W):
        return jnp.argmax(X, 1) * W + X.sum(1)

    np.testing.assert_allclose(np.asarray(program(X, W)), np.asarray(ref(X, W)), rtol=1e-12)
    _grad_close(
        lambda X, W: jnp.sum(program(X, W) ** 2),
        lambda X, W: jnp.sum(ref(X, W) ** 2),
        X,
        W,
        argnums=(0, 1),
    )
    assert "no gradient: A is an integer position" in k.explain()


# -- what the language does not have -----------------------------------------------------


@pytest.mark.parametrize(
    "name, spelled",
    [
        ("top_k", r"\(topk 5\) V\[i,r\]"),
        ("argkmin", r"\(argtopk 5\) N\[i,r\] := -D"),
        ("sort", "topk"),
    ],
)
def test_other_spellings_of_top_k_point_at_topk(name, spelled):
    with pytest.raises(td.ReductionError, match=spelled):
        td.kernel("A[i] := X[i,j]", reduce=name)
    with pytest.raises(td.ReductionError, match=spelled):
        td.kernel(f"({name}) A[i] := X[i,j]")


def test_unknown_reduction_lists_mean_and_argmax():
    with pytest.raises(
        td.ReductionError,
        match="one of sum, mean, max, min, prod, logsumexp, argmax, argmin, topk, argtopk",
    ) as err:
        td.kernel("A[i] := X[i,j]", reduce="avg")
    assert "reduce='mean'" in str(err.value)


# -- ... (leading batch axes) ------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_ellipsis_stands_for_any_number_of_leading_axes(backend):
    W = _x((5, 6), seed=10)
    dense = td.kernel("Y[..., o] := X[..., i] * W[i,o]", backend=backend)
    for lead in [(2, 3), (4,), ()]:
        X = _x((*lead, 5), seed=11)
        got = dense(X, W)
        assert got.shape == (*lead, 6)
        np.testing.assert_allclose(np.asarray(got), X @ W, rtol=1e-12, atol=1e-12)
    X = _x((2, 3, 5), seed=12)
    _grad_close(
        lambda X, W: jnp.sum(dense(X, W) ** 2),
        lambda X, W: jnp.sum((X @ W) ** 2),
        X,
        W,
        argnums=(0, 1),
    )
    batched = jax.jit(jax.vmap(dense, in_axes=(0, None)))(X, W)
    np.testing.assert_allclose(np.asarray(batched), X @ W, rtol=1e-12, atol=1e-12)
    # an output without `...` sums over the leading axes
    total = td.kernel("s[o] := X[..., o] * X[..., o]", backend=backend)
    np.testing.assert_allclose(np.asarray(total(X)), (X**2).sum((0, 1)), rtol=1e-12)


def test_ellipsis_errors():
    dense = td.kernel("Y[..., o] := X[..., i] * W[i,o]", backend="reference")
    with pytest.raises(td.ShapeError, match=r"leading axes \(2, 3\) of 'X' but \(3, 3\) of 'V'"):
        td.kernel("Y[..., i] := X[..., i] * V[..., i]")(np.ones((2, 3, 4)), np.ones((3, 3, 4)))
    with pytest.raises(td.ShapeError, match="'X' has 0 axes, fewer than the 1"):
        dense(np.float64(1.0), np.ones((1, 2)))
    with pytest.raises(td.IndexExpressionError, match="'...' is not the first index"):
        td.kernel("Y[o, ...] := X[..., o]")
    with pytest.raises(td.TensorDSLError):  # an empty index list (found by the parser fuzzer)
        td.kernel("Y[i]:=min(X[i,j],W[])")
    assert "  Y[..., o] = sum_i X[..., i]*W[i, o]\n" in dense.explain()


DENSE_TANH = """
    H[..., o] := X[..., i] * W[i, o] + B[o]
    Y[..., o] := tanh(H[..., o])
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_ellipsis_in_a_program_of_a_dense_layer_and_an_activation(backend):
    W, B = _x((5, 6), seed=20), _x(6, seed=21)
    layer = td.program(DENSE_TANH, backend=backend)
    both = td.program(DENSE_TANH, backend=backend, outputs=("H", "Y"))
    for lead in [(4,), (2, 3), (2, 1, 3)]:
        X = _x((*lead, 5), seed=22)
        got = layer(X, W, B)
        assert got.shape == (*lead, 6)
        np.testing.assert_allclose(np.asarray(got), np.tanh(X @ W + B), rtol=1e-12, atol=1e-12)
        H, Y = both(X, W, B)
        assert H.shape == Y.shape == (*lead, 6)
        np.testing.assert_allclose(np.asarray(H), X @ W + B, rtol=1e-12, atol=1e-12)
        _grad_close(
            lambda X, W, B: jnp.sum(jnp.sin(layer(X, W, B))),
            lambda X, W, B: jnp.sum(jnp.sin(jnp.tanh(X @ W + B))),
            X,
            W,
            B,
            argnums=(0, 1, 2),
        )
    X = _x((3, 2, 5), seed=23)
    batched = jax.jit(jax.vmap(layer, in_axes=(0, None, None)))(X, W, B)
    np.testing.assert_allclose(np.asarray(batched), np.tanh(X @ W + B), rtol=1e-12, atol=1e-12)
    # a statement without `...` on its left sums the leading axes of its reads
    total = td.program("H[..., o] := X[..., i] * W[i, o]; s[o] := H[..., o] ** 2", backend=backend)
    np.testing.assert_allclose(np.asarray(total(X, W)), ((X @ W) ** 2).sum((0, 1)), rtol=1e-12)


def test_ellipsis_in_a_program_errors_and_explain():
    layer = td.program(DENSE_TANH, backend="reference")
    with pytest.raises(td.ShapeError, match=r"leading axes \(2, 3\) of 'X' but \(3, 2\) of 'V'"):
        td.program("H[..., i] := X[..., i] * 2; Y[..., i] := H[..., i] * V[..., i]")(
            np.ones((2, 3, 4)), np.ones((3, 2, 4))
        )
    with pytest.raises(td.UnsupportedError, match="'H' is read without '...' here but defined"):
        td.program("H[..., o] := X[..., i] * W[i,o]; Y[b, o] := H[b, o] * 2")
    with pytest.raises(td.UnsupportedError, match="'H' is read with '...' here but defined"):
        td.program("H[b, o] := X[b, i] * W[i,o]; Y[..., o] := H[..., o] * 2")
    with pytest.raises(td.UnsupportedError, match="'X' is read without '...' here but read"):
        td.program("H[..., o] := X[..., i] * W[i,o]; Y[o] := X[b, o]")
    shapes = {"X": (2, 3, 5), "W": (5, 6), "B": (6,)}
    assert "fused for these shapes" in layer.explain(shapes)
    td.program(DENSE_TANH, backend="c").build(shapes)


def test_build_and_profile_take_an_argmax_alone_or_in_a_program():
    k = td.kernel("(argmax) A[i] := X[i,j]", backend="c")
    k.build({"X": (4, 5)})
    assert [row.name for row in k.profile({"X": (16, 9)}, reps=1).timings] == ["forward"]
    p = td.kernel("(argmax) A[i] := X[i,j]; (mean) M[i] := X[i,j] * A[i]", outputs=("A", "M"))
    p.build({"X": (4, 5)})
    assert {"A", "M", "dX"} <= {row.name for row in p.profile({"X": (16, 9)}, reps=1).timings}


def test_a_body_reading_an_extent_keeps_that_axis_whole_under_sharding():
    from tensordsl.binding.partitioning import plan_sharding
    from tensordsl.frontend.lower import lower
    from tensordsl.frontend.parse import parse

    # a device's shard would divide by its own extent: the axis is never split
    assert plan_sharding(lower(parse("M[i] := X[i,j]"), reduce="mean").nest).rule == "i r0 -> i"
    assert plan_sharding(lower(parse("M[i] := X[i,j]")).nest).rule == "i j -> i"
    assert plan_sharding(lower(parse("Y[i,j] := X[i,j] * size(i)")).nest).rule == "r0 j -> r1 j"


@pytest.mark.parametrize("backend", BACKENDS)
def test_nearest_neighbour_recomputes_the_distances_inside_the_argmin(backend):
    W, X = _x((3, 37), seed=13), _x((3, 26), seed=14)
    nearest = td.kernel("D[i,j] := (W[k,i] - X[k,j])^2; (argmin) N[i] := D[i,j]", backend=backend)
    want = np.argmin(((W[:, :, None] - X[:, None, :]) ** 2).sum(0), 1)
    np.testing.assert_array_equal(np.asarray(nearest(W, X)), want)
    np.testing.assert_array_equal(np.asarray(jax.jit(nearest)(W, X)), want)
    text = nearest.explain({"W": W.shape, "X": X.shape})
    # a position has no gradient, so nothing argues for storing the (i, j) distances
    assert "D recomputed where read, never stored" in text
