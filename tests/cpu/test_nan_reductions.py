"""NaN and infinities in max, min and logsumexp: jnp's semantics (NaN propagates) on the C back
end under every candidate schedule and on the reference back end, and where the cotangent
goes (max/min: the first NaN, as np.argmax/np.argmin pick it)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.c.run.build import build_c
from codegen.c.schedule import candidate_schedules
from codegen.ir.reductions import REDUCTIONS
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.backends import NEEDS_C_COMPILER

pytestmark = [NEEDS_C_COMPILER, pytest.mark.usefixtures("poisoned_outputs")]
NAN, INF = np.nan, np.inf
ROWS, WIDTH = 13, 35  # a row is X[i] of shape (5, 7): 35 values, several lanes and chunks


def special_rows(seed: int = 0) -> np.ndarray:
    """Random rows with NaN first, in the middle, last, everywhere, with +-inf, and rows of
    infinities without NaN; shape (ROWS, WIDTH)."""
    x = np.random.default_rng(seed).standard_normal((ROWS, WIDTH))
    x[1, 0] = NAN
    x[2, 17] = NAN
    x[3, -1] = NAN
    x[4] = NAN
    x[5, [3, 20]] = [INF, NAN]
    x[6, [4, 30]] = [NAN, -INF]
    x[7, [9, 10]] = [NAN, NAN]
    x[8, 11] = INF
    x[9] = -INF
    x[10] = INF
    x[11, ::2], x[11, 1::2] = INF, -INF
    x[12, [0, 34]] = [-INF, INF]
    return x


def _logsumexp(x: np.ndarray, axis: tuple[int, ...]) -> np.ndarray:
    return np.asarray(jax.nn.logsumexp(jnp.asarray(x, jnp.float64), axis=axis))


EXPECTED = {
    "max": lambda x, axis: np.max(x, axis=axis),
    "min": lambda x, axis: np.min(x, axis=axis),
    "logsumexp": _logsumexp,
}


def test_special_rows_cover_every_case() -> None:
    x = special_rows()
    assert np.isnan(x[1, 0]) and np.isnan(x[3, -1]) and np.isnan(x[4]).all()
    nan_rows = np.isnan(x).any(axis=1)
    assert nan_rows.tolist() == [False] + [True] * 7 + [False] * 5
    assert np.isnan(np.max(x, axis=1)[nan_rows]).all()  # what the kernels must give


def run_every_schedule(source: str, reduction: str, values: np.ndarray) -> list[np.ndarray]:
    """`source` with `reduction` on `values` under every candidate schedule."""
    nest = lower(parse(source), reduce=reduction).nest
    dtypes = {"X": values.dtype.name, nest.output: values.dtype.name}
    schedules = candidate_schedules(nest)
    if REDUCTIONS[reduction].simd:  # the vector lanes of the fast path are exercised
        assert any(s.strategy == "dot" for s in schedules) or not nest.free
    results = []
    for schedule in schedules:
        out = np.full(values.shape[: len(nest.free)], 12345.0, values.dtype)
        build_c(nest, dtypes=dtypes, schedule=schedule)(out, [values], {})
        results.append(out)
    return results


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("reduction", sorted(EXPECTED))
def test_nan_propagates_under_every_schedule(reduction: str, dtype: str) -> None:
    values = special_rows().reshape(ROWS, 5, 7).astype(dtype)
    expected = EXPECTED[reduction](values.astype(np.float64), (1, 2))
    for out in run_every_schedule("Y[i] := X[i,j,k]", reduction, values):
        np.testing.assert_allclose(out, expected, rtol=1e-5)


@pytest.mark.parametrize("reduction", sorted(EXPECTED))
def test_nan_propagates_through_the_chunk_combine(reduction: str) -> None:
    # A full reduction is split into chunks whose states are combined: NaN in one chunk, in
    # several, chunks left empty (a short row), infinities in some chunks only.
    for row in special_rows(6):
        for values in (row, np.tile(row, 9)):
            expected = EXPECTED[reduction](values, (0,))
            for out in run_every_schedule("s := X[j]", reduction, values):
                np.testing.assert_allclose(out, expected, rtol=1e-12)


@pytest.mark.parametrize("backend", ["c", "reference"])
@pytest.mark.parametrize("reduction", sorted(EXPECTED))
def test_kernels_agree_with_jnp(reduction: str, backend: str) -> None:
    x = special_rows(1)
    got = td.kernel("Y[i] := X[i,j]", reduce=reduction, backend=backend)(x)
    np.testing.assert_allclose(np.asarray(got), EXPECTED[reduction](x, (1,)), rtol=1e-12)


def test_the_issue_example() -> None:
    x = np.array([[1.0, NAN, 3.0], [NAN, NAN, NAN]])
    for reduction in ("max", "min", "logsumexp"):
        got = td.kernel("Y[i] := X[i,j]", reduce=reduction, backend="c")(x)
        assert np.isnan(np.asarray(got)).all(), reduction


@pytest.mark.parametrize("backend", ["c", "reference"])
@pytest.mark.parametrize("reduction", ["max", "min"])
def test_cotangent_goes_to_the_first_nan(reduction: str, backend: str) -> None:
    # jnp's own gradient of max with a NaN is NaN everywhere in the row (it splits the
    # cotangent among positions equal to the result, and NaN equals nothing); tensordsl sends
    # the whole cotangent to the position np.argmax/np.argmin picks: the first NaN.
    x = special_rows(2)
    cotangent = np.random.default_rng(3).uniform(1.0, 2.0, ROWS)
    k = td.kernel("Y[i] := X[i,j]", reduce=reduction, backend=backend)
    got = jax.grad(lambda x: jnp.sum(k(x) * cotangent))(x)
    pick = np.argmax if reduction == "max" else np.argmin
    expected = np.zeros_like(x)
    expected[np.arange(ROWS), pick(x, axis=1)] = cotangent
    np.testing.assert_array_equal(np.asarray(got), expected)


@pytest.mark.parametrize("backend", ["c", "reference"])
def test_logsumexp_gradient_agrees_with_jnp(backend: str) -> None:
    x = special_rows(4)
    cotangent = np.random.default_rng(5).uniform(1.0, 2.0, ROWS)
    k = td.kernel("Y[i] := X[i,j]", reduce="logsumexp", backend=backend)
    got = jax.grad(lambda x: jnp.sum(k(x) * cotangent))(x)
    expected = jax.grad(lambda x: jnp.sum(jax.nn.logsumexp(x, axis=1) * cotangent))(x)
    # A row of -inf alone (a softmax row a mask leaves empty) gives no gradient, as in
    # FlexAttention (issue 38), where jnp's is NaN (exp(-inf - -inf)).
    empty = np.all(np.asarray(x) == -np.inf, axis=1)
    assert empty.any()
    expected = np.where(empty[:, None], 0.0, np.asarray(expected))
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12)
