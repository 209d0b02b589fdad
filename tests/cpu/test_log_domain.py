"""Log-domain iterations (Sinkhorn): logsumexp statements over rows and columns alternating,
each reading the potential the one before computed, with exp arguments far below -87. The
gradient of the cost matrix is one elementwise nest of several terms (one per statement),
each an `exp` under the logsumexp gradient's test for an empty row: values and gradients
against float64 jax.numpy at odd sizes, outputs poisoned, and the C nest's row-only reads
computed outside that test (so that GCC vectorises the lane loop)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.backends import NEEDS_C_COMPILER

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

BACKENDS = ["reference", pytest.param("c", marks=NEEDS_C_COMPILER)]


def sinkhorn_source(iterations: int) -> str:
    """The potentials scaled by 1/epsilon, `u = la - A`, `v = lb - B` inlined."""
    lines = ["(logsumexp) A1[i] := -cost[i,j] / epsilon"]
    for k in range(1, iterations + 1):
        if k > 1:
            lines.append(f"(logsumexp) A{k}[i] := lb[j] - B{k - 1}[j] - cost[i,j] / epsilon")
        lines.append(f"(logsumexp) B{k}[j] := la[i] - A{k}[i] - cost[i,j] / epsilon")
    return "\n".join([*lines, f"V[j] := lb[j] - B{iterations}[j]"])


def sinkhorn_reference(cost, epsilon, la, lb, iterations):
    """jax.numpy, as a user writes it (float64 under the tests' x64)."""
    v = jnp.zeros_like(lb)
    for _ in range(iterations):
        u = la - jax.nn.logsumexp(v[None, :] - cost / epsilon, axis=1)
        v = lb - jax.nn.logsumexp(u[:, None] - cost / epsilon, axis=0)
    return v


def _inputs(m, n, seed):
    rng = np.random.default_rng(seed)
    cost = 4 * np.square(0.5 * rng.standard_normal((m, n)))  # squared distances
    la, lb = 0.5 * rng.standard_normal(m), 0.5 * rng.standard_normal(n)
    values = {"cost": cost, "epsilon": 0.01, "la": la, "lb": lb}
    return {k: np.asarray(v, np.float32) for k, v in values.items()}, rng.standard_normal(n)


def _close(found, expected, tolerance):
    found, expected = np.asarray(found, np.float64), np.asarray(expected, np.float64)
    assert found.shape == expected.shape
    assert np.all(np.isfinite(found))
    scale = max(np.abs(expected).max(), 1e-30)
    np.testing.assert_allclose(found, expected, rtol=0, atol=tolerance * scale)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("m", "n", "iterations"), [(37, 45, 3), (9, 70, 2)])
def test_sinkhorn_values_and_gradients(backend, m, n, iterations):
    values, ct = _inputs(m, n, seed=m + n)
    k = td.program(sinkhorn_source(iterations), backend=backend)
    names = ("cost", "la", "lb")
    args = [values[name] for name in k.inputs]
    wide = {name: np.float64(values[name]) for name in values}

    def loss(fn, *differentiated, rest):
        full = dict(zip(names, differentiated, strict=True), **rest)
        return jnp.sum(fn(**full) * ct)

    found = jax.jit(k)(*args)
    want = sinkhorn_reference(**wide, iterations=iterations)
    _close(found, want, 1e-5)
    rest = {"epsilon": values["epsilon"]}
    grads = jax.jit(jax.grad(lambda *d: loss(k, *d, rest=rest), argnums=(0, 1, 2)))(
        *(values[name] for name in names)
    )
    reference = jax.grad(
        lambda *d: loss(
            lambda **kw: sinkhorn_reference(**kw, iterations=iterations),
            *d,
            rest={"epsilon": np.float64(values["epsilon"])},
        ),
        argnums=(0, 1, 2),
    )(*(wide[name] for name in names))
    for g, r in zip(grads, reference, strict=True):
        _close(g, r, 2e-4)


@NEEDS_C_COMPILER
def test_row_reads_are_computed_outside_the_tests():
    """The cost gradient's terms test each row's (or column's) logsumexp for -inf around the
    exp; a read of the row's index under that test would be a masked load of one address,
    which GCC does not vectorise (the loop ran scalar `expf`): it is a named temporary. (The
    exp's argument is parenthesised: the score summed before the logsumexp is subtracted,
    `codegen.passes.softmax_weights`.)"""
    values, _ = _inputs(40, 40, seed=1)
    k = td.program(sinkhorn_source(2), backend="c")
    text = k.source("c", {name: values[name].shape for name in k.inputs})["dcost"]
    arm = r"\? 0 : tdsl_exp\(\(?([^()]*)\)"
    arms = [a for loop in _simd_loops(text) for a in re.findall(arm, loop)]
    assert arms
    row_reads = [arm for arm in arms if re.search(r"\bin_\w+\[v_i_\]", arm)]
    assert not row_reads, row_reads[0]


def _simd_loops(text: str) -> list[str]:
    """The text of each `#pragma omp simd` loop of a C source (up to its closing brace)."""
    lines, loops = text.splitlines(), []
    for n, line in enumerate(lines):
        if line.strip() == "#pragma omp simd":
            indent = len(lines[n + 1]) - len(lines[n + 1].lstrip())
            end = next(m for m in range(n + 2, len(lines)) if lines[m] == " " * indent + "}")
            loops.append("\n".join(lines[n + 1 : end]))
    return loops
