"""Edge tiles of shifted gradients without per-lane tests (`codegen.c.tiles.padding`): the shifted
operand read from a zero-padded copy, the lane constraints a mask row ANDed into each lane's
value. Values against float64 numpy at odd extents, outputs poisoned; a lane outside its
operand adds exactly zero even where the weight it multiplies is infinite or NaN."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import tensordsl as td
from tensordsl.explain.nests import generated_sources

CONV1D = "Y[o,i] := X[c,i+k] * W[o,c,k]"
CONV2D = "Y[o,y,x] := X[c,y+p,x+q] * W[o,c,p,q]"
DILATED = "Y[i] := X[i+2*k] * W[k]"


def _conv1d_vjp(X, W, dY, dilation=1):
    """Gradients of `sum(Y * dY)`, `Y[o, i] = sum X[c, i + dilation k] W[o, c, k]`, float64,
    each `(k)` adding only where it is read (so an infinite weight stays where it is)."""
    dX, dW = np.zeros_like(X), np.zeros_like(W)
    n = dY.shape[-1]
    for k in range(W.shape[-1]):
        at = slice(dilation * k, dilation * k + n)
        dX[:, at] += np.einsum("oi,oc->ci", dY, W[:, :, k])
        dW[:, :, k] = np.einsum("oi,ci->oc", dY, X[:, at])
    return dX, dW


def _conv2d_vjp(X, W, dY):
    dX, dW = np.zeros_like(X), np.zeros_like(W)
    _, h, w = dY.shape
    for p in range(W.shape[2]):
        for q in range(W.shape[3]):
            dX[:, p : p + h, q : q + w] += np.einsum("oyx,oc->cyx", dY, W[:, :, p, q])
            dW[:, :, p, q] = np.einsum("oyx,cyx->oc", dY, X[:, p : p + h, q : q + w])
    return dX, dW


def test_the_input_gradient_masks_its_edge_lanes():
    text = generated_sources(td.kernel(CONV2D).nest, "c")["grad_X"]
    assert "tdsl_lane_maskf(" in text and "malloc(" in text and "free(" in text
    lines = text.splitlines()
    masked = [n for n, line in enumerate(lines) if "= tdsl_lane_maskf(" in line]
    # per tile width (32 and 8 lanes): full tiles whose rows are inside, then the edge
    # paths of full and partial tiles
    assert len(masked) == 6
    tested = ["(-v_p + v_s >= 0)" in "\n".join(lines[n - 4 : n]) for n in masked]
    assert tested == [False, True, True, False, True, True]
    for n in masked:  # no column's test around the lanes
        assert "v_t >= 0" not in "\n".join(lines[n - 4 : n])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("height", "width"), [(20, 34), (15, 32), (9, 7), (26, 41)])
def test_tiles_with_rows_inside_test_only_their_lanes(height, width, dtype, monkeypatch):
    """conv2d's input gradient: a full tile whose rows are all inside the rows of dY runs no
    row test, only its lane masks (every tile crosses a column edge where the output is at
    most a tile wider than the interior); values and a NaN and an infinite weight as in
    `test_masked_lanes_add_zero_next_to_infinite_and_nan_weights`, outputs poisoned."""
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(height * width)
    X = rng.normal(size=(3, height + 2, width + 2)).astype(dtype)
    W = rng.normal(size=(4, 3, 3, 3)).astype(dtype)
    dY = rng.normal(size=(4, height, width)).astype(dtype)
    kernel = td.kernel(CONV2D, backend="c")
    dX, dW = jax.vjp(kernel, X, W)[1](dY)
    want = _conv2d_vjp(*(a.astype(np.float64) for a in (X, W, dY)))
    tol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(dX, want[0], rtol=tol, atol=tol)
    np.testing.assert_allclose(dW, want[1], rtol=tol, atol=tol)
    W[1, 0, 0, 0], W[0, 0, 2, 2] = np.nan, np.inf
    dX, _ = jax.vjp(kernel, X, W)[1](dY)
    want, _ = _conv2d_vjp(*(a.astype(np.float64) for a in (X, W, dY)))
    assert np.isfinite(want[0, :2, width:]).all() and np.isfinite(want[0, height:, :2]).all()
    np.testing.assert_allclose(dX, want, rtol=tol, atol=tol, equal_nan=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("width", [1, 5, 30, 32, 37])
def test_conv1d_gradients(width, dtype, monkeypatch):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(width)
    X = rng.normal(size=(3, width + 4)).astype(dtype)
    W = rng.normal(size=(4, 3, 5)).astype(dtype)
    dY = rng.normal(size=(4, width)).astype(dtype)
    dX, dW = jax.vjp(td.kernel(CONV1D, backend="c"), X, W)[1](dY)
    want = _conv1d_vjp(*(a.astype(np.float64) for a in (X, W, dY)))
    tol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(dX, want[0], rtol=tol, atol=tol)
    np.testing.assert_allclose(dW, want[1], rtol=tol, atol=tol)


@pytest.mark.parametrize("width", [3, 31, 34])
def test_dilated_shift(width, monkeypatch):
    """`X[i + 2k]`: the shift's coefficient of k is 2, the lanes' still 1."""
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(width + 100)
    X, W, dY = rng.normal(size=(width + 6,)), rng.normal(size=(4,)), rng.normal(size=(width,))
    dX, dW = jax.vjp(td.kernel(DILATED, backend="c"), X, W)[1](dY)
    want = _conv1d_vjp(X[None], W[None, None], dY[None], dilation=2)
    np.testing.assert_allclose(dX, want[0][0], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dW, want[1][0, 0], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("width", [7, 32])
def test_masked_lanes_add_zero_next_to_infinite_and_nan_weights(width, monkeypatch):
    """dX's edge elements that never read W[1, 0, 0, 0] (NaN) or W[0, 0, 2, 2] (inf) stay
    finite: a zero-padded read times the weight would be NaN there."""
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(width)
    X = rng.normal(size=(2, 9, width + 2)).astype(np.float32)
    W = rng.normal(size=(3, 2, 3, 3)).astype(np.float32)
    W[1, 0, 0, 0], W[0, 0, 2, 2] = np.nan, np.inf
    dY = rng.normal(size=(3, 7, width)).astype(np.float32)
    dX, _ = jax.vjp(td.kernel(CONV2D, backend="c"), X, W)[1](dY)
    want, _ = _conv2d_vjp(X.astype(np.float64), W.astype(np.float64), dY.astype(np.float64))
    corners = want[0, :2, width:], want[0, 7:, :2]  # read neither weight
    assert all(np.isfinite(c).all() for c in corners)
    np.testing.assert_allclose(dX, want, rtol=1e-4, atol=1e-4, equal_nan=True)


@pytest.mark.parametrize("width", [33, 38, 40, 41])
def test_a_short_remainder_runs_one_narrow_tile(width, monkeypatch):
    """conv2d's output `width` wide (32-wide tiles, then one 8-wide tile where at most 8
    columns are left, `_wide_and_narrow`), forward and gradients, outputs poisoned."""
    text = generated_sources(td.kernel(CONV2D).nest, "c")["forward"]
    assert "const int64_t vs_ = " in text and "sk_ = tdsl_imax(sk_, vs_ - o_x);" in text
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(width)
    X, W = rng.normal(size=(2, 8, width + 2)), rng.normal(size=(3, 2, 3, 3))
    dY = rng.normal(size=(3, 6, width))
    Y, vjp = jax.vjp(td.kernel(CONV2D, backend="c"), X, W)
    dX, dW = vjp(dY)
    want = _conv2d_vjp(X, W, dY)
    forward = sum(
        np.einsum("cyx,oc->oyx", X[:, p : p + 6, q : q + width], W[:, :, p, q])
        for p in range(3)
        for q in range(3)
    )
    np.testing.assert_allclose(Y, forward, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dX, want[0], rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dW, want[1], rtol=1e-10, atol=1e-10)
