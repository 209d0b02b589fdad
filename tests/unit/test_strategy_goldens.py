"""Every CUDA strategy with a kernel has a golden source: its case in tests/strategy_cases.py,
emitted under the heuristic's schedule, pinned in tests/golden/cuda/strategy_<name>.cu.

Pure Python (no compiler). `TENSORDSL_UPDATE_GOLDEN=1` rewrites the files, on purpose only.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from codegen.cuda.emit import emit_cuda
from codegen.cuda.schedule import choose_gpu_schedule
from tests.strategy_cases import CASES

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "cuda"


#: Strategies whose case is a kernel another golden already pins (tests/compile_only/
#: test_nvrtc.py): the same file, never a copy of it.
SHARED = {"rows": "logsumexp"}


def golden_path(strategy: str) -> Path:
    if strategy in SHARED:
        return GOLDEN / f"{SHARED[strategy]}.cu"
    return GOLDEN / f"strategy_{strategy}.cu"


@pytest.mark.parametrize("strategy", sorted(CASES))
def test_the_strategy_source_is_the_golden_one(strategy: str) -> None:
    case = CASES[strategy]
    nest, _ = case.build()
    dtypes = case.dtypes(nest)
    assert choose_gpu_schedule(nest, dtypes, kernel=True).strategy == strategy
    text = emit_cuda(nest, dtypes=dtypes).text
    path = golden_path(strategy)
    if os.environ.get("TENSORDSL_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing {path}; run with TENSORDSL_UPDATE_GOLDEN=1"
    assert text == path.read_text()
