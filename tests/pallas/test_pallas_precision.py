"""Precision as jax.numpy has it on the pallas back end (codegen/tiles/precision.py): the
dot precision each `precision=` mode puts into the Triton kernels lowered for CUDA, results
in interpret mode against float64 within each mode's stated tolerance, and worded refusals.

Interpret mode on the CPU is exact float32 whatever the mode, so the GPU's rounding is
checked where it is decided (the lowered `tt.dot`s) and the stated TF32 bound against an
emulation of TF32's operand rounding."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.tiles.precision import HALF, MODES
from tensordsl.backends.pallas.api import lowering_for_gpu
from tensordsl.errors import UnknownNameError
from tests.backends import NEEDS_C_COMPILER
from tests.pallas.triton_ir import dot_precisions, triton_kernels

MATMUL = "C[i,j] := A[i,k] * B[k,j]"
#: Attention's weighted sum over a causal mask: a dot whose loop is bounded per row tile.
CAUSAL_SUM = "O[i,e] := P[i,j] * V[j,e] * (j <= i)"
SHAPES = {MATMUL: {"A": (40, 70), "B": (70, 24)}, CAUSAL_SUM: {"P": (48, 48), "V": (48, 32)}}


def _inputs(source, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.normal(size=shape), dtype) for shape in SHAPES[source].values()]


def _lowered(function, *args):
    with lowering_for_gpu():
        return jax.jit(function).trace(*args).lower(lowering_platforms=("cuda",))


@pytest.mark.parametrize(
    ("precision", "expected"),
    [(None, "tf32"), ("default", "tf32"), ("high", "tf32"), ("highest", "ieee")]
    + [(jax.lax.Precision.HIGHEST, "ieee"), (jax.lax.Precision.DEFAULT, "tf32")],
)
def test_each_mode_reaches_the_float32_dots_lowered_for_cuda(precision, expected):
    k = td.kernel(MATMUL, backend="pallas", precision=precision)
    args = _inputs(MATMUL, jnp.float32)
    assert dot_precisions(_lowered(k, *args)) == [expected]

    def loss(a, b):
        return k(a, b).sum()

    # value_and_grad: the forward's dot and each gradient nest's (dA = dC B^T, dB = A^T dC).
    found = dot_precisions(_lowered(jax.value_and_grad(loss, argnums=(0, 1)), *args))
    assert len(found) == 3 and set(found) == {expected}


def test_none_follows_jax_default_matmul_precision_at_trace_time():
    k = td.kernel(MATMUL, backend="pallas")
    args = _inputs(MATMUL, jnp.float32)
    with jax.default_matmul_precision("highest"):
        assert dot_precisions(_lowered(k, *args)) == ["ieee"]
    with jax.default_matmul_precision("float32"):
        assert dot_precisions(_lowered(k, *args)) == ["ieee"]
    with jax.default_matmul_precision("tensorfloat32"):
        assert dot_precisions(_lowered(k, *args)) == ["tf32"]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("precision", ["default", "highest"])
def test_half_dots_take_their_operands_as_they_are_and_accumulate_in_float32(dtype, precision):
    k = td.kernel(MATMUL, backend="pallas", precision=precision)
    (kernel,) = triton_kernels(_lowered(k, *_inputs(MATMUL, dtype)))
    short = {"bfloat16": "bf16", "float16": "f16"}[dtype]
    (dot,) = [line for line in kernel.splitlines() if "tt.dot " in line]
    assert f"tensor<32x32x{short}> * tensor<32x32x{short}> -> tensor<32x32xf32>" in dot


def _relative_error(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def _float64(source, args):
    a, b = (np.asarray(x, np.float64) for x in args)
    if source == MATMUL:
        return a @ b
    return np.tril(a) @ b


@pytest.mark.parametrize("source", [MATMUL, CAUSAL_SUM])
@pytest.mark.parametrize("precision", sorted(MODES))
def test_interpret_mode_matches_float64_within_each_modes_tolerance(source, precision):
    k = td.kernel(source, backend="pallas", precision=precision)
    args = _inputs(source, jnp.float32, seed=3)
    assert _relative_error(k(*args), _float64(source, args)) <= MODES[precision].tolerance


@pytest.mark.parametrize("dtype", sorted(HALF))
def test_half_results_match_float64_within_their_tolerance(dtype):
    """Against float64 on the same (half) inputs: the output's own rounding included."""
    k = td.kernel(MATMUL, backend="pallas")
    args = _inputs(MATMUL, dtype, seed=4)
    got = k(*args)
    assert got.dtype == jnp.dtype(dtype)
    assert _relative_error(got, _float64(MATMUL, args)) <= HALF[dtype].tolerance


def _tf32(x: np.ndarray) -> np.ndarray:
    """float32 values rounded to TF32 (10 mantissa bits), to nearest with ties away from
    zero, as `cvt.rna.tf32.f32` does on the GPU."""
    bits = np.asarray(x, np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


@pytest.mark.parametrize("length", [64, 4096])
def test_the_stated_tf32_tolerance_holds_for_tf32_operand_rounding(length):
    """An emulation (operands rounded to TF32, exact products and sums) stays within the
    stated bound, and is far from exact float32: the bound is not vacuous."""
    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(64, length)), rng.normal(size=(length, 48))
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    exact = a32.astype(np.float64) @ b32.astype(np.float64)
    emulated = _tf32(a32).astype(np.float64) @ _tf32(b32).astype(np.float64)
    error = _relative_error(emulated, exact)
    assert MODES["highest"].tolerance < error <= MODES["default"].tolerance


def test_an_unknown_precision_is_a_worded_error():
    with pytest.raises(UnknownNameError, match=r"unknown precision 'tf32'") as caught:
        td.kernel(MATMUL, backend="pallas", precision="tf32")
    assert "expected None, 'default', 'high', 'highest' or a jax.lax.Precision" in str(caught.value)
    with pytest.raises(UnknownNameError, match="did you mean 'highest'"):
        td.kernel(MATMUL, backend="pallas", precision="higest")


@pytest.mark.parametrize("backend", ["reference", pytest.param("c", marks=NEEDS_C_COMPILER)])
@pytest.mark.parametrize("precision", sorted(MODES))
def test_other_back_ends_take_every_mode_exactly_on_the_cpu(backend, precision, monkeypatch):
    """c and reference accept every mode; on the CPU each is exact float32."""
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    k = td.kernel(CAUSAL_SUM, backend=backend, precision=precision)
    args = _inputs(CAUSAL_SUM, jnp.float32, seed=6)
    assert _relative_error(k(*args), _float64(CAUSAL_SUM, args)) <= MODES["highest"].tolerance
