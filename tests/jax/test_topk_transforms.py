"""topk as an ordinary JAX function: jit of vmap of grad, a second derivative, check_grads,
a program that reads the k values, a float32 call, positions of a fused program under grad,
rows sharded across devices, and init= refused, against float64 numpy
(the k largest by a stable argsort of the negated values)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.test_util import check_grads

import tensordsl as td
from tests.backends import BACKENDS, generated_kernels  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("generated_kernels")


def _x(shape, seed=0):
    return np.random.default_rng(seed).normal(size=shape)


def _positions(values, k):
    return np.argsort(-values, axis=-1, kind="stable")[..., :k]


@pytest.mark.parametrize("backend", BACKENDS)
def test_jit_of_vmap_of_grad(backend):
    X, w = _x((3, 5, 11), seed=1), _x(11, seed=2)
    V = td.kernel("(topk 3) V[i,r] := X[i,j] * exp(w[j])", backend=backend)
    weights = np.array([3.0, 2.0, 1.0])
    grads = jax.jit(jax.vmap(jax.grad(lambda X: jnp.sum(V(X, w) * weights))))(X)
    want = np.zeros_like(X)
    for b in range(3):
        positions = _positions(X[b] * np.exp(w), 3)
        for i in range(5):
            want[b, i, positions[i]] += weights * np.exp(w[positions[i]])
    np.testing.assert_allclose(np.asarray(grads), want, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_derivative_and_check_grads(backend):
    X = _x((4, 9), seed=3)
    V = td.kernel("(topk 2) V[i,r] := X[i,j]^3", backend=backend)

    def loss(X):
        return jnp.sum(V(X) * jnp.array([1.0, -2.0]))

    # d2/dX2 of x^3 at the selected positions: 6x times the rank's weight, on the diagonal
    hessian_diagonal = jax.grad(lambda X: jnp.sum(jax.grad(loss)(X)))(X)
    want = np.zeros_like(X)
    positions = _positions(X**3, 2)
    for i in range(4):
        want[i, positions[i]] = 6 * X[i, positions[i]] * np.array([1.0, -2.0])
    np.testing.assert_allclose(np.asarray(hessian_diagonal), want, rtol=1e-12)
    check_grads(loss, (X,), order=2, modes=("fwd", "rev"), eps=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_program_reads_the_k_values(backend):
    X = _x((6, 10), seed=4)
    program = td.kernel("(topk 3) V[i,r] := X[i,j]; s[i] := V[i,r] * V[i,r]", backend=backend)
    top = np.take_along_axis(X, _positions(X, 3), -1)
    np.testing.assert_allclose(np.asarray(program(X)), (top**2).sum(1), rtol=1e-12)
    grad = jax.grad(lambda X: jnp.sum(program(X)))(X)
    want = np.zeros_like(X)
    np.put_along_axis(want, _positions(X, 3), 2 * top, -1)
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_float32(backend):
    X = _x((5, 33), seed=5).astype(np.float32)
    N = td.kernel("(argtopk 4) N[i,r] := X[i,j]", backend=backend)
    V = td.kernel("(topk 4) V[i,r] := X[i,j]", backend=backend)
    positions = _positions(X.astype(np.float64), 4)
    np.testing.assert_array_equal(np.asarray(N(X)), positions)
    values = V(X)
    assert values.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(values), np.take_along_axis(X, positions, -1))


@pytest.mark.parametrize(
    "source",
    ["(topk 2) A[i,r] := X[i,j]", "(argtopk 2) A[i,r] := X[i,j]", "(argmax) A[i] := X[i,j]"],
)
def test_init_is_refused_for_positions_and_selections(source):
    with pytest.raises(td.ReductionError, match="init= starts a reduction from a value"):
        td.kernel(source, init=1.0)


@pytest.mark.parametrize(
    "source",
    [
        "D[i,j] := (X[i,d] - Y[j,d])^2; (argtopk 3) N[i,r] := -D[i,j]",
        "D[i,j] := (X[i,d] - Y[j,d])^2; (argmin) N[i] := D[i,j]",
    ],
)
def test_positions_of_a_fused_program_under_grad_jvp_and_vmap(source):
    # the neighbours gathered and differentiated: the positions' tangent is float0 (a
    # TypeError from custom_jvp before), the gradient flows through the gathered rows only
    X, Y = _x((40, 3), seed=6), jnp.asarray(_x((30, 3), seed=7))
    knn = td.kernel(source, backend="c")
    D = ((X[:, None, :] - np.asarray(Y)[None]) ** 2).sum(-1)
    positions = _positions(-D, 3) if "argtopk" in source else D.argmin(1)
    np.testing.assert_array_equal(np.asarray(knn(X, Y)), positions)

    def loss(X, N=None):
        N = knn(X, Y) if N is None else N
        return jnp.sum((X[:, None, :] - Y[N]) ** 2) if N.ndim == 2 else jnp.sum((X - Y[N]) ** 2)

    want = jax.grad(loss)(X, jnp.asarray(positions))
    np.testing.assert_allclose(np.asarray(jax.grad(loss)(X)), np.asarray(want), rtol=1e-12)
    batched = jax.vmap(jax.grad(loss))(np.stack([X, X]))
    np.testing.assert_allclose(np.asarray(batched[1]), np.asarray(want), rtol=1e-12)
    _, tangent = jax.jvp(knn, (X, Y), (X, Y))
    assert tangent.dtype == jax.dtypes.float0


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_rows_sharded_across_devices(backend):
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices (tests/conftest.py asks XLA for 4 CPU devices)")
    mesh = Mesh(np.array(jax.devices()[:4]), ("x",))
    X = _x((8, 50), seed=8)
    sharded = jax.device_put(X, NamedSharding(mesh, P("x", None)))
    V = td.kernel("(topk 3) V[i,r] := X[i,j]", backend=backend)
    out = jax.jit(V)(sharded)
    np.testing.assert_array_equal(np.asarray(out), np.take_along_axis(X, _positions(X, 3), -1))
    assert out.sharding.spec == P("x", None)
    grad = jax.jit(jax.grad(lambda X: jnp.sum(V(X) * jnp.arange(1.0, 4.0))))(sharded)
    want = np.zeros_like(X)
    np.put_along_axis(want, _positions(X, 3), np.arange(1.0, 4.0)[None], -1)
    np.testing.assert_array_equal(np.asarray(grad), want)
