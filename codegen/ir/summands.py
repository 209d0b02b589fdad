"""A summed term whose body adds products, as one term per group of products that contract
the same tensors (`codegen.ir.contraction.xla_plan`: each group then one einsum).

A tangent nest adds the derivative through each factor: the scores' tangent is
`Q[i,d]*tK[j,d] + K[j,d]*tQ[i,d]`, attention's weighted sum's
`exp(S - L)*tV[j,e] + exp(S - L)*V[j,e]*tS - exp(S - L)*V[j,e]*tL`. As one term no einsum
computes it; as one term per group of products that contract the same plain accesses, the
rest of each product added up and factored out (`tV * exp(S - L)` and
`V * (exp(S - L)*tS - exp(S - L)*tL)`, a prologue each), every term is a dot, as jnp's
own forward-mode derivative runs it.

>>> from codegen.ir.nest import Term, index_symbol, tensor_base
>>> i, j, e = (index_symbol(n) for n in "ije")
>>> P, V, tV, a, b = (tensor_base(n) for n in ("P", "V", "tV", "a", "b"))
>>> term = Term(P[i, j] * tV[j, e] + P[i, j] * V[j, e] * a[i, j] - P[i, j] * V[j, e] * b[i])
>>> def key(product):  # what an einsum reads as it is: here V or tV
...     return tuple(f for f in product.atoms(sympy.Indexed) if f.base in (V, tV))
>>> [t.body for t in grouped(term, key)]
[P[i, j]*tV[j, e], (P[i, j]*a[i, j] - P[i, j]*b[i])*V[j, e]]
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import sympy

from codegen.ir.nest import Term

#: The most products a term is split into (a tangent nest adds one per perturbed factor).
MAX_PRODUCTS = 8


def grouped(
    term: Term, key: Callable[[sympy.Expr], tuple[sympy.Expr, ...] | None]
) -> tuple[Term, ...] | None:
    """`term` as one term per group of its products with the same `key`, or None.

    Args:
        term: a term of a summed nest (its ranges, constraints and guard are kept).
        key: the factors of one product that an einsum reads as they are (every product of a
            group has them), or None where a product is no contraction.

    Returns:
        The terms, in the order their groups first appear; None where the body adds fewer
        than two products or more than `MAX_PRODUCTS`, or a product has no key.
    """
    products = sympy.Add.make_args(sympy.expand_mul(term.body, deep=False))
    if not 2 <= len(products) <= MAX_PRODUCTS:
        return None
    groups: dict[tuple[sympy.Expr, ...], list[sympy.Expr]] = {}
    for product in products:
        found = key(product)
        if found is None:
            return None
        groups.setdefault(found, []).append(product)
    terms = []
    for factors, members in groups.items():
        common = sympy.Mul(*factors)
        body = (
            members[0] if len(members) == 1 else common * sympy.Add(*(m / common for m in members))
        )
        terms.append(dataclasses.replace(term, body=body))
    return tuple(terms)
