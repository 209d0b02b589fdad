"""Every corpus expression on the reference back end equals its hand-written numpy value."""

import jax
import numpy as np
import pytest

import tensordsl as td
from tests.corpus import CORPUS, make_inputs


def build(case, backend="reference"):
    return td.kernel(case.source, reduce=case.reduce, ranges=case.ranges, backend=backend)


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_reference_matches_numpy(case):
    k = build(case)
    inputs = make_inputs(case)
    expected = case.expected(**inputs)
    got = np.asarray(k(**inputs))
    assert got.shape == expected.shape
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("case", CORPUS, ids=lambda c: c.name)
def test_reference_inside_jit(case):
    k = build(case)
    inputs = make_inputs(case)
    args = [inputs[name] for name in k.inputs]
    got = jax.jit(lambda *a: k(*a))(*args)
    np.testing.assert_allclose(np.asarray(got), case.expected(**inputs), rtol=1e-11, atol=1e-12)


def test_inputs_are_not_modified():
    case = next(c for c in CORPUS if c.name == "pairwise_sq_dist")
    inputs = make_inputs(case)
    before = {n: np.array(v, copy=True) for n, v in inputs.items()}
    build(case)(**inputs)
    for name, value in inputs.items():
        np.testing.assert_array_equal(value, before[name])
