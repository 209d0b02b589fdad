"""Tullio's boundary forms (`mod`, `clamp`, `pad`), left sides with a repeated index or a
new axis of length 1, `abs2`/`atan2`, unicode names: reference and C back ends against
float64 numpy, gradients against central differences. (CUDA: the corpus cases
`conv1d_same_pad`, `conv1d_circular_mod`, `clamped_shift` under the emulator.)"""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

import tensordsl as td
from codegen import config
from tensordsl.errors import IndexExpressionError, RangeError, ReductionError, UnsupportedError

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

HAVE_CC = shutil.which(config.c_compiler()) is not None
BACKENDS = ["reference", pytest.param("c", marks=pytest.mark.skipif(not HAVE_CC, reason="no C"))]
RNG = np.random.default_rng(25)


def _pad1(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    return np.correlate(np.pad(X, 1), W, mode="valid")


def _same2d(I: np.ndarray, K: np.ndarray) -> np.ndarray:  # noqa: E741
    P = np.pad(I, 1)
    return np.array(
        [[(P[y : y + 3, x : x + 3] * K).sum() for x in range(I.shape[1])] for y in range(5)]
    )


# name: (source, inputs, ranges, float64 reference)
CASES = {
    "same_conv1d": ("Y[i] := X[pad(i+k-1, 1)] * W[k]", {"X": (9,), "W": (3,)}, None, _pad1),
    "same_conv2d": (
        "Y[y,x] := I[pad(y+a-1, 1), pad(x+b-1, 1)] * K[a,b]",
        {"I": (5, 6), "K": (3, 3)},
        None,
        _same2d,
    ),
    "pad_two_widths": (
        "Y[i] := X[pad(i-2, 2, 3)]",
        {"X": (4,)},
        None,
        lambda X: np.concatenate([np.zeros(2), X, np.zeros(3)]),
    ),
    "pad_anywhere": (
        "Y[i] := exp(X[pad(i-1)])",
        {"X": (4,)},
        {"i": 6},
        lambda X: np.exp(np.concatenate([[0.0], X, [0.0]])),
    ),
    "mod_circular": (
        "Y[i] := X[mod(i+k)] * W[k]",
        {"X": (7,), "W": (3,)},
        {"i": 7},
        lambda X, W: np.array([sum(X[(i + k) % 7] * W[k] for k in range(3)) for i in range(7)]),
    ),
    "mod_negative": (
        "Y[i] := X[mod(i-3)]",
        {"X": (5,)},
        {"i": 8},
        lambda X: X[(np.arange(8) - 3) % 5],
    ),
    "mod_stride": (
        "Y[i] := X[mod(2i)]",
        {"X": (5,)},
        {"i": 6},
        lambda X: X[(2 * np.arange(6)) % 5],
    ),
    "clamp_shift": (
        "Y[i] := X[clamp(i-2)] * X[i]",
        {"X": (6,)},
        None,
        lambda X: X[np.clip(np.arange(6) - 2, 0, 5)] * X,
    ),
    "clamp_range_from_elsewhere": (
        "D[i] := max(A[i], B[clamp(i)])",
        {"A": (7,), "B": (4,)},
        None,
        lambda A, B: np.maximum(A, B[np.clip(np.arange(7), 0, 3)]),
    ),
    "clamp_2d_blur": (
        "Y[i,j] := X[clamp(i+a-1), clamp(j+b-1)] / 9",
        {"X": (4, 5)},
        {"a": 3, "b": 3, "i": 4, "j": 5},
        lambda X: np.array(
            [
                [
                    sum(
                        X[np.clip(i + a - 1, 0, 3), np.clip(j + b - 1, 0, 4)]
                        for a in range(3)
                        for b in range(3)
                    )
                    / 9
                    for j in range(5)
                ]
                for i in range(4)
            ]
        ),
    ),
    "diagonal": ("D[i,i] := X[i]^2", {"X": (4,)}, None, lambda X: np.diag(X**2)),
    "diagonal_of_sum": (
        "D[i,i] := M[i,k] * v[k] + c[i]",
        {"M": (3, 4), "v": (4,), "c": (3,)},
        None,
        lambda M, v, c: np.diag(M @ v + c),
    ),
    "unit_axis": ("Y[0,j] := M[i,j]", {"M": (3, 4)}, None, lambda M: M.sum(0)[None]),
    "abs2_atan2": (
        "Z[i] := atan2(Y[i], X[i]) * abs2(X[i] - Y[i])",
        {"Y": (5,), "X": (5,)},
        None,
        lambda Y, X: np.arctan2(Y, X) * (X - Y) ** 2,
    ),
    "unicode_names": ("Δ[α] := Χ[α, β] * w[β]", {"Χ": (3, 4), "w": (4,)}, None, lambda X, w: X @ w),
}


def _inputs(shapes: dict) -> list[np.ndarray]:
    return [RNG.uniform(0.5, 2.0, shape) * RNG.choice([-1, 1], shape) for shape in shapes.values()]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_gradients(name: str, backend: str) -> None:
    source, shapes, ranges, expected = CASES[name]
    if name == "abs2_atan2":  # atan2's branch cut: keep x > 0
        args = [RNG.uniform(0.5, 2.0, s) for s in shapes.values()]
    else:
        args = _inputs(shapes)
    kernel = td.kernel(source, ranges=ranges, backend=backend)
    np.testing.assert_allclose(kernel(*args), expected(*args), rtol=1e-12, atol=1e-12)
    weights = RNG.normal(size=np.shape(expected(*args)))

    def loss(*a):
        return (kernel(*a) * weights).sum()

    grads = jax.grad(loss, argnums=tuple(range(len(args))))(*args)
    for n, (x, g) in enumerate(zip(args, grads, strict=True)):
        numeric = np.zeros_like(x)
        for flat in range(x.size):
            step = np.zeros(x.size)
            step[flat] = 1e-6
            up = [*args[:n], x + step.reshape(x.shape), *args[n + 1 :]]
            down = [*args[:n], x - step.reshape(x.shape), *args[n + 1 :]]
            numeric.flat[flat] = (float(loss(*up)) - float(loss(*down))) / 2e-6
        np.testing.assert_allclose(g, numeric, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_tullio_gradient_counts(backend: str) -> None:
    """Tullio's `mod, clamp, pad` gradients (test/gradients.jl), 0-based: each element
    counts the positions that read it; pad's zeros have no gradient."""
    ones = np.ones(3)
    cases = {
        "y[i] := x[mod(i)]": ({"i": 5}, [2, 2, 1]),
        "y[i] := x[clamp(i)]": ({"i": 5}, [1, 1, 3]),
        "y[i] := x[pad(i-2, 2)]": (None, [1, 1, 1]),
    }
    for source, (ranges, want) in cases.items():
        kernel = td.kernel(source, ranges=ranges, backend=backend)
        assert jax.grad(lambda x, k=kernel: k(x).sum())(ones).tolist() == want, source


def test_ranges_follow_tullio() -> None:
    same = td.kernel("Y[i] := X[pad(i+k-1, 1)] * W[k]")
    assert same(np.ones(9), np.ones(3)).shape == (9,)
    full = td.kernel("Y[i] := X[pad(i+k-2, 2)] * W[k]")  # full convolution: N + K - 1
    assert full(np.ones(9), np.ones(3)).shape == (11,)
    with pytest.raises(RangeError, match="cannot infer the range of index 'i'"):
        td.kernel("Y[i] := X[mod(i+1)]")
    with pytest.raises(RangeError, match="outside"):
        td.kernel("Y[i] := X[pad(i-2, 1)]", ranges={"i": 5})(np.ones(5))
    for form in ("mod(i)", "clamp(i)", "pad(i, 1)"):
        with pytest.raises(RangeError, match="which is empty"):
            td.kernel(f"Y[i] := X[{form}]", ranges={"i": 3})(np.ones(0))


@pytest.mark.parametrize(
    ("source", "error", "match"),
    [
        ("Y[i] := X[mod(i, 3)]", IndexExpressionError, "'mod' takes 1 argument"),
        ("Y[i] := X[pad(clamp(i), 1)]", IndexExpressionError, "do not nest"),
        ("Y[i] := X[pad(i, -1)]", IndexExpressionError, "is not at least 0"),
        ("Y[i] := X[2*mod(i)]", IndexExpressionError, "part of the index expression"),
        ("Y[mod(i)] := X[i]", IndexExpressionError, "not an index name"),
        ("Y[i] := conj(X[i])", UnsupportedError, "complex numbers"),
        ("Y[2,j] := X[j]", IndexExpressionError, "constant '2' on the left"),
    ],
)
def test_mistakes(source: str, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        td.kernel(source, ranges={"i": 3})


@pytest.mark.parametrize("backend", BACKENDS)
def test_init(backend: str) -> None:
    X = RNG.normal(size=(3, 4))
    cases = {
        "sum": (5.0, X.sum(1) + 5),
        "max": (0.5, np.maximum(X.max(1), 0.5)),
        "min": (-0.5, np.minimum(X.min(1), -0.5)),
        "prod": (2.0, X.prod(1) * 2),
        "logsumexp": (1.0, np.logaddexp(np.log(np.exp(X).sum(1)), 1.0)),
    }
    for reduction, (init, want) in cases.items():
        kernel = td.kernel("Y[i] := X[i,j]", reduce=reduction, init=init, backend=backend)
        np.testing.assert_allclose(kernel(X), want, rtol=1e-12)
    grad = jax.grad(lambda x: td.kernel("(max) m := X[i]", init=0.0, backend=backend)(x))
    assert grad(np.array([-1.0, -2.0])).tolist() == [0.0, 0.0]  # init wins: no gradient
    assert grad(np.array([1.0, 2.0])).tolist() == [0.0, 1.0]


def test_init_mistakes() -> None:
    with pytest.raises(ReductionError, match="reduces no index"):
        td.kernel("Y[i] := X[i]", init=1.0)
    with pytest.raises(ReductionError, match="init= is 'x'"):
        td.kernel("Y[i] := X[i,j]", init="x")
    with pytest.raises(UnsupportedError, match="kernel of one statement"):
        td.program("Y[i] := X[i,j]; Z[i] := Y[i]", init=1.0)
