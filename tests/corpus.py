"""The shared corpus of index expressions, each with a hand-written float64 numpy reference.

Every back end, schedule and gradient test runs over ``CORPUS``. A case holds the source, its
inputs (in order of first appearance in the body, which is ``k.inputs`` order), how to sample
them, and an independent numpy computation of the expected output. The reduction of a kernel
applies to the *whole* body: ``R[i,j] := exp(-gamma*(X[i,d]-Y[j,d])^2)`` is
``sum_d exp(...)``, not ``exp(sum_d ...)``; but a sum adds a top-level term that reads none
of the summed indices once, outside the sum (``X[b,i] * W[i,o] + c[o]`` is ``X @ W + c``).

Range conventions (0-based, Tullio's rule) are spelled out in the comment next to each case
whose output does not start at index value 0 or whose extent is not read off one axis.

This module imports numpy, math and dataclasses only; it never imports tensordsl.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

__all__ = ["Arg", "Case", "CORPUS", "CORPUS_BY_NAME", "make_inputs"]


@dataclass(frozen=True)
class Arg:
    """How to sample one input: its shape and a uniform domain (``()`` is a Python float)."""

    shape: tuple[int, ...]
    low: float = -2.0
    high: float = 2.0
    integer: bool = False


@dataclass(frozen=True)
class Case:
    """One corpus expression and its float64 reference, called with keyword arguments."""

    name: str
    source: str
    args: dict[str, Arg]
    expected: Callable[..., np.ndarray] = field(compare=False)
    reduce: str = "sum"
    ranges: dict | None = None
    differentiable: bool = True
    ties: bool = False


def _f64(function: Callable[..., object]) -> Callable[..., np.ndarray]:
    """Wrap a reference so that it always returns a float64 ndarray (0-d for scalars)."""

    def expected(**inputs: object) -> np.ndarray:
        return np.asarray(function(**inputs), dtype=np.float64)

    expected.__name__ = getattr(function, "__name__", "expected")
    return expected


def _case(name: str, source: str, args: dict[str, Arg], expected, **options) -> Case:
    return Case(name, source, args, _f64(expected), **options)


# Scalar functions, written out by hand (never taken from tensordsl's table).
def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _softplus(x):
    return np.logaddexp(0.0, x)


def _erf(x):
    return np.vectorize(math.erf, otypes=[np.float64])(x)


def _logsumexp(x, axis=None):
    peak = np.max(x, axis=axis, keepdims=True)
    total = np.log(np.sum(np.exp(x - peak), axis=axis, keepdims=True)) + peak
    return np.squeeze(total, axis=axis) if axis is not None else total.reshape(())


def _windows(x, starts, offsets):
    """Gather ``x[starts[p] + offsets[q]]`` into a (len(starts), len(offsets)) array."""
    return x[np.asarray(starts)[:, None] + np.asarray(offsets)[None, :]]


def _conv1d_channels(X, W):
    O, C, K = W.shape
    width = X.shape[1] - K + 1
    windows = np.stack([X[:, i : i + K] for i in range(width)], axis=1)  # (C, width, K)
    return np.einsum("cik,ock->oi", windows, W)


def _conv2d_channels(I, K):
    O, C, KH, KW = K.shape
    height, width = I.shape[1] - KH + 1, I.shape[2] - KW + 1
    Y = np.zeros((O, height, width))
    for dy in range(KH):
        for dx in range(KW):
            patch = I[:, dy : dy + height, dx : dx + width]  # (C, height, width)
            Y += np.einsum("cyx,oc->oyx", patch, K[:, :, dy, dx])
    return Y


def _laplace_2d(X):
    core = X[1:-1, 1:-1]
    return X[:-2, 1:-1] + X[2:, 1:-1] + X[1:-1, :-2] + X[1:-1, 2:] - 4.0 * core


_CASES: list[Case] = [
    # ---- contractions --------------------------------------------------------------------
    _case(
        "matmul",
        "C[i,j] := A[i,k] * B[k,j]",
        {"A": Arg((3, 5)), "B": Arg((5, 4))},
        lambda A, B: A @ B,
    ),
    _case(
        "matmul_inner_one",
        "C[i,j] := A[i,k] * B[k,j]",
        {"A": Arg((3, 1)), "B": Arg((1, 4))},
        lambda A, B: np.outer(A[:, 0], B[0, :]),
    ),
    _case(
        "matmul_at_b",
        "C[i,j] := A[k,i] * B[k,j]",
        {"A": Arg((5, 3)), "B": Arg((5, 4))},
        lambda A, B: A.T @ B,
    ),
    _case(
        "matmul_a_bt",
        "C[i,j] := A[i,k] * B[j,k]",
        {"A": Arg((3, 5)), "B": Arg((4, 5))},
        lambda A, B: A @ B.T,
    ),
    _case(
        "matmul_self",
        "C[i,j] := A[i,k] * A[k,j]",
        {"A": Arg((4, 4))},
        lambda A: A @ A,
    ),
    _case(
        "batched_matmul",
        "C[b,i,j] := A[b,i,k] * B[b,k,j]",
        {"A": Arg((2, 3, 5)), "B": Arg((2, 5, 4))},
        lambda A, B: np.einsum("bik,bkj->bij", A, B),
    ),
    _case(
        "batched_matmul_batch_one",
        "C[b,i,j] := A[b,i,k] * B[b,k,j]",
        {"A": Arg((1, 7, 2)), "B": Arg((1, 2, 5))},
        lambda A, B: A[0][None] @ B[0][None],
    ),
    _case(
        "matvec",
        "y[i] := A[i,j] * x[j]",
        {"A": Arg((3, 7)), "x": Arg((7,))},
        lambda A, x: A @ x,
    ),
    _case(
        "outer_product",
        "O[i,j] := a[i] * b[j]",
        {"a": Arg((3,)), "b": Arg((4,))},
        lambda a, b: a[:, None] * b[None, :],
    ),
    _case(
        "attention_scores",
        "S[h,i,j] := Q[h,i,d] * K[h,j,d]",
        {"Q": Arg((2, 3, 5)), "K": Arg((2, 4, 5))},
        lambda Q, K: np.einsum("hid,hjd->hij", Q, K),
    ),
    _case(
        "attention_weighted_sum",
        "O[h,i,d] := P[h,i,j] * V[h,j,d]",
        {"P": Arg((2, 3, 4), 0.0, 1.0), "V": Arg((2, 4, 5))},
        lambda P, V: np.einsum("hij,hjd->hid", P, V),
    ),
    # ---- repeated indices, permutations -------------------------------------------------
    _case("trace", "t := A[i,i]", {"A": Arg((5, 5))}, lambda A: np.trace(A)),
    _case("diagonal", "D[i] := A[i,i]", {"A": Arg((5, 5))}, lambda A: np.diag(A).copy()),
    _case(
        "partial_trace",
        "P[i] := A[i,j,j]",
        {"A": Arg((3, 4, 4))},
        lambda A: np.einsum("ijj->i", A),
    ),
    _case("transpose", "T[j,i] := A[i,j]", {"A": Arg((3, 5))}, lambda A: A.T.copy()),
    _case(
        "permute_3d",
        "P[k,i,j] := A[i,j,k]",
        {"A": Arg((2, 3, 4))},
        lambda A: np.transpose(A, (2, 0, 1)).copy(),
    ),
    # ---- plain and full reductions ------------------------------------------------------
    _case("row_sum", "Y[i] := X[i,j]", {"X": Arg((4, 7))}, lambda X: X.sum(axis=1)),
    _case(
        "full_inner_product",
        "s := X[i,j] * Y[i,j]",
        {"X": Arg((3, 5)), "Y": Arg((3, 5))},
        lambda X, Y: np.sum(X * Y),
    ),
    _case("sum_of_squares", "s := X[i,j]**2", {"X": Arg((4, 3))}, lambda X: np.sum(X * X)),
    _case(
        "scalar_times_full_sum",
        "s := alpha * X[i]",
        {"alpha": Arg(()), "X": Arg((7,))},
        lambda alpha, X: alpha * np.sum(X),
    ),
    _case(
        "scalar_affine",
        "Y[i] := alpha*X[i] + beta",
        {"alpha": Arg(()), "X": Arg((5,)), "beta": Arg(())},
        lambda alpha, X, beta: alpha * X + beta,
    ),
    _case(
        "layernorm_mean",
        "M[b] := X[b,f] / F",
        {"X": Arg((3, 7)), "F": Arg((), 2.0, 6.0)},
        lambda X, F: X.sum(axis=1) / F,
    ),
    _case(
        "layernorm_variance",
        "V[b] := (X[b,f] - M[b])^2 / F",
        {"X": Arg((3, 7)), "M": Arg((3,)), "F": Arg((), 2.0, 6.0)},
        lambda X, M, F: ((X - M[:, None]) ** 2).sum(axis=1) / F,
    ),
    _case(
        "division_by_vector",
        "Y[i] := A[i,j] / B[j]",
        {"A": Arg((3, 5)), "B": Arg((5,), 0.5, 2.0)},
        lambda A, B: (A / B[None, :]).sum(axis=1),
    ),
    _case(
        "polynomial_elementwise",
        "Y[i] := X[i]*(1 + X[i]*(0.5 + X[i]/6))",
        {"X": Arg((7,))},
        lambda X: X * (1.0 + X * (0.5 + X / 6.0)),
    ),
    # ---- max / min / logsumexp / prod ---------------------------------------------------
    _case("row_max", "M[i] := X[i,j]", {"X": Arg((4, 7))}, lambda X: X.max(axis=1), reduce="max"),
    _case("row_min", "M[i] := X[i,j]", {"X": Arg((4, 7))}, lambda X: X.min(axis=1), reduce="min"),
    _case("col_max", "M[j] := X[i,j]", {"X": Arg((5, 3))}, lambda X: X.max(axis=0), reduce="max"),
    _case(
        "row_max_ties",
        "M[i] := X[i,j]",
        {"X": Arg((4, 7))},
        lambda X: X.max(axis=1),
        reduce="max",
        ties=True,
    ),
    _case(
        "full_min_ties",
        "s := X[i,j]",
        {"X": Arg((3, 7))},
        lambda X: X.min(),
        reduce="min",
        ties=True,
    ),
    _case(
        "max_of_products",
        "M[i] := A[i,k] * B[k]",
        {"A": Arg((3, 5)), "B": Arg((5,))},
        lambda A, B: (A * B[None, :]).max(axis=1),
        reduce="max",
    ),
    _case(
        "logsumexp_rows",
        "L[i] := X[i,j]",
        {"X": Arg((4, 7))},
        lambda X: np.log(np.exp(X).sum(axis=1)),
        reduce="logsumexp",
    ),
    _case(
        "logsumexp_full",
        "s := X[i,j]",
        {"X": Arg((3, 5))},
        lambda X: _logsumexp(X),
        reduce="logsumexp",
    ),
    _case(
        "logsumexp_affine",
        "L[i] := A[i,k] + B[k]",
        {"A": Arg((3, 5)), "B": Arg((5,))},
        lambda A, B: _logsumexp(A + B[None, :], axis=1),
        reduce="logsumexp",
    ),
    _case(
        "softmax_denominator",
        "Z[i] := exp(X[i,j] - M[i])",
        {"X": Arg((4, 7)), "M": Arg((4,))},
        lambda X, M: np.exp(X - M[:, None]).sum(axis=1),
    ),
    _case(
        "prod_rows",
        "P[i] := X[i,j]",
        {"X": Arg((3, 5), 0.5, 1.5)},
        lambda X: X.prod(axis=1),
        reduce="prod",
    ),
    # make_inputs puts exact zeros in X: one in column 1, two in column 2.
    _case(
        "prod_with_zero",
        "P[j] := X[i,j]",
        {"X": Arg((4, 3), 0.5, 1.5)},
        lambda X: X.prod(axis=0),
        reduce="prod",
    ),
    _case(
        "prod_affine_body",
        "P[i] := 1 + 0.1*X[i,j]",
        {"X": Arg((4, 5))},
        lambda X: (1.0 + 0.1 * X).prod(axis=1),
        reduce="prod",
    ),
    # ---- distances and kernels ----------------------------------------------------------
    _case(
        "pairwise_sq_dist",
        "D[i,j] := (W[k,i]-X[k,j])^2",
        {"W": Arg((5, 3)), "X": Arg((5, 4))},
        lambda W, X: ((W[:, :, None] - X[:, None, :]) ** 2).sum(axis=0),
    ),
    # The reduction covers the whole body: sum over d of exp(...), not exp of a sum.
    _case(
        "rbf_kernel",
        "R[i,j] := exp(-gamma*(X[i,d]-Y[j,d])^2)",
        {"gamma": Arg((), 0.1, 1.0), "X": Arg((3, 5)), "Y": Arg((4, 5))},
        lambda gamma, X, Y: np.exp(-gamma * (X[:, None, :] - Y[None, :, :]) ** 2).sum(axis=2),
    ),
    _case(
        "l1_distance",
        "s := abs(X[i] - Y[i])",
        {"X": Arg((7,)), "Y": Arg((7,))},
        lambda X, Y: np.abs(X - Y).sum(),
    ),
    # ---- convolutions, strides, stencils ------------------------------------------------
    # i in 0..N-K: output length N-K+1 = 7.
    _case(
        "conv1d_valid",
        "Y[i] := X[i+k] * W[k]",
        {"X": Arg((9,)), "W": Arg((3,))},
        lambda X, W: np.correlate(X, W, mode="valid"),
    ),
    _case(
        "conv1d_channels",
        "Y[o,i] := X[c,i+k] * W[o,c,k]",
        {"X": Arg((2, 9)), "W": Arg((4, 2, 3))},
        _conv1d_channels,
    ),
    _case(
        "conv2d_channels",
        "Y[o,y,x] := I[c,y+dy,x+dx] * K[o,c,dy,dx]",
        {"I": Arg((2, 7, 8)), "K": Arg((3, 2, 3, 2))},
        _conv2d_channels,
    ),
    # Tullio's boundary forms. pad(i+k-1, 1): i+k-1 in [-1, 9], so i in 0..8 (same size),
    # reading zero past each end.
    _case(
        "conv1d_same_pad",
        "Y[i] := X[pad(i+k-1, 1)] * W[k]",
        {"X": Arg((9,)), "W": Arg((3,))},
        lambda X, W: np.correlate(np.pad(X, 1), W, mode="valid"),
    ),
    # mod constrains nothing: i takes its range from ranges=; a circular correlation.
    _case(
        "conv1d_circular_mod",
        "Y[i] := X[mod(i+k)] * W[k]",
        {"X": Arg((7,)), "W": Arg((3,))},
        lambda X, W: np.array([sum(X[(i + k) % 7] * W[k] for k in range(3)) for i in range(7)]),
        ranges={"i": 7},
    ),
    # clamp(i-2) repeats X[0] for i < 2: each edge element gathers several positions.
    _case(
        "clamped_shift",
        "Y[i] := X[clamp(i-2)] * X[i]",
        {"X": Arg((8,))},
        lambda X: X[np.clip(np.arange(8) - 2, 0, 7)] * X,
    ),
    # i + 2k <= 8 for k <= 2: i in 0..4.
    _case(
        "conv1d_dilated",
        "Y[i] := X[i+2k] * W[k]",
        {"X": Arg((9,)), "W": Arg((3,))},
        lambda X, W: _windows(X, np.arange(5), 2 * np.arange(3)) @ W,
    ),
    # 2i + k <= 8 for k <= 2: i in 0..3.
    _case(
        "conv1d_strided",
        "Y[i] := X[2*i+k] * W[k]",
        {"X": Arg((9,)), "W": Arg((3,))},
        lambda X, W: _windows(X, 2 * np.arange(4), np.arange(3)) @ W,
    ),
    # 0 <= i+2k-3 <= 8 for k in 0..2: i in 3..7, so output position p is i = p+3.
    _case(
        "conv1d_dilated_offset_weighted",
        "Y[i] := i * X[i+2*k-3] * W[k]",
        {"X": Arg((9,)), "W": Arg((3,))},
        lambda X, W: (np.arange(5) + 3) * (_windows(X, np.arange(5), 2 * np.arange(3)) @ W),
    ),
    # N = 9: i in 0..3 (X[8] is never read).
    _case(
        "downsample_stride2",
        "Y[i] := X[2i] + X[2i+1]",
        {"X": Arg((9,))},
        lambda X: X[:8].reshape(4, 2).sum(axis=1),
    ),
    # i in 1..N-2; output position p is i = p+1.
    _case(
        "stencil_1d",
        "Y[i] := X[i-1] - 2*X[i] + X[i+1]",
        {"X": Arg((8,))},
        lambda X: X[:-2] - 2.0 * X[1:-1] + X[2:],
    ),
    _case(
        "stencil_1d_index_weighted",
        "Y[i] := i * (X[i+1] - X[i-1])",
        {"X": Arg((7,))},
        lambda X: (np.arange(5) + 1) * (X[2:] - X[:-2]),
    ),
    _case(
        "stencil_2d",
        "Y[i,j] := X[i-1,j] + X[i+1,j] + X[i,j-1] + X[i,j+1] - 4*X[i,j]",
        {"X": Arg((6, 7))},
        _laplace_2d,
    ),
    # ---- negative coefficients and explicit ranges --------------------------------------
    # 0 <= -i+4 <= 4: i in 0..4, a reversal.
    _case("reverse_inferred", "Y[i] := X[-i+4]", {"X": Arg((5,))}, lambda X: X[::-1].copy()),
    # The inferred range would be -2..4; ranges= narrows it to 0..4.
    _case(
        "reverse_explicit",
        "Y[i] := X[-i+4]",
        {"X": Arg((7,))},
        lambda X: X[4::-1].copy(),
        ranges={"i": 5},
    ),
    _case(
        "ranges_narrow_k",
        "Y[i] := X[i,k]",
        {"X": Arg((4, 7))},
        lambda X: X[:, :3].sum(axis=1),
        ranges={"k": 3},
    ),
    # j in -1..1: output position q is j = q-1, and the value j shows it.
    _case(
        "ranges_negative_start",
        "Y[i,j] := X[i,j+1] * j",
        {"X": Arg((4, 3))},
        lambda X: X * np.array([-1.0, 0.0, 1.0])[None, :],
        ranges={"j": range(-1, 2)},
    ),
    # k in -1..1 (explicit), so 0 <= i+k+1 <= 6 gives i in 0..4.
    _case(
        "ranges_shifted_reduction",
        "Y[i] := X[i+k+1] * W[k+1]",
        {"X": Arg((7,)), "W": Arg((3,))},
        lambda X, W: np.correlate(X, W, mode="valid"),
        ranges={"k": range(-1, 2)},
    ),
    # k in 0..2 (explicit): i in 0..N-3.
    _case(
        "moving_sum",
        "Y[i] := X[i+k]",
        {"X": Arg((8,))},
        lambda X: _windows(X, np.arange(6), np.arange(3)).sum(axis=1),
        ranges={"k": 3},
    ),
    # k in 0..1 (explicit), 2i+1 <= 8: i in 0..3.
    _case(
        "max_pool_stride2",
        "Y[i] := X[2i+k]",
        {"X": Arg((9,))},
        lambda X: X[:8].reshape(4, 2).max(axis=1),
        reduce="max",
        ranges={"k": 2},
    ),
    # Per channel: the gradient solves k = p - 2t, which sympy's Piecewise once turned
    # round for ever in the tie rule's test (a segfault, the stack exhausted).
    _case(
        "max_pool_channels",
        "Y[c,t] := X[c, 2t+k]",
        {"X": Arg((3, 9))},
        lambda X: X[:, :8].reshape(3, 4, 2).max(axis=2),
        reduce="max",
        ranges={"k": 2},
    ),
    # ---- indices as values, comparisons, masks ------------------------------------------
    _case(
        "index_as_value",
        "Y[i] := i*X[i]",
        {"X": Arg((7,))},
        lambda X: np.arange(7) * X,
    ),
    _case(
        "masked_triangular_outer",
        "M[i,j] := A[i]*A[j]*(i <= j)",
        {"A": Arg((5,))},
        lambda A: np.triu(np.outer(A, A)),
    ),
    _case(
        "lower_triangular_matmul",
        "C[i,j] := A[i,k]*B[k,j]*(k <= i)",
        {"A": Arg((4, 5)), "B": Arg((5, 3))},
        lambda A, B: np.tril(A) @ B,
    ),
    # j appears only in the output and a comparison, so ranges= must give it.
    _case(
        "diag_embed",
        "D[i,j] := X[i]*(i == j)",
        {"X": Arg((5,))},
        lambda X: np.diag(X),
        ranges={"j": 5},
    ),
    _case(
        "cumulative_sum",
        "C[i] := X[j]*(j <= i)",
        {"X": Arg((6,))},
        lambda X: np.cumsum(X),
        ranges={"i": 6},
    ),
    _case(
        "offdiag_sum",
        "s := A[i,j]*(i != j)",
        {"A": Arg((4, 4))},
        lambda A: A.sum() - np.trace(A),
    ),
    _case(
        "relu_by_comparison",
        "Y[i] := X[i,j] * (X[i,j] > 0)",
        {"X": Arg((4, 5))},
        lambda X: (X * (X > 0)).sum(axis=1),
    ),
    _case(
        "compare_tensors",
        "Y[i] := X[i,j] * (X[i,j] < W[j])",
        {"X": Arg((4, 5)), "W": Arg((5,))},
        lambda X, W: (X * np.less(X, W[None, :])).sum(axis=1),
    ),
    _case(
        "where_index_mask",
        "Y[i,j] := where(i >= j, A[i,j], -A[j,i])",
        {"A": Arg((4, 4))},
        lambda A: np.where(np.arange(4)[:, None] >= np.arange(4)[None, :], A, -A.T),
    ),
    _case(
        "leaky_relu_where",
        "Y[i] := where(X[i,j] > 0, X[i,j], 0.1*X[i,j])",
        {"X": Arg((4, 5))},
        lambda X: np.where(X > 0, X, 0.1 * X).sum(axis=1),
    ),
    # ---- scalar functions ---------------------------------------------------------------
    _case(
        "log_sum",
        "s := log(X[i])",
        {"X": Arg((7,), 0.5, 3.0)},
        lambda X: np.log(X).sum(),
    ),
    _case(
        "log1p_rows",
        "Y[i] := log1p(X[i,j])",
        {"X": Arg((3, 5), -0.5, 2.0)},
        lambda X: np.log1p(X).sum(axis=1),
    ),
    _case(
        "expm1_weighted",
        "Y[i] := expm1(X[i,j]) * W[j]",
        {"X": Arg((3, 5), -0.5, 2.0), "W": Arg((5,))},
        lambda X, W: np.expm1(X) @ W,
    ),
    _case(
        "sqrt_weighted",
        "Y[i] := sqrt(X[i,j]) * W[j]",
        {"X": Arg((3, 5), 0.5, 3.0), "W": Arg((5,))},
        lambda X, W: np.sqrt(X) @ W,
    ),
    _case(
        "rsqrt_scale",
        "Y[b,f] := X[b,f] * rsqrt(V[b])",
        {"X": Arg((3, 7)), "V": Arg((3,), 0.5, 3.0)},
        lambda X, V: X / np.sqrt(V)[:, None],
    ),
    # sum_k tanh(A[i,k]*B[k,j]): tanh is inside the reduction.
    _case(
        "tanh_matmul",
        "H[i,j] := tanh(A[i,k]*B[k,j])",
        {"A": Arg((3, 5)), "B": Arg((5, 4))},
        lambda A, B: np.tanh(A[:, :, None] * B[None, :, :]).sum(axis=1),
    ),
    _case(
        "sigmoid_weighted",
        "Y[i] := sigmoid(X[i,j]) * W[j]",
        {"X": Arg((3, 5)), "W": Arg((5,))},
        lambda X, W: _sigmoid(X) @ W,
    ),
    _case(
        "softplus_sum",
        "s := softplus(X[i,j])",
        {"X": Arg((4, 3))},
        lambda X: _softplus(X).sum(),
    ),
    _case(
        "relu_mlp",
        "Y[i,j] := relu(X[i,k] + c[k]) * W[k,j]",
        {"X": Arg((3, 5)), "c": Arg((5,)), "W": Arg((5, 4))},
        lambda X, c, W: np.maximum(X + c[None, :], 0.0) @ W,
    ),
    # A sum adds a top-level term that reads no summed index once, outside the sum
    # (Einstein's convention): the bias is added once, not once per summed value.
    _case(
        "linear_bias",
        "Y[b,o] := X[b,i] * W[i,o] + c[o]",
        {"X": Arg((3, 8)), "W": Arg((8, 4)), "c": Arg((4,))},
        lambda X, W, c: X @ W + c[None, :],
    ),
    _case(
        "scores_bias",
        "S[i,j] := Q[i,d] * K[j,d] - B[i,j]",
        {"Q": Arg((4, 3)), "K": Arg((5, 3)), "B": Arg((4, 5))},
        lambda Q, K, B: Q @ K.T - B,
    ),
    _case(
        "sum_plus_constants",
        "s := X[i,j] - 2*a + 1",
        {"X": Arg((4, 3)), "a": Arg(())},
        lambda X, a: X.sum() - 2 * a + 1,
    ),
    # Terms that read a summed index are summed, whichever ones they read.
    _case(
        "summed_and_once_terms",
        "Y[i] := A[i,k] * x[k] + A[i,k] - (c[i] + 0.5)",
        {"A": Arg((3, 5)), "x": Arg((5,)), "c": Arg((3,))},
        lambda A, x, c: A @ x + A.sum(axis=1) - c - 0.5,
    ),
    _case(
        "sin_cos_matmul",
        "Y[i,j] := sin(X[i,k]) * cos(W[k,j])",
        {"X": Arg((3, 5)), "W": Arg((5, 4))},
        lambda X, W: np.sin(X) @ np.cos(W),
    ),
    _case(
        "gelu_erf",
        "G[i,j] := 0.5*X[i,j]*(1 + erf(X[i,j]*0.7071067811865476))",
        {"X": Arg((3, 5))},
        lambda X: 0.5 * X * (1.0 + _erf(X / math.sqrt(2.0))),
    ),
    _case(
        "min_with_vector",
        "Y[i] := min(X[i,j], W[j])",
        {"X": Arg((4, 5)), "W": Arg((5,))},
        lambda X, W: np.minimum(X, W[None, :]).sum(axis=1),
    ),
    _case(
        "clip_scalars",
        "Y[i] := min(max(X[i], lo), hi)",
        {"X": Arg((7,)), "lo": Arg((), -1.0, -0.5), "hi": Arg((), 0.5, 1.0)},
        lambda X, lo, hi: np.minimum(np.maximum(X, lo), hi),
    ),
    _case(
        "pow_rows",
        "Y[i] := pow(A[i,j], B[j])",
        {"A": Arg((3, 5), 0.5, 2.0), "B": Arg((5,))},
        lambda A, B: (A ** B[None, :]).sum(axis=1),
    ),
    # ---- integer inputs -----------------------------------------------------------------
    _case(
        "integer_mask",
        "Y[i] := X[i,j] * M[i,j]",
        {"X": Arg((4, 5)), "M": Arg((4, 5), 0, 2, integer=True)},
        lambda X, M: (X * M).sum(axis=1),
    ),
    _case(
        "integer_sum",
        "c := N[i,j]",
        {"N": Arg((3, 5), 0, 5, integer=True)},
        lambda N: N.astype(np.float64).sum(),
        differentiable=False,
    ),
]

CORPUS: tuple[Case, ...] = tuple(_CASES)
CORPUS_BY_NAME: dict[str, Case] = {case.name: case for case in CORPUS}


def _zeros_in_prod_with_zero(inputs: dict) -> None:
    # One zero in column 1 (its gradient is the product of the others), two in column 2
    # (every gradient in that column is zero).
    inputs["X"][2, 1] = 0.0
    inputs["X"][0, 2] = 0.0
    inputs["X"][3, 2] = 0.0


_OVERRIDES: dict[str, Callable[[dict], None]] = {"prod_with_zero": _zeros_in_prod_with_zero}


def _stable_seed(name: str) -> int:
    """A seed derived from the case name that does not depend on PYTHONHASHSEED."""
    return sum((position + 1) * ord(char) for position, char in enumerate(name)) % (2**31)


def _with_ties(x: np.ndarray) -> np.ndarray:
    """Round to a 0.5 grid and copy each last-axis row's max and min to a second position."""
    x = np.round(x * 2.0) / 2.0
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[1]
    for row in rows:
        top = int(np.argmax(row))
        row[(top + 1) % n] = row[top]
        bottom = int(np.argmin(row))
        taken = {top, (top + 1) % n, bottom}
        spare = next((p for p in range(n) if p not in taken), None)
        if spare is not None:
            row[spare] = row[bottom]
    return rows.reshape(x.shape)


