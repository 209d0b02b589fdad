"""Scores that feed only a softmax: their cotangent sums, along each row, to the logsumexp's
own cotangent, and a parameter's gradient summed from it can be made to respect that.

Attention's stored scores `s_` are read by a logsumexp and by statements that read them
only as `exp(score - lse_)` (the weighted sum):

    (logsumexp) lse_[b,h,i] := s_[b,h,i,j] + A[h] * (j - i)
    out_[b,h,i,e] := exp(s_[b,h,i,j] + A[h] * (j - i) - lse_[b,h,i]) * v_[b,j,h,e]

Moving every score of a row by `t(b,h,i)` moves `lse_` by `t` and leaves `out_` as it is,
so the loss moves by `t` times the logsumexp's own cotangent `g` (zero unless `lse_` is an
output): the scores' cotangent `dS` sums along each row to `g`, exactly. Computed in float32
it does not: `dS = P * (dP - D)` takes `P = exp(score - lse_)` with `lse_` rounded to
float32, whose error is `|lse_|` ulps of 1 and the same for the whole row (ALiBi's scores
reach hundreds), so each row of `dS` is off by a multiple of `P`, `(sum_j dS - g) P`.
A gradient that weights `dS` by a factor that grows along the row (ALiBi's slopes, `dA[h] =
sum dS * (j - i)`) multiplies that error by up to T. Subtracting it, `dS - P * rho` with
`rho = sum_j dS - g` (exactly 0 in exact arithmetic, so the gradient is unchanged),
removes it: `tensordsl.binding.through` does so where `softmax_rows` proves the structure.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, j, e = index_symbol("i"), index_symbol("j"), index_symbol("e")
>>> S, A, L, V = tensor_base("S"), tensor_base("A"), tensor_base("L"), tensor_base("V")
>>> rows, keys = Range(i, 0, extent_symbol("S", 0)), Range(j, 0, extent_symbol("S", 1))
>>> width = Range(e, 0, extent_symbol("V", 1))
>>> lse = LoopNest("L", (rows,), (Term(S[i, j] + A[0] * (j - i), (keys,), (i - j,)),),
...     (Operand("S", 2), Operand("A", 1)), "logsumexp")
>>> out = LoopNest("O", (rows, width),
...     (Term(sympy.exp(S[i, j] + A[0] * (j - i) - L[i]) * V[j, e], (keys,), (i - j,)),),
...     (Operand("S", 2), Operand("A", 1), Operand("L", 1), Operand("V", 2)))
>>> found = softmax_rows([lse, out], "S", stored=[lse, out], outputs=("O",))
>>> found.lse, found.rows, found.weight, found.constraints
('L', (0,), exp(Shifted((-x0_ + x1_)*A[0] + S[x0_, x1_], -L[x0_])), (x0_ - x1_,))
>>> scaled = LoopNest("O", (rows, width), (Term(S[i, j] * V[j, e], (keys,), (i - j,)),),
...     (Operand("S", 2), Operand("V", 2)))
>>> softmax_rows([lse, scaled], "S", stored=[lse, scaled], outputs=("O",)) is None
True
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from codegen.ir import probe
from codegen.ir.ieee import Shifted, shifted
from codegen.ir.nest import LoopNest, Operand, Term, index_symbol, tensor_base

_SHIFT = sympy.Function("row_shift")


@dataclass(frozen=True)
class SoftmaxRows:
    """How the stored scores feed a softmax: the logsumexp `lse` (its free indices are the
    scores' axes `rows`, in its order), each score's weight `exp(score - lse)` and the
    mask's `constraints` (each >= 0 where a score is kept), written in the scores' axes
    (`x0_`, `x1_`...), and the `operands` the weight reads: the scores' cotangent, summed
    over the other axes, is the logsumexp's own cotangent."""

    lse: str
    rows: tuple[int, ...]
    weight: sympy.Expr
    constraints: tuple[sympy.Expr, ...]
    operands: tuple[Operand, ...]


def _whole(expr: sympy.Expr) -> sympy.Expr:
    return expr.replace(lambda e: isinstance(e, Shifted), lambda e: sympy.Add(*e.args))


def _reads(expr: sympy.Basic, name: str) -> list[sympy.Indexed]:
    return [a for a in sympy.sympify(expr).atoms(sympy.Indexed) if str(a.base) == name]


def _same(moved: sympy.Expr, body: sympy.Expr) -> bool:
    """Whether `moved` is `body` (a `Shifted` weight's argument taken as the sum it is)."""
    difference = _whole(moved) - _whole(body)
    if probe.nonzero(difference):
        return False
    return probe.simplest(difference, good=lambda d: d == 0) == 0


def _one_read(term: Term, name: str) -> sympy.Indexed | None:
    """The term's one access of `name`, read in the body alone, or None."""
    others = [e for e in term.expressions() if e is not term.body]
    if any(_reads(e, name) for e in others):
        return None
    found = _reads(term.body, name)
    return found[0] if len(found) == 1 else None


def softmax_rows(
    readers: Sequence[LoopNest],
    partner: str,
    *,
    stored: Sequence[LoopNest],
    outputs: Sequence[str],
) -> SoftmaxRows | None:
    """How `partner`, read by `readers` (all its readers among `stored`), feeds a softmax,
    or None where that is not shown: `partner` is no output; one reader is a logsumexp of
    one term reading it once, at distinct loop indices, that moves by `t` when every score
    of a row does; every other reader reads the logsumexp and comes out unchanged (each of
    its terms); no other statement reads the logsumexp; every reader keeps the same scores
    (the same constraints, in the scores' axes); no bound, constraint or guard reads either.
    """
    lses = [nest for nest in readers if nest.reduction == "logsumexp"]
    if partner in outputs or len(lses) != 1 or len(lses[0].terms) != 1:
        return None
    lse = lses[0]
    if any(lse.output in nest.operand_names for nest in stored if nest not in readers):
        return None
    term = lse.terms[0]
    access = _one_read(term, partner)
    if access is None or len(set(access.indices)) != len(access.indices):
        return None
    if not set(access.indices) <= {*lse.free_indices, *term.reduced_indices}:
        return None
    if not set(lse.free_indices) <= set(access.indices):
        return None
    rows = tuple(access.indices.index(x) for x in lse.free_indices)
    axes = {x: index_symbol(f"x{n}_") for n, x in enumerate(access.indices)}
    shift = _SHIFT(*lse.free_indices)
    if not _same(term.body.xreplace({access: access + shift}) - shift, term.body):
        return None
    kept = {tuple(sympy.sympify(c).xreplace(axes) for c in term.constraints)}
    for nest in readers:
        if nest is not lse and not _unmoved(nest, partner, lse, rows, kept):
            return None
    if len(kept) != 1:
        return None
    weight = shifted(term.body, tensor_base(lse.output)[lse.free_indices]).xreplace(axes)
    operands = (*lse.operands, Operand(lse.output, len(lse.free_indices)))
    names = {str(a.base) for a in weight.atoms(sympy.Indexed)}
    names |= {str(x) for x in weight.free_symbols}
    read = tuple(op for op in operands if op.name in names)
    return SoftmaxRows(lse.output, rows, weight, kept.pop(), read)


def _unmoved(nest: LoopNest, partner: str, lse: LoopNest, rows: tuple[int, ...], kept: set) -> bool:
    """Whether each term of `nest` reads `partner` once and `lse` once, at the row's indices,
    and is unchanged when both move by the same `t` of the row; adds its constraints, in
    the scores' axes, to `kept`."""
    for term in nest.terms:
        access, total = _one_read(term, partner), _one_read(term, lse.output)
        if access is None or total is None:
            return False
        if len(set(access.indices)) != len(access.indices):
            return False
        if tuple(access.indices[n] for n in rows) != tuple(total.indices):
            return False
        shift = _SHIFT(*total.indices)
        moved = term.body.xreplace({access: access + shift, total: total + shift})
        if not _same(moved, term.body):
            return False
        axes = {x: index_symbol(f"x{n}_") for n, x in enumerate(access.indices)}
        kept.add(tuple(sympy.sympify(c).xreplace(axes) for c in term.constraints))
    return True


__all__ = ["SoftmaxRows", "softmax_rows"]
