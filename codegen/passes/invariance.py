"""Shift-invariant statistics: a row maximum subtracted for stability has no gradient.

Softmax written as a program subtracts the row maximum before `exp` and divides by the sum
of the same exponentials::

    (max) M[i] := X[i,j]
    Z[i] := exp(X[i,j] - M[i])
    P[i,j] := exp(X[i,j] - M[i]) / Z[i]

Any `M` gives the same `P`: moving `M[i]` by `s(i)` scales `Z[i]` by `exp(-s(i))` and leaves
`P` unchanged, so the gradient reaching `M` is exactly zero. `shift_invariant` proves this
symbolically, statement by statement: each statement after `M`, with every read of `M`
shifted and every earlier statement's change applied, must be unchanged, or (a sum) scaled
by a factor of its free indices alone, which its readers then see; every output must come
out unchanged. The backward (`tensordsl.binding.program_grad`) then runs no gradient nest
for `M` (nor the argmax nest its gradient would need).

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, j = index_symbol("i"), index_symbol("j")
>>> X, M, Z = tensor_base("X"), tensor_base("M"), tensor_base("Z")
>>> rows, cols = Range(i, 0, extent_symbol("X", 0)), Range(j, 0, extent_symbol("X", 1))
>>> peak = LoopNest("M", (rows,), (Term(X[i, j], (cols,)),), (Operand("X", 2),), "max")
>>> total = LoopNest("Z", (rows,), (Term(sympy.exp(X[i, j] - M[i]), (cols,)),),
...     (Operand("X", 2), Operand("M", 1)))
>>> probs = LoopNest("P", (rows, cols), (Term(sympy.exp(X[i, j] - M[i]) / Z[i]),),
...     (Operand("X", 2), Operand("M", 1), Operand("Z", 1)))
>>> shift_invariant((peak, total, probs), outputs=("P",))
('M',)
>>> shift_invariant((peak, total, probs), outputs=("P", "Z"))
()
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import sympy

from codegen.ir import probe
from codegen.ir.nest import LoopNest, Reduce

#: Reductions whose result is a statistic subtracted for stability.
STATISTICS = ("max", "min")

_SHIFT = sympy.Function("shift")

Change = Callable[[sympy.Indexed], sympy.Expr]


def _apply(expr: sympy.Expr, changes: dict[str, Change]) -> sympy.Expr:
    reads = [a for a in expr.atoms(sympy.Indexed) if a.base.name in changes]
    return expr.xreplace({a: changes[a.base.name](a) for a in reads})


def _unchanged(read: sympy.Indexed) -> sympy.Expr:
    return read


def _same(moved: sympy.Expr, body: sympy.Expr) -> bool:
    """Whether a moved body is the body: sympy's own forms first, `simplify` (slow) only where
    a point does not already show them different (`codegen.ir.probe`)."""
    difference = moved - body
    if probe.nonzero(difference):
        return False
    return probe.simplest(difference, good=lambda d: d == 0) == 0


def _factor(ratio: sympy.Expr, reduced: set[sympy.Symbol]) -> sympy.Expr | None:
    """A moved sum term over the term as a factor that reads no tensor and no reduced index,
    or None: not so at two points, or not shown so even by `simplify`."""

    def fits(factor: sympy.Expr) -> bool:
        return not factor.atoms(sympy.Indexed) and not reduced & factor.free_symbols

    if probe.varies(ratio, held=lambda a: not isinstance(a, sympy.Indexed) and a not in reduced):
        return None
    factor = probe.simplest(ratio, good=fits)
    return factor if fits(factor) else None


def _change_of(nest: LoopNest, changes: dict[str, Change]) -> Change | None:
    """How `nest`'s output changes: `_unchanged`, a `Change` (a factor of its free indices),
    or None (some other way, or not provably)."""
    if not any(name in changes for name in nest.operand_names):
        return _unchanged
    factors = set()
    for term in nest.terms:
        if term.body.atoms(Reduce) or term.guard != sympy.true:
            return None
        moved = _apply(term.body, changes)
        if _same(moved, term.body):
            factors.add(sympy.Integer(1))
            continue
        if nest.reduction != "sum":
            return None
        factor = _factor(moved / term.body, set(term.reduced_indices))
        if factor is None:
            return None
        factors.add(factor)
    if factors == {sympy.Integer(1)}:
        return _unchanged
    if len(factors) != 1:
        return None
    factor = factors.pop()
    free = nest.free_indices

    def scaled(read: sympy.Indexed) -> sympy.Expr:
        return read * factor.xreplace(dict(zip(free, read.indices)))

    return scaled


def shift_invariant(stored: Sequence[LoopNest], *, outputs: Sequence[str]) -> tuple[str, ...]:
    """The stored max/min statistics that no output depends on (module docstring).

    Args:
        stored: the nests a fused program runs, in order.
        outputs: the program's outputs.

    Returns:
        The names of the statistics whose gradient is exactly zero.
    """
    found = []
    for n, statistic in enumerate(stored):
        if statistic.reduction not in STATISTICS or statistic.output in outputs:
            continue
        changes: dict[str, Change] = {statistic.output: lambda read: read + _SHIFT(*read.indices)}
        invariant = True
        for nest in stored[n + 1 :]:
            change = _change_of(nest, changes)
            if change is None or (change is not _unchanged and nest.output in outputs):
                invariant = False
                break
            if change is not _unchanged:
                changes[nest.output] = change
        if invariant:
            found.append(statistic.output)
    return tuple(found)


__all__ = ["shift_invariant"]
