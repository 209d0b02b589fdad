"""Translate the syntax tree of a statement's right-hand side to sympy.

Tensor reads become `Indexed` accesses, scalars real symbols, indices integer symbols (usable
as values), functions the sympy forms of `codegen/ir/functions.py`. Every access's index
expressions are kept as `Affine` forms (`codegen/ir/affine.py` decides what is affine) for range
inference and the call-time checks. Names are checked for their roles on the way (an output
read on the right, an index read as a tensor, a tensor read with two ranks, ...).

>>> from tensordsl.frontend.parse import parse
>>> t = translate(parse("Y[i] := X[i+k] * W[k]"))
>>> t.body, t.free, t.reduced, t.operands
(W[k]*X[i + k], ['i'], ['k'], [('X', 1), ('W', 1)])
>>> t.accesses[0].axes
(Affine(coefficients=((i, 1), (k, 1)), constant=0),)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import sympy

from codegen.ir.functions import FUNCTIONS, canonical, indicator, spellings
from codegen.ir.ieee import IeeeAdd, cancels, ieee
from codegen.ir.nest import index_symbol, scalar_symbol
from codegen.ir.reductions import USER_REDUCTIONS
from tensordsl.errors import (
    ExpressionError,
    IndexExpressionError,
    ShapeError,
    UnknownNameError,
    UnsupportedError,
    close_match,
)
from tensordsl.frontend.boundaries import BOUNDARY_FORMS
from tensordsl.frontend.einstein import Whole
from tensordsl.frontend.ellipsis import check_placement
from tensordsl.frontend.gathers import Gather, GatheredAccesses
from tensordsl.frontend.indices import (
    INFINITY,
    POSITIONS,
    SIZE,
    SIZE_HINTS,
    AccessUse,
    size_placeholder,
    text_of,
    walk,
)
from tensordsl.frontend.logic import Conditions, is_condition
from tensordsl.frontend.parse import (
    Access,
    Binary,
    Call,
    Compare,
    Expr,
    Name,
    Number,
    Span,
    Statement,
    Unary,
)

__all__ = ["AccessUse", "Translation", "translate"]


_RELATIONS = {
    "<": sympy.Lt,
    "<=": sympy.Le,
    ">": sympy.Gt,
    ">=": sympy.Ge,
    "==": sympy.Eq,
    "!=": sympy.Ne,
}
_NOT_FINITE = (sympy.zoo, sympy.oo, -sympy.oo, sympy.nan, sympy.I)


@dataclass
class Translation:
    """What walking the right-hand side found."""

    body: sympy.Expr
    free: list[str]  # from the left-hand side, in order
    reduced: list[str]  # the other indices, in order of first appearance on the right
    operands: list[tuple[str, int]]  # (name, rank), in order of first appearance
    accesses: tuple[AccessUse, ...]  # every tensor access, in source order
    index_spans: tuple[tuple[str, Span], ...]  # first occurrence of every index
    body_spans: dict[str, Span]  # first occurrence of every index on the right-hand side
    operand_spans: dict[str, Span]  # first use of every operand
    gathers: tuple[Gather, ...] = ()  # accesses through index arrays (gathered operands)


class _Translator(Conditions, GatheredAccesses):
    """Turns the syntax tree of the right-hand side into sympy, recording names and accesses."""

    def __init__(self, statement: Statement, named: Collection[str] = ()) -> None:
        self.st = statement
        self.named = named
        self.src = statement.source
        self.ranks: dict[str, int] = {}
        self.spans: dict[str, Span] = {}
        self.accesses: list[AccessUse] = []
        self.gathers: list[Gather] = []

    def build(self) -> Translation:
        check_placement(self.st, self.src)
        free = self.free_indices()
        bracketed = [
            n
            for a in walk(self.st.body)
            if isinstance(a, Access)
            for i in a.indices
            for n in walk(i)
            if isinstance(n, Name) and n.name not in POSITIONS
        ]
        # A name given a range by `ranges=` is an index even where it is only a value
        # (`s := (i >= 0)` with ranges={"i": 10}), never a scalar input.
        valued = {n.name for n in walk(self.st.body) if isinstance(n, Name)} & set(self.named)
        self.indices = set(free) | {n.name for n in bracketed} | valued
        self.index_symbols = tuple(index_symbol(n) for n in sorted(self.indices))
        body_spans: dict[str, Span] = {}
        for node in walk(self.st.body):
            if isinstance(node, Name) and node.name in self.indices:
                body_spans.setdefault(node.name, node.span)
        if self.st.output in self.indices:
            raise UnknownNameError(
                f"'{self.st.output}' is both the output and an index",
                self.src,
                self.st.output_span,
                expected="different names for the output and its indices",
            )
        parts = self.additive(self.st.body)
        body = self.checked(self.st.body, lambda: sympy.Add(*parts))
        spans = dict(zip(free, (n.span for n in self.st.indices or ()), strict=True))
        for name, span in body_spans.items():
            spans.setdefault(name, span)
        reduced = [n for n in body_spans if n not in free]
        return Translation(
            body,
            free,
            reduced,
            list(self.ranks.items()),
            tuple(self.accesses),
            tuple(spans.items()),
            body_spans,
            self.spans,
            tuple(self.gathers),
        )

    def free_indices(self) -> list[str]:
        names: list[str] = []
        for node in self.st.indices or ():
            if not isinstance(node, Name):
                raise IndexExpressionError(
                    f"'{text_of(self.src, node.span)}' on the left-hand side is not an index name",
                    self.src,
                    node.span,
                    expected="plain, distinct index names, as in 'Y[i, j]'",
                )
            if node.name in POSITIONS:
                raise IndexExpressionError(
                    f"'{node.name}' is a position, not an index name",
                    self.src,
                    node.span,
                    expected="an index name; 'begin' and 'end' stand for the first and last "
                    "position of an axis inside an input's index, as in 'D[i,end]'",
                )
            if node.name in names:
                raise IndexExpressionError(
                    f"index '{node.name}' appears twice on the left-hand side",
                    self.src,
                    node.span,
                    expected="distinct names (a diagonal is read as 'Y[i] := A[i, i]')",
                )
            names.append(node.name)
        return names

    def register(self, name: str, rank: int, span: Span) -> None:
        if name == self.st.output:
            raise UnknownNameError(
                f"the output '{name}' is used on the right-hand side",
                self.src,
                span,
                expected="only inputs on the right-hand side",
            )
        if rank and name in self.indices:
            raise UnknownNameError(
                f"'{name}' is an index and cannot be read as a tensor",
                self.src,
                span,
                expected="different names for tensors and indices",
            )
        self.spans.setdefault(name, span)
        before = self.ranks.setdefault(name, rank)
        if before == rank:
            return
        if 0 in (before, rank):
            raise UnknownNameError(
                f"'{name}' is used both as a scalar and as a tensor",
                self.src,
                span,
                expected="one role per name",
            )
        raise ShapeError(
            f"'{name}' is read with {rank} indices here but with {before} before",
            self.src,
            span,
            expected=f"the same number of indices on every read of '{name}'",
        )

    def fail(self, what: str, node: Expr, expected: str) -> ExpressionError:
        return ExpressionError(what, self.src, node.span, expected=expected)

    def checked(self, node: Expr, build: Callable[[], sympy.Basic]) -> Any:
        """`build()`, turning sympy's complaints and non-finite values into user errors."""
        text = text_of(self.src, node.span)
        try:
            result = _large_integers_as_floats(build())
        except (TypeError, ValueError, ArithmeticError, RecursionError) as err:
            raise self.fail(
                f"cannot evaluate '{text}': {err}", node, "an expression with a finite real value"
            ) from None
        floats = result.atoms(sympy.Float) if isinstance(result, sympy.Basic) else ()
        # Written infinities stay (`-inf`); an undefined value (`inf - inf`, `1/0`) never does.
        infinite = any(isinstance(n, Name) and n.name == INFINITY for n in walk(node))
        bad = [v for v in _NOT_FINITE if not (infinite and v in (sympy.oo, -sympy.oo))]
        if (
            any(result.has(v) for v in bad)
            or any(not math.isfinite(f) for f in floats)
            or _complex_power(result)
        ):
            kind = "real number or infinity" if infinite else "finite real number"
            raise self.fail(
                f"'{text}' is not a {kind}",
                node,
                f"an expression with a {'real' if infinite else 'finite real'} value",
            )
        return result

    def value(self, node: Expr) -> Any:
        if isinstance(node, Number):
            return self.checked(node, lambda: _number(node.text))
        if isinstance(node, Name):
            if node.name == INFINITY:
                return sympy.oo
            if node.name in self.indices:
                return index_symbol(node.name)
            self.register(node.name, 0, node.span)
            return scalar_symbol(node.name)
        if isinstance(node, Access):
            return self.access(node)
        if isinstance(node, Call):
            return self.call(node)
        if isinstance(node, Compare) or is_condition(node):
            return indicator(self.condition(node))
        if isinstance(node, Unary):
            operand = self.value(node.operand)
            return -operand if node.op == "-" else operand
        return self.binary(node)

    def additive(self, node: Expr, negated: bool = False) -> tuple[Any, ...]:
        """The values of the top-level additive terms of `node` (through `+`, `-` and a
        leading sign), signed, in source order; every sum on the way is checked as
        `binary` checks it."""
        if isinstance(node, Binary) and node.op in ("+", "-"):
            left = self.additive(node.left, negated)
            right = self.additive(node.right, negated != (node.op == "-"))
            total = self.checked(node, lambda: sympy.Add(*left, *right))
            if cancels("+", sympy.Add(*left), sympy.Add(*right), total):
                # one part, the operation kept as written (`binary`): NaN and inf propagate
                value = self.value(node)
                return (-value if negated else value,)
            return (*left, *right)
        if isinstance(node, Unary) and node.op in "+-":
            return self.additive(node.operand, negated != (node.op == "-"))
        value = self.value(node)
        return (-value if negated else value,)

    def binary(self, node: Binary) -> Any:
        left, right = self.value(node.left), self.value(node.right)
        if node.op in ("//", "%"):
            return self.division(node, left, right)
        huge = left.is_Number and right.is_Number and abs(right) > 256
        if node.op == "**" and huge and left not in (0, 1, -1):
            raise self.fail(
                f"'{text_of(self.src, node.span)}' is too large",
                node,
                "a constant power with an exponent of at most 256",
            )
        ops: dict[str, Callable[[], Any]] = {
            "+": lambda: left + right,
            "-": lambda: left - right,
            "*": lambda: left * right,
            "/": lambda: left / right,
            "**": lambda: left**right,
        }
        result = self.checked(node, ops[node.op])
        if node.op == "**":
            return result
        if node.op == "*" and _negative_zero(node.left) != _negative_zero(node.right):
            # sympy has no -0.0: `-0.0*X` is `-(0.0*X)`, a zero of the sign IEEE gives it
            return -ieee("*", abs(left), right) if left.is_zero else -ieee("*", left, abs(right))
        if cancels(node.op, left, right, result):
            return ieee(node.op, left, right)
        return result

    def relation(self, node: Compare) -> Any:
        left, right = self.value(node.left), self.value(node.right)
        return self.checked(node, lambda: _RELATIONS[node.op](left, right))

    def call(self, node: Call) -> Any:
        if node.name == SIZE:
            return self.size(node)
        spec = FUNCTIONS.get(canonical(node.name, len(node.args)))
        if node.name in BOUNDARY_FORMS and (spec is None or len(node.args) != spec.arity):
            value_form = f" or '{node.name}(x, lo, hi)' of values" if spec else ""
            raise IndexExpressionError(
                f"'{node.name}' with {len(node.args)} argument"
                f"{'' if len(node.args) == 1 else 's'} is an index form, not a function of values",
                self.src,
                node.span,
                expected=f"'{node.name}' as the whole index of a tensor's axis, as in "
                f"'A[{node.name}(i + 1)]'{value_form}",
            )
        if spec is None and node.name == "conj":
            raise UnsupportedError(
                "'conj' needs complex numbers, which tensordsl does not support",
                self.src,
                node.span,
                expected="real inputs, whose conjugate is the value itself: drop 'conj'",
            )
        if spec is None:
            raise UnknownNameError(
                f"unknown function '{node.name}'",
                self.src,
                node.name_span,
                expected="one of " + ", ".join(sorted([*FUNCTIONS, SIZE])),
                hint=SIZE_HINTS.get(node.name)
                or _reduction_hint(node.name)
                or close_match(node.name, [*spellings(), SIZE]),
            )
        if len(node.args) != spec.arity:
            params = ", ".join("xyz"[: spec.arity])
            raise ShapeError(
                f"'{node.name}' takes {spec.arity} argument(s), got {len(node.args)}",
                self.src,
                node.span,
                expected=f"{node.name}({params})",
                hint=_reduction_hint(node.name) if len(node.args) == 1 else None,
            )
        args = [
            self.condition(a)
            if is_condition(a) and (node.name, n) == ("where", 0)
            else self.value(a)
            for n, a in enumerate(node.args)
        ]
        value = self.checked(node, lambda: spec.build(*args))
        # A call sympy simplified into a sum stays one term for Einstein's rule.
        return Whole(value) if isinstance(value, (sympy.Add, IeeeAdd)) else value

    def size(self, node: Call) -> Any:
        """`size(j)`: the number of values index `j` runs over (`size_placeholder`, replaced
        by the extents of its range once ranges are inferred)."""
        arg = node.args[0] if len(node.args) == 1 else None
        if not isinstance(arg, Name) or arg.name not in self.indices:
            raise self.fail(
                f"'{text_of(self.src, node.span)}' does not name an index of this statement",
                node,
                "size(j) of an index j that the statement uses, as in 'M[i] := X[i,j] / size(j)'",
            )
        return size_placeholder(arg.name)


