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
from tensordsl.errors import ExpressionError
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
            left, right = self.condition(node.left), self.condition(node.right)
            return self.checked(node, lambda: _JOINS[node.op](left, right))
        if isinstance(node, Unary) and node.op == "not":
            operand = self.condition(node.operand)
            return self.checked(node, lambda: sympy.Not(operand))
        value = self.value(node)
        return self.checked(node, lambda: sympy.Ne(value, 0))

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
