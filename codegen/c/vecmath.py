"""float32 math functions that vectorise in generated C: glibc's libmvec.

glibc's `expf`, `logf`, ... are scalar calls; inside a `#pragma omp simd` loop every lane
waits on them. glibc also ships vector variants (libmvec, `_ZGVdN8v_expf` for AVX2, ...),
but declares them (`#pragma omp declare simd`) only under `-ffast-math`. The generated C
declares the ones it calls itself, so GCC calls the vector variant from a vectorised loop
and the scalar one elsewhere (-lmvec links them; `codegen.c.run.build` defines `TDSL_LIBMVEC` when
it does; GCC vectorises the calls only with `-fno-math-errno`, a base flag). Without libmvec
(another C library, another architecture) the declarations drop out and the calls stay
scalar libm calls. Which functions have a variant, from which glibc version, and the
maximum error the tests assert are the `libmvec` and `float32_ulps` columns of
`codegen.ir.functions.FUNCTIONS`; float64 keeps libm.

`sigmoid` and `softplus` are helpers written so that their loops vectorise: one division
and selects between values computed anyway (with GCC's default `-ftrapping-math`, a `?:`
arm computed only for that select becomes a branch, and the loop does not vectorise).

libmvec's variants send a vector with any lane out of their fast range (`expf` beyond
|x| ~ 87.3, where the result underflows or overflows) to scalar libm lane by lane, an order
of magnitude slower: log-domain code (Sinkhorn, a logsumexp over masked or far-apart scores)
lives there. So the float32 calls of the `WIDE_RANGE` functions print as helpers
(`tdsl_expm1`, ...) that keep the argument in the fast range: beyond a limit it is shifted
by a constant (exactly, both being multiples of the argument's ulp) and the result scaled
back by one multiplication, which rounds once into the subnormal range or overflows to inf as
the function would; NaN passes through (comparisons with NaN are false: no `fmaxf`, which
would turn NaN into the bound), and arguments beyond `clamp` give the same 0 or inf.
`exp`, the most called (logsumexp, softmax, sigmoid), is inline arithmetic instead
(`EXP_HELPER`, `tdsl_exp`): no call, no slow path, no wide-range helper around it.

>>> print(float_helpers({"sigmoid"}, inline="static inline", prefix="tdsl_"))
... # doctest: +ELLIPSIS
float tdsl_exp_low = -104.0F, tdsl_exp_high = 89.0F; /* variables, not constants */
static inline __attribute__((always_inline)) float tdsl_exp(float x) {
...
static inline float tdsl_sigmoid(float x) {
...
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from codegen.ir.functions import FUNCTIONS

#: The functions each float32 helper calls (`tdsl_exp` is `EXP_HELPER`).
HELPER_CALLS = {"sigmoid": ("exp", "fabs"), "softplus": ("log1p", "exp", "fabs")}

#: The float32 definitions of the helper rows of FUNCTIONS (the other targets' are the
#: printer's): a `?:` between values computed anyway, and one division.
FLOAT_HELPERS = {
    "sigmoid": """\
{inline} float {prefix}sigmoid(float x) {{
    /* stable: exp of a non-positive number only */
    const float e = {prefix}exp(-fabsf(x));
    return (x >= 0 ? 1.0F : e) / (1 + e);
}}""",
    "softplus": """\
{inline} float {prefix}softplus(float x) {{
    return (x > 0 ? x : 0.0F) + log1pf({prefix}exp(-fabsf(x)));
}}""",
}


@dataclass(frozen=True)
class WideRange:
    """How `<name>f(x)` is kept inside libmvec's fast range: `x` clamped to +-`clamp`; below
    `-below` (above `above`) shifted by +`shift` (-`shift`) and the result multiplied by
    `scales[0]` (`scales[1]`)."""

    below: float
    above: float
    clamp: float
    shift: float
    scales: tuple[str, str]


#: exp(-64), exp(64) rounded to float32
_E64 = ("0x1.969d48p-93F", "0x1.425982p+92F")

#: The functions whose libmvec variant has a slow path, and how their helpers avoid it; the
#: limits are inside the fast range measured with glibc 2.36. sinh and cosh of |x| > 87 are
#: +-exp(|x|)/2 to float32 precision and expm1 of x > 86 is exp(x), so the same shift and
#: scale hold for them; expm1 below -87 is -1, shifted or not (its scale there is 1). `exp`
#: itself is `EXP_HELPER`, no libm call at all.
WIDE_RANGE = {
    "exp2": WideRange(120.0, 120.0, 180.0, 64.0, ("0x1p-64F", "0x1p64F")),
    "expm1": WideRange(87.0, 86.0, 150.0, 64.0, ("1.0F", _E64[1])),
    "sinh": WideRange(87.0, 87.0, 150.0, 64.0, (_E64[1], _E64[1])),
    "cosh": WideRange(87.0, 87.0, 150.0, 64.0, (_E64[1], _E64[1])),
}


#: The float32 `exp`: inline arithmetic with no slow path, in place of libmvec's `expf`
#: behind a wide-range helper. That helper (a clamp, two compares, a scale) doubled the cost
#: of libmvec's call in its fast range, and a vector call spills the registers live across
#: it; inlined, the polynomial costs about what the bare vector call does, and a
#: log-domain loop (a logsumexp's gradient, Sinkhorn) about half of what the helper did
#: (benchmarks/RESULTS.md, "Issue 37: Sinkhorn"). `x = n ln2 + r`, `|r| <= ln2/2` (Cephes'
#: two-part ln2, n rounded by adding 1.5 * 2^23); `e^r - 1` by Cephes' polynomial; 2^n in
#: two normal factors, so that a subnormal or infinite result is rounded once. The
#: argument is clamped to [-104, 89], beyond which exp rounds to 0 and overflows to inf;
#: NaN passes the clamp (both comparisons are false) and stays NaN. Always inlined: GCC stops
#: inlining into a function grown large (a gradient nest of 20 terms), and a call of it does
#: not vectorise. The clamp's bounds are variables of the library, which the compiler
#: cannot see through in position-independent code: as constants, GCC's partial redundancy
#: elimination computes a vector call that takes exp's value (`log(1 + exp(x))`, softplus,
#: Mish) once more for each bound, on that bound's lanes only, the other lanes zero; a
#: libmvec call on zeros (`log(0)`) takes its slow path, in every iteration: 256 x 1024
#: values of `log(1 + exp(x))` took 1.6 ms instead of 0.1.
EXP_HELPER = """\
float {prefix}exp_low = -104.0F, {prefix}exp_high = 89.0F; /* variables, not constants */
{inline} __attribute__((always_inline)) float {prefix}exp(float x) {{
    /* exp with no slow path: a polynomial, 2^n in two factors (codegen.c.vecmath) */
    const float lo = {prefix}exp_low, hi = {prefix}exp_high;
    const float c = x < lo ? lo : x > hi ? hi : x;
    const float t = c * 1.44269504088896341F + 12582912.0F;
    const float n = t - 12582912.0F;
    const float r = c - n * 0.693359375F - n * -2.12194440e-4F;
    const float q = ((((1.9875691500e-4F * r + 1.3981999507e-3F) * r + 8.3334519073e-3F) * r
                      + 4.1665795894e-2F) * r + 1.6666665459e-1F) * r + 5.0000001201e-1F;
    union {{ float f; int32_t i; uint32_t u; }} u = {{.f = t}}, a, b;
    const int32_t k = u.i - 0x4b400000, k1 = k >> 1;
    a.u = (uint32_t)(k1 + 127) << 23;
    b.u = (uint32_t)(k - k1 + 127) << 23;
    return (q * r * r + r + 1.0F) * a.f * b.f;
}}"""


def _constant(value: float) -> str:
    return f"{value:.1f}F"


def wide_range_helper(name: str, *, inline: str, prefix: str) -> str:
    """The float32 definition of `<prefix><name>`, a row of `WIDE_RANGE`.

    The sides are chosen by arithmetic on 0.0/1.0 (exact: one term is not zero), not `?:`:
    GCC turns selects of the shift and the scale under one condition into branches and
    copies the call into each, three vector calls per vector, each meeting the slow path
    (and so it does with one side only: both sides are always written).

    >>> print(wide_range_helper("sinh", inline="static inline", prefix="tdsl_"))
    static inline float tdsl_sinh(float x) {
        /* sinhf with its argument in libmvec's fast range (codegen.c.vecmath) */
        const float c = x < -150.0F ? -150.0F : x > 150.0F ? 150.0F : x;
        const float lo = (float)(c < -87.0F), hi = (float)(c > 87.0F);
        /* (hi - lo) * -64.0 is -0.0 inside the range, and c + -0.0 is c, -0.0 included */
        const float s = (1.0F - lo - hi) + lo * 0x1.425982p+92F + hi * 0x1.425982p+92F;
        return sinhf(c + (hi - lo) * -64.0F) * s;
    }
    """
    row = WIDE_RANGE[name]
    low, high, shift = _constant(-row.clamp), _constant(row.clamp), _constant(row.shift)
    below, above = _constant(-row.below), _constant(row.above)
    return "\n".join(
        [
            f"{inline} float {prefix}{name}(float x) {{",
            f"    /* {name}f with its argument in libmvec's fast range (codegen.c.vecmath) */",
            f"    const float c = x < {low} ? {low} : x > {high} ? {high} : x;",
            f"    const float lo = (float)(c < {below}), hi = (float)(c > {above});",
            f"    /* (hi - lo) * -{shift[:-1]} is -0.0 inside the range, and c + -0.0 is c,"
            " -0.0 included */",
            f"    const float s = (1.0F - lo - hi) + lo * {row.scales[0]} + hi * {row.scales[1]};",
            f"    return {name}f(c + (hi - lo) * -{shift}) * s;",
            "}",
        ]
    )


def wide_range_functions(prefix: str) -> dict[str, str]:
    """sympy printer `user_functions` for float32 C: each `WIDE_RANGE` function's name ->
    its helper's (`exp` -> `tdsl_exp`)."""
    return {name: prefix + name for name in ("exp", *WIDE_RANGE)}


