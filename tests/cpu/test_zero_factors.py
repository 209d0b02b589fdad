"""Gradients at a zero (or subnormal) factor, against float64 numpy, on the reference, C and
CUDA back ends (the CUDA emulator where there is no GPU): a gradient never divides the
saved output by a factor (issue 27: `dW = dY * Y / W` was NaN at `W = 0`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.backends import BACKENDS, generated_kernels  # noqa: F401 (a fixture)

TINY = 3e-310  # a float64 subnormal: `Y / W` loses most of its digits


pytestmark = pytest.mark.usefixtures("generated_kernels")  # every test: generated kernels


def _x(shape, seed=0):
    return np.random.default_rng(seed).uniform(-1.5, 2.0, shape)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_zero_row_factor_gets_the_sum_of_the_others(backend):
    W, X = np.array([0.0, 1.25, TINY, -0.5]), _x((4, 3))
    dY = np.array([0.7, -1.1, 1.3, 0.4])
    k = td.kernel("Y[i] := W[i] * X[i,j]", backend=backend)
    got = jax.grad(lambda W: jnp.vdot(k(W=W, X=X), dY))(W)
    np.testing.assert_allclose(np.asarray(got), dY * X.sum(1), rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("a", [0.0, TINY, -0.75])
def test_a_scalar_factor_at_zero(backend, a):
    X = _x(5, seed=1)
    once = td.kernel("s := a * exp(X[i])", backend=backend)
    twice = td.kernel("s := a * a * exp(X[i])", backend=backend)
    got_once = jax.grad(lambda a: once(a=a, X=X))(a)
    got_twice = jax.grad(lambda a: twice(a=a, X=X))(a)
    np.testing.assert_allclose(float(got_once), np.exp(X).sum(), rtol=1e-12)
    # XLA on the CPU flushes subnormal results to zero, C does not: 2*a*sum(exp(X)) either way
    np.testing.assert_allclose(float(got_twice), 2 * a * np.exp(X).sum(), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_zero_factor_in_a_program_and_under_vmap(backend):
    W, X = np.array([0.0, 2.0, TINY]), _x((3, 4), seed=2)
    program = td.kernel("T[i] := W[i] * X[i,j]\nZ[i] := T[i] * T[i]", backend=backend)
    got = jax.grad(lambda W: program(W=W, X=X).sum())(W)
    T = W * X.sum(1)
    np.testing.assert_allclose(np.asarray(got), 2 * T * X.sum(1), rtol=1e-12, atol=1e-300)
    k = td.kernel("Y[i] := W[i] * X[i,j]", backend=backend)
    batch = np.stack([W, W[::-1]])
    got = jax.vmap(jax.grad(lambda W: k(W=W, X=X).sum()))(batch)
    np.testing.assert_allclose(np.asarray(got), np.stack([X.sum(1)] * 2), rtol=1e-12)


def test_the_gradient_recomputes_the_sum_rather_than_divide():
    from codegen.passes.grad import gradient
    from tensordsl.frontend.lower import lower
    from tensordsl.frontend.parse import parse

    nest = lower(parse("Y[i] := W[i] * X[i,j]")).nest
    assert "/" not in str(gradient(nest, "W").nest)
    # attention's `dL = -sum_e dO*O` still reads the saved output: no division there
    nest = lower(parse("O[i] := exp(S[i,j] - L[i]) * V[j]")).nest
    (term,) = gradient(nest, "L").nest.terms
    assert "O[i]" in str(term.body) and term.reduced == ()
