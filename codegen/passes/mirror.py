"""Gradients that mirror another: an input read only in a difference (or a sum) with another
operand, at the same indices, has that operand's gradient, negated (or as is).

Sinkhorn's potentials read the marginal `la` only as `la[i] - A[i]`, inside a logsumexp
(`B[j] := la[i] - A[i] - C[i,j] / eps`): the gradient of `la` from that statement is minus the
gradient of `A`, which the backward computes anyway (`A` is an intermediate it stores). Its
own gradient nest would compute the same weights `exp(la[i] - A[i] - C[i,j]/eps - B[j])` once
more; `tensordsl.binding.program_grad` reads the partner's gradient instead.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, j = index_symbol("i"), index_symbol("j")
>>> la, A, C = tensor_base("la"), tensor_base("A"), tensor_base("C")
>>> def nest(body):
...     free = (Range(j, 0, extent_symbol("C", 1)),)
...     term = Term(body, (Range(i, 0, extent_symbol("C", 0)),))
...     ops = (Operand("la", 1), Operand("A", 1), Operand("C", 2))
...     return LoopNest("B", free, (term,), ops, reduction="logsumexp")
>>> mirror_sign(nest(la[i] - A[i] - C[i, j]), "la", "A"), mirror_sign(nest(la[i] + A[i]), "la", "A")
(-1, 1)
>>> mirror_sign(nest(la[i] * A[i]), "la", "A"), mirror_sign(nest(la[i] - A[j]), "la", "A")
(None, None)
"""

from __future__ import annotations

import sympy

from codegen.ir.nest import LoopNest, Term


def mirror_sign(nest: LoopNest, wrt: str, partner: str) -> int | None:
    """-1 where the gradient of `nest` with respect to `wrt` is minus its gradient with
    respect to `partner`, 1 where it is the same, None where neither holds (or is shown):
    every term reads both, each with one access of the same indices, and only as their
    difference (or sum), or reads neither; no bound, constraint or guard reads them."""
    sign = None
    for term in nest.terms:
        found = _term_sign(term, wrt, partner)
        if found == 0:
            continue
        if found is None or (sign is not None and found != sign):
            return None
        sign = found
    return sign


def _accesses(expr: sympy.Basic, name: str) -> set[sympy.Indexed]:
    return {a for a in expr.atoms(sympy.Indexed) if str(a.base) == name}


def _term_sign(term: Term, wrt: str, partner: str) -> int | None:
    """The sign for one term: 0 where it reads neither tensor."""
    body, others = term.body, [e for e in term.expressions() if e is not term.body]
    if any(_accesses(sympy.sympify(e), n) for e in others for n in (wrt, partner)):
        return None
    mine, theirs = _accesses(body, wrt), _accesses(body, partner)
    if not mine and not theirs:
        return 0
    if len(mine) != 1 or len(theirs) != 1:
        return None
    (a,), (b,) = mine, theirs
    if a.indices != b.indices:
        return None
    shift = sympy.Dummy("shift")
    for sign, moved in ((-1, b + shift), (1, shift - b)):
        if not _accesses(body.xreplace({a: moved}), partner):
            return sign
    return None
