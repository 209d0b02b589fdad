"""vmap rewrites the nest with a batch index: one kernel call per batch, any in/out axes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl import UnsupportedError
from tests.corpus import CORPUS, CORPUS_BY_NAME, make_inputs

B = 3


def kernel(case, backend):
    return td.kernel(case.source, reduce=case.reduce, ranges=case.ranges, backend=backend)


def nest_calls(jaxpr):
    """Every tensordsl_nest equation of a jaxpr, nested jaxprs included."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "tensordsl_nest":
            found.append(eqn)
        for sub in jax.core.subjaxprs(eqn.params) if hasattr(jax.core, "subjaxprs") else ():
            found += nest_calls(sub)
    return found


def batch_of(case, batched, axis=0):
    """Positional args with `batched` inputs stacked on `axis`, and the stacked reference."""
    draws = [make_inputs(case, seed=s) for s in range(B)]
    names = list(case.args)
    args = [
        np.stack([np.asarray(d[n]) for d in draws], axis) if n in batched else draws[0][n]
        for n in names
    ]
    per_example = [{n: (d[n] if n in batched else draws[0][n]) for n in names} for d in draws]
    expected = np.stack([case.expected(**inputs) for inputs in per_example])
    in_axes = tuple(axis if n in batched else None for n in names)
    return args, in_axes, expected


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_vmap_first_input_reference(case):
    """The rewrite on every corpus kernel (reference back end): first input batched."""
    args, in_axes, expected = batch_of(case, {next(iter(case.args))})
    got = jax.vmap(kernel(case, "reference"), in_axes)(*args)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-10, atol=1e-11)


@pytest.mark.parametrize("case", CORPUS[::4], ids=lambda c: c.name)
def test_vmap_all_inputs_c_last_axis(case, monkeypatch):
    """Every input batched, on its last axis (scalars on axis 0), through compiled C."""
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    draws = [make_inputs(case, seed=s) for s in range(B)]
    names = list(case.args)
    axes = tuple(np.ndim(draws[0][n]) for n in names)
    args = [np.stack([np.asarray(d[n]) for d in draws], a) for n, a in zip(names, axes)]
    expected = np.stack([case.expected(**d) for d in draws])
    got = jax.vmap(kernel(case, "c"), axes)(*args)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-10, atol=1e-11)


def test_one_kernel_call_per_batch():
    """vmap of a kernel is a single nest over the batch, not B calls."""
    case = CORPUS_BY_NAME["matmul"]
    args, in_axes, _ = batch_of(case, {"A"})
    jaxpr = jax.make_jaxpr(jax.vmap(kernel(case, "c"), in_axes))(*args).jaxpr
    (call,) = nest_calls(jaxpr)
    assert str(call.params["nest"]) == "C[b, i, j] := A[b, i, k]*B[k, j]"
    assert call.outvars[0].aval.shape == (B, 3, 4)


def test_in_axes_out_axes_and_nesting():
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", backend="c")
    rng = np.random.default_rng(1)
    A = rng.uniform(-1, 1, (3, 2, 5))  # batch on axis 1
    Bm = rng.uniform(-1, 1, (5, 4, 2))  # batch on axis 2
    got = jax.vmap(k, in_axes=(1, 2), out_axes=2)(A, Bm)
    expected = np.einsum("ibk,kjb->ijb", A, Bm)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12)

    A2 = rng.uniform(-1, 1, (4, 2, 3, 5))
    B2 = rng.uniform(-1, 1, (2, 5, 6))
    nested = jax.vmap(jax.vmap(k, in_axes=(0, 0)), in_axes=(0, None))
    np.testing.assert_allclose(
        np.asarray(nested(A2, B2)), np.einsum("cbik,bkj->cbij", A2, B2), rtol=1e-12
    )
    jaxpr = jax.make_jaxpr(nested)(A2, B2).jaxpr
    (call,) = nest_calls(jaxpr)
    assert call.outvars[0].aval.shape == (4, 2, 3, 6)


def test_vmap_over_scalar_input():
    k = td.kernel("Y[i] := alpha*X[i] + beta", backend="c")
    alphas = np.array([0.5, -1.25, 2.0])
    X = np.linspace(-1, 1, 5)
    got = jax.vmap(k, in_axes=(0, None, None))(alphas, X, 0.25)
    np.testing.assert_allclose(np.asarray(got), alphas[:, None] * X + 0.25, rtol=1e-12)


# Per-example gradients and gradients of batched kernels, against jnp float64.
LAYERS = {
    "matmul": ("C[i,j] := A[i,k] * B[k,j]", "sum", lambda A, B: A @ B, [(3, 5), (5, 4)]),
    "pairwise": (
        "D[i,j] := (W[k,i]-X[k,j])^2",
        "sum",
        lambda W, X: ((W[:, :, None] - X[:, None, :]) ** 2).sum(0),
        [(4, 3), (4, 5)],
    ),
    "conv1d": (
        "Y[o,i] := X[c,i+k] * W[o,c,k]",
        "sum",
        lambda X, W: jnp.stack(
            [jnp.einsum("cik,ock->oi", jnp.stack([X[:, i : i + 3] for i in range(7)], 1), W)]
        )[0],
        [(2, 9), (4, 2, 3)],
    ),
    "logsumexp": (
        "L[i] := A[i,k] + B[k]",
        "logsumexp",
        lambda A, B: jax.nn.logsumexp(A + B, axis=1),
        [(3, 5), (5,)],
    ),
    "max": ("M[i] := A[i,k] * B[k]", "max", lambda A, B: (A * B).max(1), [(3, 5), (5,)]),
}


