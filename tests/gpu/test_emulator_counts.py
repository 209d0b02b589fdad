"""The CUDA emulator's counters (codegen/cuda/emulator/counting.h, counts.py): FMAs of the
emitter's hooks, global bytes, shared-memory bank conflicts, on kernels small enough to
count by hand; the nest's useful FMAs and minimum bytes; the static benchmark's JSON."""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest

from codegen.cuda.emit import emit_cuda
from codegen.cuda.emulator import emulate
from codegen.cuda.emulator.counts import Counts, min_global_bytes, useful_fmas
from codegen.cuda.schedule import candidate_gpu_schedules, choose_gpu_schedule
from tensordsl.backends import cuda as gpu
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.skipif(
    not emulate.available(), reason=f"CUDA emulator: {emulate.unavailable_reason()}"
)

GEMM = "C[i,j] := A[i,k] * B[k,j]"
FLOAT = {"A": "float32", "B": "float32", "C": "float32"}


def _count(
    source: str, operands: list[np.ndarray], strategy: str, out_dtype: str, shape: tuple
) -> tuple[Counts, np.ndarray]:
    """The counts and the output of `source` on `operands` under the first schedule of
    `strategy` (the heuristic's, for the dtypes of `operands`, when it is that strategy)."""
    nest = lower(parse(source)).nest
    dtypes = {op.name: str(a.dtype) for op, a in zip(nest.operands, operands, strict=True)}
    dtypes[nest.output] = out_dtype
    picks = (choose_gpu_schedule(nest, dtypes, kernel=True), *candidate_gpu_schedules(nest))
    schedule = next(s for s in picks if s.strategy == strategy)
    la = gpu.prepare(nest, operands, {}, out_dtype, schedule, counting=True)
    (kernel,) = emulate.build([(la.source.text, p.entry) for p in la.source.passes], counting=True)
    out = np.full(shape, np.nan, jnp.dtype(out_dtype))  # poisoned: unwritten elements show
    args = (out, *operands, *(np.int64(p) for p in la.params))
    counts = kernel.count(la.passes[0][1], la.source.block, args, shared_mem=la.source.shared)
    return counts, np.asarray(out, np.float64)


def _gemm(strategy: str, dtype: str = "float32") -> tuple[Counts, np.ndarray, np.ndarray]:
    """The counts of a 5x3 @ 3x7 product under the first schedule of `strategy`."""
    rng = np.random.default_rng(1)
    A = rng.normal(size=(5, 3)).astype(jnp.dtype(dtype))
    B = rng.normal(size=(3, 7)).astype(jnp.dtype(dtype))
    counts, out = _count(GEMM, [A, B], strategy, dtype, (5, 7))
    return counts, out, np.asarray(A, np.float64) @ np.asarray(B, np.float64)


@pytest.mark.parametrize(("dtype", "size"), [("float32", 4), ("bfloat16", 2)])
def test_a_thread_per_element_gemm_counts_every_fma_once(dtype, size):
    counts, out, want = _gemm("thread", dtype)
    np.testing.assert_allclose(out, want, rtol=1e-5 if size == 4 else 2e-2, atol=1e-2)
    assert counts.fmas == 5 * 7 * 3
    assert counts.loaded == 5 * 7 * (3 + 3) * size  # each element reads its row and column
    assert counts.stored == 5 * 7 * size  # bfloat16: a struct returned in place, counted too
    assert (counts.shared_loads, counts.conflicts) == (0, 0)


def test_a_staged_gemm_loads_each_element_once_and_pays_for_busy_warps_only():
    counts, out, want = _gemm("smem")
    np.testing.assert_allclose(out, want, rtol=1e-5)
    # One 64x64 tile; of its 8 warps (16x32 outputs each) only the first has a row and a
    # column in range; the slice of 16 is cut at k = 3.
    assert counts.fmas == 16 * 32 * 3
    assert counts.loaded == (5 * 3 + 3 * 7) * 4
    assert counts.stored == 5 * 7 * 4
    assert counts.shared_stores == 2 * 64 * 16 and counts.conflicts == 0


#: An odd size: m and n no multiple of a tile (64) or of a warp's block, k of no slice.
M, K, N = 45, 23, 61
PAIRWISE = "D[i,j] := (X[i,k] - Y[j,k])^2"


@pytest.mark.parametrize(
    ("source", "strategy", "dtype", "executed"),
    [
        # warps' blocks of 16 rows x 32 columns: 48 x 64 outputs computed, k to its stop
        (GEMM, "smem", "float32", 48 * 64 * K),
        (PAIRWISE, "pairwise", "float32", 48 * 64 * K),
        # mma tiles of 16 rows x 8 columns, k in steps of 16 and a last one of 8
        (GEMM, "mma", "bfloat16", 48 * 64 * 24),
        (GEMM, "mma", "float16", 48 * 64 * 24),
    ],
)
def test_tiles_at_an_odd_size_execute_at_most_1_3x_the_useful_fmas(
    source, strategy, dtype, executed
):
    nest = lower(parse(source)).nest
    rng = np.random.default_rng(5)
    if strategy == "pairwise":
        a, b = rng.normal(size=(M, K)), rng.normal(size=(N, K))
        want = ((a[:, None, :] - b[None, :, :]) ** 2).sum(-1)
        operands, shapes = [a.astype(dtype), b.astype(dtype)], {"X": (M, K), "Y": (N, K)}
    else:
        operands = [rng.normal(size=(M, K)), rng.normal(size=(K, N))]
        operands = [x.astype(jnp.dtype(dtype)) for x in operands]
        want = np.asarray(operands[0], np.float64) @ np.asarray(operands[1], np.float64)
        shapes = {"A": (M, K), "B": (K, N)}
    counts, out = _count(source, operands, strategy, "float32", (M, N))
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
    useful = useful_fmas(nest, shapes)
    assert useful == M * N * K
    assert counts.fmas == executed and counts.fmas <= 1.3 * useful
    if strategy != "mma":  # the mma tile's staging stores conflict (docs/backends.md)
        assert counts.conflicts == 0


