"""Notebook-sized examples: per-example gradients with vmap, and a data-parallel training
step on four (fake CPU) devices, against float64 jnp references."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

import tensordsl as td

LAYER = td.kernel("y[i] := W[i,k] * x[k]", backend="c")
DENSE = td.kernel("Y[b,i] := W[i,k] * X[b,k]", backend="c")


def close(got, want, tol=1e-11):
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=tol, atol=tol)


def test_per_example_gradients_with_vmap():
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(6, 5)))
    x, t = jnp.asarray(rng.normal(size=(7, 5))), jnp.asarray(rng.normal(size=(7, 6)))

    def loss(layer):
        return lambda w, x, t: jnp.sum((jnp.tanh(layer(w, x)) - t) ** 2)

    per_example = jax.jit(jax.vmap(jax.grad(loss(LAYER)), in_axes=(None, 0, 0)))
    got = per_example(w, x, t)
    assert got.shape == (7, 6, 5)
    want = jax.vmap(jax.grad(loss(lambda w, x: w @ x)), in_axes=(None, 0, 0))(w, x, t)
    close(got, want)
    # the batch of per-example gradients sums to the gradient of the summed loss
    total = jax.grad(lambda w: jnp.sum(jax.vmap(loss(LAYER), in_axes=(None, 0, 0))(w, x, t)))
    close(got.sum(0), total(w))


def mlp_loss(dense):
    def loss(params, x, t):
        w1, w2 = params
        hidden = jnp.tanh(dense(w1, x))
        return jnp.mean((dense(w2, hidden) - t) ** 2)

    return loss


def sgd(loss, rate=0.2):
    def step(params, x, t):
        value, grads = jax.value_and_grad(loss)(params, x, t)
        return value, jax.tree.map(lambda p, g: p - rate * g, params, grads)

    return step


def train(step, params, x, t, steps=5):
    losses = []
    for _ in range(steps):
        value, params = step(params, x, t)
        losses.append(float(value))
    return losses, params


@pytest.mark.skipif(
    jax.device_count() < 4,
    reason="needs 4 devices: XLA_FLAGS=--xla_force_host_platform_device_count=4 (conftest.py)",
)
def test_data_parallel_training_step_on_four_devices(monkeypatch):
    # The dense layers are pure contractions; generate kernels for them, whose partitioning
    # this test is about (XLA partitions its own dots).
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    rng = np.random.default_rng(1)
    params = (
        jnp.asarray(rng.normal(size=(16, 8)) / 3),
        jnp.asarray(rng.normal(size=(4, 16)) / 4),
    )
    x, t = jnp.asarray(rng.normal(size=(32, 8))), jnp.asarray(rng.normal(size=(32, 4)))
    mesh = jax.make_mesh((4,), ("data",), axis_types=(AxisType.Auto,))
    batch, replicated = NamedSharding(mesh, P("data")), NamedSharding(mesh, P())

    step = jax.jit(sgd(mlp_loss(DENSE)))
    sharded_params = jax.device_put(params, replicated)
    xs, ts = jax.device_put(x, batch), jax.device_put(t, batch)
    sharded_losses, sharded_final = train(step, sharded_params, xs, ts)
    single_losses, single_final = train(step, params, x, t)
    reference_losses, reference_final = train(
        jax.jit(sgd(mlp_loss(lambda w, x: x @ w.T))), params, x, t
    )

    assert all(b < a for a, b in zip(sharded_losses, sharded_losses[1:])), sharded_losses
    close(sharded_losses, single_losses)
    close(sharded_losses, reference_losses)
    for got, single, want in zip(sharded_final, single_final, reference_final):
        close(got, single)
        close(got, want)
        assert got.sharding.is_fully_replicated

    # Each device runs the kernels on its 8 examples; only the weight gradients (and the
    # loss) are summed across devices, and no batch-sharded input is gathered.
    hlo = step.lower(sharded_params, xs, ts).compile().as_text()
    kernels = re.findall(r"= (f64\[[\d,]*\])\{[\d,]*\} custom-call\(", hlo)
    assert "f64[8,16]" in kernels and "f64[8,4]" in kernels, kernels
    assert "all-gather" not in hlo
    assert "all-reduce" in hlo
