"""Every generated CUDA kernel compiles with NVRTC; entry points, parameters and spills.
(By default those of the corpus's sample, `tests/sampling.py`; `-m exhaustive`: every one.)

Needs NVRTC only (`pip install "cupy-cuda13x[ctk]"`), no GPU. Compiled results are cached
in memory by `codegen.cuda.run.nvrtc`, so each kernel is compiled once per architecture per session.
"""

from __future__ import annotations

import os
import pathlib
import re

import pytest

from codegen.cuda.emit import CudaSource, emit_cuda
from codegen.cuda.run import nvrtc
from codegen.cuda.schedule import GpuSchedule, candidate_gpu_schedules, choose_gpu_schedule
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.compile_only.nests import Named, all_nests, dtypes
from tests.corpus import CORPUS
from tests.sampling import by_case, corpus_sample_names

pytestmark = pytest.mark.skipif(
    not nvrtc.available(), reason='NVRTC unavailable: pip install "cupy-cuda13x[ctk]"'
)
NESTS = all_nests()
BY_ID = {n.id: n for n in NESTS}
GOLDEN = pathlib.Path(__file__).parent.parent / "golden" / "cuda"
#: A subset also compiled for sm_80 (A100) to keep the tier fast.
SM80 = (
    "matmul",
    "batched_matmul",
    "pairwise_sq_dist",
    "conv2d_channels",
    "logsumexp_rows",
    "row_max",
    "full_inner_product",
    "prod_with_zero",
    "conv1d_valid",
    "cumulative_sum",
)
SPILLS: dict[str, tuple[int, int]] = {}


def emit(named: Named, dtype: str = "float32", schedule: GpuSchedule | None = None) -> CudaSource:
    return emit_cuda(named.nest, dtypes=dtypes(named, dtype), schedule=schedule, role=named.role)


def check_ptx(source: CudaSource, arch: str = "compute_80", ptx: str | None = None) -> None:
    """Every pass of `source` is an entry of its PTX (compiled for `arch`, or `ptx`), with the
    launcher's parameters."""
    ptx = nvrtc.compile_source(source.text, arch=arch).ptx if ptx is None else ptx
    for kernel in source.passes:
        assert f".entry {kernel.entry}(" in ptx
        params = nvrtc.ptx_parameters(ptx, kernel.entry)
        # The launcher passes the output, operand and scratch pointers then int64 parameters:
        # 64-bit each, the same for every kernel of the source.
        assert len(params) == source.argument_count, (params, source.argument_count)
        assert set(params) <= {".u64", ".s64"}, params


@pytest.mark.parametrize(
    "named", by_case(NESTS, corpus_sample_names(CORPUS), lambda n: n.case, lambda n: n.id)
)
def test_compiles_for_sm90_without_spills(named: Named) -> None:
    source = emit(named)
    cubin = nvrtc.compile_source(source.text, arch="sm_90", options=["--ptxas-options=-v"])
    check_ptx(source, ptx=cubin.ptx)  # the PTX of the same compile: NVRTC runs once
    assert cubin.binary[:4] == b"\x7fELF"
    assert cubin.registers is not None, cubin.log
    assert (cubin.spill_stores, cubin.spill_loads) == (0, 0), (named.id, cubin.log)


@pytest.mark.parametrize("name", SM80)
def test_compiles_for_sm80(name: str) -> None:
    for named in NESTS:
        if named.case == name:
            source = emit(named)
            compiled = nvrtc.compile_source(
                source.text, arch="sm_80", options=["--ptxas-options=-v"]
            )
            assert (compiled.spill_stores, compiled.spill_loads) == (0, 0), compiled.log


