"""Conditions joined with `and`/`&`, `or`/`|`, `not`/`~`, and the floor division `//` and
remainder `%` of values and indices.

A condition is a sympy boolean: a comparison, a conjunction, a disjunction or a negation of
conditions, or a value read as `value != 0`. Used as a value it is 1 where it holds and 0
elsewhere (`codegen.ir.functions.indicator`), with no gradient. A conjunction of affine
comparisons between indices is what a product of comparisons already was, a `sympy.And`, so
it bounds the loops as they do (`codegen.passes.guards`); a disjunction stays a test per
element.

`a // b` and `a % b` round towards minus infinity, as Python and jnp: `-7 // 2` is -4 and
`-7 % 2` is 1. Between indices (and integer constants) the divisor must be a nonzero integer
constant; the result is an integer value (`FloorDiv`), usable in values and conditions but
not in an access, where it is not affine.

>>> from tensordsl.frontend.parse import parse
>>> from tensordsl.frontend.translate import translate
>>> translate(parse("Y[i] := X[j] * ((j <= i) & not (j < i - 8))")).body
Piecewise((1, (i >= j) & (j >= i - 8)), (0, True))*X[j]
>>> translate(parse("Y[i] := X[i] * ((i - 3) % 4)")).body
(i - 4*FloorDiv(i - 3, 4) - 3)*X[i]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import sympy

from codegen.ir.functions import floor_divide, remainder
from tensordsl.errors import ExpressionError, UnsupportedError
from tensordsl.frontend.indices import text_of
from tensordsl.frontend.parse import Binary, Compare, Expr, Span, Unary

_JOINS = {"and": sympy.And, "or": sympy.Or}
_DIVISIONS = {"//": floor_divide, "%": remainder}


def is_condition(node: Expr) -> bool:
    """Whether `node` is written as a condition: a comparison or a logical operation."""
    return (
        isinstance(node, Compare)
        or (isinstance(node, Binary) and node.op in _JOINS)
        or (isinstance(node, Unary) and node.op == "not")
    )


class Conditions:
    """The translator's conditions and divisions; the translator provides `src`, `value`,
    `relation` and `checked`."""

    src: str
    value: Callable[[Expr], Any]
    relation: Callable[[Compare], Any]
    checked: Callable[[Expr, Callable[[], Any]], Any]

    def condition(self, node: Expr) -> Any:
        """`node` as a sympy boolean; a value `v` is the condition `v != 0`."""
        if isinstance(node, Compare):
            return self.relation(node)
        if isinstance(node, Binary) and node.op in _JOINS:
            symbol = self.src[node.left.span[1] : node.right.span[0]].strip(" \t\n()")
            left = self.operand_condition(node.left, node, symbol)
            right = self.operand_condition(node.right, node, symbol)
            return self.checked(node, lambda: _JOINS[node.op](left, right))
        if isinstance(node, Unary) and node.op == "not":
            symbol = self.src[node.span[0] : node.operand.span[0]].strip(" \t\n()")
            operand = self.operand_condition(node.operand, node, symbol)
            return self.checked(node, lambda: sympy.Not(operand))
        value = self.value(node)
        return self.checked(node, lambda: sympy.Ne(value, 0))

    def operand_condition(self, operand: Expr, node: Expr, symbol: str) -> Any:
        """An operand of `&`, `|` or `~` (`symbol`) as a condition. Python and FlexAttention
        read `&`, `|` and `~` of integers bitwise (`q_idx & 1` is its lowest bit, `~i` is
        `-i - 1`), the language logically (`i & 1` would be `i != 0`): an operand that is
        integer arithmetic of indices (other than a 0 or 1) is refused rather than read
        otherwise than its writer meant. The words `and`, `or`, `not` are logical in
        Python too, and read any value as a condition."""
        if symbol in ("&", "|", "~") and not is_condition(operand):
            value = self.value(operand)
            if value.is_integer and value not in (sympy.Integer(0), sympy.Integer(1)):
                raise UnsupportedError(
                    f"'{symbol}' of the integer '{text_of(self.src, operand.span)}' would be "
                    "bitwise in Python; here '&', '|' and '~' join conditions",
                    self.src,
                    node.span,
                    expected="conditions on both sides: comparisons, and values of arrays",
                    hint="the lowest bit of i is 'i % 2 == 1'; a value as a condition is "
                    "written with 'and', 'or', 'not' ('i and j <= 4')",
                )
        return self.condition(operand)

    def division(self, node: Binary, left: Any, right: Any) -> Any:
        """`left // right` or `left % right` (`node.op`), rounded towards minus infinity."""
        if left.is_integer and right.is_integer and not (right.is_Integer and right != 0):
            self.refuse_divisor(node, node.right.span)
        return self.checked(node, lambda: _DIVISIONS[node.op](left, right))

    def refuse_divisor(self, node: Binary, span: Span) -> None:
        raise ExpressionError(
            f"the divisor of '{text_of(self.src, node.span)}' is not a nonzero constant",
            self.src,
            span,
            expected=f"'{node.op}' between indices by a nonzero integer constant, as in "
            f"'q_idx {node.op} 64'",
        )
