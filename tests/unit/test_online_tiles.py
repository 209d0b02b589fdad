"""The static counts of the CUDA one-pass kernel (`codegen.cuda.attention.tile_counts`) and
what `explain` says of it: pure Python, no compiler. The kernel itself runs under the emulator
in tests/gpu/test_online_cuda.py."""

from __future__ import annotations

import numpy as np
import pytest

import tensordsl as td
from codegen.cuda.attention.tile_counts import tile_counts
from codegen.cuda.schedule import choose_gpu_schedule
from codegen.ir.nest import LoopNest
from codegen.passes.online import pair_stored
from tensordsl.binding.programs import compiled_statements
from tests.gpu.test_online_cuda import ATTENTION, MASKS


def _nest(mask: str, shapes: dict) -> tuple[td.Kernel, LoopNest]:
    k = td.kernel(ATTENTION.format(mask=MASKS[mask][0]), outputs=("O", "L"), fuse={"S": "inline"})
    values = {n: np.zeros(s) for n, s in shapes.items()}
    (nest,) = [n for n in pair_stored(compiled_statements(k.program, values, "cuda", k.fuse))]
    return k, nest


def _shapes(T: int, D: int, E: int, outer: tuple[int, int] = (2, 1)) -> dict:
    return {"Q": (*outer, T, D), "K": (*outer, T, D), "scale": (), "V": (*outer, T, E)}


