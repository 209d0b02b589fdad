"""The scalar-function table: one row per function of the language.

Each row gives the surface name, the number of arguments, how to build its sympy form (the
form that is differentiated and printed), the sympy function class that form is made of when
it has its own (printers and the reference back end key their spelling by it), whether the
generated code calls a helper of its own for it (`tdsl_<name>`, see `codegen.emit.printer`), the
reference implementation (a dotted path, resolved lazily so that codegen never imports JAX),
a safe test domain (every argument in it gives a finite, smooth value), the glibc version
whose libmvec has a float32 vector variant of the libm function of the same name (generated
C declares it `omp declare simd`, see `codegen.c.vecmath`), and the maximum error of float32
generated C against float64, in ulps, that `tests/cpu/test_vector_math.py` asserts over the
function's whole domain and docs/backends.md documents.

>>> FUNCTIONS["sigmoid"].build(sympy.Symbol("x"))
sigmoid(x)
>>> sorted(FUNCTIONS)[:4]
['abs', 'abs2', 'acos', 'acosh']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy
from sympy.codegen.cfunctions import exp2, expm1, log1p, log2, log10

from codegen.ir import elementwise as ew


class sigmoid(sympy.Function):  # noqa: N801 - printed by name
    """The logistic function 1 / (1 + exp(-x))."""

    nargs = 1

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        s = sigmoid(self.args[0])
        return s * (1 - s)

    @classmethod
    def eval(cls, x: sympy.Expr) -> sympy.Expr | None:
        if x.is_Number:
            return 1 / (1 + sympy.exp(-x))
        return None

    def _eval_is_real(self) -> bool | None:
        return self.args[0].is_real


class softplus(sympy.Function):  # noqa: N801 - printed by name
    """log(1 + exp(x)), evaluated stably."""

    nargs = 1

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        return sigmoid(self.args[0])

    @classmethod
    def eval(cls, x: sympy.Expr) -> sympy.Expr | None:
        if x.is_Number:
            return sympy.log(1 + sympy.exp(x))
        return None

    def _eval_is_real(self) -> bool | None:
        return self.args[0].is_real


class _Stepwise(sympy.Function):
    """A piecewise-constant function of a value: its derivative is zero wherever it has one
    (as `jax.grad` gives), not sympy's unevaluated `Derivative` or `DiracDelta`."""

    nargs = 1

    def fdiff(self, argindex: int = 1) -> sympy.Expr:
        return sympy.Integer(0)

    def _eval_is_real(self) -> bool | None:
        return self.args[0].is_real


class floor(_Stepwise):  # noqa: N801 - printed by name (C's floor)
    """The largest integer at most x, as a float."""

    @classmethod
    def eval(cls, x: sympy.Expr) -> sympy.Expr | None:
        return sympy.floor(x) if x.is_Number else None


class ceiling(_Stepwise):  # noqa: N801 - printed by name (sympy prints `ceiling` as C's ceil)
    """The smallest integer at least x, as a float."""

    @classmethod
    def eval(cls, x: sympy.Expr) -> sympy.Expr | None:
        return sympy.ceiling(x) if x.is_Number else None


class sign(_Stepwise):  # noqa: N801 - printed by name (the printers' `tdsl_sign` helper)
    """-1, 0 or 1 (NaN stays NaN)."""

    @classmethod
    def eval(cls, x: sympy.Expr) -> sympy.Expr | None:
        return sympy.sign(x) if x.is_Number else None


