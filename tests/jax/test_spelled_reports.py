"""No internal name of a gathered operand (`W__at8`, `tensordsl.frontend.gathers`) reaches a
user (issue 36.12): every explain output, the static reports of every target included (CUDA's
per-access lines, the pallas tile programs), shows the access as written, `W[tok[i], d]`,
and the gradient of a gathered operand as that of its table there, `dW[tok[i], d]`."""

from __future__ import annotations

import pytest

import tensordsl as td
from tensordsl.backends import table

SHAPES = {"W": (10, 4), "tok": (6,), "X": (6, 4)}
SOURCES = {
    "kernel": "Y[i] := W[tok[i], d] * X[i,d]",
    "program": "H[i,d] := W[tok[i], d] * X[i,d]; Y[i] := H[i,d] * W[tok[i], d]",
}


@pytest.mark.parametrize("target", [None, *table.REPORT_TARGETS])
@pytest.mark.parametrize("kind", ["kernel", "program"])
def test_no_internal_name_of_a_gathered_operand_in_any_explain_output(kind, target):
    make = td.kernel if kind == "kernel" else td.program
    found = make(SOURCES[kind], backend="c")
    text = found.explain(SHAPES, target=target)
    assert "__at" not in text, [line for line in text.splitlines() if "__at" in line]
    assert "W[tok[i], d]" in text
    if target is not None:
        report = text.splitlines()
        start = next(n for n, line in enumerate(report) if line.startswith(target))
        report = "\n".join(report[start:])
        assert "W[tok[i], d]" in report  # the report itself reads the gathered operand
        if kind == "program":  # its gradient, named by the table at the access
            assert "dW[tok[i], d]:" in report
