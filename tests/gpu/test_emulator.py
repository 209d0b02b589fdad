"""The CUDA emulator's execution model on hand-written kernels (no GPU needed).

Barriers, warp intrinsics with masks and widths (checked against CUDA's rules written out in
numpy), shared memory poisoned between blocks, deadlock reports, the reverse order, 3-d
launches, half types, dynamic shared memory, atomics and argument checks. All kernels are
compiled in one translation unit.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from codegen.c.run import compiler
from codegen.cuda.emulator import emulate, pch

pytestmark = pytest.mark.skipif(
    not emulate.available(), reason=f"CUDA emulator: {emulate.unavailable_reason()}"
)

KERNELS = {
    "count_threads": """
extern "C" __global__ void count_threads(int *out) {
    out[blockIdx.x * blockDim.x + threadIdx.x] = int(threadIdx.x);
}
""",
    "block_sum": """
extern "C" __global__ void block_sum(float *out, const float *x, long long n) {
    __shared__ float s[256];
    const int t = threadIdx.x;
    float acc = 0;
    for (long long i = blockIdx.x * 256 + t; i < n; i += 256 * gridDim.x) acc += x[i];
    s[t] = acc;
    __syncthreads();
    for (int h = 128; h >= 32; h >>= 1) {
        if (t < h) s[t] += s[t + h];
        __syncthreads();
    }
    if (t < 32) {
        float v = s[t];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffff, v, o);
        if (t == 0) atomicAdd(out, v);
    }
}""",
    "shuffles": """
extern "C" __global__ void shuffles(int *out, long long src, long long delta) {
    const int t = threadIdx.x, lane = t % 32, v = 100 * t + 7;
    out[5 * t + 0] = __shfl_sync(0xffffffff, v, (int)src, 8);
    out[5 * t + 1] = __shfl_up_sync(0xffffffff, v, (unsigned)delta, 16);
    out[5 * t + 2] = __shfl_down_sync(0xffffffff, v, (unsigned)delta);
    out[5 * t + 3] = __shfl_xor_sync(0xffffffff, v, 6, 8);
    out[5 * t + 4] = __shfl_xor_sync(0xffffffff, v, 20);
    (void)lane;
}""",
    "votes": """
extern "C" __global__ void votes(unsigned *out) {
    const int t = threadIdx.x;
    if (t >= 40) return;
    out[4 * t + 0] = __ballot_sync(__activemask(), t % 3 == 0);
    out[4 * t + 1] = __any_sync(__activemask(), t == 5);
    out[4 * t + 2] = __all_sync(__activemask(), t < 100);
    out[4 * t + 3] = __activemask();
}""",
    "exited_threads": """
extern "C" __global__ void exited_threads(float *out, const float *x, long long n) {
    __shared__ float s[64];
    const int t = threadIdx.x;
    if (t >= n) return;
    s[t] = x[t];
    __syncthreads();
    __syncwarp(__activemask());
    out[t] = s[n - 1 - t];
}""",
    "partial_mask": """
extern "C" __global__ void partial_mask(float *out) {
    const int t = threadIdx.x;
    float v = t;
    if (t < 16) v = __shfl_down_sync(0x0000ffff, v, 8);
    out[t] = v;
}""",
    "missing_barrier": """
extern "C" __global__ void missing_barrier(float *out, const float *x) {
    __shared__ float s[128];
    const int t = threadIdx.x;
    s[t] = x[t];
    out[t] = t > 0 ? s[t - 1] : 0.0f;  /* needs __syncthreads() before reading */
}""",
    "stale_shared": """
extern "C" __global__ void stale_shared(float *out) {
    __shared__ float s[32];
    const int t = threadIdx.x;
    out[blockIdx.x * 32 + t] = s[t];  /* never written by this block */
    s[t] = 1.0f;
}""",
    "lane_exits": """
extern "C" __global__ void lane_exits(float *out) {
    const int t = threadIdx.x;
    if (t < 16) return;
    out[t] = __shfl_down_sync(0xffffffff, (float)t, 1);
}""",
    "divergent_barrier": """
extern "C" __global__ void divergent_barrier(float *out) {
    if (threadIdx.x < 32) {
        __syncthreads();
    } else {
        __syncthreads();
    }
    out[threadIdx.x] = 1;
}""",
    "mask_mismatch": """
extern "C" __global__ void mask_mismatch(float *out) {
    const unsigned mask = threadIdx.x == 3 ? 0x0000000fu : 0xffffffffu;
    out[threadIdx.x] = __shfl_sync(mask, 1.0f, 0);
}""",
    "traps": """
extern "C" __global__ void traps(float *out) {
    if (blockIdx.x == 1 && threadIdx.x == 2) __trap();
    out[threadIdx.x] = 1;
}""",
    "asserts": """
