"""float32 math functions that vectorise in generated C: glibc's libmvec.

glibc's `expf`, `logf`, ... are scalar calls; inside a `#pragma omp simd` loop every lane
waits on them. glibc also ships vector variants (libmvec, `_ZGVdN8v_expf` for AVX2, ...),
but declares them (`#pragma omp declare simd`) only under `-ffast-math`. The generated C
declares the ones it calls itself, so GCC calls the vector variant from a vectorised loop
and the scalar one elsewhere (-lmvec links them; `codegen.c.build` defines `TDSL_LIBMVEC` when
it does; GCC vectorises the calls only with `-fno-math-errno`, a base flag). Without libmvec
(another C library, another architecture) the declarations drop out and the calls stay
scalar libm calls. Which functions have a variant, from which glibc version, and the
maximum error the tests assert are the `libmvec` and `float32_ulps` columns of
`codegen.ir.functions.FUNCTIONS`; float64 keeps libm.

`sigmoid` and `softplus` are helpers written so that their loops vectorise: one division
and selects between values computed anyway (with GCC's default `-ftrapping-math`, a `?:`
arm computed only for that select becomes a branch, and the loop does not vectorise).

>>> print(float_helpers("y = tdsl_sigmoid(x);", inline="static inline", prefix="tdsl_"))
... # doctest: +ELLIPSIS
/* glibc's vector variants (libmvec) of these, for calls in vectorised loops */
#if defined(TDSL_LIBMVEC) && defined(__x86_64__) && __GLIBC__ * 100 + __GLIBC_MINOR__ >= 222
#pragma omp declare simd notinbranch
float expf(float);
#endif
static inline float tdsl_sigmoid(float x) {
...
"""

from __future__ import annotations

import re

from codegen.ir.functions import FUNCTIONS

#: The float32 definitions of the helper rows of FUNCTIONS (the other targets' are the
#: printer's): a `?:` between values computed anyway, and one division.
FLOAT_HELPERS = {
    "sigmoid": """\
{inline} float {prefix}sigmoid(float x) {{
    /* stable: exp of a non-positive number only */
    const float e = expf(-fabsf(x));
    return (x >= 0 ? 1.0F : e) / (1 + e);
}}""",
    "softplus": """\
{inline} float {prefix}softplus(float x) {{
    return (x > 0 ? x : 0.0F) + log1pf(expf(-fabsf(x)));
}}""",
}

_CALL = re.compile(r"\b(\w+)\(")


def libmvec_functions(code: str) -> list[str]:
    """The functions with a libmvec variant that float32 C text `code` calls, sorted.

    >>> libmvec_functions("v = expf(a) + sqrtf(b) + exp(c) + log1pf(d);")
    ['exp', 'log1p']
    """
    names = {word.removesuffix("f") for word in _CALL.findall(code) if word.endswith("f")}
    return sorted(n for n in names if n in FUNCTIONS and FUNCTIONS[n].libmvec)


def declarations(names: list[str]) -> str:
    """`omp declare simd` declarations of float32 libm functions, grouped under a guard for
    the glibc version whose libmvec has them.

    Args:
        names: rows of FUNCTIONS with a `libmvec` version (`libmvec_functions` finds them).

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


def float_helpers(code: str, *, inline: str, prefix: str) -> str:
    """The helpers and declarations that float32 C code needs (see the module's example).

    Args:
        code: the C text that will follow (the function body).
        inline: the qualifier of helper definitions (`static inline`).
        prefix: the helpers' name prefix (`tdsl_`).

    Returns:
        The definitions of the `FLOAT_HELPERS` that `code` calls (`<prefix><name>`), after
        the declarations of the libm functions that `code` and those helpers call; empty
        when it needs none.
    """
    called = [name for name in FLOAT_HELPERS if re.search(rf"\b{prefix}{name}\(", code)]
    helpers = [FLOAT_HELPERS[name].format(inline=inline, prefix=prefix) for name in called]
    needed = libmvec_functions("\n".join([code, *helpers]))
    return "\n".join([declarations(needed), *helpers] if needed else helpers)
