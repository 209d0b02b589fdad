"""`codegen.ir.probe`: numeric evidence before sympy.simplify, never a wrong acceptance."""

from __future__ import annotations

import pytest
import sympy

from codegen.ir import probe

X, Z = sympy.IndexedBase("X"), sympy.IndexedBase("Z")
i, j, eps = sympy.symbols("i j eps")
shift = sympy.Function("shift")(i)


@pytest.mark.parametrize(
    ("expr", "shown"),
    [
        (X[i, j] - X[i, j], False),
        (sympy.exp(X[i, j] - shift) * sympy.exp(shift) - sympy.exp(X[i, j]), False),
        (sympy.sin(X[i]) ** 2 + sympy.cos(X[i]) ** 2 - 1, False),  # zero, within rounding
        (sympy.exp(X[i, j]) - X[i, j], True),
        (sympy.log(-X[i] - 5), False),  # not a real number at the point: nothing shown
        (X[i] / (X[i] - X[i]), False),  # not finite: nothing shown
    ],
)
def test_nonzero_shows_only_what_is_not_zero(expr, shown):
    assert probe.nonzero(expr) is shown


def test_varies_holds_what_it_is_told_to():
    assert not probe.varies(eps * shift, held=lambda a: a in (eps, shift))
    assert probe.varies(eps * shift * X[i, j], held=lambda a: a in (eps, shift))
    assert not probe.varies(sympy.sqrt(-X[i, j] - 4), held=lambda a: False)  # not real


def test_simplest_takes_the_first_good_form_and_falls_back_to_simplify(monkeypatch):
    ratio = sympy.exp(X[i, j] - shift) / sympy.exp(X[i, j])
    good = lambda e: not e.atoms(sympy.Indexed)  # noqa: E731
    calls = []
    monkeypatch.setattr(probe.sympy, "simplify", lambda e: calls.append(e) or sympy.Integer(7))
    assert probe.simplest(ratio, good=good) == sympy.exp(-shift)
    assert calls == []
    trig = X[i] * (sympy.sin(eps) ** 2 + sympy.cos(eps) ** 2) / X[i] + X[i] * 0
    assert probe.simplest(trig + Z[i] - Z[i], good=lambda e: e == 1) == 7  # simplify's answer
    assert len(calls) == 1
