"""Print expressions of a loop nest as index-notation source (`codegen.ir.nest` prints
the nest itself with them).

A nest lowered from a single statement prints as that statement again (the parser reads it
back to the same nest). Nests with several terms print one line per term, the first with
`:=` and the rest with `+=`.

>>> from codegen.ir.nest import index_symbol, tensor_base
>>> i, j = index_symbol("i"), index_symbol("j")
>>> A = tensor_base("A")
>>> expr_source(A[i] * A[j] * indicator(i <= j))
'A[i]*A[j]*(i <= j)'
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Collection
from typing import Any

import sympy
from sympy.printing.str import StrPrinter

from codegen.ir.functions import indicator  # noqa: F401 - used in the doctest
from codegen.ir.ieee import IeeeAdd, IeeeDiv, IeeeMul, print_written

_FUNCTION_NAMES = {"Abs": "abs"}

#: A rewrite of a nest's expressions for people, applied before they are printed (`explain`
#: shows a gathered operand as the access its user wrote, `tensordsl.explain.spelling`).
Spell = Callable[[sympy.Basic], sympy.Basic]


def as_written(expr: sympy.Basic) -> sympy.Basic:
    """The `Spell` that leaves an expression as the nest writes it."""
    return expr


class SourcePrinter(StrPrinter):
    """sympy's str printer, speaking the index-notation language."""

    def _print_Indexed(self, expr: sympy.Indexed) -> str:
        indices = ", ".join(self._print(i) for i in expr.indices)
        return f"{expr.base.name}[{indices}]"

    def _print_IndexedBase(self, expr: sympy.IndexedBase) -> str:
        return str(expr.name)

    def __init__(
        self, settings: dict[str, Any], operands: tuple[str, ...] = (), positive_first: bool = False
    ) -> None:
        super().__init__(settings)
        self.operands = operands
        self.positive_first = positive_first

    def _position(self, expr: sympy.Basic) -> int:
        """Where the first operand read by `expr` stands in the operand order."""
        names = {a.base.name for a in expr.atoms(sympy.Indexed)}
        names |= {s.name for s in expr.free_symbols if isinstance(s, sympy.Symbol)}
        found = [self.operands.index(n) for n in names if n in self.operands]
        return min(found, default=len(self.operands))

    def _ordered(self, args: tuple, numbers_first: bool) -> list:
        numbers = [a for a in args if a.is_number]
        others = sorted((a for a in args if not a.is_number), key=self._position)
        return numbers + others if numbers_first else others + numbers

    _print_IeeeAdd = _print_IeeeMul = _print_IeeeDiv = _print_Shifted = print_written

    def _print_Add(self, expr: sympy.Add, order: Any = None) -> str:
        # Terms in the order their operands first appear; constants last (`p + 1`).
        ordered = self._ordered(expr.args, numbers_first=False)
        if self.positive_first:  # `S - L` and `W - X`, not `-L + S`
            ordered.sort(key=lambda a: a.could_extract_minus_sign())
        return super()._print_Add(sympy.Add(*ordered, evaluate=False), order)

    def _print_Mul(self, expr: sympy.Mul) -> str:
        ordered = self._ordered(expr.args, numbers_first=True)
        return super()._print_Mul(sympy.Mul(*ordered, evaluate=False))

    def _print_Relational(self, expr: Any) -> str:
        op = {"==": "==", "!=": "!="}.get(expr.rel_op, expr.rel_op)
        return f"{self._print(expr.lhs)} {op} {self._print(expr.rhs)}"

    def _print_Float(self, expr: sympy.Float) -> str:
        return repr(float(expr))

    def _print_Exp1(self, expr: Any) -> str:
        return "exp(1)"  # sympy's E: `E` would read back as an input named E

    def _print_Infinity(self, expr: Any) -> str:
        return "inf"

    def _print_NegativeInfinity(self, expr: Any) -> str:
        return "-inf"

    def _print_Piecewise(self, expr: sympy.Piecewise) -> str:
        (value, condition), *rest = expr.args
        if not rest:
            return self._print(value)
        otherwise = sympy.Piecewise(*rest) if len(rest) > 1 else rest[0][0]
        if value == 1 and otherwise == 0:
            return f"({self._print(condition)})"
        return f"where({self._print(condition)}, {self._print(value)}, {self._print(otherwise)})"

    def _print_Function(self, expr: Any) -> str:
        name = type(expr).__name__
        args = ", ".join(self._print(a) for a in expr.args)
        return f"{_FUNCTION_NAMES.get(name, name)}({args})"

    _print_Abs = _print_Function

    def _print_Max(self, expr: Any) -> str:
        return self._lattice("max", expr.args)

    def _print_Min(self, expr: Any) -> str:
        return self._lattice("min", expr.args)

    def _lattice(self, name: str, args: tuple[Any, ...]) -> str:
        """sympy's n-ary Max/Min as the language's two-argument max/min, nested."""
        first, *rest = args
        text = self._print(first)
        for arg in rest:
            text = f"{name}({text}, {self._print(arg)})"
        return text

    def _print_FloorDiv(self, expr: Any) -> str:
        a, b = (self._operand(x) for x in expr.args)
        return f"({a} // {b})"

    def _print_CeilDiv(self, expr: Any) -> str:
        a, b = (self._operand(x) for x in expr.args)
        return f"(-(-{a} // {b}))"

    def _operand(self, expr: Any) -> str:
        """An operand of `//`, in parentheses unless it is a single name or number."""
        text = self._print(expr)
        return text if expr.is_Atom or isinstance(expr, sympy.Indexed) else f"({text})"

    def _print_Wrap(self, expr: Any) -> str:
        return f"mod({self._print(expr.args[0])})"  # the extent is the axis's own

    def _print_Clamp(self, expr: Any) -> str:
        return f"clamp({self._print(expr.args[0])})"

    _print_Padded = _print_Clamp  # sympy skips a renamed subclass's base printer

    def _print_And(self, expr: sympy.And) -> str:
        return " & ".join(f"({self._print(a)})" for a in expr.args)

    def _print_Or(self, expr: sympy.Or) -> str:
        return " | ".join(f"({self._print(a)})" for a in expr.args)

    def _print_OneTerm(self, expr: Any) -> str:
        return f"pow({self._print(expr.args[0])}, 1)"

    def _print_BooleanTrue(self, expr: Any) -> str:
        return "1"

    def _print_BooleanFalse(self, expr: Any) -> str:
        return "0"


