"""The dot strategy with lane arrays: a function call that reads a row and the lanes of the
reduced index but not the column is computed once per lane for all the columns (the Gaussian
kernel's gradient), on interior and edge tiles, with and without tests at the lane level."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from codegen import config
from codegen.c.emit import emit_c
from codegen.c.run.build import build_c
from codegen.c.schedule import Schedule, choose_cpu_schedule
from codegen.passes.grad import gradient
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.skipif(shutil.which(config.c_compiler()) is None, reason="no C compiler")

GAUSSIAN = "Y[i] := exp(-((X[i,0]-Z[j,0])^2 + (X[i,1]-Z[j,1])^2 + (X[i,2]-Z[j,2])^2)) * B[j]"
TOLERANCE = {"float32": 2e-5, "float64": 1e-12}


def _run(nest, arrays, dtype, schedule, out_shape):
    dtypes = {name: dtype for name in [*nest.operand_names, nest.output]}
    operands = [np.ascontiguousarray(arrays[n], dtype=dtype) for n in nest.operand_names]
    out = np.full(out_shape, np.nan, dtype=dtype)
    shapes = {n: a.shape for n, a in arrays.items()} | {nest.output: out_shape}
    build_c(nest, dtypes=dtypes, schedule=schedule)(out, operands, shapes)
    return out


def _check(out, expected, dtype):
    scale = float(np.max(np.abs(expected)))
    np.testing.assert_allclose(out, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * scale)


def _gaussian_gradient_of_x(X, Z, B, dY):
    diff = X[:, None, :] - Z[None, :, :]
    weight = np.exp(-(diff**2).sum(-1)) * B[None, :] * dY[:, None]
    return (-2 * diff * weight[:, :, None]).sum(1)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(
    "schedule",
    [
        None,  # the heuristic: a tile, with dot products where p is shorter than the tile
        Schedule(("i", "p"), (("j",),), strategy="dot", row="i", vector="p", rows=4, width=3),
        Schedule(("i", "p"), (("j",),), strategy="dot", row="i", vector="p", rows=3, width=2),
        Schedule(("i", "p"), (("j",),), strategy="dot", vector="p", width=4, lanes=4),
    ],
    ids=["heuristic", "4x3", "3x2", "no-row"],
)
def test_the_gaussian_gradient_computes_each_exponential_once(dtype, schedule):
    nest = gradient(lower(parse(GAUSSIAN)).nest, "X").nest
    dtypes = {name: dtype for name in [*nest.operand_names, nest.output]}
    text = emit_c(nest, dtypes=dtypes, schedule=schedule).text
    assert "lane[l_] = " in text  # the lane arrays
    rng = np.random.default_rng(3)
    # 37 rows and 29 lanes: edge tiles in both, and a remainder of the lanes.
    arrays = {
        "X": rng.normal(size=(37, 3)) * 0.6,
        "Z": rng.normal(size=(29, 3)) * 0.6,
        "B": rng.uniform(0.5, 1.5, size=29),
        "dY": rng.uniform(-1.5, 1.5, size=37),
    }
    rounded = {n: a.astype(dtype).astype(np.float64) for n, a in arrays.items()}
    out = _run(nest, arrays, dtype, schedule, (37, 3))
    _check(out, _gaussian_gradient_of_x(**rounded), dtype)


def test_the_heuristic_runs_a_short_selected_axis_as_dot_products():
    nest = gradient(lower(parse(GAUSSIAN)).nest, "X").nest
    schedule = choose_cpu_schedule(nest, {}, kernel=True)
    assert schedule.strategy == "tile" and schedule.small is not None
    assert schedule.small.strategy == "dot" and schedule.small.vector == "p"


WEIGHTED_SUM = "O[i,e] := where(j <= i, exp(S[i,j] - L[i]), 0) * V[j,e]"


def test_an_axis_that_accesses_read_takes_a_half_wide_tile_when_short():
    # Attention's weighted sum reads e in V[j, e]: no dot products for a short e, but a
    # head narrower than the wide tile (32 under 64 float lanes) fills a tile half as wide
    # instead of running every tile on the edge path; so does its gradient of V.
    forward = lower(parse(WEIGHTED_SUM)).nest
    for nest in (forward, gradient(forward, "V").nest):
        for dtype, width in (("float32", 64), ("float64", 32)):
            schedule = choose_cpu_schedule(nest, {nest.output: dtype}, kernel=True)
            assert (schedule.strategy, schedule.width) == ("tile", width)
            assert schedule.small == dataclasses.replace(schedule, width=width // 2, small=None)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("heads", [64, 32, 20, 7])
def test_the_weighted_sum_and_its_gradient_on_wide_half_and_edge_tiles(dtype, heads):
    # Head widths that fill the wide tile, the half tile, and neither (its edge path); 37
    # rows and keys: partial tiles of rows, and tiles across the causal diagonal.
    rng = np.random.default_rng(5)
    arrays = {
        "S": rng.normal(size=(37, 37)),
        "L": rng.uniform(1.0, 2.0, size=37),
        "V": rng.normal(size=(37, heads)),
        "dO": rng.normal(size=(37, heads)),
    }
    r = {n: a.astype(dtype).astype(np.float64) for n, a in arrays.items()}
    weights = np.tril(np.exp(r["S"] - r["L"][:, None]))
    nest = lower(parse(WEIGHTED_SUM)).nest
    out = _run(nest, arrays, dtype, None, (37, heads))
    _check(out, weights @ r["V"], dtype)
    out = _run(gradient(nest, "V").nest, arrays, dtype, None, (37, heads))  # reads dO, S, L
    _check(out, weights.T @ r["dO"], dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_lane_tests_mask_both_the_shared_values_and_the_columns(dtype):
    # j <= i bounds the lanes per row; the exponential and the tanh depend on (i, j) only.
    source = "Y[i,p] := where(j <= i, exp(X[i] - Z[j]) * (p == 0) + tanh(X[i] * Z[j]) * W[p], 0)"
    nest = lower(parse(source)).nest
    schedule = Schedule(("i", "p"), (("j",),), strategy="dot", row="i", vector="p", rows=2, width=4)
    dtypes = {name: dtype for name in [*nest.operand_names, nest.output]}
    assert "lane[l_] = " in emit_c(nest, dtypes=dtypes, schedule=schedule).text
    rng = np.random.default_rng(4)
    arrays = {
        "X": rng.normal(size=23),
        "Z": rng.normal(size=21),
        "W": rng.normal(size=6),
    }
    r = {n: a.astype(dtype).astype(np.float64) for n, a in arrays.items()}
    i, j = np.arange(23)[:, None], np.arange(21)[None, :]
    shared = np.where(j <= i, 1.0, 0.0)
    first = (shared * np.exp(r["X"][:, None] - r["Z"][None, :])).sum(1)
    second = (shared * np.tanh(r["X"][:, None] * r["Z"][None, :])).sum(1)
    expected = second[:, None] * r["W"][None, :]
    expected[:, 0] += first
    _check(_run(nest, arrays, dtype, schedule, (23, 6)), expected, dtype)
