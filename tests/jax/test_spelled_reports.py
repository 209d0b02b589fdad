"""No internal name of a gathered operand (`W__at8`, `tensordsl.frontend.gathers`) reaches a
user (issue 36.12): every explain output, the static reports of every target included (CUDA's
per-access lines and one-pass staging, the pallas tile programs, the names of paired gradient
nests), and the command line's explain, show the access as written, `W[tok[i], d]`, and the
gradient of a gathered operand as that of its table there, `dW[tok[i], d]`."""

from __future__ import annotations

import pytest

import tensordsl as td
from tensordsl.backends import table
from tensordsl.cli import main
from tests.backends import NEEDS_C_COMPILER

CASES = {  # a gather read by a kernel, by two statements, by attention's one pass
    "kernel": (
        td.kernel,
        "Y[i] := W[tok[i], d] * X[i,d]",
        {"W": (10, 4), "tok": (6,), "X": (6, 4)},
        "W[tok[i], d]",
    ),
    "program": (
        td.program,
        "H[i,d] := W[tok[i], d] * X[i,d]; Y[i] := H[i,d] * W[tok[i], d]",
        {"W": (10, 4), "tok": (6,), "X": (6, 4)},
        "W[tok[i], d]",
    ),
    "attention": (
        td.program,
        "S[i,j] := Q[i,d] * W[tok[j],d]\n(logsumexp) L[i] := S[i,j]\n"
        "O[i,e] := exp(S[i,j] - L[i]) * V[j,e]",
        {"Q": (64, 16), "W": (100, 16), "tok": (48,), "V": (48, 16)},
        "W[tok[j], d",
    ),
}


@pytest.mark.parametrize("target", [None, *table.REPORT_TARGETS])
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_internal_name_of_a_gathered_operand_in_any_explain_output(case, target):
    make, source, shapes, access = CASES[case]
    text = make(source, backend="c").explain(shapes, target=target)
    assert "__at" not in text, [line for line in text.splitlines() if "__at" in line]
    assert access in text
    if target is not None:
        lines = text.splitlines()
        start = next(n for n, line in enumerate(lines) if line.startswith(target))
        report = "\n".join(lines[start:])
        assert access in report  # the report itself reads the gathered operand
        if case != "kernel":  # its gradient, named by the table at the access
            assert f"d{access}" in report


@NEEDS_C_COMPILER
@pytest.mark.parametrize("case", sorted(CASES))
def test_no_internal_name_on_the_command_line(case, capsys):
    """`python -m tensordsl explain` (its parsed statement, schedules, builds and report)."""
    _, source, shapes, access = CASES[case]
    given = [f"{name}={'x'.join(map(str, shape))}" for name, shape in shapes.items()]
    argv = ["explain", source.replace("\n", ";"), "--shapes", *given, "--target", "cuda"]
    assert main([*argv, "--build"]) == 0
    text = capsys.readouterr().out
    assert "__at" not in text, [line for line in text.splitlines() if "__at" in line]
    assert access in text
