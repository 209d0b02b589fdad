"""`codegen.passes.spread`: which gradients are another's sum, decided without sympy.simplify
where two points already show the ratio is not fixed."""

from __future__ import annotations

import pytest
import sympy

from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol, tensor_base
from codegen.passes import spread as spread_module
from codegen.passes.spread import spread

i, j = index_symbol("i"), index_symbol("j")
A, C, la, mu = (tensor_base(n) for n in ("A", "C", "la", "mu"))
eps = sympy.Symbol("eps")


def _nest(body: sympy.Expr, reduction: str = "logsumexp") -> LoopNest:
    free = (Range(j, 0, extent_symbol("C", 1)),)
    term = Term(body, (Range(i, 0, extent_symbol("C", 0)),))
    ops = (Operand("la", 1), Operand("A", 1), Operand("C", 2), Operand("eps", 0))
    ops += (Operand("mu", 1),)
    return LoopNest("B", free, (term,), ops, reduction=reduction)


@pytest.fixture
def no_simplify(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("sympy.simplify was called")

    monkeypatch.setattr(spread_module.sympy, "simplify", refuse)


@pytest.mark.parametrize(
    ("body", "ratio"),
    [
        (la[i] - A[i] - C[i, j] / eps, eps),  # Sinkhorn's potentials
        (sympy.exp(la[i] - A[i] - C[i, j] / eps), eps),
        (la[i] - 3 * A[i] + 2 * C[i, j], sympy.Rational(-3, 2)),
        ((C[i, j] - A[i]) ** 2, -1),
    ],
)
def test_a_fixed_ratio_is_found_without_simplify(no_simplify, body, ratio):
    found = spread(_nest(body), "C", "A")
    assert found is not None
    assert sympy.expand(found.ratio) == ratio
    assert found.summed == (1,)  # C[i, j] summed over j for A[i]


@pytest.mark.parametrize(
    "body",
    [
        -(C[i, j] - mu[i]) / (2 * (A[i] + sympy.Float(1e-5))),  # LayerNorm's variance
        la[i] - A[i] * C[i, j],
        sympy.exp(A[i]) * C[i, j] + A[i] ** 2,
    ],
)
def test_a_ratio_that_varies_is_refused_without_simplify(no_simplify, body):
    assert spread(_nest(body), "C", "A") is None


def test_a_ratio_that_only_simplify_shows_fixed():
    # The ratio is 1 / (sin(eps)^2 + cos(eps)^2): cancel leaves it as it is, and simplify
    # shows it is 1 (a scalar expression either way: the two points agree).
    body = la[i] + C[i, j] + A[i] * (sympy.sin(eps) ** 2 + sympy.cos(eps) ** 2)
    found = spread(_nest(body), "C", "A")
    assert found is not None
    assert sympy.simplify(found.ratio - 1) == 0
