"""Arithmetic that sympy must not simplify, so that NaN and infinities propagate as in jnp.

sympy simplifies as it builds: `X - X` is 0, `X/X` is 1, `0*exp(X)` is 0, `X*1e30*1e-30` is
`X*1.0`. IEEE arithmetic does not: `inf - inf` and `0/0` are NaN, `0*inf` is NaN, and
`X*1e30` overflows in float32 before `*1e-30` can bring it back. The translator
(`tensordsl/frontend/translate.py: _ieee`) builds such an operation as one of the functions below
instead, only where sympy's result would differ: they print as the operation written
(`(X[i] - X[i])` in C and in source), the reference back end evaluates them as jnp does, and
they differentiate as jax does (`X/X` has the derivative `1/X - X/X**2`, kept unsimplified
too, so the gradient is NaN wherever jnp's is).

>>> from codegen.ir.nest import tensor_base, index_symbol
>>> x = tensor_base("X")[index_symbol("i")]
>>> ieee("-", x, x)
IeeeAdd(X[i], -X[i])
>>> ieee("/", x, x).diff(x)
IeeeDiv(1, X[i]) - IeeeDiv(X[i], X[i]**2)
"""

from __future__ import annotations

from typing import Any

import sympy
from sympy.printing.precedence import PRECEDENCE