@pytest.mark.parametrize("dtype", ["float64", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "name",
    [
        "matmul-forward",
        "matmul-grad_A",
        "pairwise_sq_dist-forward",
        "pairwise_sq_dist-grad_W",
        "logsumexp_rows-forward",
        "full_inner_product-forward",
    ],
)
def test_other_dtypes_compile(name: str, dtype: str) -> None:
    source = emit(BY_ID[name], dtype)
    check_ptx(source)
    compiled = nvrtc.compile_source(source.text, arch="sm_90", options=["--ptxas-options=-v"])
    assert (compiled.spill_stores, compiled.spill_loads) == (0, 0), compiled.log
    if dtype in ("float16", "bfloat16"):
        assert "2float(" in source.text and "double" not in source.text.split("*/", 1)[1]


@pytest.mark.parametrize(
    "name",
    [
        "matmul-forward",
        "row_max-argument",
        "conv1d_valid-grad_X",
        "logsumexp_full-forward",
        "stencil_2d-forward",
        "pairwise_sq_dist-forward",
    ],
)
def test_every_candidate_schedule_compiles(name: str) -> None:
    named = BY_ID[name]
    schedules = candidate_gpu_schedules(named.nest)
    assert choose_gpu_schedule(named.nest, kernel=True) in schedules
    assert len({s.strategy for s in schedules}) >= 2
    for schedule in schedules:
        check_ptx(emit(named, schedule=schedule))


def test_int64_indices_switch() -> None:
    named = BY_ID["matmul-forward"]
    schedule = choose_gpu_schedule(named.nest, index_type="int64", kernel=True)
    source = emit(named, schedule=schedule)
    assert "typedef long long idx_t;" in source.text
    check_ptx(source)


def test_entry_names_are_stable_and_distinct() -> None:
    entries = [emit(n).entry for n in NESTS[:40]]
    assert entries == [emit(n).entry for n in NESTS[:40]]
    assert all(e.startswith("tdsl_") for e in entries)


GOLDEN_KERNELS = {
    "matmul": "matmul-forward",
    "matmul_grad_a": "matmul-grad_A",
    "pairwise": "pairwise_sq_dist-forward",
    "logsumexp": "logsumexp_rows-forward",
    "full_sum": "full_inner_product-forward",
    "argmax": "row_max-argument",
    "conv_grad": "conv1d_valid-grad_X",
    "conv2d": "conv2d_channels-forward",
    "two_terms": "stencil_1d-grad_X",
}


@pytest.mark.parametrize("golden", sorted(GOLDEN_KERNELS))
def test_golden_cuda(golden: str) -> None:
    text = emit(BY_ID[GOLDEN_KERNELS[golden]]).text
    path = GOLDEN / f"{golden}.cu"
    if os.environ.get("TENSORDSL_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing {path}; run with TENSORDSL_UPDATE_GOLDEN=1"
    assert text == path.read_text()


@pytest.mark.parametrize("name", ["row_max-grad_X", "row_max_ties-grad_X"])
def test_saved_positions_compare_as_integers(name: str) -> None:
    # The saved argmax position is int32; as a float it would be exact only below 2**24.
    source = emit(BY_ID[name])
    assert "(float)in_M_argument" not in source.text
    assert "((idx_t)in_M_argument[" in source.text
    check_ptx(source)


@pytest.mark.parametrize(
    "statement",
    [
        "Y[i] := X[i] * 1000000000000000000000000000000 + i * 18446744073709551616",
        "Y[i] := X[i + 9223372036854775807] * (i < 100000000000000000000)",
    ],
)
def test_large_integers_compile_as_floats_and_int64(statement: str) -> None:
    # Values at or above 2**63 are floating-point literals (NVRTC accepts an integer literal
    # beyond 64 bits without a word); index offsets fit in int64.
    source = emit_cuda(lower(parse(statement)).nest, dtypes={"X": "float32", "Y": "float32"})
    check_ptx(source)
    body = source.text[source.text.index("*/") :]  # the header shows the statement as typed
    assert max(int(n) for n in re.findall(r"(?<![\w.])\d+(?![\w.])", body)) < 2**63
