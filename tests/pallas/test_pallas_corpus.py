"""The corpus through td.kernel(backend="pallas") in Pallas' interpret mode, against the
float64 references: every forward, the gradients of a spread of cases (each gradient nest
is a nest, run by the same runner), bf16 and f32 against a float32 computation, and
vmap/jvp through the binding.

Pallas allocates the output and every program instance writes its whole output tile, so
there is nothing to poison. Interpret mode compiles each kernel (about a second): the
gradients of the whole corpus take minutes, so this tier runs every fourth case's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl.backends import reference
from tensordsl.errors import UnsupportedError
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.corpus import CORPUS, CORPUS_BY_NAME, make_inputs

#: Corpus cases whose forward nest tile programs refuse (measured: none).
UNSUPPORTED_FORWARD: set[str] = set()
#: A spread of the corpus for gradients (every fourth differentiable case).
GRADIENT_CASES = [c for c in CORPUS if c.differentiable][::4]
#: Cases for the half-precision check: a contraction, causal scores, a logsumexp, a conv.
HALF_CASES = ["matmul", "attention_scores", "logsumexp_rows", "conv1d_valid", "rbf_kernel"]


def kernel(case, backend="pallas"):
    return td.kernel(case.source, reduce=case.reduce, ranges=case.ranges, backend=backend)


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_forward(case):
    inputs = make_inputs(case)
    if case.name in UNSUPPORTED_FORWARD:
        with pytest.raises(UnsupportedError, match="the pallas back end cannot run"):
            kernel(case)(**inputs)
        return
    got = np.asarray(kernel(case)(**inputs))
    expected = case.expected(**inputs)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-11)


def float_names(case, inputs):
    names = kernel(case).inputs
    return [n for n in names if np.issubdtype(np.asarray(inputs[n]).dtype, np.floating)]


@pytest.mark.parametrize("case", GRADIENT_CASES, ids=lambda c: c.name)
def test_gradients(case):
    """Every float input's gradient against jax.vjp of the reference, random cotangent."""
    inputs = make_inputs(case)
    names = float_names(case, inputs)
    tiles = kernel(case)

    def through_pallas(*values):
        return tiles(**{**inputs, **dict(zip(names, values))})

    def truth(*values):
        if case.ties:  # jnp's max/min split ties; the reference kernel applies our tie rule
            return kernel(case, "reference")(**{**inputs, **dict(zip(names, values))})
        nest = lower(parse(case.source), reduce=case.reduce, ranges=case.ranges).nest
        shapes = {n: np.shape(v) for n, v in inputs.items()}
        return reference.evaluate(nest, {**inputs, **dict(zip(names, values))}, shapes)

    primals = [jnp.asarray(inputs[n], jnp.float64) for n in names]
    out, vjp_pallas = jax.vjp(through_pallas, *primals)
    _, vjp_truth = jax.vjp(truth, *primals)
    cotangent = jnp.asarray(np.random.default_rng(3).normal(size=np.shape(out)))
    for name, got, want in zip(names, vjp_pallas(cotangent), vjp_truth(cotangent)):
        np.testing.assert_allclose(
            np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-10, err_msg=f"gradient of {name}"
        )


def relative_error(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return np.linalg.norm(got - want) / np.linalg.norm(want)


@pytest.mark.parametrize(("dtype", "bound"), [("float32", 1e-6), ("bfloat16", 1e-2)])
@pytest.mark.parametrize("name", HALF_CASES)
def test_narrow_types_against_a_float32_computation(name, dtype, bound):
    """Inputs rounded to `dtype`; the reference computes in float64 on the rounded inputs,
    so what is left is the kernel's own rounding (float32 accumulation, a `dtype` output)."""
    case = CORPUS_BY_NAME[name]
    inputs = make_inputs(case)
    narrow = {n: jnp.asarray(v, dtype) for n, v in inputs.items()}
    rounded = {n: np.asarray(v.astype(jnp.float32), np.float64) for n, v in narrow.items()}
    got = kernel(case)(**narrow)
    assert got.dtype == jnp.dtype(dtype)
    assert relative_error(got, case.expected(**rounded)) < bound


def test_narrow_gradients_against_a_float32_computation():
    case = CORPUS_BY_NAME["attention_scores"]
    inputs = {n: jnp.asarray(v, jnp.bfloat16) for n, v in make_inputs(case).items()}
    wide = {n: v.astype(jnp.float32) for n, v in inputs.items()}

    def loss(k, values):
        return (k(**values).astype(jnp.float32) ** 2).sum()

    got = jax.grad(lambda v: loss(kernel(case), v))(inputs)
    want = jax.grad(lambda v: loss(kernel(case, "reference"), v))(wide)
    for name in inputs:
        assert got[name].dtype == jnp.bfloat16
        assert relative_error(got[name], want[name]) < 2e-2, name


def test_vmap_and_jvp_through_the_binding():
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", backend="pallas")
    rng = np.random.default_rng(5)
    A, B = rng.normal(size=(3, 20, 9)), rng.normal(size=(9, 18))
    batched = jax.jit(jax.vmap(k, in_axes=(0, None)))(A, B)
    np.testing.assert_allclose(np.asarray(batched), A @ B, rtol=1e-12, atol=1e-12)
    dA, dB = rng.normal(size=(20, 9)), rng.normal(size=(9, 18))
    out, tangent = jax.jvp(k, (A[0], B), (dA, dB))
    np.testing.assert_allclose(np.asarray(out), A[0] @ B, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(tangent), dA @ B + A[0] @ dB, rtol=1e-12, atol=1e-12)


def test_a_nest_tile_programs_refuse_names_itself():
    k = td.kernel("(topk 3) V[i,r] := X[i,j]", backend="pallas")
    X = np.random.default_rng(1).normal(size=(4, 9))
    with pytest.raises(UnsupportedError, match="the pallas back end cannot run 'V'"):
        k(X)


def test_interpret_mode_is_said_once(caplog):
    from tensordsl.backends.pallas import api

    api._say_interpreted.cache_clear()
    k = td.kernel("Y[i] := X[i,j] * X[i,j]", backend="pallas")
    with caplog.at_level("WARNING", logger="tensordsl"):
        for n in (3, 5):
            k(np.random.default_rng(n).normal(size=(n, 7)))
    said = [r for r in caplog.records if "interpret mode" in r.getMessage()]
    assert len(said) == 1
