"""Index-array positions that leave JAX's integer type (issue 36, item 3): `A[65536*tok[b]]`
with `tok = 65536` is 2^32, outside the table, never the row its int32 value wraps to; with
x64, `A[2^32*tok[b]]` never wraps at 2^64. Eagerly a `RangeError` that names the true
position, under jit NaN, as for any position outside the table (docs/language.md); an int64
index array whose values JAX would truncate to int32 (no x64) is refused when it is passed."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl.errors import InputError, RangeError, UnsupportedError
from tests.jax.test_index_arrays import BACKENDS, _backend

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

# (x64, statement, rows of the table, tok, the true position of b = 1); b = 0 and b = 2
# read rows 0 and 2 (tok is 0 there).
OVERFLOWS = [
    (False, "E[b,d] := A[65536*tok[b] + b, d]", 5, [0, 65536, 0], 2**32 + 1),
    (False, "E[b,d] := A[65536*tok[b] + b, d]", 5, [0, 32768, 0], 2**31 + 1),
    (False, "E[b,d] := A[b - 65536*tok[b], d]", 5, [0, -65536, 0], 2**32 + 1),
    (False, "E[b,d] := A[4294967296*tok[b] + b, d]", 5, [0, 1, 0], 2**32 + 1),
    (True, "E[b,d] := A[4294967296*tok[b] + b, d]", 5, [0, 2**32, 0], 2**64 + 1),
    (True, "E[b,d] := A[b - 4294967296*tok[b], d]", 5, [0, -(2**32), 0], 2**64 + 1),
]
IDS = [f"{s}-tok={t[1]}-x64={x}" for x, s, _, t, _ in OVERFLOWS]


def _table(rows: int, x64: bool) -> np.ndarray:
    values = np.random.default_rng(5).normal(size=(rows, 4))
    return values.astype(np.float64 if x64 else np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("x64", "source", "rows", "tok", "true"), OVERFLOWS, ids=IDS)
def test_a_position_beyond_the_index_type_is_outside(
    x64, source, rows, tok, true, backend, monkeypatch
) -> None:
    table = _table(rows, x64)
    with jax.enable_x64(x64):
        tok = np.array(tok, np.int64 if x64 else np.int32)
        k = td.kernel(source, backend=_backend(backend, monkeypatch))
        with pytest.raises(
            RangeError, match=rf"'tok' points to {true} on axis 0 of 'A' \(at b=1\)"
        ):
            k(table, tok)
        got = np.asarray(jax.jit(k)(table, tok))
    assert np.isnan(got[1]).all()
    np.testing.assert_array_equal(got[[0, 2]], table[[0, 2]])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x64", [False, True])
def test_large_positions_inside_the_table_read_and_take_gradients(x64, backend, monkeypatch):
    # 65536*tok[b] + b is right up to the table's end: no position is refused for its size.
    table = np.random.default_rng(6).normal(size=(3 * 65536 + 3, 2))
    tok, cotangent = np.array([2, 0, 1]), np.random.default_rng(7).uniform(1, 2, (3, 2))
    rows = 65536 * tok + np.arange(3)
    dtype = np.float64 if x64 else np.float32
    with jax.enable_x64(x64):
        k = td.kernel("E[b,d] := A[65536*tok[b] + b, d]", backend=_backend(backend, monkeypatch))
        a, t = table.astype(dtype), tok.astype(np.int32)
        got = np.asarray(k(a, t))
        grad = np.asarray(jax.grad(lambda a: jnp.sum(k(a, t) * cotangent.astype(dtype)))(a))
    np.testing.assert_array_equal(got, a[rows])
    expected = np.zeros_like(table)
    np.add.at(expected, rows, cotangent)
    np.testing.assert_allclose(grad, expected, rtol=1e-6)


def test_terms_too_large_for_the_type_mark_their_position_outside_even_where_they_cancel():
    # docs/language.md: each term must fit its share of the type; the sum is not formed.
    table = _table(5, False)
    p = np.array([0, 65536, 0], np.int32)
    with jax.enable_x64(False):
        k = td.kernel("E[b,d] := A[65536*p[b] - 65536*q[b] + b, d]")
        with pytest.raises(RangeError, match=r"points to 1 on axis 0 of 'A' \(at b=1\), from "):
            k(table, p, p)
        got = np.asarray(jax.jit(k)(table, p, p))
    assert np.isnan(got[1]).all()
    np.testing.assert_array_equal(got[[0, 2]], table[[0, 2]])


def test_an_affine_part_too_large_for_int32_positions_is_refused_without_x64() -> None:
    # Before: a raw OverflowError from JAX ("Python int 4294967296 too large").
    with jax.enable_x64(False):
        k = td.kernel("E[b,d] := A[tok[b] + 4294967296, d]")
        with pytest.raises(UnsupportedError, match="reaches 4294967296 in magnitude"):
            k(_table(5, False), np.array([0, 1, 2], np.int32))


@pytest.mark.parametrize("value", [2**32 + 1, -(2**31) - 1, 2**40])
def test_an_int64_index_array_jax_would_truncate_is_refused(value) -> None:
    table = np.random.default_rng(8).normal(size=(5, 3)).astype(np.float32)
    tok = np.array([0, value, 2], np.int64)
    with jax.enable_x64(False):
        k = td.kernel("E[b,d] := A[tok[b], d]")
        with pytest.raises(InputError, match=rf"input 'tok' holds {value}, beyond int32"):
            k(table, tok)
        # values that fit are read as they are
        np.testing.assert_array_equal(np.asarray(k(table, tok * 0 + 3)), table[[3, 3, 3]])
