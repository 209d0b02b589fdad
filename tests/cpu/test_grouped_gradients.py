"""Gradients that share their loops run as one multi-output nest (`codegen.passes.group`,
the C back end's ``members`` strategy): the Gaussian kernel's dX (its coordinates), dZ and dB,
LayerNorm's dgamma and dbeta, a pairwise-kernel's gradients. Values against float64 numpy at
odd sizes with outputs poisoned, under jit, vmap, and for one input alone; which groups form."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy

import tensordsl as td
from codegen.c.emit import emit_c
from codegen.c.schedule import choose_cpu_schedule
from codegen.ir.members import member_bodies
from codegen.ir.nest import default_dtypes
from codegen.passes.grad import gradient
from codegen.passes.group import group_gradients, split_members
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.optimised
GAUSSIAN = "Y[i] := exp(-((X[i,0]-Z[j,0])^2 + (X[i,1]-Z[j,1])^2 + (X[i,2]-Z[j,2])^2)) * B[j]"
LAYERNORM = "Y[b,c] := (X[b,c] - M[b]) * R[b] * g[c] + beta[c]"
CAUCHY = "E[i] := W[j] / (1 + (X[i,0]-Y[j,0])^2 + (X[i,1]-Y[j,1])^2)"


def _gaussian_vjp(X, Z, B, ct):
    """dX, dZ, dB of `sum(ct * (exp(-|X_i - Z_j|^2) @ B))`, float64."""
    D = X[:, None, :] - Z[None, :, :]
    K = np.exp(-(D**2).sum(-1))
    W = ct[:, None] * K * B[None, :]
    return -2 * (W[..., None] * D).sum(1), 2 * (W[..., None] * D).sum(0), (ct[:, None] * K).sum(0)


def _layernorm_vjp(X, M, R, g, beta, ct):
    N = (X - M[:, None]) * R[:, None]
    dX = ct * R[:, None] * g
    dM = -(ct * R[:, None] * g).sum(1)
    dR = (ct * (X - M[:, None]) * g).sum(1)
    return dX, dM, dR, (ct * N).sum(0), ct.sum(0)


def _cauchy_vjp(X, Y, W, ct):
    D = X[:, None, :] - Y[None, :, :]
    Q = 1 / (1 + (D**2).sum(-1))
    G = ct[:, None] * W[None, :] * Q**2
    return -2 * (G[..., None] * D).sum(1), 2 * (G[..., None] * D).sum(0), (ct[:, None] * Q).sum(0)


def _grad(source, values, ct, argnums, backend="c", dtype=jnp.float32):
    kernel = td.kernel(source, backend=backend)
    names = list(values)

    def loss(*args):
        return jnp.sum(kernel(**dict(zip(names, args))) * ct)

    args = [jnp.asarray(v, dtype) for v in values.values()]
    return jax.jit(jax.grad(loss, argnums=argnums))(*args)


def _close(found, expected):
    found, expected = np.asarray(found, np.float64), np.asarray(expected)
    assert found.shape == expected.shape
    assert np.all(np.isfinite(found))
    scale = max(np.abs(expected).max(), 1e-30)
    np.testing.assert_allclose(found, expected, rtol=0, atol=2e-5 * scale)


def _gaussian_inputs(n, m, seed=0):
    rng = np.random.default_rng(seed)
    X = 0.5 * rng.standard_normal((n, 3))
    Z = 0.5 * rng.standard_normal((m, 3))
    return {"X": X, "Z": Z, "B": rng.standard_normal(m)}, rng.standard_normal(n)


def _rounded(values):
    return {k: np.asarray(v, np.float32).astype(np.float64) for k, v in values.items()}


@pytest.mark.parametrize("n, m", [(1, 1), (5, 3), (37, 23), (70, 129)])
def test_gaussian_gradients_together(monkeypatch, n, m):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    values, ct = _gaussian_inputs(n, m)
    found = _grad(GAUSSIAN, values, ct, (0, 1, 2))
    expected = _gaussian_vjp(*_rounded(values).values(), ct.astype(np.float32))
    for f, e in zip(found, expected, strict=True):
        _close(f, e)


def test_gaussian_gradients_in_float64(monkeypatch):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    values, ct = _gaussian_inputs(13, 41, seed=8)
    found = _grad(GAUSSIAN, values, ct, (0, 1, 2), dtype=jnp.float64)
    for f, e in zip(found, _gaussian_vjp(*values.values(), ct), strict=True):
        assert f.dtype == jnp.float64
        np.testing.assert_allclose(f, e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("argnums", [0, 1, 2, (1, 2), (2, 0)])
def test_gaussian_some_gradients(monkeypatch, argnums):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    values, ct = _gaussian_inputs(19, 33, seed=1)
    found = _grad(GAUSSIAN, values, ct, argnums)
    expected = _gaussian_vjp(*_rounded(values).values(), ct.astype(np.float32))
    if isinstance(argnums, int):
        _close(found, expected[argnums])
        return
    for f, a in zip(found, argnums, strict=True):
        _close(f, expected[a])


def test_gaussian_gradients_under_vmap(monkeypatch):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    kernel = td.kernel(GAUSSIAN, backend="c")
    rng = np.random.default_rng(2)
    Xs = (0.5 * rng.standard_normal((3, 11, 3))).astype(np.float32)
    Z = (0.5 * rng.standard_normal((13, 3))).astype(np.float32)
    B = rng.standard_normal(13).astype(np.float32)
    ct = rng.standard_normal(11).astype(np.float32)

    def loss(X, Z, B):
        return jnp.sum(kernel(X=X, Z=Z, B=B) * ct)

    found = jax.jit(jax.vmap(jax.grad(loss, argnums=(0, 1, 2)), in_axes=(0, None, None)))(Xs, Z, B)
    for k in range(3):
        expected = _gaussian_vjp(Xs[k].astype(np.float64), Z.astype(np.float64), B, ct)
        for f, e in zip(found, expected, strict=True):
            _close(f[k], e)


def test_layernorm_gradients(monkeypatch):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(3)
    b, c = 9, 13
    values = {
        "X": rng.standard_normal((b, c)),
        "M": rng.standard_normal(b),
        "R": 1 + rng.random(b),
        "g": rng.standard_normal(c),
        "beta": rng.standard_normal(c),
    }
    ct = rng.standard_normal((b, c))
    expected = _layernorm_vjp(*_rounded(values).values(), ct.astype(np.float32))
    for f, e in zip(_grad(LAYERNORM, values, ct, (0, 1, 2, 3, 4)), expected, strict=True):
        _close(f, e)
    for f, e in zip(_grad(LAYERNORM, values, ct, (3, 4)), expected[3:], strict=True):
        _close(f, e)


LAYERNORM_PROGRAM = """
mu[b] := X[b,f] / F
var[b] := (X[b,f] - mu[b])^2 / F
N[b,f] := (X[b,f] - mu[b]) * rsqrt(var[b] + eps)
Y[b,f] := N[b,f] * g[f] + beta[f]
"""


def test_a_programs_gradients_together(monkeypatch):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(9)
    X, g, beta = rng.standard_normal((11, 37)), rng.standard_normal(37), rng.standard_normal(37)
    ct = rng.standard_normal((11, 37))
    layer = td.kernel(LAYERNORM_PROGRAM, backend="c")

    def loss(X, g, beta):
        return jnp.sum(layer(X=X, F=37.0, eps=1e-3, g=g, beta=beta) * ct)

    args = [jnp.asarray(v, jnp.float32) for v in (X, g, beta)]
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(1, 2)))(*args)
    text = str(jaxpr)
    assert "dg_dbeta" in text  # one nest for both
    dg, dbeta = jax.jit(jax.grad(loss, argnums=(1, 2)))(*args)
    Xr = np.asarray(args[0], np.float64)
    mean = Xr.mean(1, keepdims=True)
    N = (Xr - mean) / np.sqrt(((Xr - mean) ** 2).mean(1, keepdims=True) + 1e-3)
    _close(dg, (ct * N).sum(0))
    _close(dbeta, ct.sum(0))


def test_pairwise_kernel_gradients(monkeypatch):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(4)
    values = {"W": rng.standard_normal(17), "X": rng.standard_normal((29, 2))}
    values["Y"] = rng.standard_normal((17, 2))
    ct = rng.standard_normal(29)
    found = _grad(CAUCHY, values, ct, (0, 1, 2))
    r = _rounded(values)
    dX, dY, dW = _cauchy_vjp(r["X"], r["Y"], r["W"], ct.astype(np.float32))
    for f, e in zip(found, (dW, dX, dY), strict=True):
        _close(f, e)


MASKED = "Y[i] := where(j <= i, exp(A[i,j]) * B[j] + tanh(A[i,j]) * C[j], 0)"


@pytest.mark.parametrize("n", [1, 6, 37])
def test_masked_gradients_together(monkeypatch, n):
    # dB[j] and dC[j] sum over i >= j: the reduced loop's bound reads the row (one row per
    # tile); dA is elementwise under the mask.
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(10)
    values = {"A": 0.5 * rng.standard_normal((n, n)), "B": rng.standard_normal(n)}
    values["C"] = rng.standard_normal(n)
    ct = rng.standard_normal(n)
    assert "dB_dC" in _nest_outputs(MASKED, values, (1, 2))
    found = _grad(MASKED, values, ct, (0, 1, 2))
    r = _rounded(values)
    A, B, C, ct = r["A"], r["B"], r["C"], ct.astype(np.float32).astype(np.float64)
    mask = np.tril(np.ones((n, n)))
    dA = mask * ct[:, None] * (np.exp(A) * B + (1 - np.tanh(A) ** 2) * C)
    dB = (mask * ct[:, None] * np.exp(A)).sum(0)
    dC = (mask * ct[:, None] * np.tanh(A)).sum(0)
    for f, e in zip(found, (dA, dB, dC), strict=True):
        _close(f, e)


def test_other_back_ends_give_the_same_gradients():
    values, ct = _gaussian_inputs(7, 6, seed=5)
    on_c = _grad(GAUSSIAN, values, ct, (0, 1, 2))
    on_reference = _grad(GAUSSIAN, values, ct, (0, 1, 2), backend="reference")
    for a, b in zip(on_c, on_reference, strict=True):
        _close(a, np.asarray(b, np.float64))


def _nests(source, names):
    nest = lower(parse(source)).nest
    return {f"d{x}": gradient(nest, x).nest for x in names}


def test_the_groups_formed():
    shapes = {"X": (8, 3), "Z": (5, 3), "B": (5,), "dX": (8, 3), "dZ": (5, 3), "dB": (5,)}
    groups = group_gradients(_nests(GAUSSIAN, "XZB"), shapes)
    assert [[str(m) for m in g.members] for g in groups] == [
        ["dX[:, 0]", "dX[:, 1]", "dX[:, 2]"],
        ["dZ[:, 0]", "dZ[:, 1]", "dZ[:, 2]", "dB"],
    ]
    shapes = {"X": (4, 6), "M": (4,), "R": (4,), "g": (6,), "beta": (6,)}
    shapes |= {f"d{k}": v for k, v in list(shapes.items())}
    groups = group_gradients(_nests(LAYERNORM, ["X", "M", "R", "g", "beta"]), shapes)
    assert sorted(sorted(str(m) for m in g.members) for g in groups) == [
        ["dM", "dR"],
        ["dbeta", "dg"],
    ]


def _nest_outputs(source, values, argnums, backend="c"):
    kernel = td.kernel(source, backend=backend)
    names = list(values)

    def loss(*args):
        return jnp.sum(kernel(**dict(zip(names, args))))

    args = [jnp.asarray(v, jnp.float32) for v in values.values()]
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=argnums))(*args)
    return [e.params["nest"].output for e in jaxpr.eqns if e.primitive.name == "tensordsl_nest"]


def test_the_backward_runs_the_groups():
    values, _ = _gaussian_inputs(8, 5)
    assert _nest_outputs(GAUSSIAN, values, (0, 1, 2)) == ["Y", "dX_", "dZ_dB"]
    assert _nest_outputs(GAUSSIAN, values, 2) == ["Y", "dB"]  # one input: its nest alone
    assert _nest_outputs(GAUSSIAN, values, 0) == ["Y", "dX_"]  # its three positions, one nest
    assert _nest_outputs(GAUSSIAN, values, (0, 1, 2), "reference") == ["Y", "dX", "dZ", "dB"]
    rng = np.random.default_rng(7)
    values = {"X": rng.random((5, 8)), "M": rng.random(5), "R": rng.random(5)}
    values |= {"g": rng.random(8), "beta": rng.random(8)}
    # dM is XLA's dot, which no group beats; dgamma and dbeta: one nest, c in the lanes.
    found = _nest_outputs(LAYERNORM, values, (0, 1, 2, 3, 4))
    assert sorted(found) == ["Y", "dM", "dR", "dX", "dg_dbeta"]


def test_gradients_that_share_no_loops_stay_apart():
    # dX sums over j, dZ over i: square shapes make their ranges equal, their loops are not.
    shapes = {"X": (5, 3), "Z": (5, 3), "B": (5,), "dX": (5, 3), "dZ": (5, 3)}
    groups = group_gradients(_nests(GAUSSIAN, "XZ"), shapes)
    assert all({m.output for m in g.members} in ({"dX"}, {"dZ"}) for g in groups)
    # dZ alone with a dB whose rows differ in number: nothing pairs dB.
    nests = _nests(GAUSSIAN, "ZB")
    assert [len(split_members("dZ", nests["dZ"])), len(split_members("dB", nests["dB"]))] == [3, 1]


def test_only_tests_against_constants_split_a_gradient():
    # the gradient of a max tests the saved winning position: `k == argmax[i]`, not a constant
    nest = gradient(lower(parse("M[i] := A[i,k] * B[k]"), reduce="max").nest, "A").nest
    assert any(e.has(sympy.Indexed) for e in nest.terms[0].body.atoms(sympy.Eq))
    (member,) = split_members("dA", nest)
    assert member.axis is None


def test_the_multi_output_kernel():
    shapes = {"X": (8, 3), "Z": (5, 3), "B": (5,), "dX": (8, 3), "dZ": (5, 3), "dB": (5,)}
    (_, group) = group_gradients(_nests(GAUSSIAN, "XZB"), shapes)
    assert len(member_bodies(group.nest)[0]) == 4
    schedule = choose_cpu_schedule(group.nest, default_dtypes(group.nest))
    assert (schedule.strategy, schedule.rows, schedule.lanes) == ("members", 4, 8)
    text = emit_c(group.nest, dtypes=default_dtypes(group.nest)).text
    assert text.count(" = tdsl_exp(") == 2  # once per value: in full chunks, in the last chunk
    entry = text[text.rindex("\nvoid tdsl_") :]  # the team helpers count threads atomically
    assert "reduction: sum" in text and "atomic" not in entry  # each output written once
    assert schedule.in_words().startswith("every member at once (8 lanes, 4 rows), reducing i")


def test_grouping_can_be_switched_off(monkeypatch):
    values, ct = _gaussian_inputs(6, 4, seed=6)
    grouped = _grad(GAUSSIAN, values, ct, (0, 1, 2))
    monkeypatch.setenv("TENSORDSL_GROUP_GRADIENTS", "0")
    alone = _grad(GAUSSIAN, values, ct, (0, 1, 2))
    for a, b in zip(grouped, alone, strict=True):
        _close(a, np.asarray(b, np.float64))


@pytest.mark.slow  # about 110 s on 2 cores
def test_second_order_through_a_group():
    # reverse over reverse: the grouped nest is differentiated like any nest
    source = "Y[i] := exp(-((X[i,0]-Z[j,0])^2 + (X[i,1]-Z[j,1])^2)) * B[j]"
    rng = np.random.default_rng(11)
    X, Z, B = rng.standard_normal((5, 2)), rng.standard_normal((4, 2)), rng.standard_normal(4)
    ct = rng.standard_normal(5)
    found = {}
    for backend in ("c", "reference"):
        kernel = td.kernel(source, backend=backend)

        def loss(X, Z, B, kernel=kernel):
            return jnp.sum(kernel(X=X, Z=Z, B=B) * ct)

        def dZ_norm(X, Z, B, loss=loss):
            return jnp.sum(jax.grad(loss, argnums=(0, 1, 2))(X, Z, B)[1] ** 2)

        second = jax.jit(jax.jacrev(dZ_norm, argnums=(0, 1, 2)))(X, Z, B)
        found[backend] = (*second, *jax.tree_util.tree_leaves(jax.hessian(loss, (0, 2))(X, Z, B)))
    for a, b in zip(found["c"], found["reference"], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
