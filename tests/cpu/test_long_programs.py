"""Long programs (issue 27): an elementwise chain of 100 statements fuses into one
expression 100 levels deep, which sympy and the passes walk recursively; its forward and
gradient hit Python's recursion limit before `codegen.recursion.deep_recursion`."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.backends import NEEDS_C_COMPILER

pytestmark = NEEDS_C_COMPILER
LENGTH = 100


def chain(n: int) -> str:
    lines = ["Y0[i] := X[i] * 1.5"]
    lines += [f"Y{k}[i] := sin(Y{k - 1}[i] + 1)" for k in range(1, n)]
    return "\n".join(lines)


def truth(x, n: int = LENGTH):
    y = x * 1.5
    for _ in range(1, n):
        y = jnp.sin(y + 1)
    return y


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_a_100_statement_chain_and_its_gradient(backend: str) -> None:
    limit = sys.getrecursionlimit()
    X = np.random.default_rng(27).uniform(-2, 2, 7)
    k = td.kernel(chain(LENGTH), outputs=(f"Y{LENGTH - 1}",), backend=backend)
    np.testing.assert_allclose(np.asarray(k(X)[0]), np.asarray(truth(X)), rtol=1e-6, atol=1e-6)
    cotangent = np.random.default_rng(28).normal(size=7)
    got = jax.grad(lambda x: jnp.vdot(k(x)[0], cotangent))(X)
    want = jax.grad(lambda x: jnp.vdot(truth(x), cotangent))(X)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-9)
    assert sys.getrecursionlimit() == limit  # raised only while tensordsl works
