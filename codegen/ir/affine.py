"""Affine index expressions: the one place that decides what "affine in the indices, with
integer coefficients" means.

An index expression `c1*i1 + ... + cn*in + constant` is affine when every coefficient `c` is
an integer and the constant is free of the indices (and not a fraction); generated code does
index arithmetic in int64, so integer coefficients and constants are at most `INDEX_LIMIT`
in magnitude. Three callers use this module: the translator of a statement's accesses
(`tensordsl/frontend/translate.py`, which builds each index expression with `combine` so that
nothing non-affine is ever built), the change of variables of a gradient (`codegen/passes/grad.py`)
and the loop bounds of a term (`codegen/ir/bounds.py`), which read the coefficients with
`affine_parts`.

>>> i, k = sympy.Symbol("i", integer=True), sympy.Symbol("k", integer=True)
>>> as_affine(2 * (i + 1) - k, (i, k))
Affine(coefficients=((i, 2), (k, -1)), constant=2)
>>> as_affine(i / 2, (i,))
Traceback (most recent call last):
...
codegen.ir.affine.NotAffine: i/2 is not affine in (i,): non-integer (coefficient 1/2 of i)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

import sympy

#: Why an expression is not affine with integer coefficients.
PRODUCT, DIVISION, POWER, FUNCTION, NON_INTEGER, NOT_INT64 = (
    "product",
    "division",
    "power",
    "function",
    "non-integer",
    "beyond int64",
)
#: The largest magnitude of an integer constant in the index arithmetic of generated code:
#: int64, made symmetric because C has no literal for -2**63 (`-9223372036854775808` is the
#: negation of an unsigned constant).
INDEX_LIMIT = 2**63 - 1
#: The largest constant exponent `combine` evaluates (larger powers are not index arithmetic).
MAX_EXPONENT = 64


class NotAffine(ValueError):
    """`expr` is not affine in `indices`; `reason` says why (PRODUCT, DIVISION, POWER,
    FUNCTION, NON_INTEGER, NOT_INT64); for NON_INTEGER and NOT_INT64, `index` and
    `coefficient` say where (`index` is None for the constant)."""

    def __init__(
        self,
        reason: str,
        expr: sympy.Basic,
        indices: Sequence[sympy.Symbol],
        index: sympy.Symbol | None = None,
        coefficient: sympy.Basic | None = None,
    ) -> None:
        where = f" (coefficient {coefficient} of {index})" if coefficient is not None else ""
        super().__init__(f"{expr} is not affine in {tuple(indices)}: {reason}{where}")
        self.reason, self.index, self.coefficient = reason, index, coefficient


@dataclass(frozen=True)
class Affine:
    """`sum(c * index) + constant`: integer coefficients (none zero), a constant free of the
    indices."""

    coefficients: tuple[tuple[sympy.Symbol, int], ...]
    constant: sympy.Expr

    def coefficient(self, index: sympy.Symbol) -> int:
        """The coefficient of `index` (0 when it does not appear)."""
        return dict(self.coefficients).get(index, 0)

    @property
    def indices(self) -> tuple[sympy.Symbol, ...]:
        return tuple(index for index, _ in self.coefficients)

    @property
    def bare_index(self) -> sympy.Symbol | None:
        """The index when the expression is that index alone (an unshifted use)."""
        if self.constant == 0 and len(self.coefficients) == 1 and self.coefficients[0][1] == 1:
            return self.coefficients[0][0]
        return None

    def expr(self) -> sympy.Expr:
        return sympy.Add(*(c * index for index, c in self.coefficients), self.constant)


def affine_parts(expr: sympy.Expr, indices: Sequence[sympy.Symbol]) -> dict[sympy.Symbol, int]:
    """The integer coefficient of each of `indices` that appears linearly in `expr`.

    Parts of `expr` where an index appears other than linearly (inside a `FloorDiv`, say) are
    not looked at; `as_affine` rejects them.

    Raises:
        NotAffine: a coefficient is not an integer (NON_INTEGER) or holds an index (PRODUCT).

    >>> i, j = sympy.Symbol("i", integer=True), sympy.Symbol("j", integer=True)
    >>> affine_parts(3 * i - j + 7, (i, j))
    {i: 3, j: -1}
    """
    expanded = sympy.expand(expr)
    coefficients = {}
    for index in indices:
        coefficient = expanded.coeff(index)
        if coefficient == 0:
            continue
        if coefficient.has(*indices):
            raise NotAffine(PRODUCT, expr, indices, index, coefficient)
        if not coefficient.is_Integer:
            raise NotAffine(NON_INTEGER, expr, indices, index, coefficient)
        coefficients[index] = int(coefficient)
    return coefficients


def as_affine(expr: sympy.Expr, indices: Sequence[sympy.Symbol]) -> Affine:
    """`expr` as an `Affine` in `indices` (its coefficients in the order of `indices`).

    Raises:
        NotAffine: `expr` is not affine in `indices` with integer coefficients, or an integer
            coefficient or constant is larger than `INDEX_LIMIT` in magnitude (NOT_INT64).

    >>> i = sympy.Symbol("i", integer=True)
    >>> as_affine(i + 2**64, (i,))
    Traceback (most recent call last):
    ...
    codegen.ir.affine.NotAffine: i + 18446744073709551616 is not affine in (i,): beyond int64 ...
    """
    expanded = sympy.expand(expr)
    coefficients = affine_parts(expanded, indices)
    constant = sympy.expand(expanded - sum(c * index for index, c in coefficients.items()))
    for term in sympy.Add.make_args(constant):
        if term.has(*indices):
            raise NotAffine(_reason(term, indices), expr, indices)
    if constant.is_integer is False:
        raise NotAffine(NON_INTEGER, expr, indices, None, constant)
    integers = [(index, sympy.Integer(c)) for index, c in coefficients.items()]
    if constant.is_Integer:
        integers.append((None, constant))
    for index, value in integers:
        if abs(value) > INDEX_LIMIT:
            raise NotAffine(NOT_INT64, expr, indices, index, value)
    return Affine(tuple(coefficients.items()), constant)


def _reason(term: sympy.Expr, indices: Collection[sympy.Symbol]) -> str:
    """Why one term of an expanded expression, which holds an index, is not linear in it."""
    for factor in sympy.Mul.make_args(term):
        if isinstance(factor, sympy.Pow) and factor.has(*indices):
            negative = factor.exp.is_negative and factor.base.has(*indices)
            return DIVISION if negative else POWER
        if factor.has(*indices) and not isinstance(factor, sympy.Symbol):
            return FUNCTION
    return PRODUCT


def combine(
    op: str, left: sympy.Expr, right: sympy.Expr, indices: Collection[sympy.Symbol]
) -> sympy.Expr:
    """`left op right` (op one of + - * / **) for two affine parts of an index expression.

    The operation is refused before it is built when its result would not be affine: a
    product of two parts that both hold indices, a division by an index or by zero, a power
    of anything but constants with an integer exponent in [0, MAX_EXPONENT].

    Raises:
        NotAffine: with reason PRODUCT, DIVISION or POWER.

    >>> i = sympy.Symbol("i", integer=True)
    >>> combine("*", sympy.Integer(2), i + 1, (i,))
    2*i + 2
    >>> combine("*", i, i, (i,))
    Traceback (most recent call last):
    ...
    codegen.ir.affine.NotAffine: i*i is not affine in (i,): product
    """
    left_indexed, right_indexed = left.has(*indices), right.has(*indices)
    if op == "+":
        return left + right
    if op == "-":
        return left - right
    if op == "*":
        if left_indexed and right_indexed:
            raise NotAffine(PRODUCT, sympy.Mul(left, right, evaluate=False), tuple(indices))
        return left * right
    if op == "/":
        if right_indexed or right == 0:
            quotient = sympy.Mul(left, sympy.Pow(right, -1, evaluate=False), evaluate=False)
            raise NotAffine(DIVISION, quotient, tuple(indices))
        return left / right
    if op == "**":
        small = right.is_Integer and 0 <= right <= MAX_EXPONENT
        if left_indexed or right_indexed or not small:
            raise NotAffine(POWER, sympy.Pow(left, right, evaluate=False), tuple(indices))
        return left**right
    raise ValueError(f"unknown operation {op!r} in an index expression")


def holds_everywhere(value: sympy.Expr, box: Mapping[sympy.Symbol, tuple[int, int]]) -> bool:
    """Whether the affine `value >= 0` holds at every point of `box` (each symbol's inclusive
    range; an empty box: yes). False where `value` is not affine in the box's symbols or
    reads another symbol.

    >>> i, j = sympy.symbols("i j", integer=True)
    >>> holds_everywhere(i - j, {i: (3, 5), j: (0, 3)})
    True
    >>> holds_everywhere(i - j, {i: (0, 5), j: (0, 3)})
    False
    """
    value = sympy.expand(value)
    if not value.free_symbols <= set(box):
        return False
    if any(hi < lo for lo, hi in box.values()):
        return True
    least = value.xreplace({s: 0 for s in box})
    for s, (lo, hi) in box.items():
        c = value.coeff(s)
        if not c.is_number or value.diff(s, 2) != 0:
            return False
        least += min(c * lo, c * hi)
    return bool(least >= 0)
