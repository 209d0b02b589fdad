"""Sum factorisation: a reduced index that only some factors read becomes a nested sum.

In a summed term `sum_{j,e} f(i, j) * g(i, j, e)` the factor `f` does not read `e`, so
`sum_j f(i, j) * (sum_e g(i, j, e))` computes the same number while evaluating `f` once per
`(i, j)` instead of once per `(i, j, e)`. The nested sum is an `ir.Reduce`, which the
emitters compute in a loop of its own at the loop level where its other indices are bound.

A reduced index is nested when (a) a factor that does not read it is costly (a function call,
a power, a nested reduction) — attention's `dS[i, j] = sum_e dO[i, e]*V[j, e]*exp(S - L)`
evaluates the exponential once per `(i, j)`, not once per `e` — or (b) the factors that read
it read fewer indices than the whole term, so the nested sum is computed fewer times than
the term's loops run (attention's input gradients `sum_{j,e} P(i, j)*K[j, d]*dO[i, e]*V[j, e]`
become `sum_j P(i, j)*K[j, d]*(sum_e dO[i, e]*V[j, e])`, O(T^2 d) instead of O(T^2 d^2)).
Indices that a constraint or the guard mentions keep their loops.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, j, e = (index_symbol(n) for n in "ije")
>>> dO, V, S = tensor_base("dO"), tensor_base("V"), tensor_base("S")
>>> term = Term(dO[i, e] * V[j, e] * sympy.exp(S[i, j]), (Range(e, 0, extent_symbol("V", 1)),))
>>> factor_term(term, (i, j)).body
exp(S[i, j])*sum_e(V[j, e]*dO[i, e])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import sympy

from codegen.ir.contraction import contraction
from codegen.ir.nest import LoopNest, Reduce, Term


def _costly(expr: sympy.Expr) -> bool:
    """Whether evaluating `expr` costs more than loads and a few multiply-adds."""
    for node in sympy.preorder_traversal(expr):
        if isinstance(node, sympy.Function | Reduce):
            return True
        if isinstance(node, sympy.Pow) and not (node.exp.is_Integer and abs(node.exp) <= 4):
            return True
    return False


def _indices(expr: sympy.Expr, loop: set[sympy.Symbol]) -> set[sympy.Symbol]:
    return expr.free_symbols & loop


def factor_term(term: Term, free: Sequence[sympy.Symbol]) -> Term:
    """`term` with every reduced index worth nesting moved into a nested sum (a summed term
    only; see the module docstring)."""
    term = dataclasses.replace(term, body=common_factors_out(term.body, term.reduced_indices))
    while True:
        loop = {*free, *term.reduced_indices}
        factors = sympy.Mul.make_args(term.body)
        bounded = set().union(*(c.free_symbols for c in term.constraints), term.guard.free_symbols)
        best = None
        for r in term.reduced:
            if r.index in bounded or r.start.free_symbols & loop or r.stop.free_symbols & loop:
                continue
            reading = [f for f in factors if r.index in f.free_symbols]
            other = [f for f in factors if r.index not in f.free_symbols]
            if not reading or not other:
                continue
            inner = set().union(*(_indices(f, loop) for f in reading)) - {r.index}
            narrower = inner | {r.index} != loop
            if not narrower and not _costly(sympy.Mul(*other)):
                continue
            if best is None or len(inner) < best[0]:
                best = (len(inner), r, reading, other)
        if best is None:
            return term
        _, r, reading, other = best
        nested = Reduce("sum", sympy.Mul(*reading), r.index, r.start, r.stop)
        kept = tuple(x for x in term.reduced if x.index != r.index)
        term = dataclasses.replace(term, body=sympy.Mul(*other) * nested, reduced=kept)


def factor_sums(nest: LoopNest, /) -> LoopNest:
    """`nest` with `factor_term` applied to every term of a sum (a pure contraction stays as
    it is: XLA's dot computes it whole, see `codegen.ir.contraction`), and the factors of every
    nested sum that do not read its index taken out of it."""
    if contraction(nest) is not None:
        return nest
    terms = nest.terms
    if nest.reduction == "sum":
        terms = tuple(factor_term(t, nest.free_indices) for t in terms)
    terms = tuple(dataclasses.replace(t, body=invariant_factors_out(t.body)) for t in terms)
    return dataclasses.replace(nest, terms=terms)


def invariant_factors_out(expr: sympy.Expr) -> sympy.Expr:
    """`expr` with every nested sum's factors that do not read its index moved out of it:
    `sum_d(scale*Q[i, d]*K[j, d])` is `scale*sum_d(Q[i, d]*K[j, d])`.

    >>> from codegen.ir.nest import index_symbol, scalar_symbol, tensor_base
    >>> i, d = index_symbol("i"), index_symbol("d")
    >>> invariant_factors_out(Reduce("sum", scalar_symbol("s") * tensor_base("Q")[i, d], d, 0, 3))
    s*sum_d(Q[i, d])
    """
    if not expr.args or not expr.has(Reduce):
        return expr  # nothing to move: the expression as it is, not rebuilt
    args = tuple(invariant_factors_out(a) for a in expr.args)
    if args != expr.args:
        expr = expr.func(*args)
    if not isinstance(expr, Reduce) or expr.reduction != "sum":
        return expr
    factors = sympy.Mul.make_args(expr.body)
    outside = [f for f in factors if expr.index not in f.free_symbols]
    if not outside or len(outside) == len(factors):
        return expr
    inside = sympy.Mul(*(f for f in factors if expr.index in f.free_symbols))
    return sympy.Mul(*outside) * Reduce("sum", inside, expr.index, expr.start, expr.stop)


def common_factors_out(body: sympy.Expr, reduced: Sequence[sympy.Symbol]) -> sympy.Expr:
    """`body` with the factors that read a reduced index and that every addend of one of its
    sums shares taken out of that sum, where the sum then reads no reduced index: so the
    gradient of `gelu(H[b,u]) * W[u,o]` with respect to H, `dY[b,o]*(a(H)*W[u,o] +
    c(H)*W[u,o])`, becomes `dY[b,o]*W[u,o]*(a(H) + c(H))`, whose sum over o `factor_term`
    nests as a matrix product (`gelu'(H) * (dY W^T)`), instead of evaluating the derivative
    once per `(b, u, o)`.

    >>> from codegen.ir.nest import index_symbol, tensor_base
    >>> b, u, o = (index_symbol(n) for n in "buo")
    >>> H, W, dY = tensor_base("H")[b, u], tensor_base("W")[u, o], tensor_base("dY")[b, o]
    >>> common_factors_out(dY * (sympy.tanh(H) * W + H * W), (o,))
    (tanh(H[b, u]) + H[b, u])*W[u, o]*dY[b, o]
    """
    loop = set(reduced)
    factors = list(sympy.Mul.make_args(body))
    for n, factor in enumerate(factors):
        if not isinstance(factor, sympy.Add) or not factor.free_symbols & loop:
            continue
        addends = [list(sympy.Mul.make_args(a)) for a in factor.args]
        shared = [f for f in addends[0] if f.free_symbols & loop]
        shared = [f for f in shared if all(f in rest for rest in addends[1:])]
        if not shared:
            continue
        kept = sympy.Add(*(sympy.Mul(*_without(a, shared)) for a in addends))
        if kept.free_symbols & loop:
            continue
        factors[n] = sympy.Mul(*shared) * kept
    return sympy.Mul(*factors)


def _without(factors: list[sympy.Expr], taken: Sequence[sympy.Expr]) -> list[sympy.Expr]:
    """`factors` less one occurrence of each of `taken`."""
    rest = list(factors)
    for f in taken:
        rest.remove(f)
    return rest
