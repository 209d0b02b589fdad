"""Kernels across four (fake CPU) devices: shard_map, and plain jit partitioned by the index
notation (tensordsl/binding/partitioning.py), against float64 jnp references on one device."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import tensordsl as td
from codegen.passes.grad import gradient
from tensordsl.binding.partitioning import plan_sharding
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.skipif(
    jax.device_count() < 4,
    reason="needs 4 devices: XLA_FLAGS=--xla_force_host_platform_device_count=4 (conftest.py)",
)

COLLECTIVES = ("all-gather", "all-reduce", "all-to-all", "collective-permute", "reduce-scatter")


@pytest.fixture(autouse=True)
def _generated_kernels(monkeypatch):
    """These tests are about how the generated kernels are partitioned: the dense layers here
    are pure contractions, which would otherwise run as XLA's own (partitioned) dots."""
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")


def mesh() -> jax.sharding.Mesh:
    return jax.make_mesh((4,), ("d",), axis_types=(AxisType.Auto,))


def shard(x: jax.Array, *spec: str | None) -> jax.Array:
    return jax.device_put(x, NamedSharding(mesh(), P(*spec)))


def collectives(f, *args) -> set[str]:
    """The collective ops in the compiled, partitioned HLO of `jax.jit(f)(*args)`."""
    text = jax.jit(f).lower(*args).compile().as_text()
    found = re.findall(r"= \S+ (" + "|".join(COLLECTIVES) + r")(?:-start)?\(", text)
    return set(found)


def close(got, want, tol=1e-12):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


@pytest.fixture(scope="module")
def rng():
    return np.random.default_rng(5)


# --- the rule read off the nest (no devices needed) ---

PLANS = [
    # source, reduce, rule, kind of each factor named by an index
    (
        "Y[b,i] := W[i,k]*X[b,k]",
        None,
        "i k, b k -> b i",
        {"b": "free", "i": "free", "k": "reduced"},
    ),
    ("Y[i] := X[i,k]", "max", "i k -> i", {"i": "free", "k": "reduced"}),
    ("Y[i] := X[i,k]", "logsumexp", "i k -> i", {"i": "free", "k": "reduced"}),
    ("Y[i] := X[i,k]", "prod", "i r0 -> i", {"i": "free", "r0": "whole"}),
    ("Y[i] := X[i+k]*K[k]", None, "r0, r1 -> r2", {"r0": "whole", "r1": "whole", "r2": "whole"}),
    ("Y[i] := A[i,i]", None, "r0 r1 -> r2", {"r0": "whole", "r1": "whole", "r2": "whole"}),
    ("Y[i] := X[i,k]*s", None, "i k,  -> i", {"i": "free", "k": "reduced"}),
    ("C[] := X[k]*X[k]", None, "k -> ", {"k": "reduced"}),
]


@pytest.mark.parametrize(("source", "reduce", "rule", "kinds"), PLANS)
def test_plan(source, reduce, rule, kinds):
    plan = plan_sharding(lower(parse(source), reduce=reduce).nest)
    assert plan.rule == rule
    assert {f.name: f.kind for f in plan.factors} == kinds


def test_plan_of_gradient_nests_divides_declared_output_shape():
    nest = lower(parse("Y[b,i] := W[i,k]*X[b,k]")).nest
    dw = plan_sharding(gradient(nest, "W").nest)  # dW[i,k] := dY[b,i]*X[b,k]
    assert {f.name: (f.kind, f.divide) for f in dw.factors} == {
        "i": ("free", ("dW", 0)),
        "k": ("free", ("dW", 1)),
        "b": ("reduced", None),
    }
    # dX[b,k] := dY[b,i]*W[i,k] with k < W.shape[1]: k is in a constraint, so it stays whole
    dx = plan_sharding(gradient(nest, "X").nest)
    assert {f.name: f.kind for f in dx.factors if f.kind != "whole"} == {
        "b": "free",
        "i": "reduced",
    }


# --- shard_map: the kernel runs on each device's block ---


def test_shard_map_forward_and_grad(rng):
    k = td.kernel("Y[b,i] := W[i,k]*X[b,k]", backend="c")
    w, x = jnp.asarray(rng.normal(size=(5, 3))), jnp.asarray(rng.normal(size=(8, 3)))
    mapped = jax.shard_map(k, mesh=mesh(), in_specs=(P(), P("d")), out_specs=P("d"))
    close(jax.jit(mapped)(w, x), x @ w.T)

    def loss(f):
        return lambda w, x: jnp.sum(jnp.sin(f(w, x)))

    got = jax.jit(jax.grad(loss(mapped), argnums=(0, 1)))(w, x)
    want = jax.grad(loss(lambda w, x: x @ w.T), argnums=(0, 1))(w, x)
    close(got[0], want[0])
    close(got[1], want[1])


