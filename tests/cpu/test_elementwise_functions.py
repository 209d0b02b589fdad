"""jax.numpy's elementwise functions beyond the core table (`cbrt`, `hypot`, `logaddexp`,
`isnan`, ..., codegen/ir/elementwise.py) and jnp's spellings of the others (`arcsin`,
`power`, ...): values and gradients against float64 NumPy/SciPy on random inputs in each
row's domain, IEEE edge values as jax.numpy has them, and the 1/0 tests in arithmetic and in
conditions, on the reference, C, CUDA (the emulator where there is no GPU) and Pallas
(interpret mode) back ends, outputs poisoned."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest
from scipy import special

import tensordsl as td
from codegen.ir.functions import FUNCTIONS, SPELLINGS
from tests.backends import BACKENDS, generated_kernels  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("generated_kernels")

ALL_BACKENDS = [*BACKENDS, "pallas"]
N = 11


def _zero(x, *rest):
    return np.zeros_like(x)


def _steps(test):
    return (lambda x: test(x).astype(np.float64), (_zero,))


#: name -> (float64 value, its partial derivatives), in NumPy/SciPy
TRUTH = {
    "cbrt": (np.cbrt, (lambda x: 1 / (3 * np.cbrt(x) ** 2),)),
    "hypot": (np.hypot, (lambda a, b: a / np.hypot(a, b), lambda a, b: b / np.hypot(a, b))),
    "sinc": (np.sinc, (lambda x: (np.cos(np.pi * x) - np.sinc(x)) / x,)),
    "logaddexp": (
        np.logaddexp,
        (
            lambda a, b: np.exp(a - np.logaddexp(a, b)),
            lambda a, b: np.exp(b - np.logaddexp(a, b)),
        ),
    ),
    "logaddexp2": (
        np.logaddexp2,
        (
            lambda a, b: np.exp2(a - np.logaddexp2(a, b)),
            lambda a, b: np.exp2(b - np.logaddexp2(a, b)),
        ),
    ),
    "reciprocal": (np.reciprocal, (lambda x: -1 / x**2,)),
    "negative": (np.negative, (lambda x: -np.ones_like(x),)),
    "copysign": (np.copysign, (lambda a, b: np.sign(a) * np.copysign(1, b), _zero)),
    "fmod": (np.fmod, (lambda a, b: np.ones_like(a), lambda a, b: -np.trunc(a / b))),
    "remainder": (np.remainder, (lambda a, b: np.ones_like(a), lambda a, b: -np.floor(a / b))),
    "deg2rad": (np.deg2rad, (lambda x: np.full_like(x, np.pi / 180),)),
    "rad2deg": (np.rad2deg, (lambda x: np.full_like(x, 180 / np.pi),)),
    "erfinv": (special.erfinv, (lambda x: np.sqrt(np.pi) / 2 * np.exp(special.erfinv(x) ** 2),)),
    "lgamma": (special.gammaln, (special.psi,)),
    "digamma": (special.psi, (lambda x: special.polygamma(1, x),)),
    "xlogy": (special.xlogy, (lambda x, y: np.log(y), lambda x, y: x / y)),
    "xlog1py": (special.xlog1py, (lambda x, y: np.log1p(y), lambda x, y: x / (1 + y))),
    "logit": (special.logit, (lambda x: 1 / (x * (1 - x)),)),
    "round": (np.round, (_zero,)),
    "trunc": (np.trunc, (_zero,)),
    "heaviside": (np.heaviside, (_zero, lambda x, h: (x == 0).astype(np.float64))),
    "isnan": _steps(np.isnan),
    "isinf": _steps(np.isinf),
    "isfinite": _steps(np.isfinite),
    "signbit": _steps(np.signbit),
}


def _inputs(name: str, seed: int) -> list[np.ndarray]:
    low, high = FUNCTIONS[name].domain
    rng = np.random.default_rng(seed)
    inputs = [rng.uniform(low, high, N) for _ in range(FUNCTIONS[name].arity)]
    if name in ("copysign", "fmod", "remainder"):  # every sign of either argument
        inputs = [x * rng.choice([-1.0, 1.0], N) for x in inputs]
    if name == "round":
        inputs[0][:4] = [0.5, 1.5, 2.5, -0.5]  # halves to even
    if name == "heaviside":
        inputs[0][:2] = 0.0
    return inputs


def _call(name: str, arity: int) -> str:
    return f"{name}({', '.join(f'X{n}[i]' for n in range(arity))})"


def test_every_new_row_is_checked() -> None:
    assert set(TRUTH) | {"polygamma"} == set(FUNCTIONS) - set(_CORE)


_CORE = (
    *("exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "tanh", "sigmoid", "softplus", "relu"),
    *("sin", "cos", "abs", "erf", "min", "max", "where", "pow", "abs2", "atan2", "exp2"),
    *("log2", "log10", "tan", "asin", "acos", "atan", "sinh", "cosh", "asinh", "acosh"),
    *("atanh", "erfc", "square", "clamp", "floor", "ceil", "sign"),
)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("name", sorted(TRUTH))
def test_value_and_gradient_against_numpy(backend: str, name: str) -> None:
    value, partials = TRUTH[name]
    inputs = _inputs(name, sorted(TRUTH).index(name))
    W = np.random.default_rng(1).normal(size=N)
    k = td.kernel(f"Y[i] := {_call(name, len(inputs))} * W[i]", backend=backend)
    np.testing.assert_allclose(np.asarray(k(*inputs, W)), value(*inputs) * W, rtol=1e-12)
    argnums = tuple(range(len(inputs)))
    got = jax.grad(lambda *a: jnp.sum(k(*a, W)), argnums)(*inputs)
    for g, partial in zip(got, partials, strict=True):
        np.testing.assert_allclose(np.asarray(g), partial(*inputs) * W, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_polygamma_orders(backend: str) -> None:
    X = np.random.default_rng(2).uniform(0.5, 4.0, N)
    k = td.kernel("Y[i] := polygamma(0, X[i]) + 2 * polygamma(1, X[i])", backend=backend)
    want = special.polygamma(0, X) + 2 * special.polygamma(1, X)
    np.testing.assert_allclose(np.asarray(k(X)), want, rtol=1e-12)
    trigamma = td.kernel("Y[i] := polygamma(1, X[i])", backend=backend)
    if backend in ("c", "cuda"):  # trigamma's derivative, polygamma(2, x), is not in C
        with pytest.raises(td.UnsupportedError, match="polygamma of order 2 has no C or CUDA"):
            jax.grad(lambda x: jnp.sum(trigamma(x)))(X)
        return
    got = jax.grad(lambda x: jnp.sum(trigamma(x)))(X)
    np.testing.assert_allclose(np.asarray(got), special.polygamma(2, X), rtol=1e-10)


INF, NAN = np.inf, np.nan

#: name -> (arguments, jax.numpy's values) at the edges
EDGES = {
    "cbrt": (([-8.0, -0.0, 27.0, -INF],), [-2.0, -0.0, 3.0, -INF]),
    "sinc": (([0.0, -0.0, 1.0, 0.5],), [1.0, 1.0, np.sinc(1.0), np.sinc(0.5)]),
    "logaddexp": (([-INF, INF, -INF, NAN], [-INF, INF, 1.0, 1.0]), [-INF, INF, 1.0, NAN]),
    "logaddexp2": (([-INF, INF, 3.0, 1.0], [-INF, INF, -INF, 1.0]), [-INF, INF, 3.0, 2.0]),
    "fmod": (([-7.5, 7.5, -7.5, 6.0], [2.0, -2.0, -2.0, 3.0]), [-1.5, 1.5, -1.5, 0.0]),
    "remainder": (([-7.5, 7.5, -7.5, 6.0], [2.0, -2.0, -2.0, -3.0]), [0.5, -0.5, -1.5, 0.0]),
    "round": (([0.5, 1.5, 2.5, -0.5, -2.5, 2.4999],), [0.0, 2.0, 2.0, -0.0, -2.0, 2.0]),
    "trunc": (([-2.7, 2.7, -0.2],), [-2.0, 2.0, -0.0]),
    "reciprocal": (([0.0, -0.0, INF],), [INF, -INF, 0.0]),
    "hypot": (([INF, 3.0, -3.0], [NAN, 4.0, -4.0]), [INF, 5.0, 5.0]),
    "copysign": (([2.0, 2.0, -0.0], [-0.0, NAN, 1.0]), [-2.0, 2.0, 0.0]),
    "heaviside": (([0.0, -0.0, -1.0, 3.0], [0.5, 0.25, 0.5, 0.5]), [0.5, 0.25, 0.0, 1.0]),
    "erfinv": (([1.0, -1.0, 2.0, 0.0],), [INF, -INF, NAN, 0.0]),
    "xlogy": (([0.0, 0.0, 2.0, 0.0], [0.0, INF, 0.0, 3.0]), [0.0, 0.0, -INF, 0.0]),
    "xlog1py": (([0.0, 0.0, 2.0], [-1.0, INF, -1.0]), [0.0, 0.0, -INF]),
    "logit": (([0.0, 1.0, 0.5],), [-INF, INF, 0.0]),
    "isnan": (([NAN, INF, 1.0],), [1.0, 0.0, 0.0]),
    "isinf": (([NAN, -INF, 1.0],), [0.0, 1.0, 0.0]),
    "isfinite": (([NAN, INF, -1.0],), [0.0, 0.0, 1.0]),
    "signbit": (([-0.0, 0.0, -2.0, -INF],), [1.0, 0.0, 1.0, 1.0]),
}


@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_values_as_jax_numpy(backend: str, name: str) -> None:
    arguments, want = EDGES[name]
    inputs = [np.asarray(a) for a in arguments]
    got = np.asarray(td.kernel(f"Y[i] := {_call(name, len(inputs))}", backend=backend)(*inputs))
    # NaN meets NaN, inf the same inf; zeros' signs are not compared: generated C adds the
    # one term to a sum started at +0, which makes -0.0 +0.0 (whatever the function)
    np.testing.assert_allclose(got, want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_tests_are_values_and_conditions(backend: str) -> None:
    rng = np.random.default_rng(3)
    X = rng.normal(size=(5, 6))
    X[rng.random(X.shape) < 0.3] = NAN
    X[0, :2] = [INF, -INF]
    count = td.kernel("Y[i] := isnan(X[i,j]) + 2 * isinf(X[i,j])", backend=backend)
    np.testing.assert_array_equal(np.asarray(count(X)), (np.isnan(X) + 2 * np.isinf(X)).sum(1))
    kept = td.kernel(
        "Y[i] := where(isfinite(X[i,j]) & not signbit(X[i,j]), X[i,j], 0)", backend=backend
    )
    want = np.where(np.isfinite(X) & ~np.signbit(X), X, 0).sum(1)
    np.testing.assert_allclose(np.asarray(kept(X)), want, rtol=1e-12)
    W = rng.normal(size=(5, 6))
    masked = td.kernel("Y[i] := where(isnan(X[i,j]), W[i,j], X[i,j] * W[i,j])", backend=backend)
    truth = lambda X, W: jnp.sum(jnp.where(jnp.isnan(X), W, X * W), 1)  # noqa: E731
    np.testing.assert_allclose(np.asarray(masked(X, W)), truth(X, W), rtol=1e-12)
    got = jax.grad(lambda W: jnp.sum(masked(X, W)))(W)
    np.testing.assert_allclose(np.asarray(got), np.where(np.isnan(X), 1.0, X), rtol=1e-12)


ALIASES = sorted((name, arity) for name, arity in SPELLINGS if name not in FUNCTIONS)


@pytest.mark.parametrize(("alias", "arity"), ALIASES)
def test_an_alias_gives_its_canonical_kernel(alias: str, arity: int) -> None:
    canonical = SPELLINGS[alias, arity]
    assert td.kernel(f"Y[i] := {_call(alias, arity)}").source("c") == (
        td.kernel(f"Y[i] := {_call(canonical, arity)}").source("c")
    )


def test_jax_numpy_spellings_are_known() -> None:
    spelled = {name for name, _ in SPELLINGS}
    jnp_names = ("arcsin", "arccos", "arctan", "arctan2", "arcsinh", "arccosh", "arctanh")
    assert {*jnp_names, "power", "maximum", "minimum", "absolute", "fabs", "rint"} <= spelled
    assert {"degrees", "radians"} <= spelled
    numpy_names = {name for name, _ in SPELLINGS} - {"fabs", "gammaln", "expit"}  # libm's, scipy's
    assert all(getattr(jnp, name, None) is not None for name in numpy_names)


@pytest.mark.parametrize(
    ("source", "error", "match"),
    [
        ("Y[i] := arcsin(X[i], X[i])", td.ShapeError, r"'arcsin' takes 1 argument"),
        ("Y[i] := arcsinn(X[i])", td.UnknownNameError, "did you mean 'arcsin'"),
        ("Y[i] := cbrtt(X[i])", td.UnknownNameError, "did you mean 'cbrt'"),
        ("Y[i] := logaddexp(X[i])", td.ShapeError, r"'logaddexp' takes 2 argument"),
    ],
)
def test_errors_name_the_spelling_written(source: str, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        td.kernel(source)


#: constant arguments: evaluated when the kernel is made, as jnp evaluates them
CONSTANTS = {
    "cbrt(-8)": -2.0,
    "round(2.5) + round(-1.5)": 0.0,
    "remainder(-7.5, 2) + fmod(-7.5, 2)": 0.5 - 1.5,
    "copysign(2, -1) + hypot(3, 4)": 3.0,
    "logaddexp(1, 2) + logaddexp2(1, 1)": np.logaddexp(1, 2) + 2.0,
    "digamma(1) + polygamma(1, 2) + lgamma(0.5)": (
        special.psi(1) + special.polygamma(1, 2) + special.gammaln(0.5)
    ),
    "isnan(1) + isfinite(2) + signbit(-3) + trunc(-2.5) + sinc(0)": 1.0,
}


@pytest.mark.parametrize("backend", ["reference", *BACKENDS[1:2]])
@pytest.mark.parametrize("constant", sorted(CONSTANTS))
def test_functions_of_constants(backend: str, constant: str) -> None:
    X = np.random.default_rng(4).normal(size=5)
    got = td.kernel(f"Y[i] := X[i] * ({constant})", backend=backend)(X)
    np.testing.assert_allclose(np.asarray(got), X * CONSTANTS[constant], rtol=1e-14)


@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_xlogy_at_zero_has_jax_gradient(backend: str) -> None:
    X, Y = np.array([0.0, 0.0, 1.5]), np.random.default_rng(5).uniform(0.5, 2.0, 3)
    k = td.kernel("Z[i] := xlogy(X[i], Y[i]) + xlog1py(X[i], Y[i])", backend=backend)
    np.testing.assert_allclose(np.asarray(k(X, Y)), 1.5 * np.log(Y * (1 + Y)) * [0, 0, 1])
    dx, dy = jax.grad(lambda x, y: jnp.sum(k(x, y)), (0, 1))(X, Y)
    np.testing.assert_allclose(np.asarray(dx), np.log(Y) + np.log1p(Y), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(dy), X / Y + X / (1 + Y), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("backend", ALL_BACKENDS)
def test_sinc_and_its_gradients_keep_their_digits_near_zero(backend: str, dtype: type) -> None:
    """sin(pi x)/(pi x)'s derivative, cos(pi x)/x - sin(pi x)/(pi x^2), is a difference of two
    terms near 1/x whose difference is -pi^2 x / 3: in float32 at x = 1e-3 it lost every
    digit. Near 0 sinc is its Taylor series, exact in value and in every derivative."""
    rng = np.random.default_rng(11)
    X = (10.0 ** rng.uniform(-7, -0.5, 40) * rng.choice([-1.0, 1.0], 40)).astype(dtype)
    X[:3] = [0.0, 0.149, -0.151]  # either side of where the series stops
    x = X.astype(np.float64)
    with mpmath.workdps(40):  # the derivative's own formula, its cancellation at 40 digits
        sinc_prime = np.array(
            [float(mpmath.diff(lambda t: mpmath.sinc(mpmath.pi * t), mpmath.mpf(v))) for v in x]
        )
    k = td.kernel("Y[i] := sinc(X[i])", backend=backend)
    tol = {np.float32: 3e-6, np.float64: 1e-13}[dtype]
    np.testing.assert_allclose(np.asarray(k(X)), np.sinc(x), rtol=tol)
    grad = jax.grad(lambda a: jnp.sum(k(a)))(X)
    np.testing.assert_allclose(np.asarray(grad), sinc_prime, rtol=tol, atol=0)
    hessian_diagonal = jax.grad(lambda a: jnp.sum(jax.grad(lambda b: jnp.sum(k(b)))(a)))(X)
    second = -(np.pi**2) / 3 + np.pi**4 * x**2 / 10  # exact to float64 for |x| < 1e-3
    near = np.abs(x) < 1e-3
    np.testing.assert_allclose(np.asarray(hessian_diagonal)[near], second[near], rtol=tol * 10)
