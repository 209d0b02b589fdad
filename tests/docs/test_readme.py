"""README.md's code blocks are plain Python that runs: they are executed in order, in a
fresh interpreter, as a reader would paste them into one file; a ```text block right after
a ```python block is the output that block prints (`...` matches anything)."""

from __future__ import annotations

import doctest
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
MARK = "=== tensordsl README block {} ==="


def readme_blocks(text: str) -> list[tuple[str, str | None]]:
    """Every ```python block with the ```text block that follows it directly, if any."""
    fences = list(FENCE.finditer(text))
    blocks = []
    for n, fence in enumerate(fences):
        if fence.group(1) != "python":
            continue
        after = fences[n + 1] if n + 1 < len(fences) else None
        follows = after is not None and not text[fence.end() : after.start()].strip()
        expected = after.group(2) if follows and after.group(1) == "text" else None
        blocks.append((fence.group(2), expected))
    return blocks


def test_the_blocks_are_found_and_are_not_doctest_transcripts():
    blocks = readme_blocks((ROOT / "README.md").read_text())
    assert len(blocks) >= 3
    for code, _ in blocks:
        assert ">>>" not in code and "doctest" not in code
        compile(code, "README.md", "exec")


def test_readme_blocks_run_and_print_what_the_readme_shows(tmp_path):
    blocks = readme_blocks((ROOT / "README.md").read_text())
    script = "\n".join(f"print({MARK.format(n)!r})\n{code}" for n, (code, _) in enumerate(blocks))
    path = tmp_path / "readme.py"
    path.write_text(script)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TENSORDSL_VERBOSE": "0"}
    env.pop("XLA_FLAGS", None)
    done = subprocess.run(
        [sys.executable, str(path)], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr[-3000:]
    outputs = re.split(r"^=== tensordsl README block \d+ ===\n", done.stdout, flags=re.M)[1:]
    assert len(outputs) == len(blocks)
    checker = doctest.OutputChecker()
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    for (code, expected), got in zip(blocks, outputs):
        if expected is None:
            continue
        if not checker.check_output(expected, got, flags):
            pytest.fail(f"README block\n{code}\nprinted\n{got}\nexpected\n{expected}")
