"""The sympy classes of jax.numpy's elementwise functions beyond the core table (`cbrt`,
`hypot`, `logaddexp`, `isnan`, ...), with the derivatives `jax.grad` takes.

Each class is named after the C function or helper it prints as (`codegen.emit.printer`
keys by the class name): a class in `LIBM` is a libm / CUDA math library call (`cbrtf`,
`fmod`), one in `HELPERS` a helper of the generated code (`tdsl_logaddexp`, whose definition
is `codegen.emit.special`'s). The functions that are arithmetic or a select of others
(`sinc`, `heaviside`, `remainder`, `deg2rad`) are builders here, not classes: every back end
and the derivation already know their parts.

>>> x, y = sympy.symbols("x y", real=True)
>>> logaddexp(x, y).diff(x)
exp(x - logaddexp(x, y))
>>> sinc(x).diff(x).subs(x, 0), sinc(x).diff(x).subs(x, 1)
(0, -1)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable

import sympy
from sympy.codegen.cfunctions import exp2, log1p


class _Real(sympy.Function):
    """A real function of real arguments; of constants, its float64 value (`value`), as
    jnp computes it: left unevaluated, sympy would evaluate it through mpmath's function of
    the same name (`mpmath.fmod` rounds towards minus infinity, C's towards zero)."""

    value: Callable[..., float]  # each function's, a staticmethod

    @classmethod
    def eval(cls, *args: sympy.Expr) -> sympy.Expr | None:
        if not all(a.is_number and a.is_real for a in args):
            return None
        with contextlib.suppress(ValueError, ZeroDivisionError, OverflowError):
            return _constant(cls.value(*(float(a) for a in args)))
        return sympy.nan

    def _eval_is_real(self) -> bool | None:
        return all(a.is_real for a in self.args) or None


def _constant(value: float) -> sympy.Expr:
    if math.isnan(value):
        return sympy.nan
    if math.isinf(value):
        return sympy.oo if value > 0 else -sympy.oo
    return sympy.Float(value)


class _Step(_Real):
    """Piecewise constant in every argument: zero derivative, as `jax.grad` gives."""

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        return sympy.Integer(0)


class cbrt(_Real):  # noqa: N801 - printed by name (libm's cbrt)
    """The real cube root: cbrt(-8) = -2 (sympy's `cbrt` is `x**(1/3)`, NaN below 0 in C)."""

    nargs = 1

    @staticmethod
    def value(x: float) -> float:
        return math.cbrt(x)

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        return 1 / (3 * cbrt(self.args[0]) ** 2)


class hypot(_Real):  # noqa: N801 - printed by name
    """sqrt(a^2 + b^2) without overflow or underflow on the way (libm's hypot)."""

    nargs = 2

    @staticmethod
    def value(a: float, b: float) -> float:
        return math.hypot(a, b)

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        # At the origin (a kink: hypot(a, 0) = |a|) a / hypot is 0/0; jax.grad of jnp.hypot
        # gives each argument 1/2 there (its max/min form splits the tie), and so does this.
        return sympy.Piecewise(
            (sympy.S.Half, sympy.Eq(self, 0)), (self.args[argindex - 1] / self, True)
        )


class rint(_Step):  # noqa: N801 - printed by name
    """x rounded to the nearest integer, halves to even (jnp.round, C's rint)."""

    nargs = 1

    @staticmethod
    def value(x: float) -> float:
        return float(round(x))


class trunc(_Step):  # noqa: N801 - printed by name
    """x rounded towards zero."""

    nargs = 1

    @staticmethod
    def value(x: float) -> float:
        return float(math.trunc(x))


class fmod(_Real):  # noqa: N801 - printed by name
    """a - b * trunc(a / b), exactly (the C remainder: the sign of a)."""

    nargs = 2

    @staticmethod
    def value(a: float, b: float) -> float:
        return math.fmod(a, b)

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        a, b = self.args
        return sympy.Integer(1) if argindex == 1 else -trunc(a / b)


class copysign(_Real):  # noqa: N801 - printed by name
    """|a| with the sign bit of b."""

    nargs = 2

    @staticmethod
    def value(a: float, b: float) -> float:
        return math.copysign(a, b)

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        a, b = self.args
        return sympy.sign(a) * copysign(sympy.Integer(1), b) if argindex == 1 else sympy.S.Zero


class logaddexp(_Real):  # noqa: N801 - printed by name (the helper tdsl_logaddexp)
    """log(exp(a) + exp(b)) without overflow; logaddexp(-inf, -inf) = -inf."""

    nargs = 2

    @staticmethod
    def value(a: float, b: float) -> float:
        return _logaddexp(a, b, math.e)

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        return sympy.exp(self.args[argindex - 1] - self)


class logaddexp2(_Real):  # noqa: N801 - printed by name (the helper tdsl_logaddexp2)
    """log2(2^a + 2^b) without overflow."""

    nargs = 2

    @staticmethod
    def value(a: float, b: float) -> float:
        return _logaddexp(a, b, 2.0)

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        return exp2(self.args[argindex - 1] - self)


class xlogy(_Real):  # noqa: N801 - printed by name (the helper tdsl_xlogy)
    """x * log(y), 0 where x is 0 (whatever y); its derivative in x is log(y) there too, as
    jax.scipy.special.xlogy's."""

    nargs = 2

    @staticmethod
    def value(a: float, b: float) -> float:
        return 0.0 if a == 0 else a * math.log(b)

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        x, y = self.args
        return sympy.log(y) if argindex == 1 else x / y


class xlog1py(_Real):  # noqa: N801 - printed by name (the helper tdsl_xlog1py)
    """x * log1p(y), 0 where x is 0 (jax.scipy.special.xlog1py)."""

    nargs = 2

    @staticmethod
    def value(a: float, b: float) -> float:
        return 0.0 if a == 0 else a * math.log1p(b)

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        x, y = self.args
        return log1p(y) if argindex == 1 else x / (1 + y)


class logit(_Real):  # noqa: N801 - printed by name (the helper tdsl_logit)
    """log(x / (1 - x)) as jax.scipy.special.logit computes it: a class, so that sympy does
    not rearrange `1 - x` (of an index, `-i` is an integer 0, whose reciprocal has no sign)."""

    nargs = 1

    @staticmethod
    def value(x: float) -> float:
        return math.inf if x == 1 else math.log(x / (1 - x))

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        x = self.args[0]
        return 1 / (x * (1 - x))


class isnan(_Step):  # noqa: N801 - printed by name
    """1 where x is NaN, else 0."""

    nargs = 1

    @staticmethod
    def value(x: float) -> float:
        return float(math.isnan(x))


class isinf(_Step):  # noqa: N801 - printed by name
    """1 where x is +-inf, else 0."""

    nargs = 1

    @staticmethod
    def value(x: float) -> float:
        return float(math.isinf(x))


class isfinite(_Step):  # noqa: N801 - printed by name
    """1 where x is neither NaN nor infinite, else 0."""

    nargs = 1

    @staticmethod
    def value(x: float) -> float:
        return float(math.isfinite(x))


class signbit(_Step):  # noqa: N801 - printed by name
    """1 where x's sign bit is set (-0.0 and -NaN included), else 0."""

    nargs = 1

    @staticmethod
    def value(x: float) -> float:
        return float(math.copysign(1.0, x) < 0)


def _logaddexp(a: float, b: float, base: float) -> float:
    if a == b:  # equal infinities too
        return a + math.log(2.0, base)
    high, low = max(a, b), min(a, b)
    return high + math.log1p(base ** (low - high)) / math.log(base)


class polygamma(sympy.polygamma):  # noqa: N801 - printed by name
    """sympy's polygamma(n, x) whose value of constants is a float (sympy's exact forms,
    such as `-EulerGamma` for digamma(1), are constants no back end prints)."""

    @classmethod
    def eval(cls, n: sympy.Expr, x: sympy.Expr) -> sympy.Expr | None:
        if n.is_number and x.is_number:
            return sympy.Float(sympy.polygamma(n, x).evalf())
        return None

    def fdiff(self, argindex: int = 2) -> sympy.Expr:
        n, x = self.args
        return polygamma(n + 1, x) if argindex == 2 else sympy.S.Zero  # n: whole


class loggamma(sympy.loggamma):  # noqa: N801 - printed by name (C's lgamma)
    """log|gamma(x)|, whose derivative is this module's `polygamma(0, x)`."""

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        return polygamma(0, self.args[0])


#: Below this |x|, sinc is its Taylor series: sin(pi x)/(pi x)'s derivative, cos(pi x)/x -
#: sin(pi x)/(pi x^2), is a difference of two terms near 1/x that cancel to -pi^2 x/3 (in
#: float32 at x = 1e-3, every digit). At |pi x| < 0.48 eight terms are exact to float64, and
#: above it the cancellation costs at most 4 bits of the derivative.
SINC_SERIES_BELOW = sympy.Rational(15, 100)


def sinc(x: sympy.Expr) -> sympy.Expr:
    """sin(pi x) / (pi x), 1 at 0 (jnp.sinc); near 0 its series, whose derivative at 0 is 0
    as jax.grad's and which keeps every digit of each derivative there."""
    series = sympy.Add(  # sum (-(pi x)^2)^n / (2n+1)!, as monomials: so are its derivatives
        *((-(sympy.pi**2)) ** n / sympy.factorial(2 * n + 1) * x ** (2 * n) for n in range(8))
    )
    return sympy.Piecewise(
        (series, sympy.Abs(x) < SINC_SERIES_BELOW),
        (sympy.sin(sympy.pi * x) / (sympy.pi * x), True),
    )


def heaviside(x: sympy.Expr, at_zero: sympy.Expr) -> sympy.Expr:
    """0 below 0, 1 above, `at_zero` at 0 (and at NaN, as jnp.heaviside)."""
    return sympy.Piecewise((sympy.Integer(0), x < 0), (sympy.Integer(1), x > 0), (at_zero, True))


def remainder(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    """jnp.remainder: `fmod(a, b)` moved by b where its sign differs from b's (exact)."""
    r = fmod(a, b)
    moved = sympy.Or(sympy.And(r < 0, b > 0), sympy.And(r > 0, b < 0))
    return sympy.Piecewise((r + b, moved), (r, True))


def deg2rad(x: sympy.Expr) -> sympy.Expr:
    """x degrees in radians."""
    return x * (sympy.pi / 180)


def rad2deg(x: sympy.Expr) -> sympy.Expr:
    """x radians in degrees."""
    return x * (180 / sympy.pi)


#: Classes printed as a call of the libm / CUDA function of their name (float32: `<name>f`).
LIBM = (cbrt, hypot, rint, trunc, fmod, copysign)

#: Classes printed as a helper of the generated code (`codegen.emit.special`); so are
#: sympy's `erfinv` and `polygamma` (digamma, trigamma), which libm does not have.
HELPERS = (logaddexp, logaddexp2, xlogy, xlog1py, logit, isnan, isinf, isfinite, signbit)
