"""The "xla" strategy: pure contractions run as XLA's dot, everything else as kernels."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.contraction import contraction
from tensordsl.lower import lower
from tensordsl.parse import parse


def _nest(source, **options):
    return lower(parse(source), **options).nest


@pytest.mark.parametrize(
    ("source", "subscripts"),
    [
        ("C[i,j] := A[i,k] * B[k,j]", "ac,cb->ab"),
        ("S[h,i,j] := Q[h,i,d] * K[h,j,d] * scale", "abd,acd->abc"),
        ("Y[b,o] := 0.5 * X[b,c] * W[o,c]", "ac,bc->ab"),
        ("G[i,j] := A[i,k] * A[j,k]", "ac,bc->ab"),
    ],
)
def test_pure_contractions_are_recognised(source, subscripts):
    found = contraction(_nest(source))
    assert found is not None and found.subscripts == subscripts


@pytest.mark.parametrize(
    "source",
    [
        "Y[i] := X[i,k]",  # one tensor: a sum, not a dot
        "C[i,j] := A[i,k] * B[k,j] + 1",  # not a product
        "Y[i] := X[i+k] * W[k]",  # shifted access
        "C[i,j] := exp(A[i,k]) * B[k,j]",  # a function of an access
        "D[i] := A[i,i,k] * B[k]",  # an index twice in one access
        "C[i,j] := A[i,j] * B[i,j]",  # nothing reduced
    ],
)
def test_other_nests_are_not_contractions(source):
    assert contraction(_nest(source)) is None


def _hlo(f, *args):
    return jax.jit(f).lower(*args).as_text()


def test_matmul_and_its_gradients_run_as_xla_dots(monkeypatch):
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(5, 7)), rng.normal(size=(7, 3))
    k = td.kernel("C[i,j] := A[i,k] * B[k,j] * s", backend="c")

    def loss(A, B):
        return jnp.sum(k(A, B, 0.5) * jnp.arange(15.0).reshape(5, 3))

    np.testing.assert_allclose(k(A, B, 0.5), 0.5 * A @ B, rtol=1e-12)
    got = jax.grad(loss, argnums=(0, 1))(A, B)
    want = jax.grad(lambda A, B: jnp.sum(0.5 * A @ B * jnp.arange(15.0).reshape(5, 3)), (0, 1))(
        A, B
    )
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    text = _hlo(jax.grad(loss, argnums=(0, 1)), A, B)
    assert "dot" in text and "custom_call" not in text
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    assert "custom_call" in _hlo(jax.grad(loss, argnums=(0, 1)), A, B)
    np.testing.assert_allclose(jax.grad(loss, argnums=(0, 1))(A, B)[0], want[0], rtol=1e-12)


def test_a_narrowed_range_falls_back_to_the_kernel():
    rng = np.random.default_rng(1)
    A, B = rng.normal(size=(4, 6)), rng.normal(size=(6, 3))
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", ranges={"k": range(1, 5)}, backend="c")
    np.testing.assert_allclose(k(A, B), A[:, 1:5] @ B[1:5], rtol=1e-12)
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", ranges={"k": 4}, backend="c")
    np.testing.assert_allclose(k(A, B), A[:, :4] @ B[:4], rtol=1e-12)


def test_a_loop_order_asks_for_the_generated_kernel():
    rng = np.random.default_rng(2)
    A, B = rng.normal(size=(4, 6)), rng.normal(size=(6, 3))
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", loop_order=("j", "i"), backend="c")
    assert "custom_call" in _hlo(k, A, B)
    np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-12)


def test_vmapped_and_half_precision_contractions():
    rng = np.random.default_rng(3)
    A, B = rng.normal(size=(3, 4, 6)), rng.normal(size=(6, 5))
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", backend="c")
    np.testing.assert_allclose(jax.vmap(k, (0, None))(A, B), A @ B, rtol=1e-12)
    half = k(A[0].astype(jnp.bfloat16), B.astype(jnp.bfloat16))
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(half, np.float64), A[0] @ B, rtol=3e-2, atol=3e-2)


def test_explain_shows_the_strategy():
    text = td.kernel("C[i,j] := A[i,k] * B[k,j]").explain()
    assert "gradient of A" in text  # the nests themselves do not depend on the strategy
    from tensordsl.explain import schedule_lines

    lines = schedule_lines(_nest("C[i,j] := A[i,k] * B[k,j]"))
    assert any("strategy=xla" in line for line in lines)
