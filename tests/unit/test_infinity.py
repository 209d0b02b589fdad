"""`inf`: the IEEE infinity as a literal of the language (masks such as
`where(j <= i, 0, -inf)`), never a scalar input; undefined values stay errors."""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

import tensordsl as td
from codegen import config
from tensordsl.errors import ExpressionError, IndexExpressionError
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

RNG = np.random.default_rng(13)


def reference(source: str, **options):
    return td.kernel(source, backend="reference", **options)


def test_inf_is_the_ieee_infinity_not_an_input():
    k = reference("Y[i] := where(X[i] > 0, min(X[i], inf), -inf)")
    assert k.inputs == ("X",)
    got = np.asarray(k(np.array([1.5, -2.0, 0.5])))
    np.testing.assert_array_equal(got, [1.5, -np.inf, 0.5])
    assert "-inf" in str(k.nest)


def test_masks_with_inf_run_through_max():
    X = RNG.normal(size=(4, 4))
    causal = reference("(max) M[i] := X[i,j] + where(j <= i, 0, -inf)")
    np.testing.assert_array_equal(np.asarray(causal(X)), [X[i, : i + 1].max() for i in range(4)])


def test_a_nest_with_inf_prints_back_as_its_source():
    nest = lower(parse("Y[i] := X[i,j] * 2 + where(j <= i, 0, -inf)")).nest
    assert str(nest) == "Y[i] := 2*X[i, j] + where(i >= j, 0, -inf)"
    assert lower(parse(str(nest))).nest == nest


BACKENDS = [
    "reference",
    pytest.param(
        "c",
        marks=pytest.mark.skipif(
            shutil.which(config.c_compiler()) is None, reason="no C compiler (set TENSORDSL_CC)"
        ),
    ),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_masked_logsumexp_and_its_gradient(backend, monkeypatch):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    k = td.kernel("(logsumexp) L[i] := X[i,j] + where(j <= i, 0, -inf)", backend=backend)
    X = RNG.normal(size=(4, 4))
    masked = np.where(np.tril(np.ones((4, 4))) > 0, X, -np.inf)
    peak = masked.max(1, keepdims=True)
    np.testing.assert_allclose(
        np.asarray(k(X)), np.log(np.exp(masked - peak).sum(1)) + peak[:, 0], rtol=1e-12
    )
    weights = RNG.normal(size=4)
    softmax = np.exp(masked - peak) / np.exp(masked - peak).sum(1, keepdims=True)
    gradient = jax.grad(lambda x: (k(x) * weights).sum())(X)
    np.testing.assert_allclose(np.asarray(gradient), softmax * weights[:, None], rtol=1e-12)


@pytest.mark.parametrize(
    ("source", "error"),
    [
        ("Y[i] := X[i] + inf - inf", ExpressionError),
        ("Y[i] := X[i] * (0 * inf)", ExpressionError),
        ("Y[i] := X[i] / 0", ExpressionError),
        ("Y[i] := X[i] + 1e999", ExpressionError),
        ("Y[i] := X[i+inf]", IndexExpressionError),
    ],
)
def test_undefined_values_and_infinite_indices_are_errors(source, error):
    with pytest.raises(error):
        td.kernel(source)