_PRINTER = SourcePrinter({"order": "none"})


class OneTerm(sympy.Function):
    """A sum that reads back as one term of a summed statement: printed `pow(x, 1)`, a call,
    whose value the parser keeps as one term (`tensordsl/frontend/einstein.py`). Only
    printed, never part of a nest."""

    nargs = 1


def as_one_term(expr: sympy.Expr, reduced: Collection[sympy.Symbol]) -> sympy.Expr:
    """A summed term's body that reads back as one term summed over `reduced`: the parser
    sums each term of a top-level sum over the reduced indices it reads (Einstein's rule,
    term by term), so a sum whose terms read different ones (`X[k] + 2`, summed over k) is
    wrapped in a `OneTerm`; a product wraps its factors that need it.

    >>> from codegen.ir.nest import index_symbol, tensor_base
    >>> k = index_symbol("k")
    >>> X, Y = tensor_base("X"), tensor_base("Y")
    >>> expr_source(as_one_term(X[k] + 2, (k,)))
    'pow(X[k] + 2, 1)'
    >>> expr_source(as_one_term((X[k] + 1)*(Y[k] + 1), (k,)))
    'pow(X[k] + 1, 1)*pow(Y[k] + 1, 1)'
    >>> expr_source(as_one_term((X[k] + 2)*Y[k], (k,)))  # each product reads k
    '(X[k] + 2)*Y[k]'
    """
    reduced = frozenset(reduced)
    if len(_term_reads(expr, reduced)) <= 1:
        return expr
    if isinstance(expr, (sympy.Mul, IeeeMul)):
        return expr.func(*(as_one_term(a, reduced) for a in expr.args))
    if isinstance(expr, IeeeDiv):
        return IeeeDiv(as_one_term(expr.args[0], reduced), expr.args[1])
    return OneTerm(expr)


def _term_reads(expr: sympy.Expr, reduced: frozenset) -> set[frozenset]:
    """The reduced indices read by each term of `expr` once products are distributed over
    sums, as the parser's `einstein_terms` opens a body: sums, products and a quotient's
    numerator; anything else is one term."""
    if isinstance(expr, (sympy.Add, IeeeAdd)):
        return set().union(*(_term_reads(a, reduced) for a in expr.args))
    if isinstance(expr, (sympy.Mul, IeeeMul)):
        factors = [_term_reads(a, reduced) for a in expr.args]
        return {frozenset().union(*reads) for reads in itertools.product(*factors)}
    if isinstance(expr, IeeeDiv):
        numerator, denominator = expr.args
        return {r | (denominator.free_symbols & reduced) for r in _term_reads(numerator, reduced)}
    return {frozenset(expr.free_symbols & reduced)}


def expr_source(
    expr: sympy.Basic, operands: tuple[str, ...] = (), *, positive_first: bool = False
) -> str:
    """One sympy expression as index-notation source; factors and terms follow `operands`
    (`positive_first`: within a sum, the terms without a minus sign first, as people write a
    difference; `explain` prints so, generated headers keep the stable order).

    >>> from codegen.ir.nest import index_symbol, tensor_base
    >>> k, i, j = index_symbol("k"), index_symbol("i"), index_symbol("j")
    >>> W, X = tensor_base("W"), tensor_base("X")
    >>> expr_source((W[k, i] - X[k, j])**2)
    '(-X[k, j] + W[k, i])**2'
    >>> expr_source((W[k, i] - X[k, j])**2, ("W", "X"), positive_first=True)
    '(W[k, i] - X[k, j])**2'
    """
    if not operands and not positive_first:
        return _PRINTER.doprint(expr)
    return SourcePrinter({"order": "none"}, operands, positive_first).doprint(expr)


def constraint_source(constraint: sympy.Expr) -> str:
    """`c >= 0` as a comparison of its negative and positive parts: `i - j` is `j <= i`.

    >>> from codegen.ir.nest import index_symbol
    >>> i, j = index_symbol("i"), index_symbol("j")
    >>> constraint_source(i - j + 2)
    'j <= i + 2'
    """
    positive: list[str] = []
    negative: list[str] = []
    for part in sympy.Add.make_args(sympy.expand(constraint)):
        coefficient, _ = part.as_coeff_Mul()
        (negative if coefficient < 0 else positive).append(part)
    high, low = sympy.Add(*positive), -sympy.Add(*negative)
    return f"{expr_source(low)} <= {expr_source(high)}"
