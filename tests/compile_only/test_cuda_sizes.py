"""What NVRTC hands over is whole, and kernels are right at every size: the CUBIN has every
byte NVRTC reports, extents past 2^31 get 64-bit index arithmetic, tiles past 48 KB of
shared memory ask for it dynamically. Needs NVRTC only, no GPU."""

from __future__ import annotations

import struct

import pytest

from codegen.cuda.emit import emit_cuda
from codegen.cuda.run import nvrtc
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.skipif(
    not nvrtc.available(), reason='NVRTC unavailable: pip install "cupy-cuda13x[ctk]"'
)
MATMUL = "C[i,j] := A[i,k] * B[k,j]"


def _elf_extent(image: bytes) -> int:
    """Where the last section, segment or header table of a 64-bit ELF image ends."""
    phoff, shoff = struct.unpack_from("<QQ", image, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", image, 0x36)
    ends = [phoff + phentsize * phnum, shoff + shentsize * shnum]
    for n in range(shnum):
        kind = struct.unpack_from("<I", image, shoff + n * shentsize + 4)[0]
        offset, size = struct.unpack_from("<QQ", image, shoff + n * shentsize + 0x18)
        ends.append(offset + size * (kind != 8))  # SHT_NOBITS takes no room in the file
    for n in range(phnum):
        offset = struct.unpack_from("<Q", image, phoff + n * phentsize + 8)[0]
        ends.append(offset + struct.unpack_from("<Q", image, phoff + n * phentsize + 0x20)[0])
    return max(ends)


def _matmul_source(dtype: str = "float32") -> str:
    nest = lower(parse(MATMUL)).nest
    return emit_cuda(nest, dtypes={"A": dtype, "B": dtype, "C": dtype}).text


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_cubin_has_every_byte_nvrtc_reports(dtype: str) -> None:
    text = _matmul_source(dtype)
    image = nvrtc.compile_source(text, arch="sm_90").binary
    assert image[:4] == b"\x7fELF"
    assert len(image) == _elf_extent(image)  # CuPy's getCUBIN and a NUL strip cut the end
    program = nvrtc._nvrtc().createProgram(text, "again.cu", [], [])
    try:
        flags = ["--gpu-architecture=sm_90", "--std=c++17"]
        nvrtc._nvrtc().compileProgram(program, flags + [f"-I{d}" for d in nvrtc.include_dirs()])
        assert nvrtc.cubin(program) == image
    finally:
        nvrtc._nvrtc().destroyProgram(program)


def test_no_openmp_pragma_in_cuda_source() -> None:
    from tests.compile_only.nests import all_nests, dtypes

    nested = 0
    for named in all_nests():
        text = emit_cuda(named.nest, dtypes=dtypes(named)).text
        assert "omp" not in text, named.id
        nested += "sum_" in str(named.nest) or "Reduce(" in repr(named.nest.terms)
    assert nested  # some nest has a nested sum, where the C emitter writes the pragma


@pytest.mark.parametrize("source", [MATMUL, "C[i,j] := A[k,i] * B[j,k]"])
def test_staged_tiles_have_no_bank_conflicts(source: str) -> None:
    from codegen.cuda.staged.tiles import store_conflicts

    nest = lower(parse(source)).nest
    text = emit_cuda(nest, dtypes={"A": "float32", "B": "float32", "C": "float32"}).text
    for array, contiguous_k in (("As_", "A[i,k]" in source), ("Bs_", "B[j,k]" in source)):
        tk, pitch = (int(n) for n in text.split(f"{array}[", 1)[1].split("];")[0].split("]["))
        assert store_conflicts(pitch, 64, tk, contiguous_k) == 1, (array, pitch)
    assert store_conflicts(65, 64, 16, True) == 2  # the old padding, for A[i,k]


@pytest.mark.parametrize(
    "source, shapes, index",
    [
        ("Y[i] := X[i] * 2", {"X": (2**31 + 5,)}, "long long"),
        ("Y[i] := X[i] * 2", {"X": (1000,)}, "int"),
        (MATMUL, {"A": (3, 2**30), "B": (2**30, 2)}, "long long"),  # small output, long k
        (MATMUL, {"A": (64, 32), "B": (32, 48)}, "int"),
    ],
)
def test_the_index_type_follows_the_shapes(source: str, shapes: dict, index: str) -> None:
    import jax

    from tensordsl.backends import cuda as gpu

    nest = lower(parse(source)).nest
    operands = [jax.ShapeDtypeStruct(shapes[op.name], "float16") for op in nest.operands]
    launch = gpu.prepare(nest, operands, {}, "float16")
    assert f"typedef {index} idx_t;" in launch.source.text
    assert f"index={'int64' if 'long' in index else 'int32'}" in launch.source.text
    assert max(launch.params) < 2**31 or index == "long long"
    ptx = nvrtc.compile_source(launch.source.text, arch="compute_90").ptx
    assert f".entry {launch.source.entry}(" in ptx


def test_a_range_past_2_to_the_31_needs_64_bit_indices_without_a_large_input() -> None:
    from tensordsl.backends import cuda as gpu

    nest = lower(parse("Y[i] := (i == 3)"), ranges={"i": 2**31 - 1}).nest
    launch = gpu.prepare(nest, [], {}, "float16")
    assert "typedef long long idx_t;" in launch.source.text


def test_a_tile_past_48_kb_compiles_only_as_dynamic_shared_memory(monkeypatch) -> None:
    import dataclasses

    from codegen.cuda.schedule import choose_gpu_schedule
    from codegen.cuda.staged import shared as cuda_shared

    nest = lower(parse(MATMUL)).nest
    schedule = dataclasses.replace(choose_gpu_schedule(nest, kernel=True), tile_k=128)
    floats = {"A": "float32", "B": "float32", "C": "float32"}
    source = emit_cuda(nest, dtypes=floats, schedule=schedule)
    assert source.shared == 128 * 130 * 4 and "extern __shared__" in source.text
    assert nvrtc.compile_source(source.text, arch="sm_90").binary[:4] == b"\x7fELF"
    monkeypatch.setattr(cuda_shared, "STATIC_SHARED_LIMIT", 10**9)  # as static arrays: too big
    static = emit_cuda(nest, dtypes=floats, schedule=schedule)
    assert static.shared == 0 and "__shared__ float As_[128][65];" in static.text
    with pytest.raises(nvrtc.NvrtcError, match="shared"):
        nvrtc.compile_source(static.text, arch="sm_90")
