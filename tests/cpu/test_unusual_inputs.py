"""Kernels with no tensor inputs, and inputs of every integer dtype, on every back end that
runs here (reference, C), against float64 NumPy; the CUDA sources are compile-checked."""

from __future__ import annotations

import importlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen import config
from codegen.cuda.run import nvrtc
from codegen.ir.functions import FUNCTIONS

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

BACKENDS = [
    "reference",
    pytest.param(
        "c",
        marks=pytest.mark.skipif(
            shutil.which(config.c_compiler()) is None,
            reason=f"no C compiler {config.c_compiler()!r} (set TENSORDSL_CC)",
        ),
    ),
]


NO_INPUTS = {
    "index_as_value": ("Y[i] := i", {"i": 3}, np.arange(3.0)),
    "constant": ("s := 2", None, np.float64(2.0)),
    "two_indices": (
        "Y[i,j] := i*j + 1",
        {"i": 2, "j": range(1, 4)},
        np.arange(2.0)[:, None] * np.arange(1.0, 4.0) + 1,
    ),
    "function_and_mask": (
        "Y[i] := exp(-i) * (i >= 1)",
        {"i": 4},
        np.exp(-np.arange(4.0)) * (np.arange(4) >= 1),
    ),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", NO_INPUTS)
def test_kernels_without_inputs(backend: str, name: str) -> None:
    source, ranges, expected = NO_INPUTS[name]
    k = td.kernel(source, ranges=ranges, backend=backend)
    assert k.inputs == ()
    for got in (k(), jax.jit(k)()):
        assert got.dtype == jnp.result_type(float)
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_kernels_whose_only_inputs_are_scalars_differentiate(backend: str) -> None:
    rng = np.random.default_rng(4)
    a, b = rng.uniform(0.5, 2.0, size=2)
    weights = rng.normal(size=5)
    k = td.kernel("Y[i] := a * i * i + b * a", ranges={"i": 5}, backend=backend)
    values = np.arange(5.0)
    np.testing.assert_allclose(np.asarray(k(a, b)), a * values**2 + b * a, rtol=1e-12)
    grads = jax.grad(lambda a, b: jnp.vdot(k(a, b), weights), (0, 1))(a, b)
    expected = (np.vdot(values**2 + b, weights), a * weights.sum())
    np.testing.assert_allclose(np.asarray(grads), expected, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", ["s := alpha", "Y[i] := alpha * (i + 1)"])
def test_max_of_python_scalars_differentiates(backend: str, source: str) -> None:
    # Found by the differential fuzzer: the saved argmax of weakly typed inputs is a weak
    # int32, which the C runner took for int64 (the FFI handler refused the call).
    alpha = float(np.random.default_rng(5).uniform(0.5, 2.0))
    ranges = {"i": 3} if "i" in source else None
    k = td.kernel(source, reduce="max", ranges=ranges, backend=backend)
    weights = np.arange(1.0, 4.0) if "i" in source else 1.0
    grad = jax.grad(lambda a: jnp.sum(k(a) * weights))(alpha)
    expected = np.sum(weights * np.arange(1.0, 4.0)) if "i" in source else 1.0
    np.testing.assert_allclose(float(grad), expected, rtol=1e-12)


UNARY = sorted(name for name, spec in FUNCTIONS.items() if spec.arity == 1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", UNARY)
def test_every_function_takes_an_index(backend: str, name: str) -> None:
    # Found by the differential fuzzer: the reference back end refused sigmoid(i) (jax's
    # sigmoid takes no integers).
    module, _, attribute = FUNCTIONS[name].reference.rpartition(".")
    function = getattr(importlib.import_module(module), attribute)
    X = np.random.default_rng(UNARY.index(name)).uniform(1, 2, 4)
    got = td.kernel(f"Y[i] := {name}(i + 1) * X[i]", backend=backend)(X)
    expected = np.asarray(function(np.arange(1.0, 5.0))) * X
    # atol: jax's gammaln(2) is 1.2e-15, libm's lgamma(2) exactly 0
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-12, atol=1e-14)


INTEGER_DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64"]


def integers(dtype: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """Random values over the dtype's whole range, with every index value among them."""
    info = np.iinfo(dtype) if dtype != "bool" else None
    if info is None:
        return rng.integers(0, 2, size).astype(bool)
    values = rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
    values[: size // 2] = np.arange(size // 2)  # some equal their index
    return rng.permutation(values)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", INTEGER_DTYPES)
def test_integer_inputs_promote_like_jnp(backend: str, dtype: str) -> None:
    rng = np.random.default_rng(INTEGER_DTYPES.index(dtype))
    M = integers(dtype, 12, rng)
    X = rng.normal(size=12)
    k = td.kernel("Y[i] := X[i] * M[i] + (M[i] == i)", backend=backend)
    got = k(X, M)
    assert got.dtype == jnp.result_type(X, M)
    index = np.arange(12)
    exact = np.array([int(m) == n for m, n in zip(M, index)])
    np.testing.assert_allclose(np.asarray(got), X * M.astype(np.float64) + exact, rtol=1e-12)
    gX = jax.grad(lambda x: jnp.vdot(k(x, M), X))(X)
    np.testing.assert_allclose(np.asarray(gX), M.astype(np.float64) * X, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["bool", "uint8", "int16", "uint32"])
def test_integer_only_inputs_give_the_default_float(backend: str, dtype: str) -> None:
    M = integers(dtype, 6, np.random.default_rng(7))
    got = td.kernel("s := M[i] * (i + 1)", backend=backend)(M)
    assert got.dtype == jnp.result_type(float)
    np.testing.assert_allclose(float(got), float(np.dot(M.astype(np.float64), np.arange(1, 7))))


@pytest.mark.parametrize("backend", BACKENDS)
def test_half_and_small_integers_stay_half(backend: str) -> None:
    rng = np.random.default_rng(8)
    X = rng.normal(size=5).astype(np.float16)
    M = rng.integers(0, 5, 5).astype(np.uint8)
    got = td.kernel("Y[i] := X[i] * M[i]", backend=backend)(X, M)
    assert got.dtype == jnp.result_type(X, M) == jnp.float16
    np.testing.assert_allclose(np.asarray(got, np.float64), X * M.astype(np.float64), rtol=1e-3)


@pytest.mark.skipif(not nvrtc.available(), reason='NVRTC unavailable: pip install "cupy-cuda13x"')
@pytest.mark.parametrize("name", NO_INPUTS)
def test_cuda_kernels_without_inputs_compile(name: str) -> None:
    from codegen.cuda.emit import emit_cuda

    source, ranges, _ = NO_INPUTS[name]
    nest = td.kernel(source, ranges=ranges).nest
    cuda = emit_cuda(nest, dtypes={nest.output: "float32"})
    assert f".entry {cuda.entry}(" in nvrtc.compile_source(cuda.text, arch="compute_80").ptx


# ---- Issue 27: inputs that raised a raw exception ----


@pytest.mark.parametrize("backend", [*BACKENDS, "cuda"])
@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "float8_e5m2", "int4"])
def test_unreadable_dtypes_are_refused_by_name(backend, dtype, monkeypatch):
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    X = jnp.asarray(np.random.default_rng(27).uniform(1, 3, 5), getattr(jnp, dtype))
    k = td.kernel("Y[i] := X[i] * 2", backend=backend)
    with pytest.raises(td.UnsupportedError, match=f"input 'X' has dtype {dtype}(.|\\n)*float32"):
        k(X)


@pytest.mark.parametrize("backend", BACKENDS)
def test_big_endian_input_says_byte_order(backend):
    X = np.random.default_rng(27).uniform(-1, 1, 5)
    k = td.kernel("Y[i] := X[i] * 2", backend=backend)
    with pytest.raises(td.InputError, match=r"byte order \(>f8\)(.|\n)*astype\('float64'\)"):
        k(X.astype(">f8"))
    np.testing.assert_allclose(np.asarray(k(X.astype(">f8").astype("float64"))), X * 2)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("source", ["Y[i] := self[i] * 2", "T[i] := self[i] * 2\nY[i] := T[i]"])
def test_an_input_named_self(backend, source):
    X = np.random.default_rng(28).uniform(-1, 1, 5)
    got = td.kernel(source, backend=backend)(self=X)
    got = got[0] if isinstance(got, tuple) else got
    np.testing.assert_allclose(np.asarray(got), X * 2, rtol=1e-6)
