"""Past 2^31 elements under the CUDA emulator: the 64-bit kernel variant writes every element
of `Y[i] := (i == 3)` with `i: 2**31 - 1` (float16: 4 GiB), on a small grid so that each
thread strides far (the 32-bit variant would wrap past 2^31 there)."""

from __future__ import annotations

import numpy as np
import pytest

from codegen.cuda.emulator import emulate
from tensordsl.backends import cuda as gpu
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

EXTENT = 2**31 - 1
MARGIN = 64


def _available_bytes() -> int:
    with open("/proc/meminfo") as info:
        fields = dict(line.split(":", 1) for line in info)
    return int(fields["MemAvailable"].split()[0]) * 1024


pytestmark = [
    pytest.mark.skipif(not emulate.available(), reason="no CUDA emulator here"),
    pytest.mark.skipif(
        not emulate.available() or _available_bytes() < 3 * 2 * EXTENT,
        reason="needs 12 GiB of free memory for a 4 GiB float16 output",
    ),
]


@pytest.mark.slow
def test_an_output_of_2_to_the_31_elements_is_right_under_the_emulator() -> None:
    nest = lower(parse("Y[i] := (i == 3)"), ranges={"i": EXTENT}).nest
    launch = gpu.prepare(nest, [], {}, "float16")
    assert "typedef long long idx_t;" in launch.source.text
    ((entry, grid),) = launch.passes
    assert grid[0] * launch.source.block[0] >= EXTENT // 2  # the grid covers the output
    small = (64, 1, 1)  # each thread strides 2^31 / 16384 times, past 2^31 at the end
    kernel = emulate.kernel(launch.source.text, entry)
    buffer = np.full(EXTENT + 2 * MARGIN, np.nan, np.float16)
    out = buffer[MARGIN : MARGIN + EXTENT]
    kernel(small, launch.source.block, (out, *(np.int64(p) for p in launch.params)))
    assert np.isnan(buffer[:MARGIN]).all() and np.isnan(buffer[-MARGIN:]).all()
    assert out[3] == 1 and np.count_nonzero(out) == 1  # NaN (unwritten) counts as nonzero
    assert out[-1] == 0 and out[2**30] == 0