extern "C" __global__ void asserts(float *out) {
    assert(threadIdx.x != 5);
    out[threadIdx.x] = 1;
}""",
    "bad_width": """
extern "C" __global__ void bad_width(float *out) {
    out[threadIdx.x] = __shfl_sync(0xffffffff, 1.0f, 0, 12);
}""",
    "dims": """
extern "C" __global__ void dims(long long *out) {
    const long long b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const long long t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    const long long n = b * blockDim.x * blockDim.y * blockDim.z + t;
    out[2 * n] = threadIdx.x + 10 * threadIdx.y + 100 * threadIdx.z;
    out[2 * n + 1] = blockIdx.x + 10 * blockIdx.y + 100 * blockIdx.z;
}""",
    "halves": """
#include <cuda_fp16.h>
#include <cuda_bf16.h>
extern "C" __global__ void halves(float *out, const __half *h, const __nv_bfloat16 *b,
                                  __half *total) {
    const int t = threadIdx.x;
    __half x = __hadd(h[t], h[t]);
    __half y = __shfl_xor_sync(0xffffffff, x, 1);
    out[3 * t + 0] = __half2float(y);
    out[3 * t + 1] = __half2float(hsqrt(h[t]));
    out[3 * t + 2] = __bfloat162float(__float2bfloat16_rn(__bfloat162float(b[t]) * 2.0f));
    atomicAdd(total, h[t]);
}""",
    "dynamic_shared": """
extern "C" __global__ void dynamic_shared(double *out) {
    extern __shared__ double buffer[];
    const int t = threadIdx.x;
    buffer[t] = 0.5 * t;
    __syncthreads();
    out[blockIdx.x * blockDim.x + t] = buffer[(t + 1) % blockDim.x];
}""",
    "atomics": """
extern "C" __global__ void atomics(int *counts, unsigned long long *flags, double *sum) {
    atomicAdd(&counts[0], 1);
    atomicMax(&counts[1], (int)(threadIdx.x * 7 % 50));
    atomicMin(&counts[2], -(int)threadIdx.x);
    atomicCAS(&flags[0], 0ull, 1ull + threadIdx.x);
    atomicAdd(sum, 0.25);
}""",
}


@pytest.fixture(scope="module")
def k() -> dict[str, emulate.EmulatedKernel]:
    built = emulate.build([(text, name) for name, text in KERNELS.items()])
    return {kernel.entry: kernel for kernel in built}


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_block_reduction_with_shuffles_and_atomics(k, order: str) -> None:
    x = np.random.default_rng(0).uniform(-1, 1, 20000).astype(np.float32)
    out = np.zeros(1, np.float32)
    k["block_sum"]((7, 1, 1), (256, 1, 1), (out, x, np.int64(x.size)), order=order)
    np.testing.assert_allclose(out[0], x.astype(np.float64).sum(), rtol=1e-5, atol=1e-3)


def _mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs /proc/self/maps")
def test_a_launch_leaves_no_fiber_stacks_mapped(k) -> None:
    """Each fiber stack is two mappings; kept after a launch, a long run of emulated kernels
    (each library its own pool) reached vm.max_map_count and mmap/malloc failed."""
    out = np.full(2 * 512, -1, np.int32)
    before = _mappings()
    k["count_threads"]((2, 1, 1), (512, 1, 1), (out,))  # this kernel's first launch
    assert _mappings() - before < 64  # 1024 more while the stacks stayed mapped
    np.testing.assert_array_equal(out, np.tile(np.arange(512), 2))


def cuda_shuffle(values: np.ndarray, op: str, arg: int, width: int) -> np.ndarray:
    """CUDA's shuffle rules, written out lane by lane."""
    result = values.copy()
    for t in range(values.size):
        lane, base = t % 32, t - t % 32
        segment = lane - lane % width
        if op == "idx":
            source = segment + arg % width
        elif op == "up":
            source = lane - arg if lane - segment >= arg else lane
        elif op == "down":
            source = lane + arg if lane - segment + arg < width else lane
        else:
            source = lane ^ arg if (lane ^ arg) < segment + width else lane
        result[t] = values[base + source]
    return result


@pytest.mark.parametrize("src, delta", [(3, 5), (13, 1), (0, 31)])
def test_shuffles_follow_cuda_width_rules(k, src: int, delta: int) -> None:
    out = np.full((64, 5), -1, np.int32)
    k["shuffles"]((1, 1, 1), (64, 1, 1), (out, np.int64(src), np.int64(delta)))
    values = 100 * np.arange(64, dtype=np.int32) + 7
    np.testing.assert_array_equal(out[:, 0], cuda_shuffle(values, "idx", src, 8))
    np.testing.assert_array_equal(out[:, 1], cuda_shuffle(values, "up", delta, 16))
    np.testing.assert_array_equal(out[:, 2], cuda_shuffle(values, "down", delta, 32))
    np.testing.assert_array_equal(out[:, 3], cuda_shuffle(values, "xor", 6, 8))
    np.testing.assert_array_equal(out[:, 4], cuda_shuffle(values, "xor", 20, 32))


