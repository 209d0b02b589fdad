"""The C back end called through XLA FFI (`ffi_call`) and through the `buffer_callback`
fallback: same numbers, the `TENSORDSL_CPU_CALL` knob, poisoning, threads, registration."""

from __future__ import annotations

import ctypes
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen import config
from codegen.c.run import ffi
from codegen.c.run.build import build_c, clear_memory_cache
from codegen.c.run.compiler import compile_c
from tensordsl.backends import c as cpu
from tensordsl.backends import reference
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.backends import NEEDS_C_COMPILER
from tests.corpus import CORPUS, make_inputs

pytestmark = NEEDS_C_COMPILER
needs_ffi = pytest.mark.skipif(ffi.include_dir() is None, reason="jaxlib has no FFI C headers")
TOLERANCE = {"float64": (1e-10, 1e-11), "float32": (2e-4, 2e-5)}  # rtol, atol
BY_NAME = {c.name: c for c in CORPUS}
# scalar_affine: the gradient nest of beta loops over X's extent, X not being its operand.
CASES = ["matmul", "scalar_affine", "row_max", "logsumexp_rows", "conv1d_strided"]
CALLBACK_TARGET = "xla_buffer_python_cpu_callback"
MATMUL = "C[i,j] := A[i,k] * B[k,j]"


@pytest.fixture(autouse=True)
def _poison(monkeypatch):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    # The matmul here is about how a generated kernel is called, not XLA's own dot.
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")


def kernel(case):
    return td.kernel(case.source, reduce=case.reduce, ranges=case.ranges, backend="c")


def cast(inputs, dtype):
    return {
        n: np.asarray(v, dtype) if np.issubdtype(np.asarray(v).dtype, np.floating) else v
        for n, v in inputs.items()
    }


def custom_calls(function, *args):
    """Targets of the custom calls in the lowered program, in order."""
    text = jax.jit(function).lower(*args).as_text()
    return [
        line.split("@")[1].split("(")[0] for line in text.splitlines() if "custom_call @" in line
    ]


