"""The static CUDA report (`codegen.cuda.report`, `explain(..., target="cuda")`): launch
shapes, lanes, FMAs and bytes per output element, checked on the shapes the GPU benchmark
runs, so that a schedule that idles SMs, strides lanes or repeats work shows up here."""

from __future__ import annotations

import dataclasses

import pytest

import tensordsl as td
from codegen.cuda.report import SMS, cuda_report
from codegen.cuda.schedule import choose_gpu_schedule
from codegen.ir.extents import output_shape
from tensordsl.errors import OptionError, UnknownNameError
from tensordsl.explain.timing import equation_dtypes, nest_equations
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

LAYER_NORM = """
M[b,t] := X[b,t,f] / F
V[b,t] := (X[b,t,f] - M[b,t])^2 / F
N[b,t,f] := (X[b,t,f] - M[b,t]) * rsqrt(V[b,t] + eps) * g[f] + beta[f]
"""
LN_SHAPES = {"X": (8, 1024, 768), "F": (), "eps": (), "g": (768,), "beta": (768,)}


def f32(nest) -> dict[str, str]:
    return {n: "float32" for n in (nest.output, *nest.operand_names)}


def assert_no_waste(report, what: str) -> None:
    assert report.blocks_per_sm >= 2, (what, report.grids)
    assert all(a.coalesced for a in report.accesses), (what, report.accesses)
    assert report.fmas is not None and report.fmas[0] == report.fmas[1], (what, report.fmas)


def test_row_logsumexp_4096_by_8192_uses_every_sm_coalesced_without_redundant_work() -> None:
    nest = lower(parse("L[i] := X[i,j]"), reduce="logsumexp").nest
    report = cuda_report(nest, f32(nest), {"X": (4096, 8192)}, registers=False)
    assert report.schedule.startswith("strategy=rows")
    assert report.grids == ((4096, 1, 1),) and report.block == (256, 1, 1)  # a block per row
    assert_no_waste(report, "logsumexp")
    assert [(a.text, a.lane, a.stride) for a in report.accesses] == [("X[i, j]", "j", 1)]
    assert report.loads == (8192 * 4, 8192 * 4)  # each value read once


@pytest.mark.parametrize(
    "length, width, grid",
    [(1, 1, 4), (7, 8, 32), (33, 32, 128), (1000, 32, 128), (2048, 64, 256), (5000, 256, 1024)],
)
def test_lanes_per_row_follow_the_row_length(length, width, grid) -> None:
    nest = lower(parse("S[i] := X[i,j]")).nest
    report = cuda_report(nest, f32(nest), {"X": (1024, length)}, registers=False)
    assert report.grids[0][0] == grid  # 1024 rows, 256 // width rows per block
    assert 1024 // (256 // width) == grid
    assert all(a.coalesced for a in report.accesses)


def layer_norm_nests():
    """Every nest a forward+backward call of LayerNorm runs on 8x1024x768, with its
    shapes and dtypes (F and eps get no gradient, as in a model)."""
    k = td.kernel(LAYER_NORM, nograd=("F", "eps"))
    found = []
    for eqn in nest_equations(k._call_jaxpr(LN_SHAPES, "float32", backend="cuda")):
        nest = eqn.params["nest"]
        shapes = {**dict(eqn.params["extents"])}
        shapes.update({op.name: v.aval.shape for op, v in zip(nest.operands, eqn.invars)})
        found.append((nest, equation_dtypes(eqn), shapes))
    return found


def test_layer_norm_forward_and_backward_use_every_sm_coalesced_without_redundant_work():
    strategies = {}
    for nest, dtypes, shapes in layer_norm_nests():
        schedule = choose_gpu_schedule(nest, dtypes)
        report = cuda_report(nest, dtypes, shapes, schedule, registers=False)
        assert_no_waste(report, str(nest))
        strategies[nest.output, output_shape(nest, shapes)] = schedule.strategy
    assert strategies[("M", (8, 1024))] == "rows"
    assert strategies[("V", (8, 1024))] == "rows"
    assert strategies[("dM", (8, 1024))] == "rows"  # a nested sum over f, strided by lanes
    assert strategies[("dg", (768,))] == "columns"  # dgamma and dbeta: columns cut in slices
    assert strategies[("dbeta", (768,))] == "columns"


def test_column_reduction_is_cut_into_enough_slices() -> None:
    nest = lower(parse("dbeta[f] := dY[b,t,f]")).nest
    report = cuda_report(nest, f32(nest), {"dY": (8, 1024, 768)}, registers=False)
    assert report.grids == ((3, 176, 1), (3, 1, 1))  # 528 blocks, then one pass to combine
    assert report.blocks_per_sm == 528 / SMS
    assert_no_waste(report, "dbeta")


