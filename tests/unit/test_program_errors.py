"""Golden error messages of programs: the caret under the offending text, in its line.

Rewrite the goldens on purpose with
`TENSORDSL_UPDATE_GOLDEN=1 pytest tests/unit/test_program_errors.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np
import pytest

import tensordsl as td
from tensordsl.errors import (
    ExpressionError,
    ParseError,
    RangeError,
    ReductionError,
    ShapeError,
    TensorDSLError,
    UnknownNameError,
)
from tensordsl.frontend.statements import check_program_shapes, lower_program

GOLDEN = Path(__file__).parent.parent / "golden" / "errors" / "programs"

ATTENTION = """
    S[b,h,i,j] := Q[b,h,i,d] * K[b,h,j,d] * scale + where(j <= i, 0, -inf)
    (logsumexp) L[b,h,i] := S[b,h,i,j]
    O[b,h,i,e] := exp(S[b,h,i,j] - L[b,h,i]) * V[b,h,j,e]
"""

# name: (source, lower_program options, input shapes for the call-time checks or None, class)
CASES: dict[str, tuple[str, dict, dict | None, type]] = {
    "empty_program": ("\n  # nothing but a comment\n", {}, None, ParseError),
    "defined_twice": ("H[i] := X[i] * 2\nH[i] := X[i] + 1", {}, None, UnknownNameError),
    "read_before_statement": (
        "Y[i] := C[i] * 2\nC[i] := X[i] + 1",
        {},
        None,
        UnknownNameError,
    ),
    "input_redefined": ("Y[i] := a * X[i]\na[i] := X[i] + 1", {}, None, UnknownNameError),
    "intermediate_wrong_rank": (
        ATTENTION.replace("- L[b,h,i])", "- L[b,h])"),
        {},
        None,
        ShapeError,
    ),
    "input_two_ranks_across_statements": (
        "A[i] := X[i,j]; B[i] := X[i] * A[i]",
        {},
        None,
        ShapeError,
    ),
    "outputs_unknown": (ATTENTION, {"outputs": ("O", "LL")}, None, UnknownNameError),
    "outputs_an_input": (ATTENTION, {"outputs": ("O", "V")}, None, UnknownNameError),
    "outputs_twice": (ATTENTION, {"outputs": ("O", "O")}, None, UnknownNameError),
    "parse_error_in_line_3": (
        ATTENTION.replace("V[b,h,j,e]", "V[b,h,j,e}"),
        {},
        None,
        ParseError,
    ),
    "parse_error_at_end_of_line_2": (
        "A[i] := X[i] + 1\nB[i] := (A[i] * 2\nC[i] := B[i]",
        {},
        None,
        ParseError,
    ),
    "unknown_function_after_semicolon": (
        "A[i] := X[i] + 1; B[i] := expp(A[i])",
        {},
        None,
        UnknownNameError,
    ),
    "output_on_right_in_line_2": ("A[i] := X[i]\nB[i] := B[i] + A[i]", {}, None, UnknownNameError),
    "unconstrained_index_in_line_2": ("A[i] := X[i]\nB[i] := A[i+k]", {}, None, RangeError),
    "unknown_reduction_prefix_in_line_2": (
        "A[i] := X[i,j]\n(lse) B[i] := X[i,j]",
        {},
        None,
        ReductionError,
    ),
    "unknown_reduce_option": (ATTENTION, {"reduce": "average"}, None, ReductionError),
    "unknown_range_key": (ATTENTION, {"ranges": {"kk": 3}}, None, RangeError),
    "infinity_minus_infinity": (
        "A[i] := X[i]\nB[i] := A[i] + (inf - inf)",
        {},
        None,
        ExpressionError,
    ),
    "division_by_zero_in_line_2": ("A[i] := X[i]\nB[i] := A[i] / 0", {}, None, ExpressionError),
    "disagreeing_extents_in_line_3": (
        ATTENTION,
        {},
        {"Q": (1, 2, 5, 3), "K": (1, 2, 5, 3), "scale": (), "V": (1, 2, 6, 4)},
        RangeError,
    ),
    "intermediate_read_out_of_bounds": (
        "C[i] := X[i] * 2\nD[i] := C[i+1] - C[i]",
        {"ranges": {"i": 8}},
        {"X": (8,)},
        RangeError,
    ),
    "wrong_input_rank_at_call": (
        ATTENTION,
        {},
        {"Q": (2, 5, 3), "K": (1, 2, 5, 3), "scale": (), "V": (1, 2, 5, 4)},
        ShapeError,
    ),
}


def raise_for(source: str, options: dict, shapes: dict | None) -> None:
    lowered = lower_program(source, **options)
    if shapes is not None:
        check_program_shapes(lowered, shapes)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_program_error(name: str) -> None:
    source, options, shapes, error = CASES[name]
    with pytest.raises(TensorDSLError) as info:
        raise_for(source, options, shapes)
    err = info.value
    assert type(err) is error
    assert isinstance(err, ValueError)
    assert err.source == source
    message = f"{type(err).__name__}: {err}\n"
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("TENSORDSL_UPDATE_GOLDEN") == "1" or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(message)
    assert message == path.read_text()


def test_goldens_have_cases() -> None:
    """A golden whose case was removed is stale."""
    assert {p.stem for p in GOLDEN.glob("*.txt")} <= set(CASES)


def test_an_error_of_a_split_program_shows_every_statement() -> None:
    """Issue 36.12: a program run in stages (it gathers from its own output) showed the
    statements of the other stages as blanks in its errors."""
    source = "Z[b,v] := X[b,d]*W[d,v]; L[b] := Z[b,y[b]]"
    k = td.program(source, backend="reference")
    X, W = (
        np.random.default_rng(0).normal(size=(3, 4)),
        np.random.default_rng(1).normal(size=(4, 5)),
    )
    with pytest.raises(
        RangeError, match=r"points to 7 (.|\n)*\n  Z\[b,v\] := X\[b,d\]\*W\[d,v\]; L"
    ):
        k(X, W, np.array([0, 1, 7]))


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_a_shape_error_in_a_later_stage_shows_every_statement(backend: str) -> None:
    """Issue 36.12: the shape check of a later stage quoted its own text, the first statement
    replaced by blanks; eagerly and under jit, the whole program shows."""
    k = td.program("Z[b,v] := X[b,d]*W[d,v]; L[b] := Z[b,y[b]] * Q[b]", backend=backend)
    rng = np.random.default_rng(0)
    X, W, Q = rng.normal(size=(3, 4)), rng.normal(size=(4, 5)), rng.normal(size=4)
    shown = r"\n  Z\[b,v\] := X\[b,d\]\*W\[d,v\]; L\[b\] := Z\[b,y\[b\]\] \* Q\[b\]\n {49}\^"
    for call in (k, jax.jit(k)):
        with pytest.raises(RangeError, match=r"of 'y' but 4 from axis 0 of 'Q'" + shown):
            call(X, W, np.array([0, 1, 2]), Q)
