"""The corpus and all its gradients through td.kernel(backend="c"), against references (by
default the corpus's sample, `tests/sampling.py`: every feature; `-m exhaustive` the rest)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest

import tensordsl as td
from codegen.c.run import compiler
from codegen.c.schedule import candidate_schedules
from tensordsl.backends import reference
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.backends import NEEDS_C_COMPILER
from tests.corpus import CORPUS, make_inputs
from tests.sampling import corpus_sample

pytestmark = [
    NEEDS_C_COMPILER,
    pytest.mark.usefixtures("poisoned_outputs"),
    pytest.mark.optimised,
]
TOLERANCE = {"float64": dict(rtol=1e-10, atol=1e-11), "float32": dict(rtol=2e-4, atol=2e-5)}


def kernel(case, **options):
    return td.kernel(case.source, reduce=case.reduce, ranges=case.ranges, backend="c", **options)


def cast(inputs, dtype):
    return {
        n: np.asarray(v, dtype) if np.issubdtype(np.asarray(v).dtype, np.floating) else v
        for n, v in inputs.items()
    }


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", corpus_sample(CORPUS))
def test_forward(case, dtype):
    inputs = make_inputs(case)
    got = np.asarray(kernel(case)(**cast(inputs, dtype)))
    expected = case.expected(**inputs)
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, **TOLERANCE[dtype])


def float_names(case, inputs):
    names = td.kernel(case.source, reduce=case.reduce, ranges=case.ranges).inputs
    return [n for n in names if np.issubdtype(np.asarray(inputs[n]).dtype, np.floating)]


@pytest.mark.parametrize("case", corpus_sample([c for c in CORPUS if c.differentiable]))
def test_gradients(case):
    """Gradients of every float input, through the generated C gradient nests."""
    inputs = make_inputs(case)
    names = float_names(case, inputs)
    k = kernel(case)

    def through_c(*values):
        return k(**{**inputs, **dict(zip(names, values))})

    def truth(*values):
        if case.ties:  # jnp's max/min split ties; the reference kernel applies our tie rule
            ref = td.kernel(
                case.source, reduce=case.reduce, ranges=case.ranges, backend="reference"
            )
            return ref(**{**inputs, **dict(zip(names, values))})
        nest = lower(parse(case.source), reduce=case.reduce, ranges=case.ranges).nest
        shapes = {n: np.shape(v) for n, v in inputs.items()}
        return reference.evaluate(nest, {**inputs, **dict(zip(names, values))}, shapes)

    @jax.jit  # the truth's jnp operations compiled as one program, not each alone
    def truth_vjp(cotangent, *primals):
        return jax.vjp(truth, *primals)[1](cotangent)

    primals = [jnp.asarray(inputs[n], jnp.float64) for n in names]
    out, vjp_c = jax.vjp(through_c, *primals)
    rng = np.random.default_rng(3)
    cotangent = jnp.asarray(rng.normal(size=np.shape(out)))
    for name, got, want in zip(names, vjp_c(cotangent), truth_vjp(cotangent, *primals)):
        np.testing.assert_allclose(
            np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-10, err_msg=f"gradient of {name}"
        )


@pytest.mark.parametrize("case", CORPUS[::5], ids=lambda c: c.name)
def test_every_candidate_schedule_agrees(case):
    inputs = make_inputs(case)
    nest = lower(parse(case.source), reduce=case.reduce, ranges=case.ranges).nest
    expected = case.expected(**inputs)
    for schedule in candidate_schedules(nest):
        got = np.asarray(kernel(case, schedule=schedule)(**inputs))
        np.testing.assert_allclose(
            got, expected, **TOLERANCE["float64"], err_msg=schedule.describe()
        )


SMOOTH = [c.name for c in CORPUS if c.differentiable and not c.ties]
#: The smooth cases whose second order runs by default: every reduction (sum, max, min,
#: logsumexp, prod with and without a zero), contractions, convolutions and strides, ranges,
#: `where`, powers, scalar functions and a sum of terms. A case's second order costs about as
#: much as its first (docs/testing.md); the other cases are marked `slow` (`-m ""` runs them).
#: Three cases whose features others here have took half the default cases' time (2026-12-07,
#: empty caches): conv2d_channels 20 s (a convolution: conv1d_strided has one), rbf_kernel
#: 13 s (pairwise differences: pairwise_sq_dist; exp: logsumexp_rows) and tanh_matmul 10 s
#: (a function: gelu_erf; a contraction: matmul); they are `slow` since.
SECOND_ORDER = {
    "matmul",
    "batched_matmul",
    "attention_weighted_sum",
    "trace",
    "layernorm_variance",
    "division_by_vector",
    "row_max",
    "row_min",
    "max_of_products",
    "logsumexp_rows",
    "softmax_denominator",
    "prod_rows",
    "prod_with_zero",
    "pairwise_sq_dist",
    "conv1d_strided",
    "ranges_negative_start",
    "where_index_mask",
    "gelu_erf",
    "pow_rows",
    "linear_bias",
    "summed_and_once_terms",
}


def _reduction(name: str) -> str:
    case = next(c for c in CORPUS if c.name == name)
    return lower(parse(case.source), reduce=case.reduce, ranges=case.ranges).nest.reduction


def test_the_default_second_order_cases_cover_every_reduction():
    assert SECOND_ORDER.issubset(SMOOTH), SECOND_ORDER - set(SMOOTH)
    assert {_reduction(n) for n in SECOND_ORDER} == {_reduction(n) for n in SMOOTH}


@pytest.mark.parametrize(
    "name",
    [pytest.param(n, marks=() if n in SECOND_ORDER else pytest.mark.slow) for n in SMOOTH],
)
def test_second_order_gradients(name):
    case = next(c for c in CORPUS if c.name == name)
    inputs = make_inputs(case)
    names = float_names(case, inputs)
    k = kernel(case)

    def f(*values):
        return k(**{**inputs, **dict(zip(names, values))})

    jax.test_util.check_grads(
        f, [jnp.asarray(inputs[n]) for n in names], order=2, modes=["rev"], atol=1e-5, rtol=1e-5
    )


def test_new_batch_size_does_not_recompile():

    k = td.kernel("Y[b,j] := X[b,k] * W[k,j]", backend="c")
    W = np.random.default_rng(0).normal(size=(3, 4))
    k(np.ones((2, 3)), W)
    compiles = compiler.STATS["compiles"] + compiler.STATS["disk_hits"]
    for batch in (1, 5, 17):
        X = np.random.default_rng(batch).normal(size=(batch, 3))
        np.testing.assert_allclose(np.asarray(k(X, W)), X @ W, rtol=1e-12)
    assert compiler.STATS["compiles"] + compiler.STATS["disk_hits"] == compiles