def libmvec_functions(called: Iterable[str]) -> list[str]:
    """The functions with a libmvec variant among `called` (rows of FUNCTIONS by name), sorted.

    >>> libmvec_functions({"exp", "sqrt", "log1p", "sigmoid"})
    ['exp', 'log1p']
    """
    return sorted(n for n in set(called) if n in FUNCTIONS and FUNCTIONS[n].libmvec)


def declarations(names: list[str]) -> str:
    """`omp declare simd` declarations of float32 libm functions, grouped under a guard for
    the glibc version whose libmvec has them.

    Args:
        names: rows of FUNCTIONS with a `libmvec` version (`libmvec_functions` picks them).

    Returns:
        C text: a comment, then one `#if ... #endif` block per glibc version.

    >>> print(declarations(["tanh"]).splitlines()[1])
    #if defined(TDSL_LIBMVEC) && defined(__x86_64__) && __GLIBC__ * 100 + __GLIBC_MINOR__ >= 235
    """
    by_version: dict[tuple[int, int], list[str]] = {}
    for name in sorted(names):
        by_version.setdefault(FUNCTIONS[name].libmvec or (0, 0), []).append(name)
    lines = ["/* glibc's vector variants (libmvec) of these, for calls in vectorised loops */"]
    for (major, minor), group in sorted(by_version.items()):
        lines.append(
            "#if defined(TDSL_LIBMVEC) && defined(__x86_64__)"
            f" && __GLIBC__ * 100 + __GLIBC_MINOR__ >= {major * 100 + minor}"
        )
        for name in group:
            lines += ["#pragma omp declare simd notinbranch", f"float {name}f(float);"]
        lines.append("#endif")
    return "\n".join(lines)


