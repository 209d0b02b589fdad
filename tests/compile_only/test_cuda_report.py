"""The static CUDA report's registers, spills and shared memory, read from ptxas (sm_90)
through NVRTC; without NVRTC the report says so and has no figures."""

from __future__ import annotations

import pytest

from codegen.cuda.report import cuda_report
from codegen.cuda.run import nvrtc
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse


def test_registers_spills_and_shared_memory_of_the_row_kernel() -> None:
    nest = lower(parse("L[i] := X[i,j]"), reduce="logsumexp").nest
    dtypes = {"L": "float32", "X": "float32"}
    report = cuda_report(nest, dtypes, {"X": (4096, 8192)})
    if not nvrtc.available():
        assert report.registers is None
        assert "NVRTC is not available" in report.lines()[-1]
        pytest.skip("NVRTC unavailable: the report has no registers")
    assert report.registers is not None and 8 <= report.registers <= 64
    assert report.spills == 0
    assert report.shared == 2 * 8 * 4  # the warps' two float states of a block-wide row
    assert report.lines()[-1].startswith(f"  sm_90: {report.registers} registers, 0 bytes")


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_pairwise_tile_fits_its_registers_and_shared_memory(dtype: str) -> None:
    nest = lower(parse("D[i,j] := (X[i,k] - Y[j,k])^2")).nest
    dtypes = dict.fromkeys(("D", "X", "Y"), dtype)
    report = cuda_report(nest, dtypes, {"X": (16384, 64), "Y": (16384, 64)})
    if not nvrtc.available():
        pytest.skip("NVRTC unavailable: the report has no registers")
    assert report.schedule.startswith("strategy=pairwise")
    assert report.registers is not None and report.registers <= 128  # two blocks of 256 per SM
    assert report.spills == 0
    item = 4 if dtype == "float32" else 8
    assert report.shared == 2 * 16 * 66 * item  # X and Y slices, rows padded by 2
