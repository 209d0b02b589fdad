"""Integers at or above 2**31 and 2**63 in statements (issue 13, item 3): a large literal used
as a value is a floating-point constant (C never wraps it, the reference never overflows);
index offsets and coefficients that are not int64 are refused when the kernel is made, index
arithmetic beyond int64 when it is called: never a wrapped value or a read out of bounds."""

from __future__ import annotations

import re

import jax
import numpy as np
import pytest

import tensordsl as td
from tensordsl.errors import IndexExpressionError, RangeError, UnsupportedError
from tests.backends import NEEDS_C_COMPILER

pytestmark = [NEEDS_C_COMPILER, pytest.mark.usefixtures("poisoned_outputs")]
INT64_MAX = 2**63 - 1
TOLERANCE = {"float64": 1e-12, "float32": 1e-6}
BACKENDS = ["c", "reference"]


# (statement, its float64 reference as a function of X and the index values i)
VALUES = [
    ("Y[i] := X[i] * 1000000000000000000000000000000", lambda x, i: x * 1e30),
    ("Y[i] := X[i] * 3000000000", lambda x, i: x * 3e9),
    ("Y[i] := X[i] * 9223372036854775808", lambda x, i: x * 2.0**63),
    ("Y[i] := X[i] * 18446744073709551616", lambda x, i: x * 2.0**64),
    ("Y[i] := X[i] * -(2^70)", lambda x, i: -x * 2.0**70),
    ("Y[i] := X[i] + i * 100000000000000000000", lambda x, i: x + i * 1e20),
    ("Y[i] := X[i] * (i + 18446744073709551616)", lambda x, i: x * (i + 2.0**64)),
    ("Y[i] := X[i] * i * 65536 * 65536 * 65536 * 65536", lambda x, i: x * i * 2.0**64),
    ("Y[i] := X[i] * (i < 100000000000000000000)", lambda x, i: x),
    ("Y[i] := X[i] * (18446744073709551616 - 18446744073709551615)", lambda x, i: x),
]


def _inputs(dtype: str = "float64") -> np.ndarray:
    return np.random.default_rng(0).uniform(0.5, 2.0, 6).astype(dtype)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("source", "reference"), VALUES, ids=[s for s, _ in VALUES])
def test_large_literals_are_floating_point_values(source, reference, backend, dtype) -> None:
    x = _inputs(dtype)
    got = np.asarray(td.kernel(source, backend=backend)(x))
    expected = reference(x.astype(np.float64), np.arange(len(x), dtype=np.float64))
    np.testing.assert_allclose(got, expected, rtol=TOLERANCE[dtype])


@pytest.mark.parametrize(("source", "reference"), VALUES, ids=[s for s, _ in VALUES])
def test_generated_c_has_no_integer_literal_beyond_int64(source, reference) -> None:
    for role, text in td.kernel(source, backend="c").source().items():
        body = text[text.index("*/") :]  # the header comment shows the statement as typed
        literals = [int(n) for n in re.findall(r"(?<![\w.])\d+(?![\w.])", body)]
        assert max(literals) <= INT64_MAX, role


@pytest.mark.parametrize(("source", "reference"), VALUES[:2], ids=[s for s, _ in VALUES[:2]])
def test_reference_without_x64(source, reference) -> None:
    # JAX's default: 32-bit integers. A literal >= 2**31 used to raise a raw OverflowError.
    x = _inputs("float32")
    with jax.enable_x64(False):
        got = np.asarray(td.kernel(source, backend="reference")(x))
    np.testing.assert_allclose(got, reference(x.astype(np.float64), None), rtol=1e-6)


def test_reference_without_x64_gradient_with_a_large_coefficient() -> None:
    # The derivative of X^3 * 10^9 has the integer coefficient 3 * 10^9 >= 2**31: a value,
    # not an index, so the 32-bit integers of JAX's default do not limit it.
    x = _inputs("float32")
    with jax.enable_x64(False):
        k = td.kernel("Y[i] := X[i]^3 * 1000000000", backend="reference")
        got = jax.grad(lambda x: k(x).sum())(x)
    np.testing.assert_allclose(np.asarray(got), 3e9 * x.astype(np.float64) ** 2, rtol=1e-6)


