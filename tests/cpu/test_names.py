"""User names never meet generated ones (issue 13: a scalar input `P0` was read as a loop bound,
an index named `int64_t` did not compile): whatever the user calls an index, a tensor or a
scalar, the generated C and CUDA are right."""

import numpy as np
import pytest

import tensordsl as td
from codegen.cuda.emit import emit_cuda
from codegen.cuda.run import nvrtc
from codegen.ir.nest import default_dtypes

# Names the generated code uses for itself, C keywords and types, and near misses.
NAMES = [
    "P0", "P1", "int64_t", "idx_t", "acc_", "val_", "pos_", "w_", "r_", "l_", "t0_", "o_i",
    "v_i", "in_X", "s_X_0", "out_", "out", "operands", "params", "work_", "rn_", "wn_",
    "nv_", "ptr_s", "INFINITY", "float", "double", "restrict", "expf", "threads_", "asked_",
]  # fmt: skip


@pytest.fixture(autouse=True)
def _kernels(monkeypatch):
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")  # these are about generated code


@pytest.mark.parametrize("name", NAMES)
def test_a_scalar_input_with_a_generated_name(name):
    x = np.arange(1.0, 4.0)
    k = td.kernel(f"Y[i] := X[i] * {name}", backend="c")
    np.testing.assert_allclose(np.asarray(k(x, 1e7)), x * 1e7, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(k(x, 2.0)), x * 2.0, rtol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_indices_with_generated_names(name):
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(7, 5)), rng.normal(size=(5, 33))
    other = "q" if name != "q" else "z"
    k = td.kernel(f"C[{name}, {other}] := A[{name}, kk] * B[kk, {other}]", backend="c")
    np.testing.assert_allclose(np.asarray(k(A, B)), A @ B, rtol=1e-12)
    conv = td.kernel(f"Y[{name}] := X[{name} + kk] * W[kk]", backend="c")
    x, w = rng.normal(size=40), rng.normal(size=3)
    want = np.array([x[i : i + 3] @ w for i in range(38)])
    np.testing.assert_allclose(np.asarray(conv(x, w)), want, rtol=1e-12)


@pytest.mark.parametrize("name", ["P0", "out_", "operands", "params", "in_X", "ptr_s"])
def test_tensors_with_generated_names(name):
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(4, 6)), rng.normal(size=6)
    k = td.kernel(f"Y[i] := {name}[i, j] * exp(B[j])", backend="c")
    np.testing.assert_allclose(np.asarray(k(a, b)), a @ np.exp(b), rtol=1e-12)


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC is not installed")
@pytest.mark.parametrize("name", ["P0", "int64_t", "idx_t", "acc_", "o_i", "ptr_s", "e_"])
def test_cuda_sources_with_generated_names_compile(name):
    for source in (f"Y[i] := X[i] * {name}", f"C[{name}, j] := A[{name}, k] * exp(B[k, j])"):
        nest = td.kernel(source).nest
        cuda = emit_cuda(nest, dtypes=default_dtypes(nest))
        nvrtc.compile_source(cuda.text, arch="compute_80")