def test_shard_map_wrong_out_spec_is_caught(rng):
    k = td.kernel("Y[b,i] := W[i,k]*X[b,k]", backend="c")
    w, x = jnp.asarray(rng.normal(size=(5, 3))), jnp.asarray(rng.normal(size=(8, 3)))
    wrong = jax.shard_map(k, mesh=mesh(), in_specs=(P(), P("d")), out_specs=P())
    with pytest.raises(ValueError, match="out_specs"):
        jax.jit(wrong)(w, x)


# --- plain jit: partitioned instead of gathered ---


def test_batch_sharded_matmul_runs_on_local_slices(rng):
    k = td.kernel("Y[b,i] := W[i,k]*X[b,k]", backend="c")
    w, x = jnp.asarray(rng.normal(size=(5, 3))), jnp.asarray(rng.normal(size=(8, 3)))
    ws, xs = shard(w), shard(x, "d")
    y = jax.jit(k)(ws, xs)
    close(y, x @ w.T)
    assert y.sharding.spec == P("d")
    hlo = jax.jit(k).lower(ws, xs).compile().as_text()
    assert "f64[2,5]{1,0} custom-call" in hlo  # each device computes its 2 of 8 rows
    assert collectives(k, ws, xs) == set()

    def loss(f):
        return lambda w, x: jnp.sum(jnp.sin(f(w, x)) * jnp.arange(5.0))

    grad = jax.grad(loss(k), argnums=(0, 1))
    got = jax.jit(grad)(ws, xs)
    want = jax.grad(loss(lambda w, x: x @ w.T), argnums=(0, 1))(w, x)
    close(got[0], want[0])
    close(got[1], want[1])
    assert got[1].sharding.spec == P("d")
    # dW sums over the batch: one all-reduce of the per-device partial dW, nothing gathered
    assert collectives(grad, ws, xs) == {"all-reduce"}


REDUCTIONS = [
    ("sum", lambda x: x.sum(1)),
    ("max", lambda x: x.max(1)),
    ("min", lambda x: x.min(1)),
    ("logsumexp", lambda x: jax.nn.logsumexp(x, axis=1)),
]


@pytest.mark.parametrize(("reduce", "reference"), REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_split_reduced_index_is_combined_across_devices(rng, reduce, reference):
    k = td.kernel("Y[i] := X[i,k]", reduce=reduce, backend="c")
    x = jnp.asarray(rng.normal(size=(6, 8)))
    xs = shard(x, None, "d")
    close(jax.jit(k)(xs), reference(x))
    assert collectives(k, xs) == {"all-reduce"}

    def loss(f):
        return lambda x: jnp.sum(f(x) * jnp.arange(6.0))

    close(jax.jit(jax.grad(loss(k)))(xs), jax.grad(loss(reference))(x))


def test_logsumexp_combine_with_empty_blocks(rng):
    k = td.kernel("Y[i] := X[i,k]", reduce="logsumexp", backend="c")
    x = np.asarray(rng.normal(size=(3, 8)))
    x[0, :6] = -np.inf  # three devices see only -inf in row 0
    x[1, :] = -np.inf  # every device does in row 1
    x[2, 2] = 800.0  # exp overflows unless the combine shifts by the maximum
    got = jax.jit(k)(shard(jnp.asarray(x), None, "d"))
    close(got, jax.nn.logsumexp(jnp.asarray(x), axis=1))


@pytest.mark.parametrize(
    ("reduce", "reference"), REDUCTIONS[1:], ids=[r[0] for r in REDUCTIONS[1:]]
)
def test_nan_and_infinities_cross_the_device_combine(reduce, reference):
    # Each device reduces two columns: NaN in one device's block, in two, everywhere; with
    # +inf in another block; infinities alone. NaN propagates, as in jnp.
    x = np.random.default_rng(7).normal(size=(7, 8))
    x[0, 1] = np.nan
    x[1, [2, 5]] = np.nan
    x[2, :] = np.nan
    x[3, [0, 7]] = [np.inf, np.nan]
    x[4, [3, 4]] = [np.nan, -np.inf]
    x[5, 3] = np.inf
    x[6, :] = -np.inf
    k = td.kernel("Y[i] := X[i,k]", reduce=reduce, backend="c")
    got = jax.jit(k)(shard(jnp.asarray(x), None, "d"))
    close(got, reference(jnp.asarray(x)))


def test_split_reduced_index_of_prod_is_gathered(rng):
    k = td.kernel("Y[i] := X[i,k]", reduce="prod", backend="c")
    x = jnp.asarray(rng.normal(size=(6, 8)))
    xs = shard(x, None, "d")
    close(jax.jit(k)(xs), x.prod(1))
    assert "all-gather" in collectives(k, xs)


def test_full_reduction_to_a_scalar_with_a_scalar_operand(rng):
    k = td.kernel("C[] := X[k]*X[k]*s", backend="c")
    x, s = jnp.asarray(rng.normal(size=(12,))), jnp.asarray(1.5)
    xs = shard(x, "d")
    close(jax.jit(k)(xs, s), 1.5 * jnp.sum(x * x))
    assert collectives(k, xs, s) == {"all-reduce"}
    close(jax.jit(jax.grad(k))(xs, s), 3.0 * x)


def test_shifted_access_is_correct_when_its_input_is_sharded(rng):
    k = td.kernel("Y[i] := X[i+k]*K[k]", backend="c")
    x, kern = jnp.asarray(rng.normal(size=(16,))), jnp.asarray(rng.normal(size=(3,)))

    def conv(x, kern):
        return jnp.stack([x[i : i + 3] @ kern for i in range(14)])

    xs = shard(x, "d")
    close(jax.jit(k)(xs, kern), conv(x, kern))

    def loss(f):
        return lambda x, kern: jnp.sum(f(x, kern) ** 2)

    got = jax.jit(jax.grad(loss(k), argnums=(0, 1)))(xs, kern)
    want = jax.grad(loss(conv), argnums=(0, 1))(x, kern)
    close(got[0], want[0])
    close(got[1], want[1])


def test_output_sharding_for_explicitly_sharded_types():
    from tensordsl.binding.partitioning import output_sharding

    nest = td.kernel("Y[b,i] := W[i,k]*X[b,k]").nest
    m = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Explicit,)).abstract_mesh

    def typed(shape, *spec):
        return jax.ShapeDtypeStruct(shape, jnp.float64, sharding=NamedSharding(m, P(*spec)))

    def spec(*avals):
        return output_sharding(*avals, nest=nest, extents=()).spec

    assert spec(typed((5, 3)), typed((8, 3), "d")) == P("d", None)
    assert spec(typed((8, 3), "d"), typed((8, 3))) == P(None, "d")
    # both free indices want "d": the batch (first output axis) keeps it, W is gathered
    assert spec(typed((8, 3), "d"), typed((8, 3), "d")) == P("d", None)
    # a split reduced index is combined: the output is replicated
    assert spec(typed((8, 4), None, "d"), typed((8, 4), None, "d")) == P(None, None)


