"""C definitions of the helpers that print jax.numpy functions libm lacks (`erfinv`,
digamma, trigamma) or that need care at the edges (`logaddexp`, `isnan`, ...), for C and
CUDA alike (`{inline}` is the target's qualifier; the CUDA emulator compiles the same text).

The classification helpers compare rather than call `isnan`/`signbit`, which are macros in C
and overloads in C++ (the emulator): `x != x` only for NaN, `x - x` is 0 only for a finite x.
erfinv, digamma and trigamma compute in double whatever the body's type: Giles'
single-precision erfinv ("Approximating the erfinv function", GPU Computing Gems, 2011)
polished by two Newton steps on libm's erf; digamma and trigamma by reflection below 1/2,
the recurrence up to 10 and their asymptotic series there (terms below 1e-13 left out).

>>> print(definitions({"isnan", "sign"}, "float", inline="static inline", prefix="tdsl_"))
static inline float tdsl_isnan(float x) { return (float)(x != x); }
"""

from __future__ import annotations

from collections.abc import Iterable

_PI = "3.14159265358979323846"

#: helper name -> its definition; `{f}` the body's float type, `{s}` its libm suffix.
SPECIAL = {
    "isnan": "{inline} {f} {p}isnan({f} x) {{ return ({f})(x != x); }}",
    "isinf": "{inline} {f} {p}isinf({f} x) {{ return ({f})(x == x && x - x != x - x); }}",
    "isfinite": "{inline} {f} {p}isfinite({f} x) {{ return ({f})(x - x == x - x); }}",
    "signbit": "{inline} {f} {p}signbit({f} x) {{ return ({f})(copysign{s}(({f})1, x) < 0); }}",
    "logaddexp": """\
{inline} {f} {p}logaddexp({f} a, {f} b) {{
    /* as jnp.logaddexp: a - b is NaN for two equal infinities (then a + b) or a NaN */
    const {f} m = a > b ? a : b, d = a - b;
    return d != d ? a + b : m + log1p{s}(exp{s}(-fabs{s}(d)));
}}""",
    "logaddexp2": """\
{inline} {f} {p}logaddexp2({f} a, {f} b) {{
    const {f} m = a > b ? a : b, d = a - b;
    return d != d ? a + b : m + log1p{s}(exp2{s}(-fabs{s}(d))) * ({f})1.44269504088896340736;
}}""",
    "xlogy": """\
{inline} {f} {p}xlogy({f} x, {f} y) {{ return x == 0 ? ({f})0 : x * log{s}(y); }}""",
    "xlog1py": """\
{inline} {f} {p}xlog1py({f} x, {f} y) {{ return x == 0 ? ({f})0 : x * log1p{s}(y); }}""",
    "logit": "{inline} {f} {p}logit({f} x) {{ return log{s}(x / (1 - x)); }}",
    "erfinv": """\
{inline} {f} {p}erfinv({f} y0) {{
    /* Giles' approximation, then Newton steps on erf (codegen.emit.special) */
    const double y = y0;
    if (y == 1 || y == -1) return y0 / 0;
    if (!(y > -1 && y < 1)) return (y0 - y0) / 0;
    double w = -log((1.0 - y) * (1.0 + y)), x;
    if (w < 5.0) {{
        w -= 2.5;
        x = (((((((2.81022636e-08 * w + 3.43273939e-07) * w - 3.5233877e-06) * w
            - 4.39150654e-06) * w + 0.00021858087) * w - 0.00125372503) * w
            - 0.00417768164) * w + 0.246640727) * w + 1.50140941;
    }} else {{
        w = sqrt(w) - 3.0;
        x = (((((((-0.000200214257 * w + 0.000100950558) * w + 0.00134934322) * w
            - 0.00367342844) * w + 0.00573950773) * w - 0.0076224613) * w
            + 0.00943887047) * w + 1.00167406) * w + 2.83297682;
    }}
    x *= y;
    for (int n = 0; n < 2; ++n) x -= (erf(x) - y) / (1.1283791670955126 * exp(-x * x));
    return ({f})x;
}}""",
    "digamma": """\
{inline} {f} {p}digamma({f} x0) {{
    double x = x0, r = 0;
    if (x <= 0 && x == floor(x)) return (x0 - x0) / 0; /* a pole */
    if (x < 0.5) {{ r = -PI_ / tan(PI_ * x); x = 1 - x; }}
    for (; x < 10; x += 1) r -= 1 / x;
    const double f = 1 / (x * x);
    return ({f})(r + log(x) - 0.5 / x
        - f * (1.0 / 12 - f * (1.0 / 120 - f * (1.0 / 252 - f * (1.0 / 240 - f / 132)))));
}}""",
    "trigamma": """\
{inline} {f} {p}trigamma({f} x0) {{
    double x = x0, r = 0, sign = 1, sum = 0;
    if (x <= 0 && x == floor(x)) return (x0 - x0) / 0; /* a pole */
    if (x < 0.5) {{ const double s = sin(PI_ * x); r = PI_ * PI_ / (s * s); sign = -1; x = 1 - x; }}
    for (; x < 10; x += 1) sum += 1 / (x * x);
    const double f = 1 / (x * x);
    sum += 1 / x + f / 2
        + f / x * (1.0 / 6 - f * (1.0 / 30 - f * (1.0 / 42 - f * (1.0 / 30 - f * 5 / 66))));
    return ({f})(r + sign * sum);
}}""",
}


def definitions(called: Iterable[str], float_type: str, *, inline: str, prefix: str) -> str:
    """The definitions of the `SPECIAL` helpers among `called` (helper names), in order."""
    suffix = "f" if float_type == "float" else ""
    return "\n".join(
        SPECIAL[name].format(inline=inline, f=float_type, s=suffix, p=prefix).replace("PI_", _PI)
        for name in SPECIAL
        if name in set(called)
    )
