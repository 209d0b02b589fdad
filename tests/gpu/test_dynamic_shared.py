"""A staged tile past 48 KB uses dynamic shared memory (`extern __shared__`), launched with
its size: under the emulator through the FFI handler, the callback and directly."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from codegen.cuda.emit import emit_cuda
from codegen.cuda.emulator import emulate
from codegen.cuda.schedule import choose_gpu_schedule
from codegen.cuda.staged.shared import STATIC_SHARED_LIMIT
from tensordsl.backends import cuda as gpu
from tensordsl.errors import UnsupportedError
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.gpu import emulated

pytestmark = pytest.mark.skipif(not emulate.available(), reason="no CUDA emulator here")
MATMUL = "C[i,j] := A[i,k] * B[k,j]"
FLOATS = {"A": "float32", "B": "float32", "C": "float32"}


def _wide_schedule(tile_k: int):  # type: ignore[no-untyped-def]
    nest = lower(parse(MATMUL)).nest
    return nest, dataclasses.replace(choose_gpu_schedule(nest, kernel=True), tile_k=tile_k)


def test_a_tile_within_48_kb_stays_static() -> None:
    nest, schedule = _wide_schedule(16)
    source = emit_cuda(nest, dtypes=FLOATS, schedule=schedule)
    assert source.shared == 0 and "extern __shared__" not in source.text


@pytest.mark.parametrize("call", ["ffi", "callback"])
def test_a_tile_past_48_kb_runs_in_dynamic_shared_memory(monkeypatch, call: str) -> None:
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    monkeypatch.setenv("TENSORDSL_GPU_CALL", call)
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    nest, schedule = _wide_schedule(128)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((70, 300)), rng.standard_normal((300, 45))
    operands = [jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)]
    source = gpu.prepare(nest, operands, {}, "float32", schedule).source
    assert STATIC_SHARED_LIMIT < source.shared == 128 * (65 + 65) * 4  # rows of 64 + 1
    assert "extern __shared__ __align__(16) unsigned char smem_[];" in source.text
    with jax.default_device(jax.devices("cpu")[0]):
        got = gpu.run_cuda(nest, operands, {}, "float32", schedule=schedule)
    np.testing.assert_allclose(np.asarray(got, np.float64), a @ b, rtol=1e-4, atol=1e-3)


def test_the_direct_emulated_launch_passes_the_size() -> None:
    nest, schedule = _wide_schedule(128)
    inst = emulated.Instance("matmul", "forward", nest, {}, {})
    rng = np.random.default_rng(6)
    arrays = [rng.standard_normal((20, 130)), rng.standard_normal((130, 17))]
    la = gpu.prepare(nest, [np.asarray(x, np.float32) for x in arrays], {}, "float32", schedule)
    got = emulated.run_arrays(la, [np.asarray(x, np.float32) for x in arrays], what=inst.id)
    np.testing.assert_allclose(got, arrays[0] @ arrays[1], rtol=1e-4, atol=1e-3)
    assert la.source.shared > STATIC_SHARED_LIMIT


def test_a_tile_past_the_device_limit_is_refused(monkeypatch) -> None:
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    nest, schedule = _wide_schedule(512)  # 512 * 130 * 4 bytes: past 227 KB
    operands = [jnp.ones((8, 8), jnp.float32), jnp.ones((8, 8), jnp.float32)]
    message = r"needs 266240 bytes of shared memory per block; this device allows 232448"
    with pytest.raises(UnsupportedError, match=message):
        gpu.run_cuda(nest, operands, {}, "float32", schedule=schedule)