@pytest.mark.parametrize("mask", ["causal", "full", "window", "strict"])
def test_tile_counts_match_a_count_of_the_mask(mask):
    """Useful pairs = the mask's true entries; executed = on each visited tile, each warp's
    rows (8 of 4 lanes) times the most keys one of them has in range there."""
    T = 70
    shapes = _shapes(T, 4, 3)
    _, nest = _nest(mask, shapes)
    schedule = choose_gpu_schedule(nest)
    counts = tile_counts(nest, shapes, schedule)
    i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    keep = MASKS[mask][1](i, j)
    outer = 2  # b, h
    assert counts.useful_pairs == outer * int(keep.sum())
    executed = 0
    for r0 in range(0, T, schedule.rows):
        rows = keep[r0 : r0 + schedule.rows]
        live = np.flatnonzero(rows.any(axis=0))
        if live.size:
            for j0 in range(live[0], live[-1] + 1, schedule.tile_k):
                tile = rows[:, j0 : min(j0 + schedule.tile_k, live[-1] + 1)]
                for w in range(0, tile.shape[0], 32 // schedule.cols):
                    warp = tile[w : w + 32 // schedule.cols]
                    executed += warp.shape[0] * int(warp.sum(axis=1).max())
    assert counts.executed_pairs == outer * executed
    assert counts.score_fmas == 4 and counts.columns == 3


def test_causal_attention_does_about_half_the_work():
    """The static check of issue 24: executed / useful FMAs <= 1.3, causal counting only the
    unmasked half, for B 8, H 12, T 1024, E 64."""
    _, nest = _nest("causal", _shapes(1024, 64, 64, (8, 12)))
    counts = tile_counts(nest, _shapes(1024, 64, 64, (8, 12)))
    assert counts.ratio <= 1.3
    assert counts.useful_pairs == 8 * 12 * 1024 * 1025 // 2
    # 16 row tiles of 64 and 32 key tiles of 32: row tile r visits 2 (r + 1) of them
    assert counts.skipped == 8 * 12 * (16 * 32 - 16 * 17)  # above the diagonal
    assert counts.boundary == 8 * 12 * 16 * 2  # the two tiles on the diagonal of each


def test_explain_prints_the_tile_the_staging_and_the_skipped_tiles():
    k, _ = _nest("causal", _shapes(100, 16, 8))
    text = k.explain(_shapes(100, 16, 8))
    assert "strategy=online" in text and "tile=rows x keys=64x32 lanes/row=4" in text
    assert "staged=weights[32][128]" in text
    assert "the keys' read K[b, h, j, d_1] staged per tile as ks_[32][129]" in text
    assert "the rows' read Q[b, h, i, d_1] staged once per row tile as qs_[64][65]" in text
    # 2 row blocks x 2 batches; blocks walk 2 and 4 of their 4 key tiles, the two on the
    # diagonal of each tested per pair
    assert "4 blocks of 256 threads, 60288 bytes of shared memory (float32, dynamic" in text
    assert "12 of 16 key tiles visited (4 skipped, 8 tested per pair)" in text


@pytest.mark.parametrize("mask", ["full", "window"])
def test_full_attention_skips_nothing_and_a_window_most(mask):
    _, nest = _nest(mask, _shapes(256, 4, 3))
    counts = tile_counts(nest, _shapes(256, 4, 3))
    if mask == "full":
        assert counts.skipped == 0 and counts.boundary == 0 and counts.ratio == 1
    else:
        # 64-row blocks: the first walks keys 0..63 (2 tiles), the others 68 keys (3 tiles)
        assert counts.visited == 2 * (2 + 3 * 3)


def test_the_gradient_nests_compute_each_score_once_per_block():
    """dQ, dK and dV of causal attention run the weighted kernel: executed / useful FMAs
    <= 1.3 (the thread strategy recomputed every score once per output column)."""
    from tensordsl.explain.timing import nest_equations

    shapes = _shapes(1024, 64, 64, (8, 12))
    k, _ = _nest("causal", shapes)
    found = {}
    for eqn in nest_equations(k._call_jaxpr(shapes, "float32")):
        nest = eqn.params["nest"]
        schedule = choose_gpu_schedule(nest)
        if schedule.strategy != "weighted":
            continue
        known = {op.name: v.aval.shape for op, v in zip(nest.operands, eqn.invars)}
        known[nest.output] = eqn.outvars[0].aval.shape
        found[nest.output] = tile_counts(nest, known, schedule)
    assert set(found) == {"dQ", "dK", "dV"}
    for counts in found.values():
        assert counts.ratio <= 1.3 and counts.skipped == 8 * 12 * (16 * 32 - 16 * 17)
    assert found["dQ"].score_fmas == 128  # the scores and sum_e dO*V, once per pair


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_shared_memory_past_48_kb_is_dynamic_and_launched_with_its_size(dtype):
    """The 64-row tile with both of the score's operands staged (float32) needs about 60 KB:
    dynamic shared memory, which the launch opts in to; the others stay static."""
    from codegen.cuda.attention.online import shared_bytes
    from codegen.cuda.emit import emit_cuda
    from codegen.cuda.schedule import candidate_gpu_schedules
    from codegen.cuda.staged.shared import STATIC_SHARED_LIMIT

    _, nest = _nest("causal", _shapes(64, 8, 8))
    dtypes = {n: dtype for n in (*nest.operand_names, nest.output)}
    f = "float" if dtype == "float32" else "double"
    for schedule in candidate_gpu_schedules(nest):
        source = emit_cuda(nest, dtypes=dtypes, schedule=schedule)
        found = shared_bytes(nest, schedule, f)
        dynamic = found > STATIC_SHARED_LIMIT
        assert source.shared == (found if dynamic else 0), schedule
        assert ("extern __shared__" in source.text) == dynamic
        assert dynamic == (schedule.rows == 64), schedule  # float64: ws_ and ss_ past 48 KB
    assert shared_bytes(nest, choose_gpu_schedule(nest), "float") == 60288


def test_the_forward_stages_the_rows_once_and_reads_both_operands_from_shared_memory():
    """Query staging (`codegen.cuda.attention.query_tiles`): the one-pass kernel loads Q once
    per row tile, and where both tiles are staged, a lane sums the products of all its keys in one
    pass over d from `qs_` and `ks_` only."""
    from codegen.cuda.emit import emit_cuda

    _, nest = _nest("causal", _shapes(100, 16, 8))
    dtypes = {n: "float32" for n in (*nest.operand_names, nest.output)}
    text = emit_cuda(nest, dtypes=dtypes).text
    staged = text[text.index("float sd8_[8];") :]
    product = staged[: staged.index("} else {")]
    assert "sd8_[m_] += q_*ks_[(ln_ + 4*m_)*kp_ + d_];" in product
    assert "if (qst_ && full_) {" in text
    assert "qs_[r_*qp_ + d_]" in product and "in_Q" not in product, product
    assert text.count("in_Q[") == 3  # the stage; the variants for a longer d (kst_ or none)
    assert "float *const qs_ = reinterpret_cast<float *>(smem_ + " in text  # dynamic
    assert text.count("qs_[") == 3  # the stage, the 1 x 8 tile, a boundary pair
