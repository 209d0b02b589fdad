"""Sweeps of the float32 math functions against float64: the inputs (each function's whole
domain sampled densely in bit space, the neighbourhoods of the points where range reductions
and results switch, special values), float64 references and the error in ulps.

Shared by tests/cpu/test_vector_math.py (which asserts `FUNCTIONS[name].float32_ulps`) and
benchmarks/vector_math.py (which reports the maxima of libm, libmvec and an inline contender).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

FLT_MAX = float(np.finfo(np.float32).max)

#: Where each function is swept; beyond, its float32 value is constant (0, 1, inf) and the
#: boundary points and special values cover it.
DOMAINS: dict[str, tuple[float, float]] = {
    "exp": (-104.0, 89.0),
    "expm1": (-104.0, 89.0),
    "log": (0.0, FLT_MAX),
    "log1p": (-1.0, FLT_MAX),
    "tanh": (-10.0, 10.0),
    "sigmoid": (-104.0, 104.0),
    "softplus": (-104.0, FLT_MAX),
    "erf": (-4.0, 4.0),
    "sin": (-FLT_MAX, FLT_MAX),
    "cos": (-FLT_MAX, FLT_MAX),
    "exp2": (-151.0, 129.0),
    "log2": (0.0, FLT_MAX),
    "log10": (0.0, FLT_MAX),
    "tan": (-FLT_MAX, FLT_MAX),
    "asin": (-1.0, 1.0),
    "acos": (-1.0, 1.0),
    "atan": (-FLT_MAX, FLT_MAX),
    "sinh": (-90.0, 90.0),
    "cosh": (-90.0, 90.0),
    "asinh": (-FLT_MAX, FLT_MAX),
    "acosh": (1.0, FLT_MAX),
    "atanh": (-1.0, 1.0),
    "erfc": (-4.0, 11.0),
    "cbrt": (-FLT_MAX, FLT_MAX),
}

_LN2, _PI = math.log(2.0), math.pi


def _boundaries(name: str) -> list[float]:
    """Points where an implementation switches method or the result changes regime."""
    powers = [2.0**k for k in range(-149, 128)]
    if name in ("exp", "expm1", "sigmoid", "softplus"):
        reductions = [k * _LN2 / 64 for k in range(-104 * 93, 89 * 93)]  # k ln2/64
        limits = [88.72283935546875, -87.33654475, -103.97208, 0.34657359, -0.34657359]
        return reductions + limits + powers + [-p for p in powers]
    if name == "exp2":
        return [k / 8 for k in range(-151 * 8, 129 * 8)] + powers + [-p for p in powers]
    if name in ("log", "log1p", "log2", "log10", "acosh"):
        scaled = [f * p for p in powers for f in (1.0, math.sqrt(0.5), 2 / 3, 4 / 3)]
        return scaled + [f - 1.0 for f in scaled if f < 4.0] + [-p for p in powers if p < 1]
    if name in ("tanh", "erf"):
        switches = [0.5493061, 0.55, 0.625, 0.84375, 1.0, 1.25, 2.857143, 3.92, 6.0, 9.01]
        return switches + [-s for s in switches] + powers + [-p for p in powers if p < 16]
    if name not in ("sin", "cos", "tan"):  # the inverse and hyperbolic functions, erfc
        switches = [0.5, 0.5625, 0.75, 0.84375, 1.0, 1.25, 2.0, 2.857143, 4.0, 6.0, 9.0, 10.0]
        return switches + [-s for s in switches] + powers + [-p for p in powers]
    quarter_turns = [k * _PI / 4 for k in range(-400_000, 400_000, 7)]  # sin, cos, tan
    return quarter_turns + powers + [-p for p in powers]


def _bit_sweep(low: float, high: float, count: int) -> np.ndarray:
    """About `count` float32 values evenly spaced in bit pattern over [low, high] (so every
    binade gets its share), both ends included."""
    if low < 0 < high:
        share = count * 0.5
        return np.concatenate(
            [-_bit_sweep(0.0, -low, int(share)), _bit_sweep(0.0, high, int(share))]
        )
    if high <= 0:
        return -_bit_sweep(-high, -low, count)
    first, last = np.array([low, high], np.float32).view(np.int32)
    return np.unique(np.linspace(first, last, count).astype(np.int32)).view(np.float32)


def _neighbourhoods(points: list[float], width: int = 8) -> np.ndarray:
    """The `width` float32 values on each side of every point, and the point."""
    centre = np.array(points, np.float32).view(np.int32)
    steps = np.arange(-width, width + 1, dtype=np.int32)
    bits = (centre[:, None].astype(np.int64) + steps).astype(np.int32).ravel()
    values = bits.view(np.float32)
    return values[np.isfinite(values)]


SPECIALS = np.array(
    [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-40, -1e-40, 1.1754944e-38]
    + [-1.0, 1.0, FLT_MAX, -FLT_MAX, 1e10, -1e10, 200.0, -200.0],
    np.float32,
)


def sweep_inputs(name: str, count: int = 1_000_000) -> np.ndarray:
    """float32 inputs for `name`: its domain swept, the boundary neighbourhoods, specials."""
    low, high = DOMAINS[name]
    return np.concatenate(
        [_bit_sweep(low, high, count), _neighbourhoods(_boundaries(name)), SPECIALS]
    )


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))


REFERENCES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "exp": np.exp,
    "expm1": np.expm1,
    "log": np.log,
    "log1p": np.log1p,
    "tanh": np.tanh,
    "sigmoid": _sigmoid,
    "softplus": lambda x: np.logaddexp(0.0, x),
    "erf": np.vectorize(math.erf, otypes=[np.float64]),
    "sin": np.sin,
    "cos": np.cos,
    "exp2": np.exp2,
    "log2": np.log2,
    "log10": np.log10,
    "tan": np.tan,
    "asin": np.arcsin,
    "acos": np.arccos,
    "atan": np.arctan,
    "sinh": np.sinh,
    "cosh": np.cosh,
    "asinh": np.arcsinh,
    "acosh": np.arccosh,
    "atanh": np.arctanh,
    "erfc": np.vectorize(math.erfc, otypes=[np.float64]),
    "cbrt": np.cbrt,
}


def reference(name: str, x: np.ndarray) -> np.ndarray:
    """The float64 value of `name` at float32 inputs `x`."""
    with np.errstate(all="ignore"):
        return REFERENCES[name](x.astype(np.float64))


def ulp_errors(got: np.ndarray, want: np.ndarray, *, zero_signs: bool = True) -> np.ndarray:
    """|got - want| in float32 ulps at `want` (2**-149 below the normal range). NaN must
    meet NaN, a result that rounds to +-inf must be that infinity, and a zero must be zero
    (with the sign of the exact zero when `zero_signs`); each violation is an infinite error."""
    with np.errstate(all="ignore"):
        want32 = want.astype(np.float32)
        spacing = np.exp2(np.floor(np.log2(np.maximum(np.abs(want), 2.0**-126))) - 23)
        errors = np.abs(got.astype(np.float64) - want) / spacing
    both_nan = np.isnan(got) & np.isnan(want)
    same_infinity = np.isinf(want32) & (got == want32)
    errors = np.where(both_nan | same_infinity, 0.0, errors)
    wrong_sign = zero_signs & (np.signbit(got) != np.signbit(want))
    wrong_zero = (want == 0) & ((got != 0) | wrong_sign)
    return np.where(np.isnan(errors) | wrong_zero, np.inf, errors)