def float_helpers(called: Iterable[str], *, inline: str, prefix: str) -> str:
    """The helpers and declarations that float32 C code needs (see the module's example).

    Args:
        called: the functions the code calls (rows of FUNCTIONS by name, as the printer and
            the emitter note them: `CPrinter.functions`).
        inline: the qualifier of helper definitions (`static inline`).
        prefix: the helpers' name prefix (`tdsl_`).

    Returns:
        The definitions of the `FLOAT_HELPERS` and `WIDE_RANGE` helpers that the code calls,
        after the declarations of the libm functions that the code and those helpers call;
        empty when it needs none.
    """
    called = set(called)
    named = [name for name in FLOAT_HELPERS if name in called]
    calls = called | {f for name in named for f in HELPER_CALLS[name]}  # sigmoid calls exp
    exp = [EXP_HELPER.format(inline=inline, prefix=prefix)] if "exp" in calls else []
    wide = [
        wide_range_helper(name, inline=inline, prefix=prefix)
        for name in WIDE_RANGE
        if name in calls
    ]
    helpers = (
        exp + wide + [FLOAT_HELPERS[name].format(inline=inline, prefix=prefix) for name in named]
    )
    # exp is inline arithmetic (no libm call); a wide-range helper calls its function itself
    needed = libmvec_functions(calls - {"exp"})
    return "\n".join([declarations(needed), *helpers] if needed else helpers)
