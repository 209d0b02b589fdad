"""NaN and infinities propagate as in jax.numpy (evaluated op by op, left to right) on the
reference, C and CUDA back ends (the CUDA emulator where there is no GPU), forward and
gradient: a value that cancels out (`X - X`, `X/X`, `0*exp(X)`), a signed zero
(`-0.0*X`), float32 overflow in a chain of constants, fractional powers of negatives
(issue 27)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.cpu.test_zero_factors import BACKENDS

SPECIAL = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, -2.0, 3.0, 1e-310, 0.75])
#: source -> the same computation in jnp, evaluated op by op
CASES = {
    "X[i]*0": lambda x: x * 0,
    "X[i] - X[i]": lambda x: x - x,
    "X[i]/X[i]": lambda x: x / x,
    "X[i]*X[i]/X[i]": lambda x: x * x / x,
    "(X[i] + 2) - X[i]": lambda x: (x + 2) - x,
    "exp(X[i])/exp(X[i])": lambda x: jnp.exp(x) / jnp.exp(x),
    "exp(X[i])*exp(-X[i])": lambda x: jnp.exp(x) * jnp.exp(-x),
    "0*exp(X[i])": lambda x: 0 * jnp.exp(x),
    "-0.0*X[i] + 1": lambda x: -0.0 * x + 1,
    "sin(X[i])*1e30*1e30*1e-30*1e-30": lambda x: jnp.sin(x) * 1e30 * 1e30 * 1e-30 * 1e-30,
    "X[i]^(1/3)": lambda x: x ** (1 / 3),
}
#: gradients jax orders differently (it multiplies the cotangent by the constants in the
#: reverse order): forward only
FORWARD_ONLY = {"sin(X[i])*1e30*1e30*1e-30*1e-30"}


@pytest.fixture(autouse=True)
def _settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    if jax.default_backend() != "gpu":
        monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")


def _same(got, want, rtol: float) -> None:
    """Equal, NaN where jnp has NaN, infinities of the same sign (zero signs aside: a sum
    accumulates from +0, docs/language.md)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(got) * np.sign(got), np.isinf(want) * np.sign(want))
    finite = np.isfinite(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=rtol, atol=rtol)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("source", list(CASES))
def test_special_values_propagate_as_in_jnp(backend, dtype, source):
    if backend == "cuda" and dtype == "float32":
        pytest.skip("one dtype under the emulator (its cost is compiling)")
    x = jnp.asarray(SPECIAL, dtype)
    if dtype == "float64" and jax.default_backend() == "cpu":
        x = x.at[7].set(0.5)  # XLA on the CPU flushes subnormals, generated C does not
    k = td.kernel("Y[i] := " + source, backend=backend)
    with jax.disable_jit():
        want = CASES[source](x)
        want_grad = jax.grad(lambda x: CASES[source](x).sum())(x)
    rtol = 1e-6 if dtype == "float32" else 1e-12
    _same(k(X=x), want, rtol)
    if source not in FORWARD_ONLY:
        _same(jax.grad(lambda x: k(X=x).sum())(x), want_grad, rtol)


def test_the_sign_of_a_zero_product_is_kept_on_the_reference_back_end():
    x = jnp.asarray([2.0, -2.0])
    assert np.signbit(td.kernel("Y[i] := -0.0*X[i]", backend="reference")(X=x)).tolist() == [
        True,
        False,
    ]
    assert np.signbit(td.kernel("Y[i] := X[i]*0", backend="reference")(X=x)).tolist() == [
        False,
        True,
    ]


def test_a_fractional_power_of_a_negative_constant_is_refused():
    with pytest.raises(td.TensorDSLError, match="is not a finite real number"):
        td.kernel("Y[i] := X[i] * (-8)^(1/3)")


def test_cancelled_operations_print_as_written():
    from tensordsl.frontend.lower import lower
    from tensordsl.frontend.parse import parse

    for source in ("X[i] - X[i]", "X[i]/X[i]", "0*exp(X[i])"):
        nest = lower(parse("Y[i] := " + source)).nest
        assert str(nest) == f"Y[i] := ({source})"
        assert lower(parse(str(nest))).nest == nest  # the printed source reads back
    # nothing cancels: sympy's form, unchanged
    assert str(lower(parse("Y[i] := X[i] + X[i] - 2*W[i]")).nest) == "Y[i] := 2*X[i] - 2*W[i]"


@pytest.mark.parametrize("backend", ["reference", "c"])
@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("Y[i] := (alpha / (alpha * X[i]))", lambda a, x: a / (a * x)),
        ("Y[i] := X[i] - (X[i] - alpha)", lambda a, x: x - (x - a)),
        ("Y[i] := X[i] / (X[i] / alpha)", lambda a, x: x / (x / a)),
    ],
)
def test_a_kept_operation_keeps_its_right_operand_whole(source, expected, backend) -> None:
    """A cancelling operation is printed as written; its right operand at the same precedence
    needs its parentheses (`a/(a*X)` printed as `a/a*X` computed X in C)."""
    x = np.random.default_rng(31).uniform(0.5, 2.0, 7)
    got = td.kernel(source, backend=backend)(alpha=1.7, X=x)
    np.testing.assert_allclose(np.asarray(got), expected(1.7, x), rtol=1e-12)
