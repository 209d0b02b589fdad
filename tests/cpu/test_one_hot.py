"""A one-hot pick written as an equality (`Z[b,t,v] * (Y[b,t] == v)` summed over v) runs as a
gather (issue 26, tensordsl/frontend/one_hot.py): values and gradients against the same
statement run as a loop over v by the reference back end (`ranges=` for v keeps the loop)
and against float64 numpy, on every back end; an index outside v's range picks nothing
(0, no RangeError), eagerly and under jit; the nest no longer loops over v."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.backends import BACKENDS, generated_kernels  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("generated_kernels")

B, T, V = 3, 4, 7


def _inputs(seed=0):
    rng = np.random.default_rng(seed)
    Z = rng.normal(size=(B, T, V))
    Y = rng.integers(-2, V + 2, size=(B, T))  # some outside [0, V): they pick nothing
    Y[0, :2] = (-1, V)
    s = rng.normal(size=B)
    return Z, Y, s


def _pick(Z, Y):
    """numpy: Z[b, t, Y[b, t]] where Y is inside [0, V), else 0."""
    return (Z * (Y[..., None] == np.arange(Z.shape[-1]))).sum(-1)


#: (statement, numpy of (Z, Y, s))
FORMS = [
    ("P[b,t] := Z[b,t,v] * (Y[b,t] == v)", lambda Z, Y, s: _pick(Z, Y)),
    ("P[b,t] := (v == Y[b,t]) * Z[b,t,v]", lambda Z, Y, s: _pick(Z, Y)),
    ("P[b,t] := where(Y[b,t] == v, Z[b,t,v], 0)", lambda Z, Y, s: _pick(Z, Y)),
    ("P[b] := -s[b] * Z[b,t,v] * (Y[b,t] == v)", lambda Z, Y, s: -s * _pick(Z, Y).sum(1)),
    (
        "P[b,t] := 2 * where(v == Y[b,t], s[b] * Z[b,t,v], 0.0)",
        lambda Z, Y, s: 2 * s[:, None] * _pick(Z, Y),
    ),
]


def _call(kernel, Z, Y, s):
    given = {"Z": Z, "Y": Y, "s": s}
    return kernel(*(given[name] for name in kernel.inputs))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source,expected", FORMS, ids=[f[0] for f in FORMS])
def test_one_hot_pick_as_a_gather_matches_the_loop(backend, source, expected):
    Z, Y, s = _inputs()
    picked = td.kernel(source, backend=backend)
    loop = td.kernel(source, backend="reference", ranges={"v": V})  # the equality, looped
    assert "v" not in [r.index.name for t in picked.nest.terms for r in t.reduced]
    assert "v" in [r.index.name for t in loop.nest.terms for r in t.reduced]
    assert [g.masked for g in picked._lowered.gathers] == [True]
    assert picked.inputs == loop.inputs  # in the order written
    got = _call(picked, Z, Y, s)
    np.testing.assert_allclose(np.asarray(got), expected(Z, Y, s), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(got), np.asarray(_call(loop, Z, Y, s)), atol=1e-12)
    np.testing.assert_allclose(
        np.asarray(jax.jit(lambda *a: _call(picked, *a))(Z, Y, s)), np.asarray(got), atol=1e-12
    )
    cotangent = np.random.default_rng(5).normal(size=np.shape(got))

    def loss(kernel, Z, s):
        return jnp.sum(_call(kernel, Z, Y, s) * cotangent)

    for argnums in [(0, 1)]:
        got_grads = jax.grad(lambda Z, s: loss(picked, Z, s), argnums)(Z, s)
        want = jax.grad(lambda Z, s: loss(loop, Z, s), argnums)(Z, s)
        for g, w in zip(got_grads, want, strict=True):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-12, atol=1e-12)
    # the gradient of Z is the cotangent on the picked entries, 0 elsewhere
    dZ = np.asarray(jax.grad(lambda Z: loss(picked, Z, s))(Z))
    assert (dZ[Y[..., None] != np.arange(V)] == 0).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_outside_picks_nothing_and_a_float_index_picks_whole_numbers(backend):
    Z, _, _ = _inputs(1)
    k = td.kernel("P[b,t] := Z[b,t,v] * (Y[b,t] == v)", backend=backend)
    outside = np.full((B, T), V)
    outside[1, 1] = -1
    np.testing.assert_array_equal(np.asarray(k(Z, outside)), np.zeros((B, T)))
    grad = jax.jit(jax.grad(lambda Z: jnp.sum(k(Z, outside))))(Z)
    np.testing.assert_array_equal(np.asarray(grad), np.zeros_like(Z))
    Yf = np.array([[0.0, 2.5, np.nan, 3.0], [6.0, 7.0, -1.0, np.inf], [1.0, 1.0, 0.5, -0.0]])
    np.testing.assert_allclose(np.asarray(k(Z, Yf)), _pick(Z, Yf), rtol=1e-12, atol=1e-12)
    dY = jax.grad(lambda Y: jnp.sum(k(Z, Y)))(np.nan_to_num(Yf, posinf=9.0))
    np.testing.assert_array_equal(np.asarray(dY), np.zeros_like(Yf))  # as d(Y == v)/dY
    Yb = np.arange(B * T).reshape(B, T) % 2 == 0
    np.testing.assert_allclose(np.asarray(k(Z, Yb)), _pick(Z, Yb), rtol=1e-12, atol=1e-12)


def test_what_stays_a_loop_and_what_explain_says():
    # v inside a function, in an index expression or on the left: not a pick of one entry
    for source in [
        "P[b] := exp(Z[b,v]) * (Y[b] == v)",
        "P[b] := Z[b,v+1] * (Y[b] == v)",
        "P[b,v] := Z[b,v] * (Y[b] == v)",
        "P[b] := Z[b,v] * (Y[b] == v) + 1",
        "P[b] := Z[b,v] * (Y[b] <= v)",
    ]:
        assert not td.kernel(source)._lowered.gathers, source
    assert not td.kernel("P[b] := Z[b,v] * (Y[b] == v)", reduce="max")._lowered.gathers
    Z = np.random.default_rng(2).normal(size=(3, 5))
    Y = np.array([4, -1, 1])
    loop = td.kernel("P[b] := exp(Z[b,v]) * (Y[b] == v)", backend="reference")
    want = np.where((Y >= 0) & (Y < 5), np.exp(Z[np.arange(3), Y % 5]), 0)
    np.testing.assert_allclose(np.asarray(loop(Z, Y)), want, rtol=1e-12)
    text = td.kernel("P[b] := Z[b,v] * (Y[b] == v)").explain()
    assert "Z[b,v] at v = Y[b] (a one-hot pick: 0 where Y[b] is outside the range of v)" in text
    assert "sum_v" not in text


@pytest.mark.parametrize("backend", BACKENDS)
def test_cross_entropy_program_picks_the_target_by_a_gather(backend):
    source = "(logsumexp) L[n] := X[n,c]\nP[n] := X[n,c] * (c == y[n])\nloss[n] := L[n] - P[n]"
    rng = np.random.default_rng(3)
    X, y = rng.normal(size=(6, 9)), np.array([0, 8, 3, 9, -1, 4])
    program = td.program(source, backend=backend)
    assert program._lowered.statements[1].gathers[0].masked
    logsumexp = np.log(np.exp(X).sum(1))
    np.testing.assert_allclose(
        np.asarray(program(X, y)), logsumexp - _pick(X, y), rtol=1e-12, atol=1e-12
    )
    looped = td.program(source, backend="reference", ranges={"c": 9})
    g = jax.grad(lambda X: jnp.sum(jnp.sin(program(X, y))))(X)
    w = jax.grad(lambda X: jnp.sum(jnp.sin(looped(X, y))))(X)
    np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-12, atol=1e-12)


def test_profile_and_source_of_a_program_with_a_pick():
    source = "(logsumexp) L[n] := X[n,c]\nP[n] := X[n,c] * (c == y[n])\nloss[n] := L[n] - P[n]"
    program = td.program(source, backend="c")
    shapes = {"X": (8, 16), "y": (8,)}
    names = [row.name for row in program.profile(shapes, reps=1).timings]
    assert "loss" in names and "dX" in names
    assert set(program.source("c", shapes=shapes)) == set(names)
    text = program.explain(shapes)  # the gathered operand's shape is known (was a KeyError)
    assert "P[n] = X[n, y[n]]" in text and "fused for these shapes" in text
    assert "__at" not in text


def _equations(jaxpr) -> list:
    found = []
    for eqn in jaxpr.eqns:
        found.append(eqn)
        for param in eqn.params.values():
            for value in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(value, "jaxpr", value)  # a cond's branches too
                if hasattr(inner, "eqns"):
                    found += _equations(inner)
    return found


def _primitives(jaxpr) -> set[str]:
    return {eqn.primitive.name for eqn in _equations(jaxpr)}


def test_the_gradient_of_a_pick_writes_each_element_once_without_a_sort():
    """Each row picks its own element (`Z[b,t,Y[b,t]]`): the table's gradient has nothing to
    sum, so each element is added once to a zero table of the table's own shape (a scatter
    with distinct indices, which XLA adds in place to the table's other cotangents), where
    an embedding's (rows read several times) sums them (`rows_total_p`: a scatter-add in
    index order on the CPU, a sort elsewhere)."""
    Z, Y, _ = _inputs(4)
    pick = td.kernel("P[b,t] := Z[b,t,v] * (Y[b,t] == v)", backend="c")
    embed = td.kernel("E[b,d] := W[tok[b], d]", backend="c")
    grad_pick = jax.make_jaxpr(jax.grad(lambda Z: jnp.sum(pick(Z, Y))))(Z)
    grad_embed = jax.make_jaxpr(jax.grad(lambda W: jnp.sum(embed(W, np.array([1, 1, 0])))))(Z[0])
    assert not {"sort", "tensordsl_rows_total"} & _primitives(grad_pick.jaxpr)
    scatters = [e for e in _equations(grad_pick.jaxpr) if e.primitive.name.startswith("scatter")]
    assert scatters and all(e.params["unique_indices"] for e in scatters)
    assert all(e.outvars[0].aval.shape == Z.shape for e in scatters)
    assert "tensordsl_rows_total" in _primitives(grad_embed.jaxpr)


def test_a_pick_beside_a_dense_read_adds_its_gradient_in_place():
    """Cross-entropy's logits are read whole (the logsumexp) and picked (the label's score):
    the pick's gradient is one scatter-add of distinct elements into the softmax's gradient,
    with no table of zeros and no second pass to add it (XLA's compiled program)."""
    rng = np.random.default_rng(11)
    X = rng.normal(size=(6, 9)).astype(np.float32)
    y = rng.integers(0, 9, size=6)
    ct = rng.normal(size=6).astype(np.float32)
    program = td.program(
        "(logsumexp) L[n] := X[n,c]\nP[n] := X[n,c] * (c == y[n])\nloss[n] := L[n] - P[n]",
        backend="c",
    )
    fn = jax.jit(jax.grad(lambda X: jnp.sum(program(X=X, y=y) * ct)))
    found = np.asarray(fn(X), np.float64)
    x64 = X.astype(np.float64)
    softmax = np.exp(x64 - x64.max(1, keepdims=True))
    softmax /= softmax.sum(1, keepdims=True)
    want = softmax * ct[:, None]
    want[np.arange(6), y] -= ct
    np.testing.assert_allclose(found, want, rtol=1e-5, atol=1e-6)
    compiled = fn.lower(X).compile().as_text()
    entry = [  # each instruction without its metadata (op names such as "scatter-add")
        line.strip().split("metadata=")[0]
        for line in compiled[compiled.index("ENTRY") :].splitlines()
    ]
    # no zero table (as 6x9, or as the gather's 54 rows of 1) and no table-sized add
    table_sized = [line for line in entry if " = f32[54," in line or " = f32[6,9]" in line]
    assert not [line for line in table_sized if "broadcast" in line or "add" in line]
    assert not [line for line in entry if " = f32[54," in line]


def test_vmap_of_a_pick_over_its_labels_sums_the_shared_table_gradient():
    """Under vmap over Y alone, the examples' picks read one table: their positions may
    coincide, and the table's gradient sums them (numpy's `add.at`)."""
    Z, _, _ = _inputs(5)
    rng = np.random.default_rng(6)
    Ys = rng.integers(0, V, size=(4, B, T))
    Ys[1] = Ys[0]  # two examples pick the same elements
    cotangent = rng.normal(size=(4, B, T))
    pick = td.kernel("P[b,t] := Z[b,t,v] * (Y[b,t] == v)", backend="c")
    batched = jax.vmap(pick, in_axes=(None, 0))
    grad = jax.jit(jax.grad(lambda Z: jnp.sum(batched(Z, Ys) * cotangent)))(Z)
    want = np.zeros_like(Z)
    b, t = np.meshgrid(np.arange(B), np.arange(T), indexing="ij")
    for e in range(4):
        np.add.at(want, (b, t, Ys[e]), cotangent[e])
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-12, atol=1e-12)
