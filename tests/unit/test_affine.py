"""The affine index analysis (codegen/ir/affine.py) and how the translator words its verdicts."""

from __future__ import annotations

import re

import pytest
import sympy

from codegen.ir.affine import (
    DIVISION,
    FUNCTION,
    NON_INTEGER,
    POWER,
    PRODUCT,
    NotAffine,
    affine_parts,
    as_affine,
    combine,
)
from codegen.ir.functions import FloorDiv
from codegen.ir.nest import extent_symbol, index_symbol
from tensordsl.errors import IndexExpressionError
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

i, j, k = (index_symbol(n) for n in "ijk")
n = extent_symbol("X", 0)


@pytest.mark.parametrize(
    "expr, coefficients, constant",
    [
        (i, {i: 1}, 0),
        (2 * (i + 1) - k, {i: 2, k: -1}, 2),
        (i - i + 3, {}, 3),
        (n - 1 - i, {i: -1}, n - 1),  # the constant may hold extents
        (sympy.Rational(1, 2) * (2 * i + 4), {i: 1}, 2),
    ],
)
def test_affine_forms(expr: sympy.Expr, coefficients: dict, constant: sympy.Expr) -> None:
    form = as_affine(expr, (i, j, k))
    assert dict(form.coefficients) == coefficients
    assert form.constant == constant
    assert sympy.expand(form.expr() - expr) == 0


def test_coefficients_follow_the_order_of_indices() -> None:
    assert as_affine(i + k, (k, i)).coefficients == ((k, 1), (i, 1))
    assert as_affine(i + k, (i, k)).coefficients == ((i, 1), (k, 1))


def test_bare_index() -> None:
    assert as_affine(i, (i,)).bare_index == i
    assert as_affine(i + 1, (i,)).bare_index is None
    assert as_affine(2 * i, (i,)).bare_index is None


@pytest.mark.parametrize(
    "expr, reason",
    [
        (i * j, PRODUCT),
        (i * n, NON_INTEGER),  # a coefficient that is an extent
        (i / 2, NON_INTEGER),
        (i + sympy.Rational(1, 2), NON_INTEGER),  # the constant too
        (1 / i, DIVISION),
        (i**2, POWER),
        (2**i, POWER),
        (FloorDiv(i, 2), FUNCTION),
        (sympy.exp(i), FUNCTION),
    ],
)
def test_not_affine(expr: sympy.Expr, reason: str) -> None:
    with pytest.raises(NotAffine) as info:
        as_affine(expr, (i, j))
    assert info.value.reason == reason


def test_affine_parts_reads_the_linear_part_only() -> None:
    """A gradient's change of variables leaves indices inside FloorDiv; those are skipped."""
    assert affine_parts(2 * i + FloorDiv(k - i, 2) + n, (i, k)) == {i: 2}
    with pytest.raises(NotAffine) as info:
        affine_parts(i * n + k, (i, k))
    assert (info.value.reason, info.value.index, info.value.coefficient) == (NON_INTEGER, i, n)


@pytest.mark.parametrize(
    "op, left, right, reason",
    [
        ("*", i, j + 1, PRODUCT),
        ("/", i, j, DIVISION),
        ("/", i, sympy.Integer(0), DIVISION),
        ("**", i, sympy.Integer(2), POWER),
        ("**", sympy.Integer(2), i, POWER),
        ("**", sympy.Integer(2), sympy.Integer(65), POWER),  # never builds huge constants
        ("**", sympy.Integer(2), sympy.Integer(-1), POWER),
        ("**", sympy.Integer(2), sympy.Rational(1, 2), POWER),
    ],
)
def test_combine_refuses(op: str, left: sympy.Expr, right: sympy.Expr, reason: str) -> None:
    with pytest.raises(NotAffine) as info:
        combine(op, left, right, (i, j))
    assert info.value.reason == reason


@pytest.mark.parametrize(
    "op, left, right, expected",
    [
        ("+", i, sympy.Integer(1), i + 1),
        ("-", i, j, i - j),
        ("*", sympy.Integer(3), i + 1, 3 * i + 3),
        ("/", 4 * i, sympy.Integer(2), 2 * i),
        ("**", sympy.Integer(2), sympy.Integer(64), sympy.Integer(2**64)),
    ],
)
def test_combine_builds(op: str, left: sympy.Expr, right: sympy.Expr, expected: sympy.Expr) -> None:
    assert sympy.expand(combine(op, left, right, (i, j)) - expected) == 0


@pytest.mark.parametrize(
    "index, words",
    [
        ("i*j", "is not affine: a product of indices"),
        ("i/j", "is not affine: a division by an index or zero"),
        ("i/0", "is not affine: a division by an index or zero"),
        ("i**2", "is not affine: a power of indices"),
        ("2**70", "is not affine: a power of indices"),
        ("i/2", "has a non-integer coefficient"),
        ("i+1/2", "has a non-integer coefficient"),
        ("1.5", "is not affine: '1.5' is not an integer"),
        ("exp(i)", "is not affine: it contains a function call"),
        ("B[i]*i", "is not affine: a product of indices"),
        ("i<j", "is not affine: it contains a comparison"),
    ],
)
def test_translator_wording(index: str, words: str) -> None:
    with pytest.raises(
        IndexExpressionError, match=re.escape(f"index expression '{index}' {words}")
    ):
        lower(parse(f"Y[i] := A[{index}] * C[i, j]"))


@pytest.mark.parametrize(
    "index, expected",
    [("2*(i+1)", 2 * i + 2), ("4/2*i - j", 2 * i - j), ("(i+j)*(2-2) + 1", 1), ("k+i", k + i)],
)
def test_translator_builds_affine_accesses(index: str, expected: sympy.Expr) -> None:
    nest = lower(parse(f"Y[i] := A[{index}] * C[i, j, k]")).nest
    access = next(a for a in nest.terms[0].body.atoms(sympy.Indexed) if a.base.name == "A")
    assert access.indices == (expected,)
