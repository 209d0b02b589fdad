"""Numeric probes of symbolic expressions: evidence that costs microseconds, before a
`sympy.simplify` that can cost a second.

A probe evaluates an expression at points where every access (`X[i, j]`), every undefined
function applied (`shift(i)`) and every other symbol takes a number. It can only show that
an expression is not zero, or not the same at two points; where it shows nothing (a value
that is not a finite real number, an atom it cannot replace) it says so, and the caller
keeps its symbolic proof. So a probe never makes a pass accept what it would have refused:
it lets the pass refuse early.

>>> x, y = sympy.symbols("x y")
>>> X = sympy.IndexedBase("X")
>>> nonzero(X[x] - X[x])
False
>>> nonzero(sympy.exp(X[x]) - 1)
True
>>> varies(2 * y, held=lambda atom: atom == y)
False
>>> varies(X[x] * y, held=lambda atom: atom == y)
True
>>> simplest(sympy.exp(X[x] - y) * sympy.exp(y), good=lambda e: not e.has(y))
exp(X[x])
"""

from __future__ import annotations

import math
from collections.abc import Callable

import sympy
from sympy.core.function import AppliedUndef

#: The two points' values, by the atom's position: distinct, in (0.5, 3), so `log`, `sqrt`
#: and divisions by differences of atoms are defined.
_SEEDS = (0.61, 1.37)
_HELD = 0.83
_STEP = 0.113


def nonzero(expr: sympy.Expr) -> bool:
    """Whether `expr` is shown not to be zero: a finite real value at one point, away from 0
    by more than rounding."""
    value = _value(expr, lambda _: False, _SEEDS[0])
    return value is not None and abs(value) > 1e-9


def varies(expr: sympy.Expr, held: Callable[[sympy.Basic], bool]) -> bool:
    """Whether `expr` is shown to take two different values at two points that differ only in
    the atoms `held` does not hold (those it holds keep one value)."""
    first, second = (_value(expr, held, seed) for seed in _SEEDS)
    if first is None or second is None:
        return False
    return abs(first - second) > 1e-9 * max(abs(first), abs(second), 1.0)


def simplest(expr: sympy.Expr, good: Callable[[sympy.Expr], bool]) -> sympy.Expr:
    """`expr` in the first form `good` accepts: as it is, with powers and exponentials
    combined (`powsimp`: `exp(a) * exp(-a)` is 1), that with common factors cancelled, and
    last `sympy.simplify`'s (slow: 0.1-1.7 s on a statement's body); the last when none is."""
    for form in (lambda e: e, sympy.powsimp, lambda e: sympy.cancel(sympy.powsimp(e))):
        try:
            found = form(expr)
        except (sympy.PolynomialError, TypeError, ValueError):
            continue
        if good(found):
            return found
    return sympy.simplify(expr)


def _value(expr: sympy.Expr, held: Callable[[sympy.Basic], bool], seed: float) -> float | None:
    point = {
        atom: sympy.Float((_HELD if held(atom) else seed) + _STEP * n)
        for n, atom in enumerate(_atoms(expr))
    }
    try:
        value = complex(sympy.sympify(expr).xreplace(point).evalf())
    except (TypeError, ValueError, ZeroDivisionError, OverflowError):
        return None
    if value.imag != 0 or not math.isfinite(value.real):
        return None
    return value.real


def _atoms(expr: sympy.Expr) -> list[sympy.Basic]:
    """What a point gives a number: accesses and undefined functions applied, whole, and the
    symbols outside them, in a fixed order (so a run's points are the same every time)."""
    expr = sympy.sympify(expr)
    whole = expr.atoms(sympy.Indexed) | expr.atoms(AppliedUndef)
    inside = set().union(*(a.free_symbols for a in whole)) if whole else set()
    symbols = expr.free_symbols - inside
    return sorted(whole, key=sympy.srepr) + sorted(symbols, key=sympy.srepr)
