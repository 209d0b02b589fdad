"""Tiles that do not fall off: a window-offset vector axis shorter than the tile keeps vector
lanes over it (a tile one vector wide, `codegen.c.schedule`), and the last tile of each part
of an axis moves back to end where the part ends (`tdsl_tile` in `codegen.c.tiles`), a
whole tile that stores only the rows and lanes the tile before it did not. Values against
float64 numpy for every extent around the tile sizes, outputs poisoned."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import tensordsl as td
from codegen.c.emit import emit_c
from codegen.c.schedule import choose_cpu_schedule
from codegen.ir.nest import default_dtypes
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.optimised
CONV2D = "Y[o,y,x] := X[c,y+p,x+q] * W[o,c,p,q]"


def _conv(X, W):
    """`Y[o, y, x] = sum X[c, y + p, x + q] * W[o, c, p, q]`, float64."""
    _, H, Wd = X.shape
    O, _, K, L = W.shape
    Y = np.zeros((O, H - K + 1, Wd - L + 1))
    for p in range(K):
        for q in range(L):
            Y += np.einsum(
                "cyx,oc->oyx", X[:, p : p + H - K + 1, q : q + Wd - L + 1], W[:, :, p, q]
            )
    return Y


def _conv_vjp(X, W, dY):
    """The gradients of `sum(_conv(X, W) * dY)` with respect to X and W, float64."""
    dX, dW = np.zeros_like(X), np.zeros_like(W)
    _, H, Wd = X.shape
    _, _, K, L = W.shape
    h, w = H - K + 1, Wd - L + 1
    for p in range(K):
        for q in range(L):
            dX[:, p : p + h, q : q + w] += np.einsum("oyx,oc->cyx", dY, W[:, :, p, q])
            dW[:, :, p, q] = np.einsum("oyx,cyx->oc", dY, X[:, p : p + h, q : q + w])
    return dX, dW


def test_a_window_offset_axis_gets_a_one_vector_tile_before_dot_products():
    schedule = choose_cpu_schedule(lower(parse(CONV2D)).nest, {}, kernel=True)
    assert (schedule.strategy, schedule.width) == ("tile", 32)
    narrow = schedule.small
    assert (narrow.strategy, narrow.vector, narrow.width) == ("tile", "x", 8)
    assert narrow.small.strategy == "dot"
    nest = lower(parse(CONV2D)).nest
    text = emit_c(nest, dtypes=default_dtypes(nest), schedule=schedule).text
    assert "if (w_ >= sk_ && r_ >= skr_)" in text  # a moved tile stores its new lanes only


@pytest.mark.parametrize("width", [1, 3, 7, 8, 9, 14, 30, 32, 33, 41])
def test_conv2d_and_its_gradients_at_every_width(width, monkeypatch):
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(width)
    height = 7 + width % 5  # rows: whole tiles of 6, moved ones and partial ones
    X = rng.normal(size=(3, height + 2, width + 2))
    W = rng.normal(size=(4, 3, 3, 3))
    dY = rng.normal(size=(4, height, width))
    k = td.kernel(CONV2D, backend="c")
    np.testing.assert_allclose(k(X, W), _conv(X, W), rtol=1e-10, atol=1e-10)
    dX, dW = jax.vjp(k, X, W)[1](dY)
    want_dX, want_dW = _conv_vjp(X, W, dY)
    np.testing.assert_allclose(dX, want_dX, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(dW, want_dW, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("shape", [(6, 32), (7, 33), (13, 70), (5, 8), (12, 9)])
def test_elementwise_and_matmul_tiles_at_odd_extents(shape, monkeypatch):
    """Moved tiles of a plain tile schedule (no window): an elementwise nest and a kernel
    matmul (a loop order asks for the generated kernel)."""
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(sum(shape))
    A, B = rng.normal(size=shape), rng.normal(size=(shape[1], shape[0] + 3))
    scale = td.kernel("Y[i,j] := tanh(A[i,j]) * 2", backend="c", loop_order=("i", "j"))
    np.testing.assert_allclose(scale(A), np.tanh(A) * 2, rtol=1e-12)
    matmul = td.kernel("C[i,j] := A[i,k] * B[k,j]", backend="c", loop_order=("i", "j", "k"))
    np.testing.assert_allclose(matmul(A, B), A @ B, rtol=1e-10, atol=1e-10)


def test_an_elementwise_tile_stores_untested_where_it_skips_nothing():
    # A masked store per vector in the inner loop had cost softmax's P 0.17 against 0.12 ms:
    # the constant path takes whole tiles that skip nothing, a moved tile the general path.
    nest = lower(parse("Y[i,j] := exp(A[i,j] - m[i]) / z[i]")).nest
    schedule = choose_cpu_schedule(nest, {}, kernel=True)
    assert (schedule.strategy, schedule.rows, schedule.width) == ("tile", 6, 32)
    text = emit_c(nest, dtypes=default_dtypes(nest), schedule=schedule).text
    assert "if (rn_ == 6 && skr_ == 0 && wn_ == 32 && sk_ == 0) {" in text
    assert text.count("if (w_ >= sk_ && r_ >= skr_)") == 1  # in the general path only


@pytest.mark.parametrize("width,window", [(29, 3), (30, 3), (31, 3), (32, 3), (33, 3), (30, 5)])
def test_float32_input_gradient_whose_interior_is_shorter_than_a_tile(width, window, monkeypatch):
    """dX's columns (`width + window - 1` of them, 32 float lanes a tile) have an interior
    shorter than a tile: whole tiles over the extent, tested per lane where they cross an
    edge (`codegen.c.tiles.tiles.tiled`), the tested lanes adding zero (`selected_fold_lines`)."""
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    rng = np.random.default_rng(width * window)
    height = 8 + width % 3
    X = rng.normal(size=(5, height + window - 1, width + window - 1)).astype(np.float32)
    W = rng.normal(size=(4, 5, window, window)).astype(np.float32)
    dY = rng.normal(size=(4, height, width)).astype(np.float32)
    k = td.kernel(CONV2D, backend="c")
    dX, dW = jax.vjp(k, X, W)[1](dY)
    want_dX, want_dW = _conv_vjp(X.astype(np.float64), W.astype(np.float64), dY)
    np.testing.assert_allclose(dX, want_dX, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dW, want_dW, rtol=1e-4, atol=1e-4)
