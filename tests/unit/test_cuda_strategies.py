"""Every CUDA strategy is one `Strategy` record (`codegen/cuda/strategies.py`), and every
record's generated source is pinned by a golden file (tests/golden/cuda), or is a known gap."""

from __future__ import annotations

import re
from pathlib import Path

from codegen.cuda.schedule import GPU_STRATEGIES
from codegen.cuda.strategies import BY_NAME, STRATEGIES

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "cuda"

#: Strategies whose generated source no golden file pins yet (issue 34's known gap): adding
#: a golden file for one (tests/compile_only/test_nvrtc.py: GOLDEN_KERNELS) removes it here.
WITHOUT_GOLDEN = {"tile", "mma", "block", "online", "weighted", "columns"}


def _golden_strategies() -> set[str]:
    """The strategies named in the header comment (`schedule: strategy=...`) of a golden."""
    found: set[str] = set()
    for path in sorted(GOLDEN.glob("*.cu")):
        found |= set(re.findall(r"^ \* schedule: strategy=(\w+)", path.read_text(), re.M))
    return found


def test_every_kernel_strategy_is_one_record() -> None:
    """The heuristic's strategies less "xla" (XLA's dot: the runner's, no kernel)."""
    names = [s.name for s in STRATEGIES]
    assert len(names) == len(set(names)) == len(BY_NAME)
    assert set(names) == set(GPU_STRATEGIES) - {"xla"}


def test_every_record_has_a_golden_source() -> None:
    golden = _golden_strategies()
    assert golden, f"no golden CUDA source under {GOLDEN}"
    assert golden <= set(BY_NAME), golden - set(BY_NAME)
    missing = set(BY_NAME) - golden
    assert missing == WITHOUT_GOLDEN, (
        f"without a golden source: {sorted(missing)}; listed as such: {sorted(WITHOUT_GOLDEN)}"
    )
