"""Nested sums that hold nested sums, hoisted into the term's own loops (tile programs
compute a nested reduction whole inside a tile, one level deep).

The gradient of a score parameter read per head (ALiBi's slopes `sl[h]`) sums over every
batch, query and key; sum factorisation (`codegen.passes.factor`) leaves it as
`dsl[h] = sum_{i,j} -abs(i - j) * sum_e(sum_b(dO * exp(S - L) * V))` with the scores `S`
a nested sum inside a nested sum. A sum is linear: `c * sum_x f = sum_x c * f` when `c` does
not read `x`, and the order of sums does not matter, so each product of a summed term that
holds such a sum as a factor becomes a term of its own over one more reduced index, until
no nested sum holds another. The sums whose bodies then hold no nested reduction are nested
again where they were (attention's `sum_e dO * V`, computed once per `(i, j)`).

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> h, i, e, d = (index_symbol(n) for n in "hied")
>>> A, B = tensor_base("A"), tensor_base("B")
>>> inner = Reduce("sum", A[h, i, d], d, 0, extent_symbol("A", 2))
>>> outer = Reduce("sum", B[h, i, e] * sympy.exp(inner), e, 0, extent_symbol("B", 2))
>>> nest = LoopNest("G", (Range(h, 0, extent_symbol("A", 0)),),
...     (Term(i * outer, (Range(i, 0, extent_symbol("A", 1)),)),),
...     (Operand("A", 3), Operand("B", 3)))
>>> [str(t.body) for t in hoist_nested(nest).terms]   # e hoisted, then nested again alone
['i*exp(sum_d(A[h, i, d]))*sum_e_(B[h, i, e_])']
>>> [r.index.name for r in hoist_nested(nest).terms[0].reduced]
['i']
"""

from __future__ import annotations

import dataclasses

import sympy

from codegen.ir.nest import LoopNest, Range, Reduce, Term, index_symbol


def _deep(node: sympy.Basic) -> bool:
    """Whether `node` is a nested sum that holds another nested reduction."""
    return isinstance(node, Reduce) and bool(node.body.atoms(Reduce))


def hoist_nested(nest: LoopNest) -> LoopNest:
    """`nest` with every nested sum that holds another moved into its term's loops
    (module docstring); `nest` itself when none does, or when the nest is not a sum."""
    if nest.reduction != "sum" or not any(
        _deep(n) for t in nest.terms for n in t.body.atoms(Reduce)
    ):
        return nest
    used = {s.name for e in nest.expressions() for s in e.free_symbols}
    used |= {r.index.name for t in nest.terms for r in (*t.reduced, *t.body.atoms(Reduce))}
    terms: list[Term] = []
    pending = list(nest.terms)
    while pending:
        term = pending.pop()
        products = sympy.Add.make_args(sympy.expand(term.body, deep=False))
        if len(products) > 1 and any(_deep(n) for n in term.body.atoms(Reduce)):
            pending += [dataclasses.replace(term, body=p) for p in products]
            continue
        factors = sympy.Mul.make_args(term.body)
        deep = next((f for f in factors if _deep(f) and f.reduction == "sum"), None)
        if deep is None:
            terms.append(term)
            continue
        name = deep.index.name
        while name in used:
            name += "_"
        used.add(name)
        index = index_symbol(name)
        rest = sympy.Mul(*(f for f in factors if f is not deep))
        body = rest * deep.body.xreplace({deep.index: index})
        reduced = (*term.reduced, Range(index, deep.start, deep.stop))
        pending.append(dataclasses.replace(term, body=body, reduced=reduced))
    return dataclasses.replace(nest, terms=tuple(_renested(t) for t in reversed(terms)))


def _renested(term: Term) -> Term:
    """`term` with each reduced index that only reduction-free factors read (and no
    constraint, guard or range) nested again as a sum of those factors."""
    bounded = set().union(*(c.free_symbols for c in term.constraints), term.guard.free_symbols)
    for r in term.reduced:
        if r.index in bounded or any(
            r.index in (x.start.free_symbols | x.stop.free_symbols) for x in term.reduced
        ):
            continue
        factors = sympy.Mul.make_args(term.body)
        reading = [f for f in factors if r.index in f.free_symbols]
        if not reading or len(reading) == len(factors) or any(f.atoms(Reduce) for f in reading):
            continue
        rest = sympy.Mul(*(f for f in factors if r.index not in f.free_symbols))
        nested = Reduce("sum", sympy.Mul(*reading), r.index, r.start, r.stop)
        reduced = tuple(x for x in term.reduced if x is not r)
        return _renested(dataclasses.replace(term, body=rest * nested, reduced=reduced))
    return term