#: Integer constants of this magnitude or more in values (not in index expressions) are
#: floating-point constants: generated code computes integer values in int64 (where they
#: would wrap), and JAX's default integers are 32-bit.
LARGE_INTEGER = 2**31


def _large_integers_as_floats(expr: Any) -> Any:
    """`expr` with every integer constant of at least `LARGE_INTEGER` in magnitude, outside
    tensor accesses, replaced by a sympy Float of the same value."""
    if not isinstance(expr, sympy.Basic):
        return expr
    large = {}
    walk = sympy.preorder_traversal(expr)
    for node in walk:
        if isinstance(node, sympy.Indexed):
            walk.skip()  # index expressions keep exact integers
        elif node.is_Integer and abs(node) >= LARGE_INTEGER:
            large[node] = sympy.Float(node)
    if not large:
        return expr
    return expr.xreplace({**large, **{read: read for read in expr.atoms(sympy.Indexed)}})


def _negative_zero(node: Expr) -> bool:
    """Whether `node` is the floating literal `-0.0` (sympy's zero has no sign)."""
    return (
        isinstance(node, Unary)
        and node.op == "-"
        and isinstance(node.operand, Number)
        and not node.operand.text.isdigit()
        and float(node.operand.text) == 0
    )


def _complex_power(expr: Any) -> bool:
    """Whether `expr` holds a fractional power of a negative constant (`(-8)**(1/3)`, which
    sympy keeps as `2*(-1)**(1/3)`): not a real number (jnp gives NaN)."""
    if not isinstance(expr, sympy.Basic):
        return False
    return any(
        p.base.is_number and p.base.is_negative and not p.exp.is_integer
        for p in expr.atoms(sympy.Pow)
    )