@pytest.mark.parametrize("mode", ["ffi", "callback"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", CASES)
def test_forward_under_jit(name, dtype, mode, monkeypatch):
    if mode == "ffi" and ffi.include_dir() is None:
        pytest.skip("jaxlib has no FFI C headers")
    monkeypatch.setenv("TENSORDSL_CPU_CALL", mode)
    case = BY_NAME[name]
    inputs = cast(make_inputs(case), dtype)
    k = kernel(case)
    f = jax.jit(lambda **kw: k(**kw))
    rtol, atol = TOLERANCE[dtype]
    want = case.expected(**make_inputs(case))
    np.testing.assert_allclose(np.asarray(f(**inputs)), want, rtol=rtol, atol=atol)
    targets = custom_calls(lambda kw: k(**kw), inputs)
    assert targets, "the C kernel was not called through a custom call"
    if mode == "ffi":
        assert all(t.startswith("tdsl_") for t in targets), targets
    else:
        assert set(targets) == {CALLBACK_TARGET}, targets


@pytest.mark.parametrize("mode", ["ffi", "callback"])
@pytest.mark.parametrize("name", CASES)
def test_gradients_under_jit(name, mode, monkeypatch):
    if mode == "ffi" and ffi.include_dir() is None:
        pytest.skip("jaxlib has no FFI C headers")
    monkeypatch.setenv("TENSORDSL_CPU_CALL", mode)
    case = BY_NAME[name]
    inputs = make_inputs(case)
    names = [n for n in kernel(case).inputs if np.asarray(inputs[n]).dtype.kind == "f"]
    nest = lower(parse(case.source), reduce=case.reduce, ranges=case.ranges).nest
    shapes = {n: np.shape(v) for n, v in inputs.items()}
    cotangent = np.random.default_rng(5).normal(size=np.shape(case.expected(**inputs)))
    k = kernel(case)

    def loss_c(*values):
        return jnp.sum(k(**{**inputs, **dict(zip(names, values))}) * cotangent)

    def loss_reference(*values):
        out = reference.evaluate(nest, {**inputs, **dict(zip(names, values))}, shapes)
        return jnp.sum(out * cotangent)

    primals = [jnp.asarray(inputs[n], jnp.float64) for n in names]
    argnums = tuple(range(len(names)))
    got = jax.jit(jax.grad(loss_c, argnums))(*primals)
    want = jax.grad(loss_reference, argnums)(*primals)
    for n, g, w in zip(names, got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-9, atol=1e-10, err_msg=n)


@needs_ffi
def test_gradient_nest_with_non_operand_extents_uses_ffi(monkeypatch):
    monkeypatch.setenv("TENSORDSL_CPU_CALL", "ffi")
    case = BY_NAME["scalar_affine"]
    inputs = make_inputs(case)
    k = kernel(case)
    targets = custom_calls(
        jax.grad(lambda beta: jnp.sum(k(**{**inputs, "beta": beta}))), jnp.float64(0.5)
    )
    # Only the gradient nest runs: the unused forward call is removed.
    assert [t.split("_")[:3] for t in targets] == [["tdsl", "dbeta", "forward"]], targets
    got = jax.jit(jax.grad(lambda beta: jnp.sum(k(**{**inputs, "beta": beta}) ** 2)))(0.5)
    alpha, x = inputs["alpha"], inputs["X"]
    np.testing.assert_allclose(got, np.sum(2 * (alpha * x + 0.5)), rtol=1e-12)


@needs_ffi
def test_vmap_is_sequential_and_right(monkeypatch):
    monkeypatch.setenv("TENSORDSL_CPU_CALL", "ffi")
    k = td.kernel(MATMUL, backend="c")
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(3, 4, 5)), rng.normal(size=(5, 2))
    got = jax.jit(jax.vmap(lambda x: k(A=x, B=b)))(a)
    np.testing.assert_allclose(np.asarray(got), a @ b, rtol=1e-12)


@needs_ffi
@pytest.mark.parametrize("m, k, n", [(1, 1, 1), (3, 0, 4), (0, 2, 3), (7, 13, 5)])
def test_extents_one_zero_and_primes(m, k, n, monkeypatch):
    monkeypatch.setenv("TENSORDSL_CPU_CALL", "ffi")
    kern = td.kernel(MATMUL, backend="c")
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a, b = rng.normal(size=(m, k)), rng.normal(size=(k, n))
    got = jax.jit(lambda x, y: kern(A=x, B=y))(a, b)
    np.testing.assert_allclose(np.asarray(got), a @ b, rtol=1e-12, atol=1e-14)


def test_knob_rejects_unknown_values(monkeypatch):
    monkeypatch.setenv("TENSORDSL_CPU_CALL", "ctypes")
    wording = "TENSORDSL_CPU_CALL='ctypes' is not a way to call a C kernel\nexpected one of ffi"
    with pytest.raises(ValueError, match=wording):
        config.cpu_call()
    monkeypatch.setenv("TENSORDSL_CPU_CALL", " CALLBACK ")
    assert config.cpu_call() == "callback"
    monkeypatch.delenv("TENSORDSL_CPU_CALL")
    assert config.cpu_call() == "ffi"


@needs_ffi
def test_poison_flag_reaches_the_handler(monkeypatch):
    k = td.kernel(MATMUL, backend="c")
    a = np.ones((2, 3))
    for flag, text in (("1", "poison = 1 : i32"), ("0", "poison = 0 : i32")):
        monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", flag)
        lowered = jax.jit(lambda x: k(A=x, B=x.T)).lower(a).as_text()
        assert text in lowered


# A hand-written "kernel" that writes only out[0] (= params[0] + operand 0's first element):
# what an unwritten element looks like through the handler, with and without poisoning.
PARTIAL = """\
#include <stdint.h>
void tdsl_partial_{t}(void *out, const void *const *operands, const int64_t *params) {{
    (({c} *)out)[0] = ({c})params[0] + (({c} *)operands[0])[0];
}}
"""


def partial_target(dtype: str, ctype: str) -> str:
    entry = f"tdsl_partial_{dtype}"
    text = PARTIAL.format(t=dtype, c=ctype)
    text += "\n" + ffi.handler_source(entry, [dtype], dtype, 2)
    folder = ffi.include_dir()
    assert folder is not None
    library = compile_c(text, key=("test", ffi.header_digest()), include_dirs=[folder])
    handler = getattr(ctypes.CDLL(str(library)), ffi.handler_name(entry))
    name = f"{entry}_{library.stem[:16]}"
    jax.ffi.register_ffi_target(name, jax.ffi.pycapsule(handler), platform="cpu", api_version=1)
    return name


@needs_ffi
@pytest.mark.parametrize(
    "dtype, ctype, unwritten",
    [("float32", "float", np.isnan), ("float64", "double", np.isnan), ("int32", "int32_t", None)],
)
def test_handler_poisons_unwritten_elements(dtype, ctype, unwritten):
    target = partial_target(dtype, ctype)
    x = np.full((3, 2), 5, dtype)

    def call(poison, params=(7, 0)):
        result = jax.ShapeDtypeStruct((3, 2), dtype)
        return jax.ffi.ffi_call(target, result)(
            x, params=np.array(params, np.int64), poison=np.int32(poison)
        )

    out = np.asarray(jax.jit(lambda: call(1))())
    assert out.ravel()[0] == 12
    rest = out.ravel()[1:]
    assert np.all(unwritten(rest)) if unwritten else np.all(rest == -1)
    with pytest.raises(Exception, match="needs params, 2 int64"):
        jax.jit(lambda: call(0, params=(1, 2, 3)))().block_until_ready()


@needs_ffi
def test_handler_checks_element_types():
    target = partial_target("float32", "float")
    call = jax.ffi.ffi_call(target, jax.ShapeDtypeStruct((2,), np.float32))
    with pytest.raises(Exception, match="operand 0 is not float32"):
        call(np.ones(2, np.float64), params=np.zeros(2, np.int64), poison=np.int32(0))
    with pytest.raises(Exception, match="expected 1 operands, 1 output"):
        call(params=np.zeros(2, np.int64), poison=np.int32(0))


def test_fallback_without_ffi_headers(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TENSORDSL_CPU_CALL", "ffi")
    monkeypatch.setattr(ffi, "include_dir", lambda: None)
    k = td.kernel(MATMUL, backend="c")
    a = np.random.default_rng(2).normal(size=(3, 3))
    assert custom_calls(lambda x: k(A=x, B=x), a) == [CALLBACK_TARGET]
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: k(A=x, B=x))(a)), a @ a, rtol=1e-12)
    dtypes = {"A": "float64", "B": "float64", "C": "float64"}
    assert build_c(k.nest, dtypes=dtypes).ffi_handler is None