class _Ieee(sympy.Function):
    """A binary operation kept as written; evaluated by sympy only between numbers."""

    nargs = 2

    @staticmethod
    def apply(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
        raise NotImplementedError

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if a.is_number and b.is_number:
            return cls.apply(a, b)
        return None

    def _eval_is_real(self) -> bool | None:
        return True if all(a.is_real for a in self.args) else None


class IeeeAdd(_Ieee):
    """`a + b` (`a - b` is `IeeeAdd(a, -b)`)."""

    @staticmethod
    def apply(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
        return a + b

    def _eval_derivative(self, s: sympy.Symbol) -> sympy.Expr:
        a, b = self.args
        return a.diff(s) + b.diff(s)


class IeeeMul(_Ieee):
    """`a * b`."""

    @staticmethod
    def apply(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
        return a * b

    def _eval_derivative(self, s: sympy.Symbol) -> sympy.Expr:
        a, b = self.args
        da, db = a.diff(s), b.diff(s)
        # A zero derivative is no term at all (jax's symbolic zero), as in jax.grad.
        return (IeeeMul(da, b) if da != 0 else 0) + (IeeeMul(a, db) if db != 0 else 0)


class IeeeDiv(_Ieee):
    """`a / b`."""

    @staticmethod
    def apply(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
        return a / b

    def _eval_derivative(self, s: sympy.Symbol) -> sympy.Expr:
        a, b = self.args
        da, db = a.diff(s), b.diff(s)
        first = IeeeDiv(da, b) if da != 0 else 0
        second = -db * IeeeDiv(a, b**2) if db != 0 else 0
        return first + second


class Shifted(IeeeAdd):
    """`a + b` with the sum `a` computed whole first: a softmax weight's argument `X - L`
    (`shifted`). Nothing in it cancels, so the reference back end adds without the
    optimization barrier of `IeeeAdd` (XLA does not reassociate a float add anyway)."""


def shifted(x: sympy.Expr, total: sympy.Expr) -> sympy.Expr:
    """`exp(x - total)`, a logsumexp's weight, with `x` (a sum of several summands: a score
    and its modifier) computed whole before `total` is subtracted, as the logsumexp's own
    pass computed it (`codegen.passes.softmax_weights`): sympy would add the summands in its
    own order, `(A*(j - i) - L) + S`, whose rounding (`A*(j - i)` in the hundreds) differs
    from the forward's score by an ulp of hundreds, and so the backward's weights from the
    forward's. A single summand is one subtraction in either form and is left as sympy
    writes it (no change to the generated code).

    >>> from codegen.ir.nest import tensor_base, index_symbol
    >>> i, j = index_symbol("i"), index_symbol("j")
    >>> S, A, L = tensor_base("S"), tensor_base("A"), tensor_base("L")
    >>> shifted(S[i, j] + A[0] * (j - i), L[i])
    exp(Shifted((-i + j)*A[0] + S[i, j], -L[i]))
    >>> shifted(S[i, j], L[i])
    exp(-L[i] + S[i, j])
    """
    if isinstance(x, sympy.Add):
        return sympy.exp(Shifted(x, -total))
    return sympy.exp(x - total)


#: The operator each function prints as.
OPERATORS: dict[type, str] = {IeeeAdd: "+", IeeeMul: "*", IeeeDiv: "/", Shifted: "+"}
IEEE_FUNCTIONS = tuple(OPERATORS)


def written(expr: _Ieee) -> tuple[sympy.Expr, str, sympy.Expr]:
    """`(a, op, b)` as the operation reads: `IeeeAdd(a, -b)` is `a - b`."""
    a, b = expr.args
    op = OPERATORS[type(expr)]
    if op == "+" and b.could_extract_minus_sign():
        return a, "-", -b
    return a, op, b


def ieee(op: str, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    """`a op b` for `op` in `+ - * /`, kept as written (see the module docstring)."""
    if op == "+":
        return IeeeAdd(a, b)
    if op == "-":
        return IeeeAdd(a, -b)
    if op == "*":
        return IeeeMul(a, b)
    return IeeeDiv(a, b)


def _terms(expr: sympy.Expr, sign: int) -> dict[sympy.Expr, sympy.Expr]:
    found: dict[sympy.Expr, sympy.Expr] = {}
    for term in sympy.Add.make_args(expr):
        coefficient, rest = term.as_coeff_Mul()
        if not rest.is_number:
            found[rest] = found.get(rest, 0) + sign * coefficient
    return found


def _factors(expr: sympy.Expr, sign: int) -> dict[sympy.Expr, list]:
    found: dict[sympy.Expr, list] = {}
    for factor in sympy.Mul.make_args(expr):
        base, exponent = factor.as_base_exp()
        if not base.is_number:
            found.setdefault(base, []).append(sign * exponent)
    return found


def _values(expr: sympy.Expr) -> set:
    return expr.free_symbols | expr.atoms(sympy.Indexed)


def cancels(op: str, a: sympy.Expr, b: sympy.Expr, result: sympy.Expr) -> bool:
    """Whether sympy's `result` of `a op b` lost what IEEE arithmetic keeps: a value that
    cancelled out (`X - X`, `X*Y/X`, `exp(X)*exp(-X)`), a product with a zero constant
    (`0*exp(X)`, `-0.0*X`), or floating constants folded across a value (`X*1e30*1e-30`).
    A written infinity is left to sympy (`X + inf` is `inf`: masks write `-inf`, and
    `X + inf - inf` stays an undefined constant, refused)."""
    if a.has(sympy.oo, -sympy.oo) or b.has(sympy.oo, -sympy.oo):
        return False
    if not (_values(a) | _values(b)) <= _values(result):
        return True
    if op in "+-":
        left, right = _terms(a, 1), _terms(b, 1 if op == "+" else -1)
        return any(left[t] + right[t] == 0 for t in left.keys() & right.keys())
    if (a.is_number and a.is_zero and not b.is_number) or (
        b.is_number and b.is_zero and not a.is_number
    ):
        return True
    left, right = _factors(a, 1), _factors(b, 1 if op == "*" else -1)
    for base in left.keys() & right.keys():
        signs = {e.is_negative for e in left[base] + right[base]}
        if len(signs) > 1 or None in signs:
            return True
    return _folds_floats(a, b)


def _folds_floats(a: sympy.Expr, b: sympy.Expr) -> bool:
    """A floating constant multiplied into a product that has a floating coefficient of its
    own: `(X*1e30)*1e30` must overflow in float32 where `X*1e60` would be folded."""
    for value, constant in ((a, b), (b, a)):
        if constant.is_Float and not value.is_number:
            coefficient, _ = value.as_coeff_Mul()
            if coefficient.is_Float and abs(coefficient) != 1 and abs(constant) != 1:
                return True
    return False


def print_written(printer: Any, expr: sympy.Expr) -> str:
    """A sympy printer's method for the IEEE forms: the operation as written, parenthesised,
    so that it is never simplified (NaN and inf propagate) and the parser reads it back to
    the same form. Shared by the C printer and the index-notation printer."""
    a, op, b = written(expr)
    level = PRECEDENCE["Add" if op in "+-" else "Mul"]
    op = f" {op} " if op in "+-" else op
    # sympy's `strict` parenthesises lower precedence only: the left operand of `a - b` or
    # `a / b` needs no parentheses at its own level, the right one does (`a/(b*c)`)
    left, right = printer.parenthesize(a, level, strict=True), printer.parenthesize(b, level)
    return f"({left}{op}{right})"