def _number(text: str) -> sympy.Expr:
    if text.isdigit():
        return sympy.Integer(int(text))
    return sympy.Float(float(text))


def translate(statement: Statement, *, indices: Collection[str] = ()) -> Translation:
    """Translate the right-hand side of `statement` to sympy.

    Args:
        statement: from `parse`.
        indices: names that are indices wherever they appear (those given by `ranges=`).

    Returns:
        A `Translation`: the body, the free and reduced indices, the operands with their
        ranks, every access with its affine axes, and where each name first appears.

    Raises:
        TensorDSLError: a subclass naming the mistake (unknown function, a name in two roles,
        a non-affine index expression, a value that is not finite, ...).

    >>> from tensordsl.frontend.parse import parse
    >>> translate(parse("Y[i] := A[i*j]"))
    Traceback (most recent call last):
    ...
    tensordsl.errors.IndexExpressionError: index expression 'i*j' is not affine: a product of ...
    ...
    """
    return _Translator(statement, indices).build()


def _reduction_hint(name: str) -> str | None:
    """`logsumexp(S[i,j], j)` written as a function: how the language writes a reduction."""
    if name not in (*USER_REDUCTIONS, "mean"):
        return None
    return (
        f"a reduction is written before the output: '({name}) L[i] := S[i,j]' takes the "
        f"{name} over every index not on the left (j here)"
    )
