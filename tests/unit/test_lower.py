"""Lowering: operands, indices, reductions, inferred ranges, and call-time shape checks."""

from __future__ import annotations

import contextlib

import pytest
import sympy

from codegen.ir.functions import FloorDiv
from codegen.ir.nest import Operand, extent_symbol, index_symbol, scalar_symbol, tensor_base
from tensordsl.errors import RangeError, ReductionError, ShapeError, TensorDSLError
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tensordsl.frontend.shapes import check_shapes


def low(source: str, **options):
    return lower(parse(source), **options)


def ranges(source: str, shapes: dict, **options) -> dict[str, tuple[int, int]]:
    """Every index's range, evaluated for `shapes`."""
    lowered = low(source, **options)
    extents = check_shapes(lowered, shapes)
    nest = lowered.nest
    return {
        r.index.name: (int(r.start.xreplace(extents)), int(r.stop.xreplace(extents)))
        for r in (*nest.free, *nest.terms[0].reduced)
    }


def test_operands_in_order_of_first_appearance() -> None:
    nest = low("Y[i] := alpha * X[i, k] + beta * W[k] + alpha").nest
    assert nest.operands == (
        Operand("alpha", 0),
        Operand("X", 2),
        Operand("beta", 0),
        Operand("W", 1),
    )


def test_free_and_reduced_order() -> None:
    nest = low("Y[j, i] := A[k, i, m] * B[j, m, k]").nest
    assert [s.name for s in nest.free_indices] == ["j", "i"]
    assert [s.name for s in nest.terms[0].reduced_indices] == ["k", "m"]


def test_body_symbols() -> None:
    nest = low("Y[i] := a * X[i + 1] + i").nest
    i = index_symbol("i")
    assert nest.terms[0].body == scalar_symbol("a") * tensor_base("X")[i + 1] + i


def test_numbers() -> None:
    body = low("s := 2 + 0.5 + 1e-3").nest.terms[0].body
    assert body == sympy.Integer(2) + sympy.Float(0.5) + sympy.Float(1e-3)


@pytest.mark.parametrize(
    "prefix, option, expected",
    [
        ("", None, "sum"),
        ("(max) ", None, "max"),
        ("", "min", "min"),
        ("(logsumexp) ", "logsumexp", "logsumexp"),
        ("(prod) ", None, "prod"),
    ],
)
def test_reduction(prefix: str, option: str | None, expected: str) -> None:
    assert low(f"{prefix}Y[i] := X[i, k]", reduce=option).nest.reduction == expected


@pytest.mark.parametrize(
    "prefix, option", [("(max) ", "min"), ("(argmax) ", "mean"), ("", "median")]
)
def test_bad_reduction(prefix: str, option: str | None) -> None:
    with pytest.raises(ReductionError):
        low(f"{prefix}Y[i] := X[i, k]", reduce=option)


def test_matmul_ranges() -> None:
    nest = low("C[i,j] := A[i,k] * B[k,j]").nest
    assert [(r.start, r.stop) for r in nest.free] == [
        (0, extent_symbol("A", 0)),
        (0, extent_symbol("B", 1)),
    ]
    assert nest.terms[0].reduced[0].stop == extent_symbol("A", 1)


def test_valid_convolution() -> None:
    nest = low("Y[i] := X[i+k] * W[k]").nest
    n, k = extent_symbol("X", 0), extent_symbol("W", 0)
    assert nest.free[0].stop == n - k + 1
    assert ranges("Y[i] := X[i+k] * W[k]", {"X": (7,), "W": (3,)}) == {"i": (0, 5), "k": (0, 3)}


def test_stencil() -> None:
    nest = low("Y[i] := X[i-1] - 2*X[i] + X[i+1]").nest
    assert (nest.free[0].start, nest.free[0].stop) == (1, extent_symbol("X", 0) - 1)


def test_strided() -> None:
    nest = low("Y[i] := X[2i] + X[2i+1]").nest
    assert nest.free[0].stop == FloorDiv(extent_symbol("X", 0) - 2, 2) + 1
    for n, stop in [(9, 4), (8, 4), (3, 1), (2, 1)]:
        assert ranges("Y[i] := X[2i] + X[2i+1]", {"X": (n,)}) == {"i": (0, stop)}
    with pytest.raises(RangeError, match="empty range"):
        ranges("Y[i] := X[2i] + X[2i+1]", {"X": (1,)})


def test_dilated() -> None:
    assert ranges("Y[i] := X[i + 2k] * W[k]", {"X": (10,), "W": (3,)}) == {"i": (0, 6), "k": (0, 3)}


