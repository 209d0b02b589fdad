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

Through an access: a score parameter read beside the stored scores, `s_[b,h,i,j] + R[h, i -
j + T - 1]`, in every statement that reads the scores (the logsumexp and the weighted sum),
has as gradient the scores' cotangent summed onto the table's elements,
`dR[h, p] = sum_b,j dS[b, h, j + p - T + 1, j]`; one read with a factor of indices beside
them (ALiBi's learnt slopes, `s_[b,h,i,j] + A[h] * (j - i)`) has that cotangent times the
factor summed, `dA[h] = sum_b,i,j dS * (j - i)`: a pass over `dS`, which the backward
computes anyway, instead of a gradient nest that recomputes every score and weight once more
and shares that work with no lane (`summed_through`, `through_nest`). The cost model stores
the scores for it on the back ends whose attention kernels do not compute such gradients
themselves (`codegen.passes.cost`).

>>> h, b = index_symbol("h"), index_symbol("b")
>>> R, S = tensor_base("R"), tensor_base("S")
>>> def reader(body):
...     free = (Range(i, 0, extent_symbol("S", 0)),)
...     term = Term(body, (Range(j, 0, extent_symbol("S", 1)),))
...     return LoopNest("L", free, (term,), (Operand("R", 1), Operand("S", 2)), "logsumexp")
>>> summed_through([reader(S[i, j] + R[i - j + 4])], "R", "S")
Through(factor=1, indices=(x0_ - x1_ + 4,))
>>> summed_through([reader(S[i, j] + (j - i) * R[i])], "R", "S")
Through(factor=-x0_ + x1_, indices=(x0_,))
>>> summed_through([reader(S[i, j] * R[i - j + 4])], "R", "S") is None
True
>>> print(through_nest("S", 2, "R", 1, summed_through([reader(S[i, j] + R[i - j + 4])], "R", "S")))
S[x0_, x1_] := R[x0_ - x1_ + 4]*(x1_ <= x0_ + 4)*(x0_ + 5 <= x1_ + R.shape[0])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from codegen.ir.nest import (
    LoopNest,
    Operand,
    Range,
    Term,
    extent_symbol,
    index_symbol,
    tensor_base,
)


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


@dataclass(frozen=True)
class Through:
    """An input read beside a stored intermediate, only in `partner + factor * wrt` (a sum:
    `factor` 1, a difference: -1, ALiBi's `(j - i)`: a polynomial of indices), the input's
    access `indices`, both written in the intermediate's axes (`x0_`, `x1_`...)."""

    factor: sympy.Expr
    indices: tuple[sympy.Expr, ...]


def _axes(rank: int) -> tuple[sympy.Symbol, ...]:
    return tuple(index_symbol(f"x{n}_") for n in range(rank))


def summed_through(readers: Sequence[LoopNest], wrt: str, partner: str) -> Through | None:
    """How every one of `readers` reads `wrt` beside `partner` (module docstring), or None:
    each term of each reader reads both, each with one access; the partner's indices are
    distinct loop indices of the term, `wrt`'s are expressions of those alone; only
    `partner + factor * wrt` is read, the factor a nonzero polynomial of those indices (the
    ratio of the body's derivatives, free of both), with one factor and one map everywhere;
    no bound, constraint or guard reads them."""
    found: set[Through] = set()
    for nest in readers:
        for term in nest.terms:
            through = _term_through(nest, term, wrt, partner)
            if through is None:
                return None
            found.add(through)
    return found.pop() if len(found) == 1 else None


def _term_through(nest: LoopNest, term: Term, wrt: str, partner: str) -> Through | None:
    """One term's `Through`, or None."""
    others = [e for e in term.expressions() if e is not term.body]
    if any(_accesses(sympy.sympify(e), n) for e in others for n in (wrt, partner)):
        return None
    mine, theirs = _accesses(term.body, wrt), _accesses(term.body, partner)
    if len(mine) != 1 or len(theirs) != 1:
        return None
    (a,), (b,) = mine, theirs
    loops = {*nest.free_indices, *term.reduced_indices}
    if not all(x in loops for x in b.indices) or len(set(b.indices)) != len(b.indices):
        return None
    if not all(sympy.sympify(x).free_symbols <= set(b.indices) for x in a.indices):
        return None
    named = dict(zip(b.indices, _axes(len(b.indices))))
    indices = tuple(sympy.sympify(x).xreplace(named) for x in a.indices)
    shift = sympy.Dummy("shift")
    for sign, moved in ((-1, b + shift), (1, shift - b)):
        if not _accesses(term.body.xreplace({a: moved}), partner):
            return Through(sympy.Integer(sign), indices)
    # f(b + c * a) for a polynomial c of indices: df/da = c * df/db everywhere
    mine, theirs = sympy.Dummy("mine"), sympy.Dummy("theirs")
    body = term.body.xreplace({a: mine, b: theirs})
    try:
        factor = sympy.cancel(sympy.diff(body, mine) / sympy.diff(body, theirs))
    except (TypeError, ValueError, NotImplementedError, ZeroDivisionError):
        return None
    if factor == 0 or not factor.free_symbols <= set(b.indices):
        return None
    if factor.has(sympy.Indexed) or not factor.is_polynomial(*b.indices):
        return None
    return Through(sympy.expand(factor.xreplace(named)), indices)


def through_nest(partner: str, rank: int, wrt: str, wrt_rank: int, through: Through) -> LoopNest:
    """The nest `partner[x...] := factor * wrt[indices]` over the intermediate's shape, each of
    `wrt`'s indices that is no bare axis kept inside `wrt`'s shape: its gradient with
    respect to `wrt`, read with the intermediate's cotangent, is `wrt`'s gradient."""
    axes = _axes(rank)
    free = tuple(Range(x, 0, extent_symbol(partner, n)) for n, x in enumerate(axes))
    inside: list[sympy.Expr] = []
    for n, index in enumerate(through.indices):
        if index not in axes:
            inside += [index, extent_symbol(wrt, n) - 1 - index]
    body = through.factor * tensor_base(wrt)[through.indices]
    term = Term(body, (), tuple(inside))
    return LoopNest(partner, free, (term,), (Operand(wrt, wrt_rank),))