def _sample(arg: Arg, rng: np.random.Generator, ties: bool) -> np.ndarray | float:
    if arg.integer:
        # Resample until not constant, so an input is never all zeros or all ones.
        for _ in range(100):
            values = rng.integers(int(arg.low), int(arg.high), size=arg.shape, dtype=np.int32)
            if values.size <= 1 or values.min() != values.max():
                return values
        return values
    if arg.shape == ():
        return float(rng.uniform(arg.low, arg.high))
    values = rng.uniform(arg.low, arg.high, size=arg.shape)
    return _with_ties(values) if ties else values


def make_inputs(case: Case, seed: int = 0) -> dict[str, np.ndarray | float]:
    """Random inputs for a case, keyed by name in ``case.args`` (= ``k.inputs``) order.

    Args:
        case: The corpus case.
        seed: Varies the draw; the same (case, seed) always gives the same inputs.

    Returns:
        float64 arrays uniform on each Arg's domain, int32 arrays for integer Args, and
        Python floats for shape-() Args.

    >>> inputs = make_inputs(CORPUS_BY_NAME["matmul"])
    >>> list(inputs), inputs["A"].shape, inputs["A"].dtype
    (['A', 'B'], (3, 5), dtype('float64'))
    """
    rng = np.random.default_rng([seed, _stable_seed(case.name)])
    inputs = {name: _sample(arg, rng, case.ties) for name, arg in case.args.items()}
    override = _OVERRIDES.get(case.name)
    if override is not None:
        override(inputs)
    return inputs