class FloorDiv(sympy.Function):
    """Integer division rounded towards minus infinity (index arithmetic only)."""

    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(int(a) // int(b))
        if b == 1:
            return a
        return None


class CeilDiv(sympy.Function):
    """Integer division rounded towards plus infinity (index arithmetic only)."""

    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr | None:
        if a.is_Integer and b.is_Integer:
            return sympy.Integer(-(-int(a) // int(b)))
        if b == 1:
            return a
        return None


class CeilPow2(sympy.Function):
    """The smallest power of two at least `a` (1 for `a` <= 1): host values only, such as
    the lanes per row of the CUDA rows strategy."""

    nargs = 1
    is_integer = True

    @classmethod
    def eval(cls, a: sympy.Expr) -> sympy.Expr | None:
        if a.is_Integer:
            return sympy.Integer(1 << max(int(a) - 1, 0).bit_length())
        return None


class Wrap(sympy.Function):
    """`mod(e)` in an index: `e` wrapped into `[0, n)` (a floor modulo, index arithmetic
    only); `n` is the extent of the axis it indexes."""

    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, e: sympy.Expr, n: sympy.Expr) -> sympy.Expr | None:
        if e.is_Integer and n.is_Integer and n > 0:
            return sympy.Integer(int(e) % int(n))
        return None


class Clamp(sympy.Function):
    """`clamp(e)` in an index: `e` clamped into `[0, n)`, `n` the extent of its axis."""

    nargs = 2
    is_integer = True

    @classmethod
    def eval(cls, e: sympy.Expr, n: sympy.Expr) -> sympy.Expr | None:
        if e.is_Integer and n.is_Integer and n > 0:
            return sympy.Integer(min(max(int(e), 0), int(n) - 1))
        return None


class Padded(Clamp):
    """`pad(e, ...)` in an index: read as `Clamp(e, n)`, so the load stays inside the array,
    always under a mask `0 <= e < n` that gives zero elsewhere (the translator builds
    both); where the read counts it equals `e`, which is how a gradient solves it."""


def clamp(x: sympy.Expr, low: sympy.Expr, high: sympy.Expr) -> sympy.Expr:
    """`clamp(x, lo, hi)` of values: `min(max(x, lo), hi)`, as `jnp.clip`."""
    above = extreme(sympy.Max, x >= low, x, low)
    return extreme(sympy.Min, above <= high, above, high)


def floor_divide(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    """`a // b` rounded towards minus infinity as Python and jnp do: `FloorDiv` between
    integers (indices), else `floor(a / b)`."""
    if a.is_integer and b.is_integer:
        return FloorDiv(a, b)
    return floor(a / b)


def remainder(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    """`a % b` with the sign of `b`, as Python and jnp: `a - b * (a // b)`."""
    return a - b * floor_divide(a, b)


def indicator(condition: sympy.Basic) -> sympy.Expr:
    """1 where `condition` holds, else 0 (comparisons used as values)."""
    return sympy.Piecewise((sympy.Integer(1), condition), (sympy.Integer(0), True))


def select(condition: sympy.Basic, a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    """`where(condition, a, b)`; a non-boolean condition means `condition != 0`."""
    if not isinstance(condition, sympy.logic.boolalg.Boolean):
        condition = _nonzero(condition)
    return sympy.Piecewise((a, condition), (b, True))


def _nonzero(value: sympy.Expr) -> sympy.Basic:
    """`value != 0` as a condition; a comparison used as a value (`indicator`) gives back its
    condition, and a product of them the conjunction (a mask `(j <= i) * (j >= i - 4)`):
    `Ne(Piecewise(...) * ..., 0)` would make sympy fold the Piecewise into the condition,
    which takes minutes for a mask of several comparisons (issue 38)."""
    factors = value.args if isinstance(value, sympy.Mul) else (value,)
    conditions = [_indicated(f) for f in factors]
    if all(c is not None for c in conditions):
        return sympy.And(*conditions)
    return sympy.Ne(value, 0)


def _indicated(value: sympy.Expr) -> sympy.Basic | None:
    """The condition of `indicator(condition)`, else None."""
    if isinstance(value, sympy.Piecewise) and len(value.args) == 2:
        (one, condition), (zero, otherwise) = value.args
        if one == 1 and zero == 0 and otherwise == sympy.true:
            return condition
    return None


def extreme(
    function: type[sympy.Min] | type[sympy.Max],
    condition: sympy.Basic,
    a: sympy.Expr,
    b: sympy.Expr,
) -> sympy.Expr:
    """`min(a, b)` or `max(a, b)`: sympy's `Min`/`Max` of integer index arithmetic (no tensor
    read), else `where(condition, a, b)`, whose derivative picks a branch.

    A comparison with a Piecewise (`j >= where(i >= 1, i, 1)`) makes sympy fold it into the
    condition and simplify the result as logic, which takes seconds per clamp and minutes for
    a mask of several (issue 38); `j >= Max(i, 1)` stays as written, and an index has no
    derivative to pick.

    >>> from codegen.ir.nest import index_symbol
    >>> i = index_symbol("i")
    >>> extreme(sympy.Max, i >= 1, i, 1)
    Max(1, i)
    """
    a, b = sympy.sympify(a), sympy.sympify(b)
    if not (a.atoms(sympy.Indexed) or b.atoms(sympy.Indexed)) and (a - b).is_integer:
        return function(a, b)
    return select(condition, a, b)


@dataclass(frozen=True)
class FunctionSpec:
    """One function of the language."""

    name: str
    arity: int
    build: Callable[..., sympy.Expr]
    reference: str  # dotted path of the jax implementation, e.g. "jax.nn.sigmoid"
    domain: tuple[float, float]  # where every argument is safe and smooth for tests
    helper: bool = False  # printed as a call to the generated code's `tdsl_<name>`
    libmvec: tuple[int, int] | None = None  # glibc (major, minor) with `<name>f`'s variant
    float32_ulps: float | None = None  # tested maximum error of float32 generated C

    @property
    def function(self) -> type | None:
        """The sympy function class `build` makes; None when it builds arithmetic (`sqrt` is
        a power) or a Piecewise (`relu`, `where`)."""
        build = self.build
        return build if isinstance(build, type) and issubclass(build, sympy.Function) else None


def _row(
    name: str,
    arity: int,
    build: Callable[..., sympy.Expr],
    reference: str,
    domain: tuple[float, float] = (-2.0, 2.0),
    *,
    helper: bool = False,
    libmvec: tuple[int, int] | None = None,
    ulps: float | None = None,
) -> tuple[str, FunctionSpec]:
    return name, FunctionSpec(name, arity, build, reference, domain, helper, libmvec, ulps)


# glibc's libmvec: exp, log, sin, cos since 2.22, the others since 2.35; its stated accuracy
# is 4 ulp. sigmoid and softplus are helpers over expf and log1pf (codegen.c.vecmath).
_OLD, _NEW = (2, 22), (2, 35)


FUNCTIONS: dict[str, FunctionSpec] = dict(
    [
        _row("exp", 1, sympy.exp, "jax.numpy.exp", libmvec=_OLD, ulps=4),
        _row("log", 1, sympy.log, "jax.numpy.log", (0.5, 3.0), libmvec=_OLD, ulps=4),
        _row("log1p", 1, log1p, "jax.numpy.log1p", (-0.5, 2.0), libmvec=_NEW, ulps=4),
        _row("expm1", 1, expm1, "jax.numpy.expm1", libmvec=_NEW, ulps=4),
        _row("sqrt", 1, sympy.sqrt, "jax.numpy.sqrt", (0.5, 3.0)),
        _row("rsqrt", 1, lambda x: 1 / sympy.sqrt(x), "jax.lax.rsqrt", (0.5, 3.0)),
        _row("tanh", 1, sympy.tanh, "jax.numpy.tanh", libmvec=_NEW, ulps=4),
        _row("sigmoid", 1, sigmoid, "jax.nn.sigmoid", helper=True, ulps=6),
        _row("softplus", 1, softplus, "jax.nn.softplus", helper=True, ulps=6),
        _row("relu", 1, lambda x: select(x > 0, x, sympy.Integer(0)), "jax.nn.relu"),
        _row("sin", 1, sympy.sin, "jax.numpy.sin", libmvec=_OLD, ulps=4),
        _row("cos", 1, sympy.cos, "jax.numpy.cos", libmvec=_OLD, ulps=4),
        _row("abs", 1, sympy.Abs, "jax.numpy.abs"),
        _row("erf", 1, sympy.erf, "jax.scipy.special.erf", libmvec=_NEW, ulps=4),
        _row("min", 2, lambda a, b: extreme(sympy.Min, a <= b, a, b), "jax.numpy.minimum"),
        _row("max", 2, lambda a, b: extreme(sympy.Max, a >= b, a, b), "jax.numpy.maximum"),
        _row("where", 3, select, "jax.numpy.where"),
        _row("pow", 2, sympy.Pow, "jax.numpy.power", (0.5, 2.0)),
        _row("abs2", 1, lambda x: x**2, "jax.numpy.square"),  # Tullio's |x|^2 of a real x
        _row("atan2", 2, sympy.atan2, "jax.numpy.arctan2", (0.5, 2.0)),
        _row("exp2", 1, exp2, "jax.numpy.exp2", libmvec=_NEW, ulps=4),
        _row("log2", 1, log2, "jax.numpy.log2", (0.5, 3.0), libmvec=_NEW, ulps=4),
        _row("log10", 1, log10, "jax.numpy.log10", (0.5, 3.0), libmvec=_NEW, ulps=4),
        _row("tan", 1, sympy.tan, "jax.numpy.tan", (-1.2, 1.2), libmvec=_NEW, ulps=4),
        _row("asin", 1, sympy.asin, "jax.numpy.arcsin", (-0.9, 0.9), libmvec=_NEW, ulps=4),
        _row("acos", 1, sympy.acos, "jax.numpy.arccos", (-0.9, 0.9), libmvec=_NEW, ulps=4),
        _row("atan", 1, sympy.atan, "jax.numpy.arctan", libmvec=_NEW, ulps=4),
        _row("sinh", 1, sympy.sinh, "jax.numpy.sinh", libmvec=_NEW, ulps=4),
        _row("cosh", 1, sympy.cosh, "jax.numpy.cosh", libmvec=_NEW, ulps=4),
        _row("asinh", 1, sympy.asinh, "jax.numpy.arcsinh", libmvec=_NEW, ulps=4),
        _row("acosh", 1, sympy.acosh, "jax.numpy.arccosh", (1.1, 3.0), libmvec=_NEW, ulps=4),
        _row("atanh", 1, sympy.atanh, "jax.numpy.arctanh", (-0.9, 0.9), libmvec=_NEW, ulps=4),
        _row("erfc", 1, sympy.erfc, "jax.scipy.special.erfc", libmvec=_NEW, ulps=4),
        _row("square", 1, lambda x: x**2, "jax.numpy.square"),
        _row("clamp", 3, clamp, "jax.numpy.clip"),
        # piecewise constant: no gradient (jax.grad gives zero)
        _row("floor", 1, floor, "jax.numpy.floor"),
        _row("ceil", 1, ceiling, "jax.numpy.ceil"),
        _row("sign", 1, sign, "jax.numpy.sign"),
        # jax.numpy's other elementwise functions (codegen.ir.elementwise)
        _row("cbrt", 1, ew.cbrt, "jax.numpy.cbrt", (-3.0, 3.0), libmvec=_NEW, ulps=4),
        _row("hypot", 2, ew.hypot, "jax.numpy.hypot"),
        _row("sinc", 1, ew.sinc, "jax.numpy.sinc"),
        _row("logaddexp", 2, ew.logaddexp, "jax.numpy.logaddexp", (-3.0, 3.0)),
        _row("logaddexp2", 2, ew.logaddexp2, "jax.numpy.logaddexp2", (-3.0, 3.0)),
        _row("reciprocal", 1, lambda x: 1 / x, "jax.numpy.reciprocal", (0.5, 3.0)),
        _row("negative", 1, lambda x: -x, "jax.numpy.negative"),
        _row("copysign", 2, ew.copysign, "jax.numpy.copysign"),
        _row("fmod", 2, ew.fmod, "jax.numpy.fmod", (0.5, 3.0)),
        _row("remainder", 2, ew.remainder, "jax.numpy.remainder", (0.5, 3.0)),
        _row("deg2rad", 1, ew.deg2rad, "jax.numpy.deg2rad", (-200.0, 200.0)),
        _row("rad2deg", 1, ew.rad2deg, "jax.numpy.rad2deg"),
        _row("erfinv", 1, sympy.erfinv, "jax.scipy.special.erfinv", (-0.9, 0.9)),
        _row("lgamma", 1, ew.loggamma, "jax.scipy.special.gammaln", (0.5, 4.0)),
        _row("digamma", 1, lambda x: ew.polygamma(0, x), "jax.scipy.special.digamma", (0.5, 4.0)),
        _row("xlogy", 2, ew.xlogy, "jax.scipy.special.xlogy", (0.5, 3.0)),
        _row("xlog1py", 2, ew.xlog1py, "jax.scipy.special.xlog1py", (0.5, 3.0)),
        _row("logit", 1, ew.logit, "jax.scipy.special.logit", (0.1, 0.9)),
        # polygamma(n, x): n a whole number; C and CUDA evaluate n = 0 and 1
        _row("polygamma", 2, ew.polygamma, "tensordsl.backends.jnp_extras.polygamma", (0.5, 4.0)),
        # piecewise constant: no gradient (jax.grad gives zero); the tests are 1 or 0
        _row("round", 1, ew.rint, "jax.numpy.round"),
        _row("trunc", 1, ew.trunc, "jax.numpy.trunc"),
        _row("heaviside", 2, ew.heaviside, "jax.numpy.heaviside"),
        _row("isnan", 1, ew.isnan, "tensordsl.backends.jnp_extras.isnan"),
        _row("isinf", 1, ew.isinf, "tensordsl.backends.jnp_extras.isinf"),
        _row("isfinite", 1, ew.isfinite, "tensordsl.backends.jnp_extras.isfinite"),
        _row("signbit", 1, ew.signbit, "tensordsl.backends.jnp_extras.signbit"),
    ]
)


#: Other spellings of the functions: of another arity under the same name (`atan(y, x)` is
#: `atan2(y, x)`), and jax.numpy's and libm's names for the functions named otherwise here.
SPELLINGS = {
    ("atan", 2): "atan2",
    **{(f"arc{name}", 1): f"a{name}" for name in ("sin", "cos", "tan", "sinh", "cosh", "tanh")},
    ("arctan2", 2): "atan2",
    ("power", 2): "pow",
    ("maximum", 2): "max",
    ("minimum", 2): "min",
    ("absolute", 1): "abs",
    ("fabs", 1): "abs",
    ("clip", 3): "clamp",
    ("rint", 1): "round",
    ("degrees", 1): "rad2deg",
    ("radians", 1): "deg2rad",
    ("gammaln", 1): "lgamma",
    ("expit", 1): "sigmoid",
}


def canonical(name: str, arity: int) -> str:
    """The row a call of `name` with `arity` arguments means: the row of another spelling
    (`arcsin` is `asin`), of any arity when none has this one (the call's error then names
    the arity the row takes).

    >>> canonical("arctan2", 2), canonical("atan", 2), canonical("arcsin", 3)
    ('atan2', 'atan2', 'asin')
    """
    if (name, arity) in SPELLINGS or name in FUNCTIONS:
        return SPELLINGS.get((name, arity), name)
    return next((row for (other, _), row in SPELLINGS.items() if other == name), name)


def spellings() -> list[str]:
    """Every name a call of a function may use, sorted: the rows' and the other spellings."""
    return sorted({*FUNCTIONS, *(name for name, _ in SPELLINGS)})


def helper_functions(prefix: str) -> dict[str, str]:
    """sympy printer `user_functions`: each helper row's class name -> `<prefix><name>`."""
    return {
        spec.function.__name__: prefix + spec.name
        for spec in FUNCTIONS.values()
        if spec.helper and spec.function is not None
    }


#: Function classes that may appear in a lowered body, beyond sympy's arithmetic.
CUSTOM_FUNCTIONS = (
    *(sigmoid, softplus, log1p, expm1, exp2, log2, log10, floor, ceiling, sign),
    *(FloorDiv, CeilDiv, Wrap, Clamp, Padded),
)
