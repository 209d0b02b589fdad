"""A small nest per CUDA strategy that the heuristic gives that strategy, with random inputs
and an independent float64 numpy reference: the strategies' golden sources
(tests/unit/test_strategy_goldens.py) and emulator runs (tests/gpu/test_strategies_emulated.py).

Adding a strategy (`codegen.cuda.strategies.STRATEGIES`) adds a case here;
tests/unit/test_cuda_strategies.py checks that every record with a kernel has one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from codegen.ir.nest import LoopNest


@dataclass(frozen=True)
class StrategyCase:
    """A nest that picks `strategy`, its inputs and its float64 reference."""

    strategy: str
    #: The nest and its operands' values (float64), built on demand (programs compile).
    build: Callable[[], tuple[LoopNest, dict[str, np.ndarray]]]
    reference: Callable[..., np.ndarray]
    dtype: str = "float32"  # the operands' dtype; the output is float32 or this

    def dtypes(self, nest: LoopNest) -> dict[str, str]:
        found = dict.fromkeys(nest.operand_names, self.dtype)
        found[nest.output] = "float32" if self.dtype == "bfloat16" else self.dtype
        return found


def _random(seed: int, **shapes: tuple[int, ...]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.uniform(-2.0, 2.0, shape) for name, shape in shapes.items()}


def _statement(
    source: str, reduce: str | None = None, seed: int = 0, **shapes: tuple[int, ...]
) -> Callable[[], tuple[LoopNest, dict[str, np.ndarray]]]:
    def build() -> tuple[LoopNest, dict[str, np.ndarray]]:
        from tensordsl.frontend.lower import lower
        from tensordsl.frontend.parse import parse

        nest = lower(parse(source), reduce=reduce).nest if reduce else lower(parse(source)).nest
        return nest, _random(seed, **shapes)

    return build


ATTENTION = """
S[h,i,j] := Q[h,i,d] * K[h,j,d] * 0.3 + where(j <= i, 0, -inf)
(logsumexp) L[h,i] := S[h,i,j]
O[h,i,e] := exp(S[h,i,j] - L[h,i]) * V[h,j,e]
"""
WEIGHTED = """
S[h,i,j] := Q[h,i,d] * K[h,j,d] * 0.3
O[h,i,e] := where(j <= i, exp(S[h,i,j]) * V[h,j,e], 0)
"""


def _program(source: str, outputs: tuple[str, ...], online: bool) -> Callable:
    def build() -> tuple[LoopNest, dict[str, np.ndarray]]:
        import tensordsl as td
        from codegen.passes.online import pair_stored
        from tensordsl.binding.programs import compiled_statements

        values = _random(5, Q=(2, 37, 6), K=(2, 37, 6), V=(2, 37, 5))
        k = td.kernel(source, outputs=outputs, fuse={"S": "inline"})
        nests = pair_stored(compiled_statements(k.program, values, "cuda", k.fuse))
        (nest,) = [n for n in nests if bool(n.online) == online]
        return nest, values

    return build


def _causal_scores(Q: np.ndarray, K: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    S = np.einsum("hid,hjd->hij", Q, K) * 0.3
    T = S.shape[-1]
    return S, np.tril(np.ones((T, T), bool))


def _attention(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    """O and L packed along the last axis (O's columns, then L), as the kernel writes them."""
    S, keep = _causal_scores(Q, K)
    S = np.where(keep, S, -np.inf)
    top = S.max(axis=-1, keepdims=True)
    L = np.log(np.exp(S - top).sum(axis=-1)) + top[..., 0]
    O = np.einsum("hij,hje->hie", np.exp(S - L[..., None]), V)
    return np.concatenate([O, L[..., None]], axis=-1)


def _weighted(Q: np.ndarray, K: np.ndarray, V: np.ndarray) -> np.ndarray:
    S, keep = _causal_scores(Q, K)
    return np.einsum("hij,hje->hie", np.where(keep, np.exp(S), 0.0), V)


def _logsumexp_rows(X: np.ndarray) -> np.ndarray:
    top = X.max(axis=1)
    return np.log(np.exp(X - top[:, None]).sum(axis=1)) + top


#: One case per strategy with a kernel, in `STRATEGIES` order.
CASES = {
    case.strategy: case
    for case in (
        StrategyCase("online", _program(ATTENTION, ("O", "L"), True), _attention),
        StrategyCase("weighted", _program(WEIGHTED, ("O",), False), _weighted),
        StrategyCase(
            "split", _statement("s := X[i] * Y[i]", X=(1000,), Y=(1000,)), lambda X, Y: X @ Y
        ),
        StrategyCase("block", _statement("s := 3*a*b - b", a=(), b=()), lambda a, b: 3 * a * b - b),
        StrategyCase(
            "mma",
            _statement("C[i,j] := A[i,k] * B[k,j]", A=(70, 40), B=(40, 36)),
            lambda A, B: A @ B,
            dtype="bfloat16",
        ),
        StrategyCase(
            "smem",
            _statement("C[i,j] := A[i,k] * B[j,k]", A=(70, 20), B=(36, 20)),
            lambda A, B: A @ B.T,
        ),
        StrategyCase(
            "pairwise",
            _statement("D[i,j] := (X[i,k] - Y[j,k])^2", X=(70, 5), Y=(36, 5)),
            lambda X, Y: ((X[:, None, :] - Y[None, :, :]) ** 2).sum(axis=-1),
        ),
        StrategyCase(
            "tile",
            _statement("Y[b,o] := X[b,i] * W[i,o] + c[o]", X=(9, 7), W=(7, 33), c=(33,)),
            lambda X, W, c: X @ W + c,
        ),
        StrategyCase(
            "rows",
            _statement("L[i] := X[i,j]", "logsumexp", X=(19, 300)),
            _logsumexp_rows,
        ),
        StrategyCase(
            "columns",
            _statement("Y[j] := X[i,j] * X[i,j]", X=(300, 45)),
            lambda X: (X * X).sum(axis=0),
        ),
        StrategyCase(
            "thread",
            _statement("Y[i,j] := exp(X[i,j]) * 2", X=(13, 29)),
            lambda X: np.exp(X) * 2,
        ),
    )
}
