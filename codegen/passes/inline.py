"""Inlining one statement of a program into another: recompute instead of store.

`inline(consumer, producer)` replaces every read of the producer's output in the consumer
by the producer's value at that position: its body with the free indices substituted, inside
nested reductions (`ir.Reduce`) over its reduced indices when it has some. So attention's
`O[i, e] := exp(S[i, j] - L[i]) * V[j, e]` with `S[i, j] := Q[i, d] * K[j, d]` inlined reads

    O[i, e] := exp(sum_d_1(Q[i, d_1]*K[j, d_1]) - L[i]) * V[j, e]

and the (T, T) scores are never stored. The consumer's ranges keep what the producer's shape
allowed: every extent of the producer's output is replaced by its expression in the
producer's own extents.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, j, d = (index_symbol(n) for n in "ijd")
>>> Q, K, S = tensor_base("Q"), tensor_base("K"), tensor_base("S")
>>> scores = LoopNest("S", (Range(i, 0, extent_symbol("Q", 0)), Range(j, 0, extent_symbol("K", 0))),
...     (Term(Q[i, d] * K[j, d], (Range(d, 0, extent_symbol("Q", 1)),)),),
...     (Operand("Q", 2), Operand("K", 2)))
>>> rowmax = LoopNest("M", (Range(i, 0, extent_symbol("S", 0)),),
...     (Term(S[i, j + 1], (Range(j, 0, extent_symbol("S", 1) - 1),)),), (Operand("S", 2),), "max")
>>> inlined = inline(rowmax, scores)
>>> inlined.terms[0].body, inlined.operand_names
(sum_d_1(K[j + 1, d_1]*Q[i, d_1]), ('Q', 'K'))
>>> inlined.terms[0].reduced[0].stop
K.shape[0] - 1
"""

from __future__ import annotations

import dataclasses
import itertools

import sympy

from codegen.ir.nest import (
    LoopNest,
    Reduce,
    extent_symbol,
    index_symbol,
    map_expressions,
    scalar_symbol,
    tensor_base,
)


class CannotInline(ValueError):
    """The producer cannot be inlined (a guard, constraints or several terms of a
    reduction other than a sum); store it instead."""


def _names(nest: LoopNest) -> set[str]:
    names = {nest.output, *nest.operand_names}
    for expr in nest.expressions():
        names |= {str(s) for s in expr.free_symbols}
        names |= {r.index.name for r in expr.atoms(Reduce)}
    for term in nest.terms:
        names |= {r.index.name for r in term.reduced}
    return names | {r.index.name for r in nest.free}


def _fresh(base: str, taken: set[str]) -> sympy.Symbol:
    for n in itertools.count(1):
        name = f"{base}_{n}"
        if name not in taken:
            taken.add(name)
            return index_symbol(name)
    raise AssertionError("unreachable")


def value_at(producer: LoopNest, position: tuple[sympy.Expr, ...], taken: set[str]) -> sympy.Expr:
    """The producer's output at `position` (one expression per axis), with its reduced
    indices bound by nested reductions named apart from `taken`."""
    terms = producer.terms
    if any(t.constraints or t.guard != sympy.true for t in terms):
        raise CannotInline(f"'{producer.output}' has bounds or guards of its own")
    if len(terms) > 1 and producer.reduction != "sum":
        raise CannotInline(f"'{producer.output}' has several terms")
    at = {r.index: q + r.start for r, q in zip(producer.free, position, strict=True)}
    parts = []
    for term in terms:
        body = term.body.xreplace(at)
        for r in reversed(term.reduced):
            index = _fresh(r.index.name, taken)
            body = Reduce(
                producer.reduction, body.xreplace({r.index: index}), index, r.start, r.stop
            )
        parts.append(body)
    return sympy.Add(*parts)


def inline(consumer: LoopNest, producer: LoopNest, /) -> LoopNest:
    """`consumer` with every read of `producer.output` recomputed (see the module docstring).

    Raises:
        CannotInline: the producer has bounds, guards, or several terms of a reduction other
            than a sum.
    """
    name = producer.output
    taken = _names(consumer) | _names(producer)
    extents = {
        extent_symbol(name, axis): sympy.Max(r.stop - r.start, 0)
        for axis, r in enumerate(producer.free)
    }

    def replace_reads(expr: sympy.Basic) -> sympy.Basic:
        if not producer.free:
            expr = expr.xreplace({scalar_symbol(name): value_at(producer, (), taken)})
        reads = [a for a in expr.atoms(sympy.Indexed) if a.base == tensor_base(name)]
        values = {a: value_at(producer, tuple(a.indices), taken) for a in reads}
        return expr.xreplace(values).xreplace(extents)

    inlined = map_expressions(consumer, replace_reads)
    operands = [op for op in consumer.operands if op.name != name]
    known = {op.name for op in operands}
    operands += [op for op in producer.operands if op.name not in known]
    return dataclasses.replace(inlined, operands=tuple(operands))
