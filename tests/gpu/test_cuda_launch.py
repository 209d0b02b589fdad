"""The CUDA launch path without Python per call (codegen/cuda/run/ffi.cc), tested on the CPU.

The handler library builds against `cuda.h` and jaxlib's FFI headers and loads without a
driver; its emulated twin runs the same attribute parsing, dtype checks, argument packing
and poisoning with the CUDA emulator standing in for `cuLaunchKernel`. Also the runner's
knobs (`TENSORDSL_CUDA_EMULATE`, `TENSORDSL_GPU_CALL`) inside `jit`, `grad` and `vmap`.
"""

from __future__ import annotations

import ctypes
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen import config
from codegen.cuda.emit import emit_cuda
from codegen.cuda.emulator import emulate
from codegen.cuda.run import launch as cuda_launch
from codegen.cuda.run import nvrtc
from tensordsl.backends import cuda as gpu
from tensordsl.backends import table
from tensordsl.errors import UnsupportedError
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

REASON = emulate.unavailable_reason() or cuda_launch.unavailable_reason()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CUDA launch handler: {REASON}")
MATMUL = "C[i,j] := A[i,k] * B[k,j]"

RECORD = """
extern "C" __global__ void record(long long *out, const float *a, const int *b,
                                  long long p0, long long p1, long long p2) {
    if (blockIdx.x != 1 || threadIdx.x != 5) return;
    out[0] = (long long)(a[1] * 4);
    out[1] = b[2];
    out[2] = p0; out[3] = p1; out[4] = p2;
    out[5] = gridDim.x * 1000 + blockDim.x;
}"""
SILENT = """
extern "C" __global__ void silent(double *out, const double *x) {}"""
STUCK = """
extern "C" __global__ void stuck(double *out, const double *x) {
    if (threadIdx.x == 0) return;
    __syncwarp();
}"""
# Two passes sharing scratch space: the first writes a value per block, the second sums them.
PASSES = """
extern "C" __global__ void partial(double *out, const double *x, unsigned char *ws, long long n) {
    double *part = (double *)ws;
    if (threadIdx.x == 0) part[blockIdx.x] = x[blockIdx.x] * (blockIdx.x + 1);
}
extern "C" __global__ void total(double *out, const double *x, unsigned char *ws, long long n) {
    const double *part = (const double *)ws;
    double sum = 0;
    for (long long b = 0; b < n; ++b) sum += part[b];
    if (threadIdx.x == 0) out[0] = sum;
}"""


@pytest.fixture(autouse=True)
def _on_the_cpu():
    """The emulated handler serves XLA's host platform, also where a GPU is the default."""
    with jax.default_device(jax.devices("cpu")[0]):
        yield


@pytest.fixture(scope="module")
def kernels() -> dict[str, emulate.EmulatedKernel]:
    built = emulate.build(
        [
            (RECORD, "record"),
            (SILENT, "silent"),
            (STUCK, "stuck"),
            (PASSES, "partial"),
            (PASSES, "total"),
        ]
    )
    return {k.entry: k for k in built}


def call(kernel, result, operands, dtypes, params=(), grid=(2, 1, 1), block=(32, 1, 1), **kw):
    return call_passes([(kernel, grid)], result, operands, dtypes, params, block, **kw)


def call_passes(passes, result, operands, dtypes, params=(), block=(32, 1, 1), **kw):
    """`ffi_call` to the emulated handler launching `(kernel, grid)` pairs in order."""
    target = gpu._register("tdsl_cuda_launch_emulated", "cpu")
    attributes = cuda_launch.launch_attributes(
        str(passes[0][0].library).encode(),
        [(kernel.entry, grid) for kernel, grid in passes],
        block=block,
        params=params,
        dtypes=dtypes,
        **kw,
    )
    return jax.ffi.ffi_call(target, result)(*operands, **attributes)


