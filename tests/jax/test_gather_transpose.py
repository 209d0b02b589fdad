"""A gather and its transpose on the CPU: the transpose a scatter-add in index order
(deterministic there): the C back end's own row kernels (codegen/c/gathers.py), XLA's for
the reference back end, where parallel platforms sort and scan
(`tensordsl/binding/scatter.py`).

GraphSAGE's neighbour mean `H[n,d] := X[nbr[n,k], d] / K` with many repeated neighbours:
values and gradients against float64 numpy (`np.add.at`), under jit, vmap and grad of grad,
bitwise equal across calls and compilations and to a serial sum in index order, and what
the CPU runs (a scatter, no sort).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

SAGE = """
    H[n,d] := X[nbr[n,k], d] / K
    Y[n,o] := H[n,d] * W[d,o]
"""


def _graph(seed: int, nodes: int = 30, neighbours: int = 7, width: int = 5):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(nodes, width)).astype(np.float32)
    nbr = rng.integers(0, nodes - 4, size=(nodes, neighbours)).astype(np.int32)  # repeats
    nbr[0, :] = 3  # one row read 7 times by one node
    W = rng.normal(size=(width, 3)).astype(np.float32)
    ct = rng.normal(size=(nodes, 3)).astype(np.float32)
    return X, nbr, W, ct


def _reference_dX(nbr, W, ct, nodes):
    """d/dX of sum(ct * (mean of X[nbr]) @ W), float64, by np.add.at."""
    dH = ct.astype(np.float64) @ W.astype(np.float64).T / nbr.shape[1]
    want = np.zeros((nodes, W.shape[0]))
    np.add.at(want, nbr, np.broadcast_to(dH[:, None, :], (*nbr.shape, dH.shape[1])))
    return want


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_graphsage_gradient_against_float64(backend):
    X, nbr, W, ct = _graph(0)
    k = td.program(SAGE, backend=backend)
    K = np.float32(nbr.shape[1])
    loss = jax.jit(jax.grad(lambda X, W: jnp.sum(k(X, nbr, K, W) * ct), argnums=(0, 1)))
    dX, dW = loss(X, W)
    Y = X.astype(np.float64)[nbr].mean(1) @ W.astype(np.float64)
    np.testing.assert_allclose(jax.jit(k)(X, nbr, K, W), Y, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(dX, _reference_dX(nbr, W, ct, len(X)), rtol=2e-5, atol=2e-5)
    H = X.astype(np.float64)[nbr].mean(1)
    np.testing.assert_allclose(dW, H.T @ ct.astype(np.float64), rtol=2e-5, atol=2e-5)
    unread = np.setdiff1d(np.arange(len(X)), nbr)
    assert unread.size and (np.asarray(dX)[unread] == 0).all()


def test_bitwise_equal_across_calls_and_compilations():
    X, nbr, W, ct = _graph(1, nodes=200, neighbours=16)
    k = td.program(SAGE, backend="c")
    K = np.float32(16)

    def grad():  # a fresh jit each time: compiled again
        return np.asarray(jax.jit(jax.grad(lambda X: jnp.sum(k(X, nbr, K, W) * ct)))(X))

    first = grad()
    for _ in range(3):
        assert grad().tobytes() == first.tobytes()


@pytest.mark.parametrize(
    ("backend", "scatter"), [("reference", "stablehlo.scatter"), ("c", "tdsl_scatter_rows_")]
)
def test_the_cpu_scatters_in_index_order_without_sorting(backend, scatter):
    """XLA's scatter for the reference back end, the C kernel's for the C back end. The
    scatter is looked for in the module lowered, as XLA may compile it as a loop (its older
    CPU emitters, which the suite selects on jaxlib 0.10: tests/conftest.py)."""
    X, nbr, W, ct = _graph(2)
    k = td.kernel("H[n,d] := X[nbr[n,k], d]", backend=backend)
    grad = jax.jit(jax.grad(lambda X: jnp.sum(k(X, nbr) * ct[:, None, :1])))
    lowered = grad.lower(X)
    module, compiled = lowered.as_text(), lowered.compile().as_text()
    assert scatter in module and "stablehlo.sort" not in module and " sort(" not in compiled
    if backend == "c":
        assert "stablehlo.scatter" not in module and " scatter(" not in compiled


@pytest.mark.parametrize(
    ("backend", "gather"), [("reference", " gather("), ("c", "tdsl_gather_rows_")]
)
def test_the_cpu_gathers_rows_with_the_back_ends_kernel(backend, gather):
    """The forward's gather: XLA's for the reference back end, the C kernel's for C; an
    index outside the table reads NaN under jit either way."""
    X, nbr, W, ct = _graph(9)
    nbr[2, 1] = len(X) + 3
    k = td.kernel("H[n,k,d] := X[nbr[n,k], d]", backend=backend)
    assert gather in jax.jit(k).lower(X, nbr).compile().as_text()
    got = np.asarray(jax.jit(k)(X, nbr))
    assert np.isnan(got[2, 1]).all()
    inside = np.ones(nbr.shape, bool)
    inside[2, 1] = False
    assert got[inside].tobytes() == X[nbr[inside]].tobytes()


@pytest.mark.parametrize("x64", [False, True])
def test_the_c_sum_is_a_serial_sum_in_index_order(x64):
    """float32 with int32 positions, float64 with int64: dX has the bits of `np.add.at` in
    the table's dtype (additions in index order), on every call and every compilation."""
    rng = np.random.default_rng(8)
    nodes, width = 40, 6
    with jax.enable_x64(x64):
        dtype = np.float64 if x64 else np.float32
        X = rng.normal(size=(nodes, width)).astype(dtype)
        nbr = rng.integers(0, nodes - 5, size=(120, 9)).astype(np.int32)  # repeats, unread
        scale = 10.0 ** rng.integers(-5, 6, size=(120, 9, 1))  # sums that depend on order
        ct = (rng.normal(size=(120, 9, width)) * scale).astype(dtype)
        k = td.kernel("E[n,k,d] := X[nbr[n,k], d]", backend="c")

        def grad():  # a fresh jit each time: compiled again
            return np.asarray(jax.jit(jax.grad(lambda X: jnp.sum(k(X, nbr) * ct)))(X))

        first = grad()
        assert first.dtype == dtype
        assert all(grad().tobytes() == first.tobytes() for _ in range(2))
    serial = np.zeros((nodes, width), dtype)
    np.add.at(serial, nbr, ct)
    assert first.tobytes() == serial.tobytes()
    exact = np.zeros((nodes, width))
    np.add.at(exact, nbr, ct.astype(np.float64))
    np.testing.assert_allclose(first, exact, rtol=1e-5, atol=1e-5 * np.abs(exact).max())
    unread = np.setdiff1d(np.arange(nodes), nbr)
    assert unread.size and (first[unread] == 0).all()


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_vmap_over_graphs(backend):
    graphs = [_graph(3 + e) for e in range(3)]
    X = np.stack([g[0] for g in graphs])
    nbr = np.stack([g[1] for g in graphs])
    W, ct = graphs[0][2], np.stack([g[3] for g in graphs])
    k = td.program(SAGE, backend=backend)
    K = np.float32(nbr.shape[-1])

    def loss(X, nbr, ct):
        return jnp.sum(k(X, nbr, K, W) * ct)

    for axes in ((0, 0, 0), (None, 0, 0)):
        x = X if axes[0] == 0 else X[0]
        got = jax.jit(jax.vmap(jax.grad(loss), in_axes=axes))(x, nbr, ct)
        for e in range(3):
            want = _reference_dX(nbr[e], W, ct[e], X.shape[1])
            np.testing.assert_allclose(got[e], want, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_grad_of_grad(backend):
    # f(X) = sum(ct * E^2), E = X[nbr] @ W: the Hessian times V is 2 X-scatter of
    # ct * (V[nbr] @ W) @ W^T, one more transpose of the transpose
    X, nbr, W, ct = _graph(6)
    k = td.program("E[n,k,o] := X[nbr[n,k], d] * W[d,o]", backend=backend)
    V = np.random.default_rng(7).normal(size=X.shape).astype(np.float32)
    ct3 = np.broadcast_to(ct[:, None, :], (*nbr.shape, 3))

    def f(X):
        return jnp.sum(ct3 * k(X, nbr, W) ** 2)

    hv = jax.jit(jax.grad(lambda X: jnp.sum(jax.grad(f)(X) * V)))(X)
    v_e = V.astype(np.float64)[nbr] @ W.astype(np.float64)
    want = np.zeros(X.shape)
    np.add.at(want, nbr, 2 * (ct3 * v_e) @ W.astype(np.float64).T)
    np.testing.assert_allclose(hv, want, rtol=1e-4, atol=1e-4)