def test_negative_coefficient() -> None:
    assert ranges("Y[i] := X[-i+4]", {"X": (5,)}) == {"i": (0, 5)}


def test_explicit_ranges() -> None:
    shapes = {"X": (6,), "W": (3,)}
    found = ranges("Y[i] := X[i+j] * W[j+1]", shapes, ranges={"j": range(-1, 2)})
    assert found == {"i": (1, 5), "j": (-1, 2)}
    assert ranges("Y[i] := X[i, k]", {"X": (4, 5)}, ranges={"k": 3}) == {"i": (0, 4), "k": (0, 3)}
    assert low("Y[i,j] := X[i]", ranges={"j": 3}).nest.free[1].stop == 3


@pytest.mark.parametrize("option", [{"q": 3}, {"k": range(0, 4, 2)}, {"k": -1}, {"k": "3"}])
def test_bad_explicit_ranges(option: dict) -> None:
    with pytest.raises(RangeError):
        low("Y[i] := X[i, k]", ranges=option)


def test_conv2d_with_channels() -> None:
    source = "Y[b,o,y,x] := X[b,c,y+u,x+v] * W[o,c,u,v]"
    found = ranges(source, {"X": (2, 3, 8, 9), "W": (4, 3, 3, 2)})
    assert found == {
        "b": (0, 2),
        "o": (0, 4),
        "y": (0, 6),
        "x": (0, 8),
        "c": (0, 3),
        "u": (0, 3),
        "v": (0, 2),
    }


def test_index_used_as_value_and_masked() -> None:
    assert ranges("M[i,j] := A[i]*A[j]*(i <= j) + i", {"A": (3,)}) == {"i": (0, 3), "j": (0, 3)}


@pytest.mark.parametrize("source", ["Y[i] := i", "Y[i] := X[i+k]", "s := X[i+j]"])
def test_unconstrained(source: str) -> None:
    with pytest.raises(RangeError, match="cannot infer the range"):
        low(source)


def test_check_shapes_returns_every_extent() -> None:
    lowered = low("Y[i] := a * X[i, k] * W[k]")
    extents = check_shapes(lowered, {"a": (), "X": (2, 3), "W": (3,)})
    assert extents == {extent_symbol("X", 0): 2, extent_symbol("X", 1): 3, extent_symbol("W", 0): 3}


@pytest.mark.parametrize(
    "shapes, error, words",
    [
        ({"A": (2, 3), "B": (4, 5)}, RangeError, "index 'k' has extent 3 from axis 1 of 'A' but 4"),
        ({"A": (2, 3)}, ShapeError, "no array given for 'B'"),
        ({"A": (2, 3, 1), "B": (3, 5)}, ShapeError, "'A' is a tensor of rank 2"),
    ],
)
def test_check_shapes_errors(shapes: dict, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        check_shapes(low("C[i,j] := A[i,k] * B[k,j]"), shapes)


def test_check_shapes_scalar_rank() -> None:
    with pytest.raises(ShapeError, match="'a' is a scalar"):
        check_shapes(low("Y[i] := a * X[i]"), {"a": (3,), "X": (3,)})


def test_empty_free_range() -> None:
    with pytest.raises(RangeError, match=r"empty range \[0, -2\)"):
        check_shapes(low("Y[i] := X[i+k] * W[k]"), {"X": (3,), "W": (6,)})
    # An empty batch is fine when the index is unshifted.
    check_shapes(low("Y[i] := X[i]"), {"X": (0,)})


def test_reads_out_of_bounds() -> None:
    lowered = low("Y[i] := X[i+j] * W[j+1]", ranges={"j": range(-1, 2)})
    with pytest.raises(RangeError, match=r"reads axis 0 of 'W' at 0\.\.2, outside \[0, 2\)"):
        check_shapes(lowered, {"X": (6,), "W": (2,)})
    with pytest.raises(RangeError, match="reads axis 0 of 'X'"):
        check_shapes(low("Y[i] := X[5] * Z[i]"), {"X": (3,), "Z": (2,)})


def test_no_bare_errors_from_check_shapes() -> None:
    lowered = low("C[i,j] := A[i,k] * B[k,j]")
    for shapes in ({}, {"A": (), "B": ()}, {"A": (1, 1), "B": (1,)}, {"A": (0, 0), "B": (1, 0)}):
        with contextlib.suppress(TensorDSLError):
            check_shapes(lowered, shapes)