def test_the_handler_library_loads_without_a_driver() -> None:
    assert (cuda_launch.driver_include_dir() / "cuda.h").is_file()
    for name in cuda_launch.HANDLERS:
        assert cuda_launch.handler(name) is not None
    error = cuda_launch.driver_error()
    assert error == "" or error.startswith("cannot open the CUDA driver: libcuda.so.1")


def test_arguments_are_packed_as_the_kernel_signature_declares(kernels) -> None:
    a = jnp.arange(4, dtype=jnp.float32)
    b = jnp.array([7, 8, 9], jnp.int32)
    result = jax.ShapeDtypeStruct((6,), jnp.int64)
    params = [3, -(2**40), 2**62]
    dtypes = ["int64", "float32", "int32"]

    def launch(a, b):
        return call(kernels["record"], result, [a, b], dtypes, params, block=(64, 1, 1))

    out = jax.jit(launch)(a, b)
    assert np.asarray(out).tolist()[:5] == [4, 9, *params]
    assert int(out[5]) == 2064


@pytest.mark.parametrize(
    "source, dtype", [(MATMUL, "float16"), ("Y[i] := alpha * X[i] + beta", "float64")]
)
def test_generated_kernels_take_pointers_then_int64_parameters(source: str, dtype: str) -> None:
    nest = lower(parse(source)).nest
    dtypes = {name: dtype for name in (*nest.operand_names, nest.output)}
    emitted = emit_cuda(nest, dtypes=dtypes)
    kernel = emulate.kernel(emitted.text, emitted.entry)
    pointers = 1 + len(nest.operands)  # the output, then every operand (scalars too)
    assert kernel.signature == ("p",) * pointers + ("i8",) * len(emitted.parameters)


def test_poison_fills_the_output_first(kernels) -> None:
    x = jnp.ones(3)
    result = jax.ShapeDtypeStruct((5,), jnp.float64)
    poisoned = call(kernels["silent"], result, [x], ["float64", "float64"], poison=True)
    assert np.isnan(np.asarray(poisoned)).all()


@pytest.mark.parametrize(
    "dtypes, message",
    [
        (["float64", "float32"], "operand 0 is not float32"),
        (["float32", "float64"], "the output is not float32"),
        (["float64"], "expected 0 operands, 1 output and 0 scratch outputs"),
    ],
)
def test_mismatched_buffers_are_an_error(kernels, dtypes, message: str) -> None:
    result = jax.ShapeDtypeStruct((2,), jnp.float64)
    with pytest.raises(Exception, match=message):
        jax.block_until_ready(call(kernels["silent"], result, [jnp.ones(2)], dtypes))


def test_passes_run_in_order_and_share_scratch_outputs(kernels) -> None:
    x = jnp.array([1.5, -2.0, 4.0])
    result = (jax.ShapeDtypeStruct((1,), jnp.float64), jax.ShapeDtypeStruct((24,), jnp.uint8))
    passes = [(kernels["partial"], (3, 1, 1)), (kernels["total"], (1, 1, 1))]
    dtypes = ["float64", "float64", "uint8"]
    out, scratch = call_passes(passes, result, [x], dtypes, [3], scratch=1, poison=True)
    assert float(out[0]) == 1.5 - 4.0 + 12.0
    np.testing.assert_array_equal(np.asarray(scratch).view(np.float64), [1.5, -4.0, 12.0])
    with pytest.raises(Exception, match="scratch output 0 is not float32"):
        jax.block_until_ready(
            call_passes(passes, result, [x], [*dtypes[:2], "float32"], [3], scratch=1)
        )


def test_a_grid_is_needed_for_every_pass(kernels) -> None:
    result = jax.ShapeDtypeStruct((2,), jnp.float64)
    attributes = cuda_launch.launch_attributes(
        str(kernels["silent"].library).encode(),
        [("silent", (1, 1, 1)), ("silent", (1, 1, 1))],
        block=(32, 1, 1),
        params=[],
        dtypes=["float64", "float64"],
    )
    attributes["grid"] = attributes["grid"][:4]
    target = gpu._register("tdsl_cuda_launch_emulated", "cpu")
    with pytest.raises(Exception, match="grid has 4 values for 2 entries; expected 3 per entry"):
        jax.block_until_ready(jax.ffi.ffi_call(target, result)(jnp.ones(2), **attributes))


