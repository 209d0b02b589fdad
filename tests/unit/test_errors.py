"""Golden error messages: the full text of what a user sees for each kind of mistake.

Rewrite the goldens on purpose with `TENSORDSL_UPDATE_GOLDEN=1 pytest tests/unit/test_errors.py`.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path

import pytest

from tensordsl.errors import (
    ExpressionError,
    IndexExpressionError,
    ParseError,
    RangeError,
    ReductionError,
    ShapeError,
    TensorDSLError,
    UnknownNameError,
    UnsupportedError,
)
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tensordsl.frontend.shapes import check_shapes

GOLDEN = Path(__file__).parent.parent / "golden" / "errors"

# name: (source, lower options, shapes for check_shapes or None, error class)
CASES: dict[str, tuple[str, dict, dict | None, type]] = {
    "unbalanced_bracket": ("C[i,j] := A[i,k * B[k,j]", {}, None, ParseError),
    "unbalanced_paren": ("Y[i] := (X[i] + 1", {}, None, ParseError),
    "wrong_closing_bracket": ("C[i,j] := A[i,k} * B[k,j]", {}, None, ParseError),
    "unexpected_token": ("Y[i] := X[i] * * W[i]", {}, None, ParseError),
    "missing_assign": ("C[i,j] = A[i,k] * B[k,j]", {}, None, ParseError),
    "chained_comparison": ("Y[i] := 0 < X[i] < 1", {}, None, ParseError),
    "unknown_function": ("Y[i] := expp(X[i])", {}, None, UnknownNameError),
    "reduction_as_function": ("L[i] := logsumexp(S[i,j], j)", {}, None, UnknownNameError),
    "wrong_arity": ("Y[i] := max(X[i])", {}, None, ShapeError),
    "unknown_reduction_prefix": ("(lse) Y[i] := X[i,k]", {}, None, ReductionError),
    "unknown_reduction_option": ("Y[i] := X[i,k]", {"reduce": "maxx"}, None, ReductionError),
    "conflicting_reduction": ("(max) Y[i] := X[i,k]", {"reduce": "min"}, None, ReductionError),
    "top_k_reads_its_rank": ("(topk 3) V[i,r] := X[i,r]", {}, None, IndexExpressionError),
    "top_k_without_a_rank": ("(argtopk 3) N := X[i,j]", {}, None, IndexExpressionError),
    "top_k_without_k": ("(topk) V[i,r] := X[i,j]", {}, None, ReductionError),
    "top_k_larger_than_the_range": (
        "(argtopk 5) N[i,r] := -D[i,j]",
        {},
        {"D": (4, 3)},
        RangeError,
    ),
    "free_index_not_on_right": ("Y[i,j] := X[i]", {}, None, RangeError),
    "shifted_output_index": ("Y[i+1] := X[i]", {}, None, IndexExpressionError),
    "constant_output_index": ("Y[1,j] := X[j]", {}, None, IndexExpressionError),
    "boundary_form_inside_index": ("Y[i] := A[mod(i) + 1]", {}, None, IndexExpressionError),
    "pad_width_not_a_literal": ("Y[i] := A[pad(i - 1, k)] * W[k]", {}, None, IndexExpressionError),
    "boundary_form_as_value": ("Y[i] := clamp(A[i])", {}, None, IndexExpressionError),
    "boundary_form_around_index_array": ("Y[i] := A[mod(tok[i])]", {}, None, UnsupportedError),
    "padded_read_outside": (
        "Y[i] := A[pad(i - 2, 1)]",
        {"ranges": {"i": 5}},
        {"A": (5,)},
        RangeError,
    ),
    "non_affine_product": ("Y[i] := A[i*j] * B[j]", {}, None, IndexExpressionError),
    "non_affine_division": ("Y[i] := A[i/2]", {}, None, IndexExpressionError),
    "function_in_index": ("Y[i] := A[exp(i)]", {}, None, IndexExpressionError),
    "indexed_twice": ("Y[i,j] := A[i][j]", {}, None, IndexExpressionError),
    "unconstrained_index": ("Y[i] := X[i+k]", {}, None, RangeError),
    "index_only_a_value": ("Y[i] := i * 2", {}, None, RangeError),
    "unknown_range_key": ("Y[i] := X[i,k]", {"ranges": {"kk": 3}}, None, RangeError),
    "bad_range_step": ("Y[i] := X[i,k]", {"ranges": {"k": range(0, 6, 2)}}, None, RangeError),
    "tensor_two_ranks": ("Y[i] := X[i] + X[i,j]", {}, None, ShapeError),
    "output_on_right": ("Y[i] := Y[i] + X[i]", {}, None, UnknownNameError),
    "scalar_as_tensor": ("Y[i] := a * a[i]", {}, None, UnknownNameError),
    "index_as_tensor": ("Y[i] := X[i] * i[i]", {}, None, UnknownNameError),
    "division_by_zero": ("Y[i] := X[i] / 0", {}, None, ExpressionError),
    "hexadecimal_literal": ("Y[i] := X[i] * 0x1F", {}, None, ParseError),
    "digit_separator": ("Y[i] := X[i] * 1_000", {}, None, ParseError),
    "nested_too_deeply": ("Y[i] := " + "-(" * 33 + "X[i]" + ")" * 33, {}, None, ParseError),
    "offset_beyond_int64": ("Y[i] := X[i+18446744073709551616]", {}, None, IndexExpressionError),
    "coefficient_beyond_int64": (
        "Y[i] := X[9223372036854775808*i]",
        {},
        None,
        IndexExpressionError,
    ),
    "disagreeing_extents": (
        "C[i,j] := A[i,k] * B[k,j]",
        {},
        {"A": (2, 3), "B": (4, 5)},
        RangeError,
    ),
    "wrong_rank": ("C[i,j] := A[i,k] * B[k,j]", {}, {"A": (2, 3, 1), "B": (3, 5)}, ShapeError),
    "scalar_given_array": ("Y[i] := a * X[i]", {}, {"a": (3,), "X": (3,)}, ShapeError),
    "kernel_longer_than_signal": ("Y[i] := X[i+k] * W[k]", {}, {"X": (3,), "W": (6,)}, RangeError),
    "index_beyond_int64": ("Y[i] := X[i-9223372036854775807]", {}, {"X": (4,)}, RangeError),
    "index_arithmetic_beyond_int64": (
        "Y[i] := X[i+j-4611686018427387904] * W[j]",
        {},
        {"X": (4,), "W": (3,)},
        RangeError,
    ),
    "output_beyond_int64_bytes": ("Y[i] := i", {"ranges": {"i": 2**63 - 1}}, {}, RangeError),
    "output_product_beyond_int64_bytes": (
        "Y[i,j] := (i == j)",
        {"ranges": {"i": 2**62, "j": 4}},
        {},
        RangeError,
    ),
    "out_of_bounds_explicit": (
        "Y[i] := X[i+j] * W[j+1]",
        {"ranges": {"j": range(-1, 2)}},
        {"X": (6,), "W": (2,)},
        RangeError,
    ),
}


def raise_for(source: str, options: dict, shapes: dict | None) -> None:
    lowered = lower(parse(source), **options)
    if shapes is not None:
        check_shapes(lowered, shapes)


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_error(name: str) -> None:
    source, options, shapes, error = CASES[name]
    with pytest.raises(TensorDSLError) as info:
        raise_for(source, options, shapes)
    err = info.value
    assert type(err) is error
    assert isinstance(err, NotImplementedError if error is UnsupportedError else ValueError)
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


def test_errors_pickle() -> None:
    err = ParseError("bad", "Y := $", (5, 6), expected="a name")
    again = pickle.loads(pickle.dumps(err))
    assert (type(again), str(again), again.span) == (ParseError, str(err), (5, 6))
