"""The C back end's row kernels (codegen/c/gathers.py), called directly. The scatter: every
table row the sum of the rows read from it, added in the order of their positions, so its
bits are those of a serial `np.add.at` in the table's dtype; positions outside the table add
nothing. The gather: `table[positions]`, NaN or 0 outside. Every output element written (the
output poisoned first)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

from codegen.c.gathers import VALUES, build_rows, gather_source, scatter_source
from codegen.c.run import ffi
from tests.backends import NEEDS_C_COMPILER

pytestmark = [
    NEEDS_C_COMPILER,
    pytest.mark.skipif(ffi.include_dir() is None, reason="no XLA FFI headers (jaxlib)"),
]


def _call(kind: str, values: np.ndarray, positions: np.ndarray, shape, params) -> np.ndarray:
    compiled = build_rows(kind, values.dtype.name, positions.dtype.name)
    assert compiled is not None
    out = np.full(shape, 7.5, values.dtype)  # poisoned: no value either kernel writes here
    operands = (ctypes.c_void_p * 2)(values.ctypes.data, positions.ctypes.data)
    params = np.array(params, np.int64)
    compiled.function(out.ctypes.data, operands, params.ctypes.data)
    return out


def _scatter(rows: np.ndarray, positions: np.ndarray, size: int) -> np.ndarray:
    width = rows.shape[1]
    return _call("scatter", rows, positions, (size, width), (len(positions), size, width))


def _gather(table: np.ndarray, positions: np.ndarray, fill: bool) -> np.ndarray:
    (size, width), count = table.shape, len(positions)
    return _call("gather", table, positions, (count, width), (count, size, width, int(fill)))


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


@pytest.mark.parametrize("fill", [True, False])
@pytest.mark.parametrize("index", ["int32", "int64"])
@pytest.mark.parametrize("dtype", VALUES)
def test_the_gather_reads_rows_and_nan_or_zero_outside(dtype, index, fill):
    rows, positions, size = _case(3, dtype, index)
    table = rows[:size]
    got = _gather(table, positions, fill)
    inside = (positions >= 0) & (positions < size)
    assert got[inside].tobytes() == table[positions[inside]].tobytes()
    outside = got[~inside]
    assert outside.size and (np.isnan(outside).all() if fill else (outside == 0).all())


def test_other_dtypes_have_no_kernel():
    for kind in ("gather", "scatter"):
        assert build_rows(kind, "float16", "int32") is None
        assert build_rows(kind, "float32", "int16") is None
    assert scatter_source("float64", "int64").entry == "tdsl_scatter_rows_float64_int64"
    assert gather_source("float32", "int32").entry == "tdsl_gather_rows_float32_int32"