@needs_ffi
def test_fallback_when_the_handler_does_not_build(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TENSORDSL_CPU_CALL", "ffi")
    monkeypatch.setattr(ffi, "handler_source", lambda *args: "this is not C;\n")
    k = td.kernel(MATMUL, backend="c")
    a = np.random.default_rng(3).normal(size=(2, 2))
    with pytest.warns(UserWarning, match="FFI handler of tdsl_C_forward_.* did not build"):
        targets = custom_calls(lambda x: k(A=x, B=x), a)
    assert targets == [CALLBACK_TARGET]
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: k(A=x, B=x))(a)), a @ a, rtol=1e-12)


@needs_ffi
def test_registering_twice_is_harmless(tmp_path, monkeypatch):
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))
    k = td.kernel(MATMUL, backend="c")
    dtypes = {"A": "float64", "B": "float64", "C": "float64"}
    compiled = build_c(k.nest, dtypes=dtypes)
    name = cpu.register_ffi_target(compiled)
    assert cpu.register_ffi_target(compiled) == name
    clear_memory_cache()  # a reload gives the same library, so the same name and handler
    again = build_c(k.nest, dtypes=dtypes)
    assert again is not compiled and cpu.register_ffi_target(again) == name
    capsule = jax.ffi.pycapsule(compiled.ffi_handler)
    jax.ffi.register_ffi_target(name, capsule, platform="cpu", api_version=1)
    a = np.random.default_rng(4).normal(size=(3, 3))
    np.testing.assert_allclose(np.asarray(jax.jit(lambda x: k(A=x, B=x))(a)), a @ a, rtol=1e-12)


@pytest.mark.parametrize("mode", ["ffi", "callback"])
def test_two_threads_call_concurrently(mode, tmp_path, monkeypatch):
    if mode == "ffi" and ffi.include_dir() is None:
        pytest.skip("jaxlib has no FFI C headers")
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))  # both threads build and register
    monkeypatch.setenv("TENSORDSL_CPU_CALL", mode)
    k = td.kernel(MATMUL, backend="c")
    rng = np.random.default_rng(6)
    inputs = [rng.normal(size=(2, 5, 4)) for _ in range(2)]
    b = rng.normal(size=(4, 3))
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def work(a):
        try:
            barrier.wait()  # both trace, build and register the same kernel at once
            for _ in range(3):
                f = jax.jit(lambda x: k(A=x[0], B=b) + k(A=x[1], B=b))
                for _ in range(20):
                    np.testing.assert_allclose(np.asarray(f(a)), a[0] @ b + a[1] @ b, rtol=1e-12)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(a,)) for a in inputs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@needs_ffi
@pytest.mark.parametrize("name", CASES)
def test_the_direct_lowering_is_the_traced_one(name, monkeypatch):
    """`nest_p` lowers a kernel's FFI call directly, without tracing the runner
    (`Backend.ffi_call`): the program of a jitted forward and gradients is the same text as
    with the runner traced, and no runner was traced for it."""
    from tensordsl.binding import primitive

    monkeypatch.setenv("TENSORDSL_CPU_CALL", "ffi")
    case = BY_NAME[name]
    inputs = make_inputs(case)
    names = [n for n in kernel(case).inputs if np.asarray(inputs[n]).dtype.kind == "f"]
    k = kernel(case)

    def loss(*values):
        out = k(**{**inputs, **dict(zip(names, values))})
        return jnp.sum(jnp.sin(out))

    primals = [jnp.asarray(inputs[n]) for n in names]
    traced = []
    runner = primitive._traced_lowering

    def counted(*args, **params):
        traced.append(params["nest"].output)
        return runner(*args, **params)

    def text():  # a new function each time: JAX's caches hold the last lowering
        function = jax.value_and_grad(lambda *v: loss(*v), tuple(range(len(names))))
        return jax.jit(function).lower(*primals).as_text()

    monkeypatch.setattr(primitive, "_traced_lowering", counted)
    direct = text()
    assert traced == [] and "custom_call @tdsl_" in direct
    monkeypatch.setattr(primitive, "_direct_ffi_call", lambda avals, params: None)
    assert text() == direct
    assert traced, "the runner was not traced with the direct lowering off"
