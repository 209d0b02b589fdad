"""topk/argtopk kernels compile with NVRTC for sm_80 and sm_90 (PTX) (the thread strategy, a row
per thread with its k slots in registers), with their gradient's auxiliary and gradient
nests; every candidate schedule is the thread strategy. Needs NVRTC only, no GPU."""

from __future__ import annotations

import pytest

from codegen.cuda.emit import emit_cuda
from codegen.cuda.run import nvrtc
from codegen.cuda.schedule import candidate_gpu_schedules
from codegen.passes import grad, gradient_rules
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.skipif(
    not nvrtc.available(), reason='NVRTC unavailable: pip install "cupy-cuda13x[ctk]"'
)

SOURCES = (
    "(topk 5) V[i,r] := X[i,j] * w[j]",
    "(argtopk 3) N[i,r] := -(X[i,d] - Y[j,d])^2",
    "(topk 64) V[b,i,r] := exp(S[b,i,j]) * where(j <= i, 1, 0)",
)


def _nests(source):
    nest = lower(parse(source)).nest
    found = [nest, *gradient_rules.auxiliary_nests(nest).values()]
    if nest.reduction == "topk":
        found += [grad.gradient(nest, op.name).nest for op in nest.operands]
    return found


def _dtypes(nest, dtype):
    found = {op.name: "int32" if op.name.endswith("_argument") else dtype for op in nest.operands}
    found[nest.output] = "int32" if nest.reduction == "argtopk" else dtype
    return found


@pytest.mark.parametrize("arch", ["compute_80", "compute_90"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("source", SOURCES)
def test_top_k_nests_compile(source, dtype, arch):
    for nest in _nests(source):
        text = emit_cuda(nest, dtypes=_dtypes(nest, dtype)).text
        assert ".entry " in nvrtc.compile_source(text, arch=arch).ptx


@pytest.mark.parametrize("source", SOURCES)
def test_every_candidate_schedule_is_the_thread_strategy(source):
    nest = lower(parse(source)).nest
    schedules = candidate_gpu_schedules(nest)
    assert {s.strategy for s in schedules} == {"thread"}
    for schedule in schedules:
        text = emit_cuda(nest, dtypes=_dtypes(nest, "float32"), schedule=schedule).text
        assert ".entry " in nvrtc.compile_source(text, arch="compute_90").ptx
