"""A gradient that is another's sum: an operand read with every index of its statement, and
another read with some of them, each once and only in a fixed combination.

Sinkhorn's column potential `B[j] := la[i] - A[i] - C[i,j] / eps` reads the cost `C` at every
index of the statement and the stored row potential `A` at `i`, only as `-A[i] - C[i,j]/eps`:
at every point of the loop nest the gradient in `A` is `eps` times the gradient in `C`. So
`dA[i]` is `eps * sum_j dC_B[i,j]`, where `dC_B` is the statement's part of `C`'s gradient, an
elementwise nest. Run that part alone and sum it, and the statement's weights
`exp(la[i] - A[i] - C[i,j]/eps - B[j])` are computed once in the backward, not once in `A`'s
gradient nest and again in `C`'s (`tensordsl.binding.program_grad`).

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, j = index_symbol("i"), index_symbol("j")
>>> la, A, C, eps = tensor_base("la"), tensor_base("A"), tensor_base("C"), sympy.Symbol("eps")
>>> def nest(body):
...     free = (Range(j, 0, extent_symbol("C", 1)),)
...     term = Term(body, (Range(i, 0, extent_symbol("C", 0)),))
...     ops = (Operand("la", 1), Operand("A", 1), Operand("C", 2), Operand("eps", 0))
...     return LoopNest("B", free, (term,), ops, reduction="logsumexp")
>>> found = spread(nest(la[i] - A[i] - C[i, j] / eps), "C", "A")
>>> found.ratio, found.summed, found.order
(eps, (1,), (0,))
>>> spread(nest(la[i] - A[i] * C[i, j]), "C", "A") is None  # not a fixed combination
True
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from codegen.ir import probe
from codegen.ir.nest import LoopNest


@dataclass(frozen=True)
class Spread:
    """How a partner's gradient follows from an operand's, in a statement that reads both."""

    #: The partner's gradient over the operand's at every point (scalar operands only).
    ratio: sympy.Expr
    #: The axes of the operand's gradient summed for the partner's.
    summed: tuple[int, ...]
    #: The axes left, in the partner's order (a transpose of what the sum leaves).
    order: tuple[int, ...]


def _accesses(expr: sympy.Basic, name: str) -> set[sympy.Indexed]:
    return {a for a in sympy.sympify(expr).atoms(sympy.Indexed) if str(a.base) == name}


def _of_scalars(expr: sympy.Expr, scalars: set[str]) -> bool:
    return all(isinstance(s, sympy.Symbol) and s.name in scalars for s in expr.free_symbols)


def spread(nest: LoopNest, wrt: str, partner: str) -> Spread | None:
    """How `nest`'s gradient in `partner` is a sum of its gradient in `wrt`, or None where
    that is not shown: one term; `wrt` read once, at exactly the nest's indices, each once;
    `partner` read once, at fewer distinct indices among them (at the same ones, `wrt`
    mirrors it: `codegen.passes.mirror`); no bound, constraint or guard reading either; the
    body's derivative in `partner` a fixed multiple of its derivative in `wrt` (a number or
    an expression of scalar operands)."""
    if len(nest.terms) != 1:
        return None
    term = nest.terms[0]
    others = [e for e in term.expressions() if e is not term.body]
    if any(_accesses(e, n) for e in others for n in (wrt, partner)):
        return None
    mine, theirs = _accesses(term.body, wrt), _accesses(term.body, partner)
    if len(mine) != 1 or len(theirs) != 1:
        return None
    (a,), (b,) = mine, theirs
    every = (*nest.free_indices, *term.reduced_indices)
    if len(a.indices) != len(every) or set(a.indices) != set(every):
        return None
    if len(set(b.indices)) != len(b.indices) or not set(b.indices) < set(a.indices):
        return None  # the same indices: `codegen.passes.mirror`'s, no sum to do
    u, v = sympy.Dummy("u"), sympy.Dummy("v")
    body = term.body.xreplace({a: u, b: v})
    slope = sympy.diff(body, u)
    if slope == 0:
        return None
    scalars = {op.name for op in nest.operands if op.rank == 0}
    ratio = sympy.diff(body, v) / slope
    if probe.varies(ratio, held=lambda atom: getattr(atom, "name", None) in scalars):
        return None  # shown not fixed at two points: no need to ask sympy.simplify
    ratio = probe.simplest(ratio, good=lambda r: _of_scalars(r, scalars))
    if ratio.has(sympy.zoo, sympy.nan) or not _of_scalars(ratio, scalars):
        return None
    kept = [x for x in a.indices if x in b.indices]
    summed = tuple(k for k, x in enumerate(a.indices) if x not in b.indices)
    return Spread(ratio, summed, tuple(kept.index(x) for x in b.indices))