def layer(name):
    source, reduce, truth, shapes = LAYERS[name]
    rng = np.random.default_rng(len(name))
    values = [rng.uniform(-1, 1, s) for s in shapes]
    return td.kernel(source, reduce=reduce, backend="c"), truth, values


@pytest.mark.parametrize("name", list(LAYERS))
def test_per_example_gradients(name):
    """vmap(grad): the second input batched; per-example gradients of both inputs."""
    k, truth, (P, Q) = layer(name)
    rng = np.random.default_rng(7)
    Qs = rng.uniform(-1, 1, (B, *Q.shape))
    ct = rng.uniform(-1, 1, np.shape(truth(P, Q)))

    def loss(f):
        return lambda p, q: jnp.sum(f(p, q) * ct)

    per_example = jax.vmap(jax.grad(loss(k), (0, 1)), (None, 0))
    expected = jax.vmap(jax.grad(loss(truth), (0, 1)), (None, 0))(P, Qs)
    got = jax.jit(per_example)(P, Qs)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", list(LAYERS))
def test_grad_of_vmap_reduces_batch_inside_the_nest(name):
    """grad(vmap): the unbatched input's gradient nest sums over the batch itself."""
    k, truth, (P, Q) = layer(name)
    rng = np.random.default_rng(8)
    Qs = rng.uniform(-1, 1, (B, *Q.shape))
    ct = rng.uniform(-1, 1, (B, *np.shape(truth(P, Q))))

    def loss(f):
        return lambda p, q: jnp.sum(jax.vmap(f, (None, 0))(p, q) * ct)

    got = jax.grad(loss(k), (0, 1))(P, Qs)
    expected = jax.grad(loss(truth), (0, 1))(P, Qs)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-10, atol=1e-12)
    jaxpr = jax.make_jaxpr(jax.grad(loss(k), 0))(P, Qs).jaxpr
    (gradient,) = [c for c in nest_calls(jaxpr) if c.outvars[0] is jaxpr.outvars[0]]
    assert gradient.outvars[0].aval.shape == P.shape
    assert "b" in {str(i) for t in gradient.params["nest"].terms for i in t.reduced_indices}


def test_second_order_of_vmapped_kernel():
    k, truth, (P, Q) = layer("pairwise")
    Qs = np.random.default_rng(9).uniform(-1, 1, (B, *Q.shape))

    def outer(f):
        inner = jax.grad(lambda p, q: jnp.sum(jax.vmap(f, (None, 0))(p, q) ** 3))
        return jax.grad(lambda p, q: jnp.sum(jnp.sin(inner(p, q))), 1)

    np.testing.assert_allclose(
        np.asarray(outer(k)(P, Qs)), np.asarray(outer(truth)(P, Qs)), rtol=1e-9, atol=1e-12
    )


def test_jacrev_and_forward_mode():
    """Reverse and forward mode agree (tests/jax/test_forward_mode.py covers forward mode)."""
    k, truth, (P, Q) = layer("matmul")
    np.testing.assert_allclose(
        np.asarray(jax.jacrev(k, 1)(P, Q)), np.asarray(jax.jacrev(truth, 1)(P, Q)), rtol=1e-12
    )
    rng = np.random.default_rng(5)
    tangents = (rng.uniform(-1, 1, P.shape), rng.uniform(-1, 1, Q.shape))
    np.testing.assert_allclose(
        np.asarray(jax.jvp(k, (P, Q), tangents)[1]),
        np.asarray(jax.jvp(truth, (P, Q), tangents)[1]),
        rtol=1e-12,
    )
    np.testing.assert_allclose(
        np.asarray(jax.jacfwd(k, 1)(P, Q)), np.asarray(jax.jacrev(truth, 1)(P, Q)), rtol=1e-12
    )


def test_linear_transpose_is_unsupported() -> None:
    """Issue 27: JAX's bare NotImplementedError for the primitive's transpose."""
    k = td.kernel("Y[i] := X[i] * 2", backend="reference")
    X = np.random.default_rng(27).uniform(-1, 1, 4)
    with pytest.raises(UnsupportedError, match="jax.linear_transpose"):
        jax.linear_transpose(k, X)(X)


@pytest.mark.parametrize("source", ["Y[i] := X[i] * 2", "T[i] := X[i] * 2\nY[i] := T[i] + 1"])
def test_export_with_a_symbolic_dimension_is_unsupported(source: str) -> None:
    """Issue 27 (docs/jax.md): JAX's InconclusiveDimensionOperation before; concrete shapes
    export."""
    from jax import export

    k = td.kernel(source, backend="reference")
    (n,) = export.symbolic_shape("n")
    with pytest.raises(UnsupportedError, match="symbolic dimension n"):
        export.export(jax.jit(k))(jax.ShapeDtypeStruct((n,), jnp.float32))
    exported = export.export(jax.jit(k))(jax.ShapeDtypeStruct((4,), jnp.float32))
    X = np.random.default_rng(28).uniform(-1, 1, 4).astype(np.float32)
    np.testing.assert_allclose(np.asarray(exported.call(X)), np.asarray(k(X)), rtol=1e-6)