def test_a_deadlock_is_an_error_through_xla(kernels) -> None:
    result = jax.ShapeDtypeStruct((2,), jnp.float64)
    with pytest.raises(Exception, match=r"(?s)stuck: deadlock .* wait at __syncwarp at stuck.cu:4"):
        jax.block_until_ready(call(kernels["stuck"], result, [jnp.ones(2)], ["float64"] * 2))


def test_image_id_depends_on_the_image_and_the_entry() -> None:
    ids = {cuda_launch.image_id(i, e) for i in (b"a", b"b") for e in ("x", "y")}
    assert len(ids) == 4 and all(0 <= i < 2**63 for i in ids)


def custom_call_targets(function, *args) -> list[str]:
    text = jax.jit(function).lower(*args).as_text()
    calls = [line for line in text.splitlines() if "custom_call @" in line]
    return [line.split("@")[1].split("(")[0] for line in calls]


@pytest.mark.parametrize("mode, order", [("ffi", "1"), ("callback", "reverse")])
def test_emulated_backend_under_jit_grad_and_vmap(monkeypatch, mode: str, order: str) -> None:
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", order)
    monkeypatch.setenv("TENSORDSL_GPU_CALL", mode)
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")  # the matmul's kernel, not XLA's dot
    k = td.kernel(MATMUL, backend="cuda")
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(37, 29)), rng.normal(size=(29, 41))
    weights = np.cos(np.arange(37 * 41)).reshape(37, 41)

    def loss(a, b):
        return jnp.sum(k(jnp.sin(a), b) * weights)

    got = jax.jit(jax.grad(loss, argnums=(0, 1)))(a, b)
    want = jax.grad(lambda a, b: jnp.sum((jnp.sin(a) @ b) * weights), argnums=(0, 1))(a, b)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
    batched = jax.vmap(k, in_axes=(0, None))(np.stack([a, -2 * a]), b)
    np.testing.assert_allclose(batched[1], -2 * a @ b, rtol=1e-10, atol=1e-10)
    targets = custom_call_targets(k, a, b)
    expected = "tdsl_cuda_launch_emulated_" if mode == "ffi" else "xla_buffer_python_cpu_callback"
    assert [t.startswith(expected) for t in targets] == [True]


def test_auto_backend_is_unchanged_by_emulation(monkeypatch) -> None:
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "0")
    unemulated = table.resolve_backend("auto")
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    assert table.resolve_backend("auto") == unemulated
    assert unemulated == ("cuda" if jax.default_backend() == "gpu" else "c")


def test_the_cuda_backend_without_gpu_or_emulation_says_how_to_emulate(monkeypatch) -> None:
    monkeypatch.delenv("TENSORDSL_CUDA_EMULATE", raising=False)
    if jax.default_backend() == "gpu":
        pytest.skip("a GPU is present")
    with pytest.raises(UnsupportedError, match="TENSORDSL_CUDA_EMULATE=1"):
        td.kernel(MATMUL, backend="cuda")(np.ones((2, 3)), np.ones((3, 2)))


@pytest.mark.parametrize(
    "name, value", [("TENSORDSL_CUDA_EMULATE", "yes"), ("TENSORDSL_GPU_CALL", "cupy")]
)
def test_bad_knob_values_are_refused(monkeypatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=f"{name}={value!r} is not an? .*\nexpected one of"):
        config.cuda_emulate() if name.endswith("EMULATE") else config.gpu_call()


