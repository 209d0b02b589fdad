"""The program corpus: layers written as several statements, each with a float64 numpy reference.

A case holds the program source, its inputs (in ``k.inputs`` order: first appearance, names no
statement defines), the ``outputs=`` it asks for (None: the last statement's output alone),
and an independent numpy computation of the outputs, always returned as a tuple in
``outputs`` order. Sizes are small so that every back end and the finite differences stay
fast. Inputs are sampled by ``tests.corpus.make_inputs`` (uniform, never all zeros or ones).

This module imports numpy, math and the corpus helpers only; it never imports tensordsl.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from tests.corpus import Arg

__all__ = ["PROGRAMS", "PROGRAMS_BY_NAME", "ProgramCase", "directional_derivative"]


@dataclass(frozen=True)
class ProgramCase:
    """One program and its float64 reference (keyword arguments in, a tuple of outputs out)."""

    name: str
    source: str
    args: dict[str, Arg]
    expected: Callable[..., tuple[np.ndarray, ...]] = field(compare=False)
    outputs: tuple[str, ...] | None = None
    ties: bool = False  # read by make_inputs


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    peak = x.max(axis=axis, keepdims=True)
    return (np.log(np.exp(x - peak).sum(axis=axis, keepdims=True)) + peak).squeeze(axis)


def _layernorm(X, F, eps, g, beta):
    mean = X.sum(1, keepdims=True) / F
    var = ((X - mean) ** 2).sum(1, keepdims=True) / F
    return ((X - mean) / np.sqrt(var + eps) * g + beta,)


def _gelu(x: np.ndarray) -> np.ndarray:
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def _cross_entropy(X, y):
    return ((_logsumexp(X) - X[np.arange(len(y)), y]).sum(),)


def _causal_attention(Q, K, scale, V):
    scores = np.einsum("bhid,bhjd->bhij", Q, K) * scale
    T = scores.shape[-1]
    scores = np.where(np.tril(np.ones((T, T))) > 0, scores, -np.inf)
    L = _logsumexp(scores)
    return np.einsum("bhij,bhje->bhie", np.exp(scores - L[..., None]), V), L


def _relative_bias_attention(Q, K, scale, R, V):
    T = Q.shape[1]
    offset = np.arange(T)[:, None] - np.arange(T)[None, :] + (T - 1)  # i - j + 5
    scores = np.einsum("hid,hjd->hij", Q, K) * scale + R[:, offset]
    return (np.einsum("hij,hje->hie", _softmax(scores), V),)


def _conv_difference(X, W):
    n = X.shape[1] - W.shape[2] + 1  # valid positions only
    conv = sum(np.einsum("ci,oc->oi", X[:, k : k + n], W[:, :, k]) for k in range(W.shape[2]))
    return (conv[:, 1:] - conv[:, :-1],)


PROGRAMS: tuple[ProgramCase, ...] = (
    ProgramCase(
        "softmax",
        """
        (max) M[i] := X[i,j]          # the row maximum, for stability
        Z[i] := exp(X[i,j] - M[i])
        P[i,j] := exp(X[i,j] - M[i]) / Z[i]
        """,
        {"X": Arg((4, 6))},
        lambda X: (_softmax(X),),
    ),
    ProgramCase(
        "layernorm",
        """
        mu[b] := X[b,f] / F
        var[b] := (X[b,f] - mu[b])^2 / F
        N[b,f] := (X[b,f] - mu[b]) * rsqrt(var[b] + eps)
        Y[b,f] := N[b,f] * g[f] + beta[f]
        """,
        {
            "X": Arg((3, 7)),
            "F": Arg((), 6.0, 8.0),
            "eps": Arg((), 0.1, 0.5),
            "g": Arg((7,)),
            "beta": Arg((7,)),
        },
        _layernorm,
    ),
    ProgramCase(
        "rmsnorm",
        "ms[b] := X[b,f]^2 / F; Y[b,f] := X[b,f] * rsqrt(ms[b] + eps) * g[f]",
        {"X": Arg((3, 5)), "F": Arg((), 4.0, 6.0), "eps": Arg((), 0.1, 0.5), "g": Arg((5,))},
        lambda X, F, eps, g: (X / np.sqrt((X**2).sum(1, keepdims=True) / F + eps) * g,),
    ),
    ProgramCase(
        "linear_bias",
        """
        H[b,j] := X[b,k] * W[k,j]
        Y[b,j] := H[b,j] + c[j]
        """,
        {"X": Arg((3, 4)), "W": Arg((4, 5)), "c": Arg((5,))},
        lambda X, W, c: (X @ W + c,),
    ),
    ProgramCase(
        "mlp_gelu",
        """
        H[b,j] := X[b,k] * W1[k,j]
        A[b,j] := 0.5 * (H[b,j] + c1[j]) * (1 + erf((H[b,j] + c1[j]) * 0.7071067811865476))
        Y[b,o] := A[b,j] * W2[j,o]
        Z[b,o] := Y[b,o] + c2[o]
        """,
        {
            "X": Arg((3, 4)),
            "W1": Arg((4, 6)),
            "c1": Arg((6,)),
            "W2": Arg((6, 2)),
            "c2": Arg((2,)),
        },
        lambda X, W1, c1, W2, c2: (_gelu(X @ W1 + c1) @ W2 + c2,),
    ),
    ProgramCase(
        "cross_entropy",
        """
        (logsumexp) L[b] := X[b,c]
        loss := (L[b] - X[b,c]) * (c == y[b])   # y: integer class labels
        """,
        {"X": Arg((4, 5)), "y": Arg((4,), 0, 5, integer=True)},
        _cross_entropy,
    ),
    ProgramCase(
        "causal_attention",
        """
        S[b,h,i,j] := Q[b,h,i,d] * K[b,h,j,d] * scale + where(j <= i, 0, -inf)
        (logsumexp) L[b,h,i] := S[b,h,i,j]
        O[b,h,i,e] := exp(S[b,h,i,j] - L[b,h,i]) * V[b,h,j,e]
        """,
        {
            "Q": Arg((2, 2, 5, 3)),
            "K": Arg((2, 2, 5, 3)),
            "scale": Arg((), 0.3, 0.7),
            "V": Arg((2, 2, 5, 4)),
        },
        _causal_attention,
        outputs=("O", "L"),
    ),
    ProgramCase(
        "relative_bias_attention",
        """
        S0[h,i,j] := Q[h,i,d] * K[h,j,d] * scale
        S[h,i,j] := S0[h,i,j] + R[h,i-j+5]     # a learnable bias per head and offset
        (logsumexp) L[h,i] := S[h,i,j]
        O[h,i,e] := exp(S[h,i,j] - L[h,i]) * V[h,j,e]
        """,
        {
            "Q": Arg((2, 6, 3)),
            "K": Arg((2, 6, 3)),
            "scale": Arg((), 0.3, 0.7),
            "R": Arg((2, 11)),
            "V": Arg((2, 6, 3)),
        },
        _relative_bias_attention,
    ),
    ProgramCase(
        "conv_difference",
        """
        C[o,i] := X[c,i+k] * W[o,c,k]
        D[o,i] := C[o,i+1] - C[o,i]
        """,
        {"X": Arg((3, 9)), "W": Arg((2, 3, 3))},
        _conv_difference,
    ),
)

PROGRAMS_BY_NAME = {case.name: case for case in PROGRAMS}


def directional_derivative(
    case: ProgramCase,
    inputs: dict,
    cotangents: tuple[np.ndarray, ...],
    name: str,
    direction: np.ndarray | float,
    step: float = 1e-5,
) -> float:
    """`d/dt sum_k <cotangent_k, output_k>` with input `name` moved by `t * direction`, at
    t = 0, by central differences of the float64 reference."""

    def weighted(t: float) -> float:
        moved = {**inputs, name: inputs[name] + t * direction}
        outputs = case.expected(**moved)
        return sum(float(np.sum(c * o)) for c, o in zip(cotangents, outputs))

    return (weighted(step) - weighted(-step)) / (2 * step)
