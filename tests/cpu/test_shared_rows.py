"""The register tile's rows share what is read along the reduced loops: in nn.attention's
(B, T, H, E) layout, the gradient of q, `dq[b, i, h, d]`, reads `k[b, j, h, d]` along the
keys j, so its tiles run over the queries i, not over the heads h written before d (issue 38:
the layout cost ~1.8x the heads-first program, each key row serving one row of a tile)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from codegen import config
from codegen.c.run.build import build_c
from codegen.c.schedule import choose_cpu_schedule
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.skipif(shutil.which(config.c_compiler()) is None, reason="no C compiler")

#: The weighted sum of attention in the (B, T, H, E) layout.
SEQUENCE_MAJOR = "O[b,i,h,e] := exp(S[b,h,i,j] - L[b,h,i]) * V[b,j,h,e]"
TOLERANCE = {"float32": 2e-5, "float64": 1e-12}


def test_the_tile_rows_are_the_queries_not_the_heads():
    schedule = choose_cpu_schedule(lower(parse(SEQUENCE_MAJOR)).nest, {}, kernel=True)
    assert schedule.strategy == "tile"
    assert (schedule.row, schedule.vector) == ("i", "e")
    assert schedule.free_order == ("b", "h", "i", "e")


@pytest.mark.parametrize(
    "source",
    [
        "C[i,k] := A[i,j] * B[j,k]",  # the row is read along j and nothing else is free
        "C[b,i,k] := A[b,i,j] * B[b,j,k]",  # b is read along j too: the order stays
        "O[b,h,i,e] := exp(S[b,h,i,j] - L[b,h,i]) * V[b,h,j,e]",  # i is not read along j
    ],
)
def test_an_order_whose_row_serves_the_tile_stays(source):
    nest = lower(parse(source)).nest
    schedule = choose_cpu_schedule(nest, {}, kernel=True)
    assert schedule.free_order == tuple(r.index.name for r in nest.free)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_reordered_tiles_compute_the_weighted_sum(dtype):
    nest = lower(parse(SEQUENCE_MAJOR)).nest
    schedule = choose_cpu_schedule(nest, {}, kernel=True)
    rng = np.random.default_rng(5)
    # 2 batches, 13 queries (an edge tile of 5 rows), 3 heads, 11 keys, 10 columns
    arrays = {
        "S": rng.normal(size=(2, 3, 13, 11)),
        "L": rng.normal(size=(2, 3, 13)) + 2,
        "V": rng.normal(size=(2, 11, 3, 10)),
    }
    rounded = {n: a.astype(dtype).astype(np.float64) for n, a in arrays.items()}
    weights = np.exp(rounded["S"] - rounded["L"][..., None])
    expected = np.einsum("bhij,bjhe->bihe", weights, rounded["V"])
    dtypes = {name: dtype for name in [*nest.operand_names, nest.output]}
    operands = [np.ascontiguousarray(arrays[n], dtype=dtype) for n in nest.operand_names]
    out = np.full(expected.shape, np.nan, dtype=dtype)  # poisoned: every element written
    shapes = {n: a.shape for n, a in arrays.items()} | {nest.output: expected.shape}
    build_c(nest, dtypes=dtypes, schedule=schedule)(out, operands, shapes)
    scale = float(np.max(np.abs(expected)))
    np.testing.assert_allclose(out, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * scale)
