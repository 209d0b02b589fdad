"""An emitter keeps what it wrote as data; nothing in `codegen/` searches generated code
(issue 34, item 4). Pure Python: the sources of `codegen/` read as syntax trees.

Counted per module: calls of `re` (and of patterns it compiled), and `in` tests whose right
side is a name for generated text (`code`, `line`, `text`, `body`). A module may use them
only on text that is not generated code (`NOT_GENERATED`: names, compiler logs, PTX, the
emulator's input); any other use fails. (The last search of generated code, which declared
variables an outlined C tile case reads, went in December 2026: a case takes them all.)
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: Names the emitters give generated text.
TEXT_NAMES = {"code", "line", "text", "body"}

#: Uses on text that is not generated code, by module: (count, what it reads).
NOT_GENERATED = {
    "codegen/emit/printer.py": (2, "c_name: a user's name made a C identifier"),
    "codegen/ir/nest.py": (2, "an extent's name, `X.shape[0]`"),
    "codegen/cuda/report.py": (1, "ptxas's log: shared memory per kernel"),
    "codegen/cuda/run/nvrtc.py": (5, "ptxas's log, the loaded libraries, the PTX's parameters"),
    "codegen/cuda/emulator/emulate.py": (
        2,
        "CUDA source as a compiler reads it: the emulator stands in for nvcc and takes any "
        "kernel (tests pass hand-written ones), sizing its `extern __shared__` arrays",
    ),
}


def _compiled_patterns(tree: ast.AST) -> set[str]:
    """Names bound to `re.compile(...)` at module level."""
    return {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _re_call(node.value, set()) == "compile"
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _re_call(node: ast.AST, patterns: set[str]) -> str | None:
    """The function's name where `node` calls `re.<name>` or `<pattern>.<name>`."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return None
    owner = node.func.value
    if isinstance(owner, ast.Name) and (owner.id == "re" or owner.id in patterns):
        return node.func.attr
    return None


def text_searches(source: str) -> tuple[int, int]:
    """(calls of `re` or of a compiled pattern, `in` tests against a name for text)."""
    tree = ast.parse(source)
    patterns = _compiled_patterns(tree)
    calls = sum(_re_call(node, patterns) not in (None, "escape") for node in ast.walk(tree))
    tests = sum(
        isinstance(node, ast.Compare)
        and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
        and any(isinstance(c, ast.Name) and c.id in TEXT_NAMES for c in node.comparators)
        for node in ast.walk(tree)
    )
    return calls, tests


def test_searches_are_found() -> None:
    assert text_searches('import re\nre.search(r"x", code)\n') == (1, 0)
    assert text_searches('import re\nP = re.compile("x")\nP.findall(t)\n') == (2, 0)
    assert text_searches('ok = any("omp" in line for line in body)\n') == (0, 1)
    assert text_searches('ok = "x" in names\n') == (0, 0)


def test_nothing_else_searches_generated_code() -> None:
    found = {}
    for path in sorted((ROOT / "codegen").rglob("*.py")):
        calls, tests = text_searches(path.read_text())
        if calls + tests:
            found[path.relative_to(ROOT).as_posix()] = calls + tests
    assert found == {module: count for module, (count, _) in NOT_GENERATED.items()}
