"""The C back end's row scatter (codegen/c/scatter.py), called directly: every table row the
sum of the rows read from it, added in the order of their positions, so its bits are those of
a serial `np.add.at` in the table's dtype; positions outside the table add nothing; every
output element written (the output poisoned with NaN first)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from codegen.c import ffi
from codegen.c.scatter import VALUES, build_scatter, scatter_source
from tests.backends import NEEDS_C_COMPILER

pytestmark = [
    NEEDS_C_COMPILER,
    pytest.mark.skipif(ffi.include_dir() is None, reason="no XLA FFI headers (jaxlib)"),
]


def _scatter(rows: np.ndarray, positions: np.ndarray, size: int) -> np.ndarray:
    compiled = build_scatter(rows.dtype.name, positions.dtype.name)
    assert compiled is not None
    out = np.full((size, rows.shape[1]), np.nan, rows.dtype)  # poisoned
    operands = (ctypes.c_void_p * 2)(rows.ctypes.data, positions.ctypes.data)
    params = np.array([len(positions), size, rows.shape[1]], np.int64)
    compiled.function(out.ctypes.data, operands, params.ctypes.data)
    return out


def _case(seed: int, dtype: str, index: str, count: int = 400, size: int = 37, width: int = 11):
    """Random rows; positions out of order, each row of the table read many times (some
    never), and a few outside the table (-1 as a gather marks them, and beyond the end)."""
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(count, width)).astype(dtype)
    positions = rng.integers(0, size - 3, size=count)
    positions[::17] = -1
    if count > 6:
        positions[5], positions[6] = size, size + 9
    return rows, positions.astype(index), size


@pytest.mark.parametrize("index", ["int32", "int64"])
@pytest.mark.parametrize("dtype", VALUES)
def test_bits_of_a_serial_add_at_and_close_to_float64(dtype, index):
    rows, positions, size = _case(0, dtype, index)
    got = _scatter(rows, positions, size)
    inside = (positions >= 0) & (positions < size)
    serial = np.zeros((size, rows.shape[1]), dtype)
    np.add.at(serial, positions[inside], rows[inside])  # in index order, in `dtype`
    assert got.tobytes() == serial.tobytes()
    exact = np.zeros((size, rows.shape[1]))
    np.add.at(exact, positions[inside], rows[inside].astype(np.float64))
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5)
    unread = np.setdiff1d(np.arange(size), positions)
    assert unread.size and (got[unread] == 0).all() and not np.signbit(got[unread]).any()


def test_the_same_bits_on_every_call_and_in_index_order():
    """Sums that rounding makes order-dependent: the same bits on every call, and those of
    the additions in index order (not, say, sorted by magnitude)."""
    rng = np.random.default_rng(1)
    rows = (rng.normal(size=(3000, 8)) * 10.0 ** rng.integers(-6, 7, size=(3000, 1))).astype(
        np.float32
    )
    positions = rng.integers(0, 4, size=3000).astype(np.int32)
    first = _scatter(rows, positions, 4)
    for _ in range(3):
        assert _scatter(rows, positions, 4).tobytes() == first.tobytes()
    serial = np.zeros((4, 8), np.float32)
    np.add.at(serial, positions, rows)
    assert first.tobytes() == serial.tobytes()
    reordered = np.zeros((4, 8), np.float32)
    order = np.argsort(np.abs(rows[:, 0]))
    np.add.at(reordered, positions[order], rows[order])
    assert reordered.tobytes() != serial.tobytes()  # the order shows in the bits


@pytest.mark.parametrize("count", [0, 1])
def test_no_rows_or_one(count):
    rows, positions, size = _case(2, "float32", "int32", count=count, size=5, width=3)
    positions[:] = 4  # the last row
    want = np.zeros((5, 3), np.float32)
    want[4] = rows.sum(0)
    assert _scatter(rows, positions, size).tobytes() == want.tobytes()


def test_other_dtypes_have_no_kernel():
    assert build_scatter("float16", "int32") is None
    assert build_scatter("float32", "int16") is None
    assert scatter_source("float64", "int64").entry == "tdsl_scatter_rows_float64_int64"