def test_votes_over_the_active_lanes(k) -> None:
    out = np.zeros((40, 4), np.uint32)
    k["votes"]((1, 1, 1), (64, 1, 1), (out,))
    lanes = np.arange(40)
    for t in lanes:
        group = lanes[(lanes // 32) == t // 32] % 32
        ballot = sum(1 << int(g) for g in group if (g + 32 * (t // 32)) % 3 == 0)
        assert out[t, 0] == ballot
        assert out[t, 1] == (t // 32 == 0)  # lane 5 is in the first warp only
        assert out[t, 2] == 1
        assert out[t, 3] == sum(1 << int(g) for g in group)


def test_exited_threads_count_as_arrived_at_barriers(k) -> None:
    x = np.random.default_rng(1).uniform(size=40).astype(np.float32)
    out = np.full(40, np.nan, np.float32)
    k["exited_threads"]((1, 1, 1), (64, 1, 1), (out, x, np.int64(40)))
    np.testing.assert_array_equal(out, x[::-1])


def test_a_shuffle_reading_a_lane_outside_the_mask_gets_poison(k) -> None:
    out = np.zeros(32, np.float32)
    k["partial_mask"]((1, 1, 1), (32, 1, 1), (out,))
    np.testing.assert_array_equal(out[:8], np.arange(8, 16))
    assert np.isnan(out[8:16]).all()  # lanes 16-23 are not in the mask: undefined
    np.testing.assert_array_equal(out[16:], np.arange(16, 32))


def test_reverse_order_exposes_a_missing_barrier(k) -> None:
    x = np.arange(1, 129, dtype=np.float32)
    want = np.concatenate([[0], x[:-1]])
    forward, reverse = np.zeros(128, np.float32), np.zeros(128, np.float32)
    k["missing_barrier"]((1, 1, 1), (128, 1, 1), (forward, x))
    k["missing_barrier"]((1, 1, 1), (128, 1, 1), (reverse, x), order="reverse")
    np.testing.assert_array_equal(forward, want)  # in order, the race happens to work
    assert np.isnan(reverse[1:]).all()  # shared memory not yet written: the poison


def test_shared_memory_is_poisoned_before_every_block(k) -> None:
    out = np.zeros(96, np.float32)
    k["stale_shared"]((3, 1, 1), (32, 1, 1), (out,))
    assert np.isnan(out).all()


def test_a_deadlock_is_reported_with_threads_and_lines(k) -> None:
    with pytest.raises(emulate.EmulationError) as caught:
        k["lane_exits"]((1, 1, 1), (32, 1, 1), (np.zeros(32, np.float32),))
    message = str(caught.value)
    assert message.startswith("lane_exits: deadlock in block (0,0,0)")
    assert "threads 0-15 ((0,0,0) ...): exited" in message
    assert "threads 16-31 ((16,0,0) ...): wait at __shfl_down_sync at lane_exits.cu:5" in message


@pytest.mark.parametrize(
    "name, expected",
    [
        ("divergent_barrier", r"at divergent_barrier.cu:4 .* at divergent_barrier.cu:6 "),
        ("mask_mismatch", r"warp intrinsics and masks must match"),
        ("traps", r"traps: __trap\(\) called"),
        ("asserts", r"asserts: assertion failed: threadIdx.x != 5 at asserts.cu:3$"),
        ("bad_width", r"bad_width: thread \(0,0,0\): __shfl_sync width must be a power of two"),
    ],
)
def test_undefined_behaviour_is_an_error(k, name: str, expected: str) -> None:
    with pytest.raises(emulate.EmulationError, match=expected):
        k[name]((2, 1, 1), (64, 1, 1), (np.zeros(64, np.float32),))


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_three_dimensional_grids_and_blocks(k, order: str) -> None:
    grid, block = (2, 3, 2), (4, 2, 3)
    out = np.full((12, 24, 2), -1, np.int64)
    k["dims"](grid, block, (out,), order=order)
    for b, (bz, by, bx) in enumerate(np.ndindex(*grid[::-1])):
        for t, (tz, ty, tx) in enumerate(np.ndindex(*block[::-1])):
            assert out[b, t].tolist() == [tx + 10 * ty + 100 * tz, bx + 10 * by + 100 * bz]


def test_half_precision_types_shuffles_and_atomics(k) -> None:
    import ml_dtypes

    rng = np.random.default_rng(2)
    h = rng.uniform(0.5, 2.0, 32).astype(np.float16)
    b = rng.uniform(0.5, 2.0, 32).astype(ml_dtypes.bfloat16)
    out, total = np.zeros((32, 3), np.float32), np.zeros(1, np.float16)
    k["halves"]((1, 1, 1), (32, 1, 1), (out, h, b, total))
    doubled = (h + h).astype(np.float32)
    np.testing.assert_array_equal(out[:, 0], doubled[np.arange(32) ^ 1])
    np.testing.assert_allclose(out[:, 1], np.sqrt(h.astype(np.float32)), rtol=1e-3)
    np.testing.assert_array_equal(out[:, 2], (b.astype(np.float32) * 2).astype(np.float32))
    np.testing.assert_allclose(total[0], h.astype(np.float64).sum(), rtol=2e-2)


def test_dynamic_shared_memory(k) -> None:
    out = np.zeros((2, 96))
    k["dynamic_shared"]((2, 1, 1), (96, 1, 1), (out,), shared_mem=96 * 8)
    np.testing.assert_array_equal(out, 0.5 * np.tile((np.arange(96) + 1) % 96, (2, 1)))


def test_atomics(k) -> None:
    counts = np.array([0, -5, 0], np.int32)
    flags, total = np.zeros(1, np.uint64), np.zeros(1)
    k["atomics"]((3, 1, 1), (64, 1, 1), (counts, flags, total))
    assert counts.tolist() == [192, 49, -63]
    assert flags[0] == 1 and total[0] == 48.0


@pytest.mark.parametrize(
    "args, message",
    [
        ((), r"takes 1 arguments \(p\), got 0"),
        ((1.5,), r"argument 0 is a pointer; got float"),
    ],
)
def test_bad_arguments_are_refused(k, args, message: str) -> None:
    with pytest.raises(emulate.EmulationError, match=message):
        k["traps"]((1, 1, 1), (32, 1, 1), args)


@pytest.mark.parametrize(
    "value, message",
    [
        (np.int32(3), "argument 1 must be int64, got int32"),
        (2.5, r"argument 1 must be an integer, got 2.5"),
        (2**70, "does not fit int64"),
    ],
)
def test_bad_scalars_are_refused(k, value, message: str) -> None:
    with pytest.raises(emulate.EmulationError, match=message):
        k["shuffles"]((1, 1, 1), (32, 1, 1), (np.zeros(160, np.int32), value, np.int64(1)))


@pytest.mark.parametrize(
    "grid, block, shared, message",
    [
        ((1, 1, 1), (2048, 1, 1), 0, "block dimension out of range"),
        ((1, 1, 1), (64, 32, 1), 0, "more than 1024 threads per block"),
        ((0, 1, 1), (32, 1, 1), 0, "grid dimension out of range"),
        ((1, 1, 1), (32, 1, 1), 1 << 20, "dynamic shared memory out of range"),
    ],
)
def test_bad_launch_shapes_are_refused(k, grid, block, shared, message: str) -> None:
    with pytest.raises(emulate.EmulationError, match=message):
        k["traps"](grid, block, (np.zeros(64, np.float32),), shared_mem=shared)


def test_units_hold_the_exact_text_and_are_cached_on_disk(k, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))
    unit = emulate.translation_unit([(KERNELS["traps"], "traps")])
    assert KERNELS["traps"] in unit
    before = dict(compiler.STATS)
    first = emulate.compile_unit(unit)
    second = emulate.compile_unit(unit)
    assert first == second and first.parent.parent == tmp_path / "cuda_emu"
    assert compiler.STATS["compiles"] == before["compiles"] + 1
    assert compiler.STATS["disk_hits"] == before["disk_hits"] + 1
    assert not list(first.parent.glob("*.tmp"))


def test_a_unit_without_the_runtime_object_compiles_the_runtime(tmp_path, monkeypatch) -> None:
    # Where runtime.o cannot be built (a cache that cannot be written), each unit compiles
    # runtime.cc itself: the same kernel, the same results.
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pch, "runtime_object", lambda compiler, flags: None)
    text = KERNELS["count_threads"] + "// a unit of its own\n"
    (kernel,) = emulate.build([(text, "count_threads")])
    out = np.full(96, -1, np.int32)
    kernel((3, 1, 1), (32, 1, 1), (out,))
    np.testing.assert_array_equal(out, np.tile(np.arange(32), 3))
    assert not list(tmp_path.glob("cuda_emu_pch/*/runtime.o"))


def test_a_compiler_error_names_the_kept_unit(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))
    with pytest.raises(compiler.BuildError, match=r"tensordsl bug(.|\n)*source kept at \S+\.cc"):
        emulate.compile_unit(emulate.translation_unit([("this is not C++", "broken")]))
