"""Checks of the test corpus itself, without tensordsl.

The shifted-index cases are re-derived by brute force: every candidate value of an output index
is tried, and it is kept only when every read, for every value of the reduced indices, stays in
bounds (Tullio's rule taken literally). This checks both the numbers and the inferred ranges of
the hand-written references in tests/corpus.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from tests.corpus import CORPUS, CORPUS_BY_NAME, make_inputs

FUNCTIONS = (
    *("exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "tanh", "sigmoid", "softplus", "relu"),
    *("sin", "cos", "abs", "erf", "min", "max", "where", "pow"),
)
REDUCTIONS = ("sum", "max", "min", "prod", "logsumexp")
CANDIDATES = range(-12, 24)  # wider than any extent in the corpus


def _body(source: str) -> str:
    return source.split(":=", 1)[1]


def _names_in_order(text: str, names) -> list[str]:
    positions = {name: re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", text) for name in names}
    return sorted(names, key=lambda name: positions[name].start())


def test_corpus_is_large_and_names_are_unique_snake_case():
    names = [case.name for case in CORPUS]
    assert len(names) >= 48
    assert len(set(names)) == len(names)
    assert all(re.fullmatch(r"[a-z][a-z0-9_]*", name) for name in names)
    assert set(CORPUS_BY_NAME) == set(names)


@pytest.mark.parametrize("case", CORPUS, ids=lambda case: case.name)
def test_args_appear_in_the_body_in_order(case):
    body = _body(case.source)
    for name in case.args:
        assert re.search(rf"(?<![\w.]){re.escape(name)}(?!\w)", body), name
    assert list(case.args) == _names_in_order(body, list(case.args))
    assert case.reduce in REDUCTIONS
    for name, arg in case.args.items():
        assert all(1 <= extent <= 9 for extent in arg.shape), name
        assert arg.low < arg.high, name


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("case", CORPUS, ids=lambda case: case.name)
def test_expected_is_finite_float64(case, seed):
    inputs = make_inputs(case, seed)
    result = case.expected(**inputs)
    assert isinstance(result, np.ndarray)
    assert result.dtype == np.float64
    assert np.all(np.isfinite(result))
    # The reference must not mutate its inputs.
    again = make_inputs(case, seed)
    for name in inputs:
        np.testing.assert_array_equal(inputs[name], again[name])


@pytest.mark.parametrize("case", CORPUS, ids=lambda case: case.name)
def test_make_inputs_types_domains_and_determinism(case):
    inputs = make_inputs(case)
    assert list(inputs) == list(case.args)
    for name, arg in case.args.items():
        value = inputs[name]
        if arg.shape == ():
            assert type(value) is float
            assert arg.low <= value <= arg.high
            continue
        assert value.shape == arg.shape
        if arg.integer:
            assert np.issubdtype(value.dtype, np.integer)
            assert value.min() >= arg.low and value.max() < arg.high
        else:
            assert value.dtype == np.float64
            if case.name != "prod_with_zero":  # its zeros are placed on purpose
                assert value.min() >= arg.low and value.max() <= arg.high
        if value.size > 1:
            assert not np.all(value == 0) and not np.all(value == 1), name
    other = make_inputs(case, seed=1)
    assert any(not np.array_equal(inputs[name], other[name]) for name in inputs)
    np.testing.assert_equal(make_inputs(case), inputs)


def test_every_function_and_reduction_is_covered():
    used = {name for case in CORPUS for name in re.findall(r"([a-z0-9]+)\(", case.source)}
    assert set(FUNCTIONS) <= used, set(FUNCTIONS) - used
    assert {case.reduce for case in CORPUS} == set(REDUCTIONS)
    assert any(case.ranges for case in CORPUS)
    assert any("**" in case.source for case in CORPUS)
    assert any("^" in case.source for case in CORPUS)


@pytest.mark.parametrize("case", [c for c in CORPUS if c.ties], ids=lambda case: case.name)
def test_tie_cases_contain_ties_at_the_extremum(case):
    for seed in range(3):
        for value in make_inputs(case, seed).values():
            rows = value.reshape(-1, value.shape[-1])
            for row in rows:
                assert np.sum(row == row.max()) >= 2
                assert np.sum(row == row.min()) >= 2


def test_prod_with_zero_has_exact_zeros():
    case = CORPUS_BY_NAME["prod_with_zero"]
    X = make_inputs(case)["X"]
    assert np.sum(X == 0.0) == 3
    result = case.expected(X=X)
    assert result[0] != 0.0 and result[1] == 0.0 and result[2] == 0.0


# ---- brute-force references for shifted, strided and dilated accesses ----------------------


def _valid(values, reads):
    """The values of an output index for which every read is in bounds."""
    return [v for v in values if all(reads(v))]


def _loop_conv1d_channels(X, W):
    (C, N), (O, _, K) = X.shape, W.shape
    ii = _valid(CANDIDATES, lambda i: [0 <= i + k < N for k in range(K)])
    Y = np.zeros((O, len(ii)))
    for o in range(O):
        for p, i in enumerate(ii):
            for c in range(C):
                for k in range(K):
                    Y[o, p] += X[c, i + k] * W[o, c, k]
    return Y


def _loop_conv2d_channels(I, K):
    (C, H, Wd), (O, _, KH, KW) = I.shape, K.shape
    yy = _valid(CANDIDATES, lambda y: [0 <= y + dy < H for dy in range(KH)])
    xx = _valid(CANDIDATES, lambda x: [0 <= x + dx < Wd for dx in range(KW)])
    Y = np.zeros((O, len(yy), len(xx)))
    for o in range(O):
        for py, y in enumerate(yy):
            for px, x in enumerate(xx):
                for c in range(C):
                    for dy in range(KH):
                        for dx in range(KW):
                            Y[o, py, px] += I[c, y + dy, x + dx] * K[o, c, dy, dx]
    return Y


def _loop_conv1d_dilated(X, W):
    N, K = len(X), len(W)
    ii = _valid(CANDIDATES, lambda i: [0 <= i + 2 * k < N for k in range(K)])
    return np.array([sum(X[i + 2 * k] * W[k] for k in range(K)) for i in ii])


def _loop_conv1d_strided(X, W):
    N, K = len(X), len(W)
    ii = _valid(CANDIDATES, lambda i: [0 <= 2 * i + k < N for k in range(K)])
    return np.array([sum(X[2 * i + k] * W[k] for k in range(K)) for i in ii])


def _loop_conv1d_dilated_offset_weighted(X, W):
    N, K = len(X), len(W)
    ii = _valid(CANDIDATES, lambda i: [0 <= i + 2 * k - 3 < N for k in range(K)])
    return np.array([sum(i * X[i + 2 * k - 3] * W[k] for k in range(K)) for i in ii])


def _loop_downsample_stride2(X):
    N = len(X)
    ii = _valid(CANDIDATES, lambda i: [0 <= 2 * i < N, 0 <= 2 * i + 1 < N])
    return np.array([X[2 * i] + X[2 * i + 1] for i in ii])


def _loop_stencil_1d_index_weighted(X):
    N = len(X)
    ii = _valid(CANDIDATES, lambda i: [0 <= i + 1 < N, 0 <= i - 1 < N])
    return np.array([i * (X[i + 1] - X[i - 1]) for i in ii])


def _loop_stencil_2d(X):
    H, Wd = X.shape
    ii = _valid(CANDIDATES, lambda i: [0 <= i - 1 < H, 0 <= i + 1 < H])
    jj = _valid(CANDIDATES, lambda j: [0 <= j - 1 < Wd, 0 <= j + 1 < Wd])
    Y = np.zeros((len(ii), len(jj)))
    for p, i in enumerate(ii):
        for q, j in enumerate(jj):
            Y[p, q] = X[i - 1, j] + X[i + 1, j] + X[i, j - 1] + X[i, j + 1] - 4 * X[i, j]
    return Y


def _loop_max_pool_stride2(X):
    N = len(X)
    ii = _valid(CANDIDATES, lambda i: [0 <= 2 * i + k < N for k in range(2)])
    return np.array([max(X[2 * i + k] for k in range(2)) for i in ii])


def _loop_ranges_negative_start(X):
    rows, _ = X.shape
    return np.array([[X[i, j + 1] * j for j in range(-1, 2)] for i in range(rows)])


LOOP_REFERENCES = {
    "conv1d_channels": _loop_conv1d_channels,
    "conv2d_channels": _loop_conv2d_channels,
    "conv1d_dilated": _loop_conv1d_dilated,
    "conv1d_strided": _loop_conv1d_strided,
    "conv1d_dilated_offset_weighted": _loop_conv1d_dilated_offset_weighted,
    "downsample_stride2": _loop_downsample_stride2,
    "stencil_1d_index_weighted": _loop_stencil_1d_index_weighted,
    "stencil_2d": _loop_stencil_2d,
    "max_pool_stride2": _loop_max_pool_stride2,
    "ranges_negative_start": _loop_ranges_negative_start,
}


@pytest.mark.parametrize("seed", [0, 3])
@pytest.mark.parametrize("name", sorted(LOOP_REFERENCES))
def test_loop_reference_agrees_with_expected(name, seed):
    case = CORPUS_BY_NAME[name]
    inputs = make_inputs(case, seed)
    want = LOOP_REFERENCES[name](**inputs)
    got = case.expected(**inputs)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