def test_useful_fmas_and_minimum_bytes_of_a_gemm():
    nest = lower(parse(GEMM)).nest
    assert useful_fmas(nest, {"A": (5, 3), "B": (3, 7)}) == 105
    assert min_global_bytes(nest, {"A": (5, 3), "B": (3, 7)}, FLOAT) == (15 + 21 + 35) * 4


def test_useful_fmas_of_causal_attention_count_the_unmasked_pairs_once():
    from benchmarks import gpu_static

    case = next(c for c in gpu_static.CASES if c.name == "attention_causal_fwd")
    T, D, E = 5, 2, 3
    shapes = {"Q": (1, 1, T, D), "K": (1, 1, T, D), "scale": (), "V": (1, 1, T, E)}
    (eqn,) = gpu_static._equations(case, shapes)
    pairs = T * (T + 1) // 2
    # the score's dot product, the logsumexp's step and the weighted sum's FMA per column
    assert useful_fmas(eqn.params["nest"], shapes) == pairs * (D + 1 + E)


def test_the_attention_forward_reads_at_most_twice_the_minimum_bytes_at_an_odd_T():
    """K and V are read once per 64-row tile: twice at T 67 (Q once, O and L written once),
    about 1.5x the minimum; 32-row tiles read them 3 times, 2.0x and more (issue 24's
    target). Causal: the first row tile reads keys 0..63 only."""
    from benchmarks import gpu_static

    T, D = 67, 32
    shapes = {"Q": (1, 2, T, D), "K": (1, 2, T, D), "scale": (), "V": (1, 2, T, D)}
    found = {}
    for name, mask in (("full", ""), ("causal", gpu_static.CAUSAL)):
        source = gpu_static.ATTENTION.format(mask=mask)
        case = gpu_static.Case(name, source, shapes, options={"outputs": ("O", "L")})
        (found[name],) = gpu_static.run_case(case)
    for record in found.values():
        assert record["strategy"] == "online" and record["bank_conflicts"] == 0
        # Q, K, V, O: T x D floats each per (batch, head); L: T floats; the scale.
        assert record["min_global_bytes"] == 2 * (4 * T * D + T) * 4 + 4
        assert record["global_bytes"] <= 2 * record["min_global_bytes"], record
    assert found["causal"]["global_bytes"] < found["full"]["global_bytes"]


BANKS = r"""
extern "C" __global__ void tdsl_banks(float *out, const float *in, long long stride) {
    __shared__ float s_[32 * 33];
    s_[threadIdx.x * stride] = in[threadIdx.x];
    __syncthreads();
    out[threadIdx.x] = s_[threadIdx.x * stride] + s_[0];
}
"""


@pytest.mark.parametrize(
    ("stride", "conflicts"),
    [(1, 0), (33, 0), (2, 2 * 1), (32, 2 * 31), (16, 2 * 15)],
)
def test_bank_conflicts_of_a_strided_shared_array(stride, conflicts):
    """A warp's 32 lanes at stride s hit gcd(s, 32) words in one bank: that many - 1 extra
    wavefronts at the store and at the load (the broadcast read of s_[0] costs none)."""
    kernel = emulate.kernel(BANKS, "tdsl_banks", counting=True)
    data = np.arange(32, dtype=np.float32) + 1
    out = np.zeros(32, np.float32)
    counts = kernel.count((1, 1, 1), (32, 1, 1), (out, data, np.int64(stride)))
    np.testing.assert_array_equal(out, data + data[0])
    assert counts.conflicts == conflicts
    assert (counts.loaded, counts.stored) == (32 * 4, 32 * 4)
    assert counts.requests == 3 and counts.fmas == 0


def test_counting_is_asked_for():
    """The text NVRTC compiles has no hooks; a kernel built without counting cannot count."""
    nest = lower(parse(GEMM)).nest
    assert "TDSL_COUNT_FMA" not in emit_cuda(nest, dtypes=FLOAT).text
    assert "TDSL_COUNT_FMA" in emit_cuda(nest, dtypes=FLOAT, counting=True).text
    kernel = emulate.kernel(BANKS, "tdsl_banks")
    out = np.zeros(32, np.float32)
    with pytest.raises(emulate.EmulationError, match="without counting"):
        kernel.count((1, 1, 1), (32, 1, 1), (out, out.copy(), np.int64(1)))


def test_the_static_benchmark_writes_its_records(tmp_path):
    from benchmarks import gpu_static

    gpu_static.main(["--quick", "--out", str(tmp_path), "--cases", "gemm,row_logsumexp"])
    records = json.loads((tmp_path / "gpu_static.json").read_text())
    assert {r["case"] for r in records} == {"gemm", "row_logsumexp"}
    for record in records:
        assert set(gpu_static.KEYS) <= set(record)
        assert all(isinstance(record[k], int) for k in gpu_static.KEYS[2:])
    gemm = next(r for r in records if r["case"] == "gemm")
    assert gemm["useful_fmas"] == 105 and gemm["min_global_bytes"] == 284
