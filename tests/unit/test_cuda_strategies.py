"""Every CUDA strategy is one `Strategy` record (`codegen/cuda/strategies.py`); every record
with a kernel has a case (tests/strategy_cases.py) whose source a golden file pins
(tests/unit/test_strategy_goldens.py) and which the emulator runs
(tests/gpu/test_strategies_emulated.py); no module of `codegen/cuda` compares strategy names."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from codegen.cuda.schedule import GPU_STRATEGIES
from codegen.cuda.strategies import BY_NAME, STRATEGIES
from tests.strategy_cases import CASES
from tests.unit.test_strategy_goldens import golden_path

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "cuda"
#: The strategies with no generated kernel: XLA's dot computes the nest (the runner's).
WITHOUT_KERNEL = {"xla"}


def _golden_strategies() -> set[str]:
    """The strategies named in the header comment (`schedule: strategy=...`) of a golden."""
    found: set[str] = set()
    for path in sorted(GOLDEN.glob("*.cu")):
        found |= set(re.findall(r"^ \* schedule: strategy=(\w+)", path.read_text(), re.M))
    return found


def test_every_strategy_is_one_record() -> None:
    """The heuristic's strategies are the records, in order; those without a kernel have no
    body, launch or second pass."""
    names = [s.name for s in STRATEGIES]
    assert len(names) == len(set(names)) == len(BY_NAME)
    assert tuple(names) == GPU_STRATEGIES
    assert STRATEGIES[-1].name == "thread"  # the fallback: applies to every nest
    for record in STRATEGIES:
        kernel = record.name not in WITHOUT_KERNEL
        assert (record.body is not None, record.launch is not None) == (kernel, kernel)
        assert kernel or record.second_pass is None


def test_every_record_with_a_kernel_has_a_case_a_golden_and_an_emulator_run() -> None:
    kernels = set(BY_NAME) - WITHOUT_KERNEL
    assert set(CASES) == kernels, sorted(set(CASES) ^ kernels)
    assert all(golden_path(name).exists() for name in kernels)
    golden = _golden_strategies()
    assert golden == kernels, sorted(golden ^ kernels)


def _is_name(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "strategy"
        or (isinstance(node, ast.Name) and node.id == "strategy")
    )


def _is_literal(node: ast.AST) -> bool:
    if isinstance(node, (ast.Tuple, ast.Set, ast.List)):
        return bool(node.elts) and all(_is_literal(e) for e in node.elts)
    return isinstance(node, ast.Constant) and isinstance(node.value, str)


def name_tests(source: str) -> int:
    """Comparisons of a `strategy` (attribute or name) with string literals in `source`."""
    count = 0
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            count += any(map(_is_name, sides)) and any(map(_is_literal, sides))
    return count


def test_name_tests_are_found() -> None:
    assert name_tests('if s.strategy in ("smem", "mma"):\n    pass\n') == 1
    assert name_tests("x = strategy == 'tile'\n") == 1
    assert name_tests("if strategy is None:\n    pass\n") == 0


def test_no_module_tests_strategy_names() -> None:
    """The schedule, the emitter and the report read the record (`Strategy`) of a schedule's
    strategy; a test such as `strategy == "tile"` in `codegen/cuda` fails here."""
    root = GOLDEN.parents[2]
    found = {
        path.relative_to(root).as_posix(): n
        for path in sorted((root / "codegen" / "cuda").rglob("*.py"))
        if (n := name_tests(path.read_text()))
    }
    assert found == {}
