"""The mma strategy's kernels compile with NVRTC for sm_90: the inline PTX `mma.sync` is
checked by the real compiler, every kernel fits in registers without spills, and the static
report says the tile uses tensor cores. Needs NVRTC only, no GPU."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from codegen.cuda.emit import emit_cuda
from codegen.cuda.report import cuda_report
from codegen.cuda.run import nvrtc
from codegen.ir.extents import extent_values
from codegen.ir.nest import LoopNest
from codegen.passes import grad
from codegen.passes.proven import drop_proven
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.gpu.test_tensor_cores import probe_source

pytestmark = pytest.mark.skipif(
    not nvrtc.available(), reason='NVRTC unavailable: pip install "cupy-cuda13x[ctk]"'
)
PTX_TYPES = {"bfloat16": "bf16", "float16": "f16"}
#: Each GEMM form and the shapes of A, B and C.
SOURCES = {
    "C[i,j] := A[i,k] * B[k,j]": ((40, 24), (24, 30), (40, 30)),
    "C[b,i,j] := A[b,i,k] * B[b,k,j]": ((3, 40, 24), (3, 24, 30), (3, 40, 30)),
    "C[i,j] := A[k,i] * B[k,j]": ((24, 40), (24, 30), (40, 30)),
    "C[i,j] := A[i,k] * B[j,k]": ((40, 24), (30, 24), (40, 30)),
}


def _nests(source: str) -> Iterator[tuple[str, LoopNest]]:
    """The forward nest and the gradient nests of both inputs, without the tests their
    shapes prove (as a call emits them: `drop_proven`)."""
    a, b, c = SOURCES[source]
    shapes = {"A": a, "B": b, "C": c, "dC": c, "dA": a, "dB": b}
    nest = lower(parse(source)).nest
    yield "forward", nest
    for name in ("A", "B"):
        gradient = grad.gradient(nest, name).nest
        yield f"grad_{name}", drop_proven(gradient, extents=extent_values(gradient, shapes))


@pytest.mark.parametrize("dtype", sorted(PTX_TYPES))
@pytest.mark.parametrize("out", ["float32", "half"])
@pytest.mark.parametrize("source", SOURCES)
def test_every_mma_kernel_compiles_for_sm_90_without_spills(
    source: str, out: str, dtype: str
) -> None:
    t = PTX_TYPES[dtype]
    for role, nest in _nests(source):
        dtypes = {op.name: dtype for op in nest.operands}
        dtypes[nest.output] = dtype if out == "half" else out
        found = emit_cuda(nest, dtypes=dtypes, role=role)
        assert found.schedule.strategy == "mma", (role, found.schedule.describe())
        ptx = nvrtc.compile_source(found.text, arch="compute_90").ptx
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32" in ptx
        assert f"mma.sync.aligned.m16n8k8.row.col.f32.{t}.{t}.f32" in ptx  # a last k step
        compiled = nvrtc.compile_source(found.text, options=("--ptxas-options=-v",))
        assert compiled.registers is not None and compiled.registers <= 128, compiled.log
        assert (compiled.spill_stores, compiled.spill_loads) == (0, 0), compiled.log


@pytest.mark.parametrize("dtype", sorted(PTX_TYPES))
def test_the_fragment_probe_compiles_for_sm_90(dtype: str) -> None:
    t = PTX_TYPES[dtype]
    compiled = nvrtc.compile_source(probe_source(dtype), arch="compute_90")
    assert compiled.ptx.count(f"mma.sync.aligned.m16n8k16.row.col.f32.{t}.{t}.f32") == 1


@pytest.mark.parametrize(
    ("source", "shapes"),
    [
        ("C[i,j] := A[i,k] * B[k,j]", {"A": (1000, 512), "B": (512, 768)}),
        ("dB[k,j] := A[i,k] * dC[i,j]", {"A": (1000, 512), "dC": (1000, 768)}),
    ],
)
def test_the_static_report_says_tensor_cores(source: str, shapes: dict) -> None:
    nest = lower(parse(source)).nest
    dtypes = {**dict.fromkeys(shapes, "bfloat16"), nest.output: "bfloat16"}
    lines = cuda_report(nest, dtypes, shapes).lines()
    assert "strategy=mma" in lines[0] and "tensor-cores=mma.sync.m16n8k16" in lines[0]
    assert any(" 0 bytes spilled" in line for line in lines), lines


def test_the_sm_80_requirement_is_stated() -> None:
    nest = lower(parse("C[i,j] := A[i,k] * B[k,j]")).nest
    text = emit_cuda(nest, dtypes={"A": "bfloat16", "B": "bfloat16", "C": "float32"}).text
    with pytest.raises(nvrtc.NvrtcError, match="the mma strategy needs sm_80 or later"):
        nvrtc.compile_source(text, arch="sm_75")