def test_the_report_shows_what_a_schedule_wastes() -> None:
    nest = lower(parse("S[i] := X[i,j]")).nest
    thread = choose_gpu_schedule(nest).__class__(("i",), (("j",),), "thread")
    report = cuda_report(nest, f32(nest), {"X": (4096, 8192)}, thread, registers=False)
    assert report.blocks_per_sm < 2 and not report.accesses[0].coalesced
    assert report.accesses[0].stride == 8192
    matmul = lower(parse("C[i,j] := A[i,k] * B[k,j]")).nest
    padded = cuda_report(
        matmul, f32(matmul), {"A": (100, 70), "B": (70, 50)}, registers=False
    )  # 64x64 tiles, warps' blocks of 16 x 32: 112 x 64 x 70 points computed for 100 x 50 x 70
    assert padded.fmas == pytest.approx((112 * 64 * 70 / 5000, 70))
    halves = {"A": "bfloat16", "B": "bfloat16", "C": "float32"}
    mma = cuda_report(matmul, halves, {"A": (100, 70), "B": (70, 50)}, registers=False)
    assert mma.schedule.startswith("strategy=mma")  # mma tiles of 16 x 8, k by 16 then 8
    assert mma.fmas == pytest.approx((112 * 56 * 72 / 5000, 70))


def test_explain_with_target_cuda_and_its_errors() -> None:
    k = td.kernel("L[i] := X[i,j]", reduce="logsumexp")
    text = k.explain({"X": (64, 300)}, target="cuda")
    # the gradient dL*exp(X - L), elementwise, is XLA's fused work (codegen.ir.xla_elementwise)
    assert "forward: strategy=rows" in text and "grad_X: strategy=xla" in text
    assert "X[i, j]: lanes step j, stride 1" in text
    with pytest.raises(OptionError, match="needs shapes"):
        k.explain(target="cuda")
    with pytest.raises(UnknownNameError, match="no static report for target 'cdua'"):
        k.explain({"X": (64, 300)}, target="cdua")
    program = td.kernel(LAYER_NORM, nograd=("F", "eps"))
    shapes = {"X": (2, 8, 24), "F": (), "eps": (), "g": (24,), "beta": (24,)}
    text = program.explain(shapes, target="cuda")
    assert "dg: strategy=columns" in text and "M: strategy=rows" in text


PAIRWISE = "D[i,j] := (X[i,k] - Y[j,k])^2"
PAIRWISE_SHAPES = {"X": (16384, 64), "Y": (16384, 64)}


def test_pairwise_distances_16384_squared_stage_coalesced_tiles_on_every_sm() -> None:
    nest = lower(parse(PAIRWISE)).nest
    report = cuda_report(nest, f32(nest), PAIRWISE_SHAPES, registers=False)
    assert report.schedule.startswith("strategy=pairwise")
    assert report.grids == ((256, 256, 1),) and report.block == (16, 16, 1)  # 64 x 64 tiles
    assert_no_waste(report, "pairwise distances")
    assert report.fmas == (64, 64)
    lanes = [(a.text, a.lane, a.stride, a.staged) for a in report.accesses]
    assert lanes == [("X[i, k]", "k", 1, True), ("Y[j, k]", "k", 1, True)]
    # each row of X and of Y once per 64 outputs of the other side: 2 * 64 * 4 / 64 bytes
    assert report.loads == (8, 2 * 16384 * 64 * 4 / 16384**2)
    tile = dataclasses.replace(choose_gpu_schedule(nest), strategy="tile", row="i", rows=4)
    before = cuda_report(nest, f32(nest), PAIRWISE_SHAPES, tile, registers=False)
    assert not before.accesses[1].coalesced and before.loads[0] == 40 * report.loads[0]
    text = "\n".join(report.lines())
    assert "X[i, k]: staged in shared memory, lanes step k, stride 1" in text


def test_pairwise_tiles_of_odd_extents_count_only_their_padding() -> None:
    nest = lower(parse("D[i,j] := exp(-g*w[k]*(W[k,i] - V[k,j])^2)")).nest
    shapes = {"g": (), "w": (50,), "W": (50, 1000), "V": (50, 700)}
    report = cuda_report(nest, f32(nest), shapes, registers=False)
    assert report.schedule.startswith("strategy=pairwise")
    # warps' blocks of 16 rows x 32 columns: 1008 x 704 points computed; none along k
    assert report.fmas == pytest.approx((50 * 1008 / 1000 * 704 / 700, 50))
    lanes = {a.text: (a.lane, a.stride, a.staged) for a in report.accesses}
    assert lanes == {"W[k, i]": ("i", 1, True), "V[k, j]": ("j", 1, True), "w[k]": ("k", 1, True)}
    # W: each element once per 11 block columns, V once per 16 block rows, w once per block
    least = 4 * (1 + 50 + 50 * 1000 + 50 * 700) / 700000
    assert report.loads == pytest.approx((4 * 50 * (11 * 1000 + 16 * 700 + 176) / 700000, least))


def test_the_gradients_of_pairwise_distances_keep_coalesced_tiles() -> None:
    k = td.kernel(PAIRWISE)
    text = k.explain(PAIRWISE_SHAPES, target="cuda")
    assert "forward: strategy=pairwise" in text and "(not coalesced)" not in text
    assert "grad_X: strategy=tile" in text and "grad_Y: strategy=tile" in text
