"""Loop nests built by hand with codegen.ir.nest, each with inputs and a numpy float64 reference."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import sympy

from codegen.ir.functions import CeilDiv, FloorDiv, select, sigmoid, softplus
from codegen.ir.nest import (
    LoopNest,
    Operand,
    Range,
    Term,
    extent_symbol,
    index_symbol,
    scalar_symbol,
)
from codegen.ir.nest import tensor_base as T

E = extent_symbol
i, j, k, p, q, c, o, y, x, u, v = (index_symbol(n) for n in "ijkpqcoyxuv")


@dataclass(frozen=True)
class Case:
    """A nest, how to make its inputs, and the float64 reference of its output."""

    name: str
    nest: LoopNest
    inputs: Callable[[np.random.Generator], dict[str, np.ndarray]]
    reference: Callable[..., np.ndarray]
    extents: Callable[[dict[str, np.ndarray]], dict[str, tuple[int, ...]]] = field(
        default=lambda arrays: {}
    )
    out_shape: Callable[[dict[str, np.ndarray]], tuple[int, ...]] | None = None


def rand(*shape: int) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: rng.standard_normal(shape)


def _inputs(**makers: Callable[[np.random.Generator], np.ndarray]):
    return lambda rng: {name: make(rng) for name, make in makers.items()}


def _ties(rng: np.random.Generator) -> np.ndarray:
    return rng.integers(-2, 3, size=(7, 5, 3)).astype(np.float64)


def _conv_grad_reference(dY: np.ndarray, W: np.ndarray) -> np.ndarray:
    return np.convolve(dY, W, mode="full")


def _correlate(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    return np.correlate(X, W, mode="valid")


def _conv2d(X: np.ndarray, W: np.ndarray) -> np.ndarray:
    O, C, KH, KW = W.shape
    _, H, Wd = X.shape
    Y = np.zeros((O, H - KH + 1, Wd - KW + 1))
    for a in range(KH):
        for b in range(KW):
            Y += np.einsum(
                "chw,oc->ohw", X[:, a : a + H - KH + 1, b : b + Wd - KW + 1], W[:, :, a, b]
            )
    return Y


def _flat_arg(values: np.ndarray, pick: Callable[..., np.ndarray]) -> np.ndarray:
    return pick(values.reshape(values.shape[0], -1), axis=1)


def _erf(a: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf)(a)


_ELEMENTWISE = (
    sympy.tanh(T("A")[i])
    + sigmoid(3 * T("A")[i])
    + softplus(2 * T("A")[i])
    + sympy.exp(T("A")[i]) * sympy.sign(T("A")[i])
    + sympy.Abs(T("A")[i]) ** 3
    + sympy.erf(T("A")[i])
    + sympy.sqrt(T("A")[i] ** 2 + 1)
)

CASES = [
    Case(
        "matmul",
        LoopNest(
            "C",
            (Range(i, 0, E("A", 0)), Range(j, 0, E("B", 1))),
            (Term(T("A")[i, k] * T("B")[k, j], (Range(k, 0, E("A", 1)),)),),
            (Operand("A", 2), Operand("B", 2)),
        ),
        _inputs(A=rand(37, 19), B=rand(19, 45)),
        lambda A, B: A @ B,
    ),
    Case(
        "matvec",
        LoopNest(
            "y",
            (Range(i, 0, E("A", 0)),),
            (Term(T("A")[i, k] * T("x")[k], (Range(k, 0, E("A", 1)),)),),
            (Operand("A", 2), Operand("x", 1)),
        ),
        _inputs(A=rand(33, 70), x=rand(70)),
        lambda A, x: A @ x,
    ),
    Case(
        "full_sum",
        LoopNest(
            "s",
            (),
            (Term(T("A")[i, j] * T("B")[i, j], (Range(i, 0, E("A", 0)), Range(j, 0, E("A", 1)))),),
            (Operand("A", 2), Operand("B", 2)),
        ),
        _inputs(A=rand(150, 41), B=rand(150, 41)),
        lambda A, B: np.sum(A * B),
    ),
    Case(
        "correlation",
        LoopNest(
            "Y",
            (Range(i, 0, E("X", 0) - E("W", 0) + 1),),
            (Term(T("X")[i + k] * T("W")[k], (Range(k, 0, E("W", 0)),)),),
            (Operand("X", 1), Operand("W", 1)),
        ),
        _inputs(X=rand(50), W=rand(7)),
        _correlate,
    ),
    Case(
        "conv_grad",
        LoopNest(
            "dX",
            (Range(p, 0, E("dX", 0)),),
            (
                Term(
                    T("dY")[p - k] * T("W")[k],
                    (Range(k, 0, E("W", 0)),),
                    constraints=(p - k, E("dY", 0) - 1 - (p - k)),
                ),
            ),
            (Operand("dY", 1), Operand("W", 1)),
        ),
        _inputs(dY=rand(44), W=rand(7)),
        _conv_grad_reference,
        extents=lambda a: {"dX": (a["dY"].shape[0] + a["W"].shape[0] - 1,)},
    ),
    Case(
        "two_terms",
        LoopNest(
            "Y",
            (Range(i, 0, E("A", 0)),),
            (
                Term(T("A")[i, k] * T("x")[k], (Range(k, 0, E("A", 1)),)),
                Term(2 * T("B")[j, i], (Range(j, 0, E("B", 0)),)),
            ),
            (Operand("A", 2), Operand("x", 1), Operand("B", 2)),
        ),
        _inputs(A=rand(21, 8), x=rand(8), B=rand(5, 21)),
        lambda A, x, B: A @ x + 2 * B.sum(0),
    ),
    Case(
        "guard",
        LoopNest(
            "dA",
            (Range(p, 0, E("dY", 0)), Range(q, 0, E("dY", 0))),
            (Term(T("dY")[p] * 3, guard=sympy.Eq(p, q)),),
            (Operand("dY", 1),),
        ),
        _inputs(dY=rand(19)),
        lambda dY: np.diag(3 * dY),
    ),
    Case(
        "max",
        LoopNest(
            "Y",
            (Range(i, 0, E("A", 0)),),
            (Term(T("A")[i, j, k], (Range(j, 0, E("A", 1)), Range(k, 0, E("A", 2)))),),
            (Operand("A", 3),),
            "max",
        ),
        lambda rng: {"A": _ties(rng)},
        lambda A: A.max(axis=(1, 2)),
    ),
    Case(
        "min",
        LoopNest(
            "Y",
            (Range(i, 0, E("A", 0)),),
            (Term(T("A")[i, j, k], (Range(j, 0, E("A", 1)), Range(k, 0, E("A", 2)))),),
            (Operand("A", 3),),
            "min",
        ),
        lambda rng: {"A": _ties(rng)},
        lambda A: A.min(axis=(1, 2)),
    ),
    Case(
        "argmax",
        LoopNest(
            "Y",
            (Range(i, 0, E("A", 0)),),
            (Term(T("A")[i, j, k], (Range(j, 0, E("A", 1)), Range(k, 0, E("A", 2)))),),
            (Operand("A", 3),),
            "argmax",
        ),
        lambda rng: {"A": _ties(rng)},
        lambda A: _flat_arg(A, np.argmax),
    ),
    Case(
        "argmin",
        LoopNest(
            "Y",
            (Range(i, 0, E("A", 0)),),
            (Term(T("A")[i, j, k], (Range(j, 0, E("A", 1)), Range(k, 0, E("A", 2)))),),
            (Operand("A", 3),),
            "argmin",
        ),
        lambda rng: {"A": _ties(rng)},
        lambda A: _flat_arg(A, np.argmin),
    ),
    Case(
        "logsumexp",
        LoopNest(
            "Y",
            (Range(i, 0, E("A", 0)),),
            (Term(3 * T("A")[i, k], (Range(k, 0, E("A", 1)),)),),
            (Operand("A", 2),),
            "logsumexp",
        ),
        _inputs(A=rand(13, 50)),
        lambda A: np.log(np.exp(3 * A).sum(axis=1)),
    ),
    Case(
        "prod",
        LoopNest(
            "Y",
            (Range(i, 0, E("A", 0)),),
            (Term(T("A")[i, k], (Range(k, 0, E("A", 1)),)),),
            (Operand("A", 2),),
            "prod",
        ),
        lambda rng: {
            "A": np.where(
                np.arange(6)[:, None] * np.arange(9) == 8, 0.0, rng.uniform(0.5, 1.5, (6, 9))
            )
        },
        lambda A: A.prod(axis=1),
    ),
    Case(
        "conv2d",
        LoopNest(
            "Y",
            (
                Range(o, 0, E("W", 0)),
                Range(y, 0, E("X", 1) - E("W", 2) + 1),
                Range(x, 0, E("X", 2) - E("W", 3) + 1),
            ),
            (
                Term(
                    T("X")[c, y + u, x + v] * T("W")[o, c, u, v],
                    (Range(c, 0, E("X", 0)), Range(u, 0, E("W", 2)), Range(v, 0, E("W", 3))),
                ),
            ),
            (Operand("X", 3), Operand("W", 4)),
        ),
        _inputs(X=rand(3, 12, 41), W=rand(5, 3, 3, 4)),
        _conv2d,
    ),
    Case(
        "pairwise",
        LoopNest(
            "D",
            (Range(i, 0, E("W", 1)), Range(j, 0, E("X", 1))),
            (Term((T("W")[k, i] - T("X")[k, j]) ** 2, (Range(k, 0, E("W", 0)),)),),
            (Operand("W", 2), Operand("X", 2)),
        ),
        _inputs(W=rand(6, 23), X=rand(6, 35)),
        lambda W, X: ((W[:, :, None] - X[:, None, :]) ** 2).sum(0),
    ),
    Case(
        "scalar_operand",
        LoopNest(
            "Y",
            (Range(i, 0, E("A", 0)),),
            (Term(scalar_symbol("alpha") * T("A")[i] + scalar_symbol("beta")),),
            (Operand("alpha", 0), Operand("A", 1), Operand("beta", 0)),
        ),
        lambda rng: {"alpha": np.array(1.5), "A": rng.standard_normal(29), "beta": np.array(-0.25)},
        lambda alpha, A, beta: alpha * A + beta,
    ),
    Case(
        "index_value",
        LoopNest(
            "Y",
            (Range(i, 0, E("A", 0)), Range(j, 0, E("A", 1))),
            (
                Term(
                    T("A")[i, j] * i
                    + j
                    + FloorDiv(i - 5, 3)
                    + CeilDiv(j - 7, 4) * sympy.Rational(1, 2)
                ),
            ),
            (Operand("A", 2),),
        ),
        _inputs(A=rand(11, 13)),
        lambda A: (
            A * np.arange(11)[:, None]
            + np.arange(13)
            + (np.arange(11)[:, None] - 5) // 3
            + -((7 - np.arange(13)) // 4) * 0.5
        ),
    ),
    Case(
        "piecewise",
        LoopNest(
            "Y",
            (Range(i, 0, E("A", 0)),),
            (
                Term(
                    select(T("A")[i, k] > 0, T("A")[i, k], sympy.Float(0.1) * T("A")[i, k])
                    * select(sympy.And(k >= 2, k < i), 2, 1),
                    (Range(k, 0, E("A", 1)),),
                ),
            ),
            (Operand("A", 2),),
        ),
        _inputs(A=rand(9, 6)),
        lambda A: (
            np.where(A > 0, A, 0.1 * A)
            * np.where((np.arange(6) >= 2) & (np.arange(6) < np.arange(9)[:, None]), 2, 1)
        ).sum(1),
    ),
    Case(
        "functions",
        LoopNest("Y", (Range(i, 0, E("A", 0)),), (Term(_ELEMENTWISE),), (Operand("A", 1),)),
        _inputs(A=rand(40)),
        lambda A: (
            np.tanh(A)
            + 1 / (1 + np.exp(-3 * A))
            + np.log1p(np.exp(2 * A))
            + np.exp(A) * np.sign(A)
            + np.abs(A) ** 3
            + _erf(A)
            + np.sqrt(A**2 + 1)
        ),
    ),
]

BY_NAME = {case.name: case for case in CASES}
