"""The tile strategy computes a function call of the row level for all the tile's rows in one
simd loop (`<t>r[r_]`) where the row level has no tests: attention's weights
`exp(S - L)` once per (row, j) as a vector call, on full and partial tiles; rows with tests
(the causal edge tiles) keep the call inside the row loop."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
import sympy

from codegen import config
from codegen.c.emit import emit_c
from codegen.c.run.build import build_c
from codegen.c.schedule import Schedule
from codegen.ir.nest import (
    LoopNest,
    Operand,
    Range,
    Reduce,
    Term,
    extent_symbol,
    index_symbol,
    tensor_base,
)
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.skipif(shutil.which(config.c_compiler()) is None, reason="no C compiler")

WEIGHTED = "O[i,e] := exp(scale * S[i,j] - L[i]) * V[j,e]"
CAUSAL = "O[i,e] := where(j <= i, exp(scale * S[i,j] - L[i]), 0) * V[j,e]"


def _weighted(S, L, V, scale, causal):
    weights = np.exp(scale * S - L[:, None])
    if causal:
        weights = np.where(
            np.arange(S.shape[1])[None, :] <= np.arange(S.shape[0])[:, None], weights, 0
        )
    return weights @ V


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("source", [WEIGHTED, CAUSAL], ids=["dense", "causal"])
@pytest.mark.parametrize("shape", [(8, 13, 16), (7, 9, 5)], ids=["full-tiles", "partial-tiles"])
def test_row_calls_are_computed_in_one_simd_loop(dtype, source, shape):
    rows, columns, width = shape
    nest = lower(parse(source)).nest
    schedule = Schedule(
        ("i", "e"), (("j",),), strategy="tile", row="i", vector="e", rows=4, width=8
    )
    dtypes = {name: dtype for name in [*nest.operand_names, nest.output]}
    text = emit_c(nest, dtypes=dtypes, schedule=schedule).text
    assert re.search(r"t\d+_r\[r_\] = (tdsl_)?exp", text), text  # float32: tdsl_exp
    rng = np.random.default_rng(11)
    S, V = rng.normal(size=(rows, columns)), rng.normal(size=(columns, width))
    L = rng.normal(size=rows)
    arrays = {"S": S, "L": L, "V": V, "scale": np.array(0.7)}
    operands = [np.ascontiguousarray(arrays[n], dtype=dtype) for n in nest.operand_names]
    out = np.full((rows, width), np.nan, dtype)
    shapes = {n: a.shape for n, a in arrays.items()} | {"O": out.shape}
    build_c(nest, dtypes=dtypes, schedule=schedule)(out, operands, shapes)
    expected = _weighted(S, L, V, 0.7, source == CAUSAL)
    tolerance = 2e-5 if dtype == "float32" else 1e-12
    np.testing.assert_allclose(
        out, expected, rtol=tolerance, atol=tolerance * np.abs(expected).max()
    )


def test_a_shifted_read_under_the_row_tests_stays_in_the_row_loop():
    """`L[i + 1]` is in bounds for the rows the tests let through, not for every row of an
    edge tile: that call is not batched there (it still is on interior tiles)."""
    nest = lower(parse("O[i,e] := where(j <= i, exp(S[i,j] - L[i+1]), 0) * V[j,e]")).nest
    schedule = Schedule(
        ("i", "e"), (("j",),), strategy="tile", row="i", vector="e", rows=4, width=8
    )
    dtypes = {name: "float64" for name in [*nest.operand_names, nest.output]}
    batched = emit_c(nest, dtypes=dtypes, schedule=schedule).text.count("_r[r_] = exp(")
    plain = lower(parse("O[i,e] := where(j <= i, exp(S[i,j] - L[i]), 0) * V[j,e]")).nest
    everywhere = emit_c(plain, dtypes=dtypes, schedule=schedule).text.count("_r[r_] = exp(")
    assert 0 < batched < everywhere  # interior tiles only
    rng = np.random.default_rng(12)
    S, L, V = rng.normal(size=(9, 11)), rng.normal(size=10), rng.normal(size=(11, 5))
    operands = [{"S": S, "L": L, "V": V}[n] for n in nest.operand_names]
    out = np.full((9, 5), np.nan)
    build_c(nest, dtypes=dtypes, schedule=schedule)(
        out, operands, {"S": S.shape, "L": L.shape, "V": V.shape, "O": out.shape}
    )
    causal = np.arange(11)[None, :] <= np.arange(9)[:, None]
    expected = np.where(causal, np.exp(S - L[1:, None]), 0) @ V
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())


def _shifted_sum_nest(shift: int) -> LoopNest:
    """`O[i,e] = sum_{j <= i} exp(sum_d A[i - shift*j, d] * B[j, d]) * V[j, e]`, built by hand:
    with `shift` = 1 the nested sum reads `A[i - j]`, in bounds only where the test holds."""
    i, e, j, d = (index_symbol(n) for n in "iejd")
    A, B, V = (tensor_base(n) for n in "ABV")
    inner = Reduce("sum", A[i - shift * j, d] * B[j, d], d, 0, extent_symbol("A", 1))
    term = Term(sympy.exp(inner) * V[j, e], (Range(j, 0, extent_symbol("B", 0)),), (i - j,))
    free = (Range(i, 0, extent_symbol("A", 0)), Range(e, 0, extent_symbol("V", 1)))
    return LoopNest("O", free, (term,), (Operand("A", 2), Operand("B", 2), Operand("V", 2)))


def test_a_shifted_nested_sum_under_the_row_tests_is_not_batched():
    schedule = Schedule(
        ("i", "e"), (("j",),), strategy="tile", row="i", vector="e", rows=4, width=8
    )
    dtypes = {"A": "float64", "B": "float64", "V": "float64", "O": "float64"}
    shifted = emit_c(_shifted_sum_nest(1), dtypes=dtypes, schedule=schedule).text
    plain = emit_c(_shifted_sum_nest(0), dtypes=dtypes, schedule=schedule).text
    batched = "a[4] = {"  # the rows' sums gathered after their loop
    assert 0 < shifted.count(batched) < plain.count(batched)  # interior tiles only
    rng = np.random.default_rng(13)
    A, B, V = rng.normal(size=(9, 3)), rng.normal(size=(9, 3)), rng.normal(size=(9, 5))
    out = np.full((9, 5), np.nan)
    shapes = {"A": A.shape, "B": B.shape, "V": V.shape, "O": out.shape}
    build_c(_shifted_sum_nest(1), dtypes=dtypes, schedule=schedule)(out, [A, B, V], shapes)
    expected = np.zeros((9, 5))
    for row in range(9):
        for col in range(row + 1):
            expected[row] += np.exp(A[row - col] @ B[col]) * V[col]
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12 * np.abs(expected).max())