def test_explicit_mesh_jit_grad_and_vmap(rng):
    """`jax.make_mesh`'s default (Explicit) axes: the output type keeps the batch sharding."""
    k = td.kernel("Y[b,i] := W[i,k]*X[b,k]", backend="c")
    mesh = jax.make_mesh((4,), ("d",), axis_types=(AxisType.Explicit,))
    W, X = rng.uniform(-1, 1, (5, 3)), rng.uniform(-1, 1, (8, 3))
    Xb = rng.uniform(-1, 1, (4, 8, 3))
    with jax.set_mesh(mesh):
        Xs = jax.device_put(X, NamedSharding(mesh, P("d")))
        Y = jax.jit(k)(W, Xs)
        assert jax.typeof(Y).sharding.spec == P("d", None)
        np.testing.assert_allclose(np.asarray(Y), X @ W.T, rtol=1e-12)
        dW, dX = jax.jit(jax.grad(lambda W, X: jnp.sum(jnp.sin(k(W, X))), (0, 1)))(W, Xs)
        Yv = jax.jit(jax.vmap(k, (None, 0)))(W, jax.device_put(Xb, NamedSharding(mesh, P("d"))))
        assert jax.typeof(Yv).sharding.spec == P("d", None, None)
    eW, eX = jax.grad(lambda W, X: jnp.sum(jnp.sin(X @ W.T)), (0, 1))(W, X)
    np.testing.assert_allclose(np.asarray(dW), np.asarray(eW), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(dX), np.asarray(eX), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(Yv), np.einsum("nbk,ik->nbi", Xb, W), rtol=1e-12)


def test_one_pass_attention_splits_its_rows_only(rng):
    # The one-pass nest of a logsumexp and its weighted sum (codegen.passes.online): its rows split
    # (here h: the causal bound keeps i whole), its reduced index and packed axis stay whole
    # (a running max does not combine by psum).
    from codegen.passes.online import pair_stored
    from tensordsl.binding.programs import compiled_statements

    source = """
        S[h,i,j] := Q[h,i,d] * K[h,j,d] + where(j <= i, 0, -inf)
        (logsumexp) L[h,i] := S[h,i,j]
        O[h,i,e] := exp(S[h,i,j] - L[h,i]) * V[h,j,e]
    """
    k = td.kernel(source, outputs=("O", "L"), backend="c")
    q, key, v = (jnp.asarray(rng.normal(size=(4, 8, 4))) for _ in range(3))
    (one,) = pair_stored(compiled_statements(k.program, {"Q": q, "K": key, "V": v}, "c"))
    assert [(f.name, f.kind) for f in plan_sharding(one).splittable] == [("h", "free")]
    s = jnp.einsum("hid,hjd->hij", q, key)
    s = jnp.where(jnp.tril(jnp.ones((8, 8), bool)), s, -jnp.inf)
    want_l = jax.nn.logsumexp(s, axis=-1)
    want_o = jnp.einsum("hij,hje->hie", jnp.exp(s - want_l[..., None]), v)
    for spec in (("d",), (None, "d"), (None, None, "d")):
        got_o, got_l = jax.jit(k)(*(shard(a, *spec) for a in (q, key, v)))
        close(got_o, want_o)
        close(got_l, want_l)