# (statement, the shape of X, where Y's elements come from in X)
SHIFTS = [
    ("Y[i] := X[i + 3000000000]", 6, np.arange(6)),
    ("Y[i] := X[i - 4611686018427387904]", 6, np.arange(6)),
    ("Y[i] := X[i + 9223372036854775807]", 6, np.arange(6)),
    ("Y[i] := X[2*i + 4611686018427387904]", 8, np.arange(0, 8, 2)),
    ("Y[i] := X[-9223372036854775807*i + 5]", 6, np.array([5])),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("source", "n", "positions"), SHIFTS, ids=[s for s, _, _ in SHIFTS])
def test_int64_offsets_read_the_right_elements(source, n, positions, backend) -> None:
    x = _inputs()[:n] if n <= 6 else np.random.default_rng(1).uniform(0.5, 2.0, n)
    k = td.kernel(source, backend=backend)
    np.testing.assert_array_equal(np.asarray(k(x)), x[positions])
    cotangent = np.random.default_rng(2).uniform(1.0, 2.0, len(positions))
    grad = jax.grad(lambda x: (k(x) * cotangent).sum())(x)
    expected = np.zeros_like(x)
    expected[positions] = cotangent
    np.testing.assert_array_equal(np.asarray(grad), expected)


def test_reference_without_x64_refuses_indices_beyond_int32() -> None:
    k = td.kernel("Y[i] := X[i + 3000000000]", backend="reference")
    with jax.enable_x64(False), pytest.raises(UnsupportedError, match="jax_enable_x64"):
        k(_inputs("float32"))


@pytest.mark.parametrize(
    ("source", "match"),
    [
        ("Y[i] := X[i+18446744073709551616]", "offset 18446744073709551616"),
        ("Y[i] := X[i-9223372036854775809]", "offset -9223372036854775809"),
        ("Y[i] := X[9223372036854775808*i]", "coefficient 9223372036854775808 of 'i'"),
        ("Y[i] := X[i+2^62*2^8]", "offset 1180591620717411303424"),
        ("Y[i] := X[i-9223372036854775808]", "offset -9223372036854775808"),
    ],
)
def test_index_constants_beyond_int64_are_refused(source: str, match: str) -> None:
    with pytest.raises(IndexExpressionError, match=match):
        td.kernel(source)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "source",
    ["Y[i] := X[i - 9223372036854775807]", "Y[i] := X[i + j - 9223372036854775807] * W[j]"],
)
def test_index_arithmetic_beyond_int64_is_refused_at_call_time(source, backend) -> None:
    k = td.kernel(source, backend=backend)
    with pytest.raises(RangeError, match="int64"):
        k(*(_inputs() for _ in k.inputs))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ranges", [{"k": range(2**63, 2**63 + 2)}, {"k": 2**64}])
def test_explicit_ranges_beyond_int64_are_refused(ranges, backend) -> None:
    # Before: a C loop `for (k = 9223372036854775807; k < 9223372036854775809; ++k)`.
    k = td.kernel("Y[i] := X[i] * W[k - 9223372036854775807]", ranges=ranges, backend=backend)
    with pytest.raises(RangeError, match="index 'k' runs over .* beyond int64"):
        k(_inputs(), _inputs())


@pytest.mark.parametrize("backend", [*BACKENDS, "cuda"])
@pytest.mark.parametrize(
    "source, ranges",
    [("Y[i] := i", {"i": INT64_MAX}), ("Y[i,j] := (i == j)", {"i": 2**62, "j": 4})],
)
def test_output_too_large_for_any_array(backend: str, source: str, ranges: dict, monkeypatch):
    """Issue 27: XLA aborted the process (SIGABRT) on an output whose size in bytes leaves
    int64; the call is refused before JAX sees the shape."""
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    k = td.kernel(source, ranges=ranges, backend=backend)
    with pytest.raises(RangeError, match=r"the output 'Y' would have shape .* elements"):
        k()