@pytest.mark.skipif(not nvrtc.available(), reason="NVRTC unavailable")
def test_the_ffi_path_gets_a_cubin_or_ptx_for_the_devices() -> None:
    nest = lower(parse(MATMUL)).nest
    source = emit_cuda(nest, dtypes={"A": "float32", "B": "float32", "C": "float32"})
    cubin = gpu._image(source, [SimpleNamespace(compute_capability="9.0")] * 2)
    assert cubin[:4] == b"\x7fELF"
    mixed = [SimpleNamespace(compute_capability="9.0"), SimpleNamespace(compute_capability="8.0")]
    ptx = gpu._image(source, mixed)
    assert b".target sm_80" in ptx and ptx.endswith(b"\0")
    assert f".entry {source.entry}(".encode() in ptx


def _cache_entries() -> int:
    function = cuda_launch.library().tdsl_cuda_cache_entries
    function.restype = ctypes.c_longlong
    return int(function())


def test_a_failed_load_leaves_nothing_in_the_cache(kernels) -> None:
    # The fault: an entry the library does not have. The same error every time, no entry left.
    result = jax.ShapeDtypeStruct((2,), jnp.float64)
    library = str(kernels["silent"].library)
    bad = [(SimpleNamespace(library=library, entry="missing_kernel"), (1, 1, 1))]
    before = _cache_entries()
    for _ in range(2):
        with pytest.raises(Exception, match=r"has no kernel missing_kernel"):
            jax.block_until_ready(call_passes(bad, result, [jnp.ones(2)], ["float64"] * 2))
        assert _cache_entries() == before
    good = [(kernels["silent"], (1, 1, 1))]
    jax.block_until_ready(call_passes(good, result, [jnp.ones(2)], ["float64"] * 2))
    assert _cache_entries() <= before + 1


class _ApiVersion(ctypes.Structure):
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("major_version", ctypes.c_int),
        ("minor_version", ctypes.c_int),
    ]


class _Metadata(ctypes.Structure):  # XLA_FFI_Metadata
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("api_version", _ApiVersion),
        ("traits", ctypes.c_uint32),
        ("state_type_id", ctypes.c_int64),
    ]


class _MetadataExtension(ctypes.Structure):  # XLA_FFI_Metadata_Extension
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("type", ctypes.c_int),
        ("next", ctypes.c_void_p),
        ("metadata", ctypes.POINTER(_Metadata)),
    ]


class _CallFrame(ctypes.Structure):  # the head of XLA_FFI_CallFrame, zeros after it
    _fields_ = [
        ("struct_size", ctypes.c_size_t),
        ("extension_start", ctypes.c_void_p),
        ("rest", ctypes.c_byte * 512),
    ]


COMMAND_BUFFER_COMPATIBLE = 1  # XLA_FFI_HANDLER_TRAITS_COMMAND_BUFFER_COMPATIBLE
METADATA_EXTENSION = 1  # XLA_FFI_Extension_Metadata


@pytest.mark.parametrize("name", cuda_launch.HANDLERS)
def test_the_handlers_may_be_captured_in_cuda_graphs(name: str) -> None:
    # XLA asks a handler for its metadata with a call frame holding the metadata extension.
    metadata = _Metadata(struct_size=ctypes.sizeof(_Metadata), traits=0xDEAD)
    extension = _MetadataExtension(
        struct_size=ctypes.sizeof(_MetadataExtension),
        type=METADATA_EXTENSION,
        metadata=ctypes.pointer(metadata),
    )
    frame = _CallFrame(struct_size=ctypes.sizeof(_CallFrame))
    frame.extension_start = ctypes.addressof(extension)
    address = ctypes.cast(cuda_launch.handler(name), ctypes.c_void_p).value
    handler = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p)(address)
    assert handler(ctypes.addressof(frame)) is None  # no XLA_FFI_Error
    assert metadata.traits == COMMAND_BUFFER_COMPATIBLE
    assert metadata.api_version.major_version >= 0
    assert metadata.api_version.struct_size == ctypes.sizeof(_ApiVersion)
