"""Print the scalar body of a loop nest as C: a thin subclass of sympy's C99 printer.

Everything that differs between C targets (type names, qualifiers, helper spelling) is a
class attribute, so a CUDA printer overrides a few attributes and nothing else.

Two printing modes: *value* mode (the default, the body's arithmetic in the accumulation
type) and *index* mode (int64 arithmetic on loop indices and host parameters). An integer
sub-expression met in value mode is printed in index mode and cast once, so `x*i` prints as
`x*((float)(v_i))`.

Names: every name that comes from the user lives in a namespace of its own in generated code
(`c_identifier`): indices print as `v_<name>`, tensors and scalars as `in_<name>`; every name
the code generator makes is a `sympy.Dummy` (host parameters `P0`, tile origins, temporaries
`t0_`) or a plain C name, and none starts with `v_` or `in_`. So no user name, whatever it
is (`P0`, `acc_`, `int64_t`), can meet a generated one.

>>> from codegen.ir.nest import index_symbol, tensor_base
>>> i, k = index_symbol("i"), index_symbol("k")
>>> p = CPrinter("float", tensors={"A": TensorView("in_A", ("s_A_0", None), "{}")})
>>> p.doprint(sympy.exp(tensor_base("A")[i, k]) * i)
'((float)(v_i))*tdsl_exp(in_A[v_i*s_A_0 + v_k])'
>>> p.doprint(sympy.Piecewise((1.5, i > k), (0, True)))
'((v_i > v_k) ? 1.5F : 0)'
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import sympy
from sympy.codegen.ast import float32, float64, real
from sympy.printing.c import C99CodePrinter

from codegen.c import vecmath
from codegen.emit import special
from codegen.errors import Unsupported
from codegen.ir import elementwise
from codegen.ir.affine import INDEX_LIMIT
from codegen.ir.functions import CeilDiv, Clamp, FloorDiv, Wrap, helper_functions
from codegen.ir.ieee import print_written
from codegen.ir.nest import scalar_symbol


def c_name(name: str) -> str:
    """`name` with every character C does not allow in an identifier replaced by `_`, and
    each non-ASCII letter spelled by its code point (`α` is `_u3b1_`): C compilers differ in
    the identifiers they accept beyond ASCII.

    >>> c_name("Δt")
    '_u394_t'
    """
    ascii_only = re.sub(r"[^\x00-\x7f]", lambda m: f"_u{ord(m.group()):x}_", name)
    return re.sub(r"\W", "_", ascii_only)


def c_identifier(symbol: sympy.Symbol, scalars: Mapping[sympy.Symbol, str] = {}) -> str:  # noqa: B006
    """The C name of a symbol: a generated one (a `sympy.Dummy`) by its own name, a scalar
    input by its variable, a user's index (or an index bound inside a nested reduction) as
    `v_<name>`."""
    if isinstance(symbol, sympy.Dummy):
        return symbol.name
    if symbol in scalars:
        return scalars[symbol]
    return f"v_{c_name(symbol.name)}"


@dataclass(frozen=True)
class TensorView:
    """How the generated code reads one tensor operand.

    `strides` names the C variable of each axis' stride (None for the last, contiguous
    axis); `load` formats an element read, e.g. `"{}"`, `"(float){}"`, `"tdsl_h2f({})"`.
    """

    cname: str
    strides: tuple[str | None, ...]
    load: str
    integer: bool = False  # integer elements: compared with indices as integers


#: Printed as `tdsl_<name>` (codegen.emit.special); sympy's printers have `_print_isnan`, ...
#: of their own for these names, which `_print_Function` replaces (below the class).
_HELPERS = (*elementwise.HELPERS, sympy.erfinv)

_RELATIONS = {"==": "==", "!=": "!=", "<": "<", "<=": "<=", ">": ">", ">=": ">="}


class CPrinter(C99CodePrinter):
    """sympy's C99 printer for tensordsl bodies in `float` or `double` arithmetic."""

    int_type = "int64_t"
    helper_prefix = "tdsl_"
    inline = "static inline"
    #: float32 libm calls vectorise through glibc's libmvec (codegen/c/vecmath.py)
    vector_math = True

    def __init__(
        self,
        float_type: str = "float",
        *,
        tensors: Mapping[str, TensorView] | None = None,
        scalars: Mapping[str, str] | None = None,
    ) -> None:
        assert float_type in ("float", "double"), float_type
        alias = float32 if float_type == "float" else float64
        functions = helper_functions(self.helper_prefix)
        if self.vector_math and float_type == "float":
            functions |= vecmath.wide_range_functions(self.helper_prefix)
        super().__init__({"type_aliases": {real: alias}, "user_functions": functions})
        self.float_type = float_type
        #: The math macros (`M_PI`, `M_SQRT2`, ...) printed so far: a target without
        #: <math.h> defines those its code uses (`codegen.cuda.emit`), read from here.
        self.macros: set[str] = set()
        #: The helpers (`tdsl_<name>`) whose calls were written so far, by the printer or
        #: an emitter (C's `team`, `hsum8`): their definitions are written only then.
        self.called: set[str] = set()
        #: The functions (sympy's names: `exp`, `log1p`, `sigmoid`) whose calls were written
        #: so far, by the printer or an emitter (`Emitter.exp`): float32 C declares their
        #: vector variants and defines their helpers from these (`codegen.c.vecmath`).
        self.functions: set[str] = set()
        self.tensors = dict(tensors or {})
        self.scalars = {scalar_symbol(name): c for name, c in (scalars or {}).items()}
        self._index_mode = False

    # -- modes ---------------------------------------------------------------------------

    def index(self, expr: sympy.Basic) -> str:
        """Print `expr` as int64 index arithmetic."""
        saved, self._index_mode = self._index_mode, True
        try:
            return str(self._print(expr))
        finally:
            self._index_mode = saved

    def _print(self, expr: Any, **kwargs: Any) -> str:
        if isinstance(expr, sympy.Function):
            self.functions.add(type(expr).__name__)
        if (
            not self._index_mode
            and isinstance(expr, sympy.Expr)
            and not expr.is_Number
            and expr.is_integer
            and not expr.atoms(sympy.Indexed)
        ):
            return f"(({self.float_type})({self.index(expr)}))"
        text = str(super()._print(expr, **kwargs))
        if isinstance(expr, sympy.Basic) and expr in self.math_macros and text == self._macro(expr):
            self.macros.add(self.math_macros[expr])
        return text

    def _macro(self, expr: sympy.Basic) -> str:
        """How sympy prints a constant of its `math_macros` table (`M_SQRT2`) where it does."""
        return f"{self.math_macros[expr]}{self._get_math_macro_suffix(real)}"

    # -- atoms ---------------------------------------------------------------------------

    def _print_Integer(self, expr: sympy.Integer) -> str:
        if abs(expr) <= INDEX_LIMIT:
            return str(super()._print_Integer(expr))
        if self._index_mode:  # the translator refuses such offsets and coefficients
            raise ValueError(f"{expr} is beyond the int64 index arithmetic of generated code")
        # A value: an exact decimal floating literal (an integer literal would wrap).
        return f"{expr}.0{self._get_literal_suffix(real)}"

    def _print_Symbol(self, expr: sympy.Symbol) -> str:
        return c_identifier(expr, self.scalars)

    _print_Dummy = _print_Symbol

    def _print_Indexed(self, expr: sympy.Indexed) -> str:
        view, offset = self.tensors[str(expr.base.name)], self.offset(expr)
        if self._index_mode and view.integer:
            return f"(({self.int_type}){view.cname}[{offset}])"
        return view.load.format(f"{view.cname}[{offset}]")

    def offset(self, expr: sympy.Indexed, *, zeros: bool = True) -> str:
        """The element offset of a tensor access, in index arithmetic (`zeros`: with the
        terms of axes read at 0)."""
        view = self.tensors[str(expr.base.name)]
        parts = []
        for index, stride in zip(expr.indices, view.strides, strict=True):
            if not zeros and index == 0:
                continue
            text = self.index(index)
            if stride is None:
                parts.append(text)
            else:
                needs_parens = isinstance(index, sympy.Add)
                parts.append(f"({text})*{stride}" if needs_parens else f"{text}*{stride}")
        return " + ".join(parts) if parts else "0"

    def _print_Pow(self, expr: sympy.Pow) -> str:
        base, exponent = expr.args
        if exponent.is_Integer and 2 <= abs(int(exponent)) <= 4:
            factor = self.parenthesize(base, 60)
            product = "(" + "*".join([factor] * abs(int(exponent))) + ")"
            return product if exponent > 0 else f"(1/{product})"
        if exponent in (sympy.Rational(-1, 2), sympy.Rational(3, 2), sympy.Rational(-3, 2)):
            # rsqrt (RMSNorm, LayerNorm) and its gradient's x**(3/2): sqrt and a division or
            # a product, 2x faster than powf per call (issue 26). `+ 0` makes a -0 base +0,
            # so 1/sqrt(-0) is +inf as pow(-0, -1/2) is; x * sqrt(x) is +0 there, as pow.
            root = f"{self._ns}sqrt{self._get_func_suffix(real)}"
            zero = f"0.0{self._get_literal_suffix(real)}"
            x = self._print(base)
            power = f"({x})*{root}({x})" if abs(exponent) == sympy.Rational(3, 2) else ""
            if exponent == sympy.Rational(-1, 2):
                return f"(1/{root}({x} + {zero}))"
            return f"({power})" if exponent > 0 else f"(1/({power}))"
        if exponent == sympy.Rational(1, 3):
            # not cbrt, which is real for a negative base: x**(1/3) is NaN there, as in jnp
            function = self._ns + "pow" + self._get_func_suffix(real)
            return f"{function}({self._print(base)}, {self._print(exponent)})"
        return str(super()._print_Pow(expr))

    # -- functions -----------------------------------------------------------------------

    def _helper(self, name: str, expr: sympy.Basic, *, index: bool = False) -> str:
        print_arg = self.index if index else self._print
        args = ", ".join(print_arg(a) for a in expr.args)
        self.called.add(name)
        return f"{self.helper_prefix}{name}({args})"

    def _print_Function(self, expr: sympy.Basic, **kwargs: Any) -> str:
        """A call; one of a function named as a helper (`tdsl_lane_mask`) is noted."""
        name = type(expr).__name__
        if isinstance(expr, elementwise.LIBM):  # cbrtf, fmod, ...: constants as floats, as
            # CUDA's overloads of copysign(1, x) for a double x are ambiguous
            args = (sympy.Float(a) if a.is_Number else a for a in expr.args)
            function = self._ns + name + self._get_func_suffix(real)
            return f"{function}({', '.join(self._print(a) for a in args)})"
        if isinstance(expr, _HELPERS):
            return self._helper(name, expr)
        if name.startswith(self.helper_prefix):
            self.called.add(name.removeprefix(self.helper_prefix))
        return str(super()._print_Function(expr, **kwargs))

    _print_IeeeAdd = _print_IeeeMul = _print_IeeeDiv = _print_Shifted = print_written

    def _print_FloorDiv(self, expr: FloorDiv) -> str:
        return self._helper("floordiv", expr, index=True)

    def _print_CeilDiv(self, expr: CeilDiv) -> str:
        return self._helper("ceildiv", expr, index=True)

    def _print_Wrap(self, expr: Wrap) -> str:
        return self._helper("wrap", expr, index=True)

    def _print_Clamp(self, expr: Clamp) -> str:
        return self._helper("clamp", expr, index=True)

    _print_Padded = _print_Clamp  # sympy skips a renamed subclass's base printer

    def _print_sign(self, expr: sympy.Expr) -> str:
        return self._helper("sign", expr)

    def _print_polygamma(self, expr: sympy.Expr) -> str:
        order, x = expr.args
        if order not in (0, 1):
            raise Unsupported(
                f"polygamma of order {order} has no C or CUDA implementation here",
                expected="order 0 (digamma) or 1 (trigamma, digamma's derivative), or the "
                "reference or pallas back end, which evaluate any order",
            )
        name = "digamma" if order == 0 else "trigamma"
        self.called.add(name)
        return f"{self.helper_prefix}{name}({self._print(x)})"

    def _minmax(self, expr: sympy.Expr, name: str) -> str:
        *rest, last = expr.args
        if self._index_mode or expr.is_integer:
            text = self.index(last)
            for arg in reversed(rest):
                text = f"{self.helper_prefix}i{name}({self.index(arg)}, {text})"
            return text
        function = self._ns + f"f{name}" + self._func_suffix(real)
        text = self._print(last)
        for arg in reversed(rest):
            text = f"{function}({self._print(arg)}, {text})"
        return text

    def _print_Min(self, expr: sympy.Expr) -> str:
        return self._minmax(expr, "min")

    def _print_Max(self, expr: sympy.Expr) -> str:
        return self._minmax(expr, "max")

    # -- conditions ----------------------------------------------------------------------

    def _print_Relational(self, expr: sympy.core.relational.Relational) -> str:
        lhs, rhs = expr.lhs, expr.rhs
        # Integer sides (indices, integer tensors such as a saved argmax position) compare
        # exactly as integers; a float holds integers exactly only below 2**24.
        integer = all(self._integer_valued(side) for side in (lhs, rhs))
        show = self.index if integer else self._print
        return f"({show(lhs)} {_RELATIONS[expr.rel_op]} {show(rhs)})"

    def _integer_valued(self, expr: sympy.Basic) -> bool:
        """True for integer expressions whose tensor accesses all read integer tensors."""
        if not isinstance(expr, sympy.Expr):
            return False
        reads = sorted(expr.atoms(sympy.Indexed), key=sympy.default_sort_key)
        if not all(self.tensors[str(a.base.name)].integer for a in reads):
            return False
        stand_in = {a: sympy.Symbol(f"int{n}_", integer=True) for n, a in enumerate(reads)}
        return bool(expr.xreplace(stand_in).is_integer)

    def _print_And(self, expr: sympy.And) -> str:
        return "(" + " && ".join(self._print(a) for a in expr.args) + ")"

    def _print_Or(self, expr: sympy.Or) -> str:
        return "(" + " || ".join(self._print(a) for a in expr.args) + ")"

    def _print_Not(self, expr: sympy.Not) -> str:
        return f"(!{self._print(expr.args[0])})"

    def _print_BooleanTrue(self, expr: Any) -> str:
        return "1"

    def _print_BooleanFalse(self, expr: Any) -> str:
        return "0"

    def _print_Piecewise(self, expr: sympy.Piecewise) -> str:
        (value, condition), *rest = expr.args
        if condition == sympy.true or not rest:
            return self._print(value)
        otherwise = sympy.Piecewise(*rest)
        return f"({self._print(condition)} ? {self._print(value)} : {self._print(otherwise)})"

    def call_name(self, function: type) -> str:
        """The name a call of sympy `function` prints as (`expf`, float32 C's `tdsl_exp`).

        >>> CPrinter("double").call_name(sympy.exp)
        'exp'
        """
        written = set(self.functions)
        name = self.doprint(function(sympy.Symbol("x"))).partition("(")[0]
        self.functions = written  # a probe: no call was written
        return name

    # -- helpers the printed code calls ---------------------------------------------------

    def helpers(self) -> str:
        """C definitions of the helper functions printed expressions may call (those of
        the boundary forms where the printer printed calls of them); with `vector_math` in
        float32, the declarations and helpers that the functions called need (`functions`)."""
        f, i, inline, p = self.float_type, self.int_type, self.inline, self.helper_prefix
        sfx = "f" if f == "float" else ""
        common = [
            f"{inline} {i} {p}floordiv({i} a, {i} b) {{",
            "    /* rounds towards -inf, also for negative a or b */",
            f"    {i} q = a / b;",
            "    return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;",
            "}",
            f"{inline} {i} {p}ceildiv({i} a, {i} b) {{ return -{p}floordiv(-a, b); }}",
            f"{inline} {i} {p}imin({i} a, {i} b) {{ return a < b ? a : b; }}",
            f"{inline} {i} {p}imax({i} a, {i} b) {{ return a > b ? a : b; }}",
            f"{inline} {f} {p}sign({f} x) {{ return ({f})((x > 0) - (x < 0)); }}",
        ]
        # the boundary forms' helpers, only where the code reads through them
        if "wrap" in self.called:
            common.append(
                f"{inline} {i} {p}wrap({i} a, {i} n) {{ {i} r = a % n; return r < 0 ? r + n : r; }}"
            )
        if "clamp" in self.called:
            common.append(
                f"{inline} {i} {p}clamp({i} a, {i} n) {{ return a < 0 ? 0 : a >= n ? n - 1 : a; }}"
            )
        common += filter(None, [special.definitions(self.called, f, inline=inline, prefix=p)])
        if self.vector_math and f == "float":
            vector = vecmath.float_helpers(self.functions, inline=inline, prefix=p)
            return "\n".join([*common, vector] if vector else common)
        return "\n".join(
            [
                *common,
                f"{inline} {f} {p}sigmoid({f} x) {{",
                f"    /* stable: exp of a non-positive number only */"
                f"\n    {f} e = exp{sfx}(-fabs{sfx}(x));",
                "    return x >= 0 ? 1 / (1 + e) : e / (1 + e);",
                "}",
                f"{inline} {f} {p}softplus({f} x) {{",
                f"    return fmax{sfx}(x, 0) + log1p{sfx}(exp{sfx}(-fabs{sfx}(x)));",
                "}",
            ]
        )


for _function in (*elementwise.LIBM, *_HELPERS):
    setattr(CPrinter, f"_print_{_function.__name__}", CPrinter._print_Function)
