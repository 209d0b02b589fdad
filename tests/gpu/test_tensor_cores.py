"""Tensor cores (the mma strategy, `codegen.cuda.staged.mma`) under the CUDA emulator: the
warp-collective `td_mma_16816_*` against numpy on its fragment layout, and generated GEMMs
of bfloat16 and float16 inputs at sizes no tile divides, batched, with transposed operands,
and their gradients, against float64 numpy on the same (rounded) inputs. The call through
JAX runs on a GPU's tensor cores where there is one."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

import tensordsl as td
from codegen.cuda.emit import emit_cuda
from codegen.cuda.emulator import emulate
from codegen.cuda.schedule import choose_gpu_schedule
from codegen.cuda.staged.fragments import a_fragment, b_fragment, c_fragment, tensor_core_type
from codegen.cuda.staged.mma import device_functions
from codegen.passes import grad
from tensordsl.backends import cuda as gpu
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.gpu import emulated
from tests.gpu.test_cuda_backend import EMULATED, REASON

needs_emulator = pytest.mark.skipif(not emulate.available(), reason="no CUDA emulator here")
HALVES = ("bfloat16", "float16")
NUMPY = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
MATMUL = "C[i,j] := A[i,k] * B[k,j]"

#: A kernel written by the PTX ISA's fragment rules (groupID = lane >> 2, threadID_in_group
#: = lane % 4), independent of the generated code: each warp multiplies its own 16x16 A
#: (row-major, 16-bit) by its 16x8 B (row-major) and adds its 16x8 C.
PROBE = """
extern "C" __global__ void probe(float *out, const unsigned short *a, const unsigned short *b,
                                 const float *c) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int group = lane >> 2, id = lane % 4;
    a += warp * 256; b += warp * 128; c += warp * 128; out += warp * 128;
    unsigned ra[4], rb[2];
    float d[4];
    for (int i = 0; i < 8; i += 2) {  /* a0..a7, two per register */
        const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
        const int col = id * 2 + (i < 4 ? 0 : 8);
        ra[i / 2] = a[row * 16 + col] | (unsigned)a[row * 16 + col + 1] << 16;
    }
    for (int i = 0; i < 4; i += 2) {  /* b0..b3 */
        const int row = id * 2 + (i < 2 ? 0 : 8);
        rb[i / 2] = b[row * 8 + group] | (unsigned)b[(row + 1) * 8 + group] << 16;
    }
    for (int i = 0; i < 4; ++i)  /* c0..c3 */
        d[i] = c[(i < 2 ? group : group + 8) * 8 + id * 2 + (i & 1)];
    td_mma_16816_TYPE(d, ra, rb);
    for (int i = 0; i < 4; ++i)
        out[(i < 2 ? group : group + 8) * 8 + id * 2 + (i & 1)] = d[i];
}
"""


def probe_source(dtype: str) -> str:
    include = {"bfloat16": "cuda_bf16.h", "float16": "cuda_fp16.h"}[dtype]
    t = {"bfloat16": "bf16", "float16": "f16"}[dtype]
    return "\n".join([f"#include <{include}>", *device_functions(dtype), PROBE.replace("TYPE", t)])


def test_the_fragment_layout_covers_each_element_once() -> None:
    a = sorted(cell for lane in range(32) for reg in a_fragment(lane) for cell in reg)
    b = sorted(cell for lane in range(32) for reg in b_fragment(lane) for cell in reg)
    c = sorted(cell for lane in range(32) for cell in c_fragment(lane))
    assert a == [(r, k) for r in range(16) for k in range(16)]
    assert b == [(k, n) for k in range(16) for n in range(8)]
    assert c == [(r, n) for r in range(16) for n in range(8)]


@needs_emulator
@pytest.mark.parametrize("dtype", HALVES)
def test_the_emulated_mma_is_exact_on_small_integers(dtype: str) -> None:
    rng = np.random.default_rng(11)
    warps = 2
    a = rng.integers(-8, 9, (warps, 16, 16)).astype(NUMPY[dtype])
    b = rng.integers(-8, 9, (warps, 16, 8)).astype(NUMPY[dtype])
    c = rng.integers(-50, 51, (warps, 16, 8)).astype(np.float32)
    (kernel,) = emulate.build([(probe_source(dtype), "probe")])
    out = np.full((warps, 16, 8), np.nan, np.float32)
    kernel((1, 1, 1), (32 * warps, 1, 1), (out, a.view(np.uint16), b.view(np.uint16), c))
    want = a.astype(np.float64) @ b.astype(np.float64) + c
    np.testing.assert_array_equal(out, want)
    # An element of A or B reaches exactly the outputs of its row or column.
    a[1, 3, 5] = 100
    kernel((1, 1, 1), (32 * warps, 1, 1), (out, a.view(np.uint16), b.view(np.uint16), c))
    np.testing.assert_array_equal(out, a.astype(np.float64) @ b.astype(np.float64) + c)


@needs_emulator
def test_the_emulated_mma_needs_a_whole_warp() -> None:
    (kernel,) = emulate.build([(probe_source("bfloat16"), "probe")])
    a, b = np.ones((16, 16), np.uint16), np.ones((16, 8), np.uint16)
    c, out = np.zeros((16, 8), np.float32), np.zeros((16, 8), np.float32)
    with pytest.raises(emulate.EmulationError, match="td_mma_16816_bf16 needs a warp of 32"):
        kernel((1, 1, 1), (16, 1, 1), (out, a, b, c))


def _rounded(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    return rng.standard_normal(shape).astype(NUMPY[dtype])


def _check(got: np.ndarray, want: np.ndarray, scale: np.ndarray) -> None:
    """float32 sums of exact products: within a few float32 ulps of the sum of |products|."""
    assert np.isfinite(got).all()
    np.testing.assert_array_less(np.abs(got - want), 1e-5 * scale + 1e-30)


def _run(
    source: str, arrays: dict[str, np.ndarray], out: str = "float32", order: str = "forward"
) -> np.ndarray:
    nest = lower(parse(source)).nest
    operands = [arrays[op.name] for op in nest.operands]
    la = gpu.prepare(nest, operands, {}, out, None)
    assert la.source.schedule.strategy == "mma", la.source.schedule.describe()
    return np.asarray(emulated.run_arrays(la, operands, order, source), np.float64)


GEMM_SIZES = [(1, 1, 1), (17, 33, 9), (64, 64, 64), (100, 40, 72)]


@needs_emulator
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize(("m", "k", "n"), GEMM_SIZES)
def test_gemms_at_any_size(dtype: str, m: int, k: int, n: int) -> None:
    rng = np.random.default_rng(m * 1000 + k * 10 + n)
    a, b = _rounded(rng, (m, k), dtype), _rounded(rng, (k, n), dtype)
    got = _run(MATMUL, {"A": a, "B": b})
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    _check(got, a64 @ b64, np.abs(a64) @ np.abs(b64))


@needs_emulator
@pytest.mark.parametrize(
    ("rows", "cols", "tile_k", "shape"),
    [(8, 8, 32, (150, 70, 130)), (2, 4, 16, (33, 17, 70)), (4, 8, 64, (65, 100, 129))],
)
def test_other_warp_tiles(rows: int, cols: int, tile_k: int, shape: tuple) -> None:
    m, k, n = shape
    nest = lower(parse(MATMUL)).nest
    rng = np.random.default_rng(rows * cols)
    a, b = _rounded(rng, (m, k), "float16"), _rounded(rng, (k, n), "float16")
    halves = {"A": "float16", "B": "float16", "C": "float32"}
    picked = choose_gpu_schedule(nest, halves, kernel=True)
    schedule = dataclasses.replace(picked, rows=rows, cols=cols, tile_k=tile_k)
    la = gpu.prepare(nest, [a, b], {}, "float32", schedule)
    assert f"tile=ixj={16 * rows}x{16 * cols} k={tile_k} tensor-cores" in la.source.text
    got = np.asarray(emulated.run_arrays(la, [a, b], what="warp tiles"), np.float64)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    _check(got, a64 @ b64, np.abs(a64) @ np.abs(b64))


@needs_emulator
def test_a_half_output_and_the_reverse_order() -> None:
    rng = np.random.default_rng(4)
    a, b = _rounded(rng, (70, 50), "bfloat16"), _rounded(rng, (50, 90), "bfloat16")
    want = a.astype(np.float64) @ b.astype(np.float64)
    got = _run(MATMUL, {"A": a, "B": b}, out="bfloat16", order="reverse")
    np.testing.assert_allclose(got, want, rtol=2**-8, atol=1e-6 * np.abs(want).max())


@needs_emulator
@pytest.mark.parametrize("dtype", HALVES)
@pytest.mark.parametrize(
    ("source", "a_shape", "b_shape", "reference"),
    [
        ("C[b,i,j] := A[b,i,k] * B[b,k,j]", (3, 17, 33), (3, 33, 9), "bik,bkj->bij"),
        ("C[i,j] := A[k,i] * B[k,j]", (37, 20), (37, 70), "ki,kj->ij"),
        ("C[i,j] := A[i,k] * B[j,k]", (65, 19), (30, 19), "ik,jk->ij"),
        ("C[i,j] := A[k,i] * B[j,k]", (16, 33), (8, 16), "ki,jk->ij"),
        ("C[b,i,j] := A[b,i,k] * B[k,j]", (2, 19, 40), (40, 66), "bik,kj->bij"),
        ("C[i,j] := A[i,k,l] * B[k,l,j]", (18, 3, 11), (3, 11, 20), "ikl,klj->ij"),
    ],
)
def test_batched_and_transposed_operands(
    dtype: str, source: str, a_shape: tuple, b_shape: tuple, reference: str
) -> None:
    rng = np.random.default_rng(len(source))
    a, b = _rounded(rng, a_shape, dtype), _rounded(rng, b_shape, dtype)
    got = _run(source, {"A": a, "B": b})
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    _check(got, np.einsum(reference, a64, b64), np.einsum(reference, abs(a64), abs(b64)))


@needs_emulator
@pytest.mark.parametrize("dtype", HALVES)
def test_the_gradients_of_both_inputs_use_tensor_cores(dtype: str) -> None:
    nest = lower(parse(MATMUL)).nest
    rng = np.random.default_rng(8)
    values = {
        "A": _rounded(rng, (33, 20), dtype),
        "B": _rounded(rng, (20, 45), dtype),
        "dC": _rounded(rng, (33, 45), dtype),
    }
    a, b, dc = (values[n].astype(np.float64) for n in ("A", "B", "dC"))
    wants = {"A": (dc @ b.T, abs(dc) @ abs(b.T)), "B": (a.T @ dc, abs(a.T) @ abs(dc))}
    shapes = {"A": (33, 20), "B": (20, 45), "dC": (33, 45), "C": (33, 45)}
    for name, (want, scale) in wants.items():
        gradient = grad.gradient(nest, name).nest
        operands = [values[op.name] for op in gradient.operands]
        extents = {**shapes, gradient.output: shapes[name]}
        la = gpu.prepare(gradient, operands, extents, "float32", None)
        assert la.source.schedule.strategy == "mma", (name, la.source.schedule.describe())
        got = emulated.run_arrays(la, operands, what=f"grad_{name}")
        _check(np.asarray(got, np.float64), want, scale)


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_a_kernel_and_its_gradients_through_jax(monkeypatch) -> None:
    """On real tensor cores where there is a GPU, else under the emulator."""
    if EMULATED:
        monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    rng = np.random.default_rng(9)
    a, b = _rounded(rng, (21, 35), "bfloat16"), _rounded(rng, (35, 13), "bfloat16")
    weights = rng.standard_normal((21, 13))
    strategies: list[str] = []

    def spy(*args: Any, **kwargs: Any) -> gpu.Launch:
        launch = prepare(*args, **kwargs)
        strategies.append(launch.source.schedule.strategy)
        return launch

    prepare = gpu.prepare
    monkeypatch.setattr(gpu, "prepare", spy)
    k = td.kernel(MATMUL, backend="cuda")
    with jax.default_device(jax.devices("cpu" if EMULATED else None)[0]):
        A, B = jnp.asarray(a), jnp.asarray(b)
        got = k(A, B)
        dA, dB = jax.grad(
            lambda A, B: jnp.sum(jnp.asarray(k(A, B), jnp.float32) * weights), (0, 1)
        )(A, B)
    assert strategies and set(strategies) == {"mma"}  # the forward, dA and dB
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = a64 @ b64
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=2**-8, atol=1e-3)
    w = weights.astype(ml_dtypes.bfloat16).astype(np.float64)  # the cotangent, in bfloat16
    for found, expected in ((dA, w @ b64.T), (dB, a64.T @ w)):
        np.testing.assert_allclose(np.asarray(found, np.float64), expected, rtol=2e-2, atol=2e-2)


def test_what_keeps_the_simt_tile() -> None:
    def strategy(source: str, **dtypes: str) -> str:
        nest = lower(parse(source)).nest
        return choose_gpu_schedule(nest, dtypes, kernel=True).strategy

    half = {"A": "bfloat16", "B": "bfloat16"}
    assert strategy(MATMUL, **half, C="float32") == "mma"
    assert strategy(MATMUL, **half, C="bfloat16") == "mma"
    assert strategy(MATMUL, A="float16", B="float16", C="float16") == "mma"
    assert strategy(MATMUL, A="float32", B="float32", C="float32") == "smem"  # no TF32
    assert strategy(MATMUL, A="bfloat16", B="float16", C="float32") == "smem"
    assert strategy(MATMUL, A="bfloat16", B="float32", C="float32") == "smem"
    assert strategy(MATMUL, **half, C="float64") == "smem"  # double sums
    assert strategy("C[i,j] := 2 * A[i,k] * B[k,j]", **half, C="float32") == "smem"
    assert strategy("C[i,j] := exp(A[i,k]) * B[k,j]", **half, C="float32") == "smem"
    nest = lower(parse(MATMUL)).nest
    assert tensor_core_type(nest, None, "i", "j") is None


def test_an_mma_schedule_that_does_not_fit_is_refused() -> None:
    nest = lower(parse(MATMUL)).nest
    halves = {"A": "bfloat16", "B": "bfloat16", "C": "float32"}
    schedule = choose_gpu_schedule(nest, halves, kernel=True)
    with pytest.raises(ValueError, match="tile_k a multiple of 16"):
        emit_cuda(nest, dtypes=halves, schedule=dataclasses.replace(schedule, tile_k=8))
    floats = dict.fromkeys(halves, "float32")
    with pytest.raises(ValueError, match="two bfloat16 .or two float16. accesses"):
        emit_cuda(nest, dtypes=floats, schedule=schedule)


def test_explain_says_tensor_cores(monkeypatch) -> None:
    from tensordsl.explain.nests import schedule_lines

    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    lines = schedule_lines(lower(parse(MATMUL)).nest, dtype="bfloat16")
    assert lines[0] == "forward" and lines[2] == (
        "  cuda: 16 x 16 threads per 64 i x 64 j output tile, staging 32-deep slices of k in "
        "shared memory, products on tensor cores (mma.sync m16n8k16, float sums)"
    )
    assert "tensor cores" not in "\n".join(schedule_lines(lower(parse(MATMUL)).nest))
