"""Einstein's rule, term by term: which reduced indices each additive term of a sum is summed over.

After products are distributed over sums, every additive term of a sum's body is summed over
exactly the reduced indices it reads; a term that reads none is added once. The one-line LoRA
`Y[b,o] := X[b,i] * (W[i,o] + A[i,r] * B[r,o])` is `X W + X A B`: the `X W` term is summed
over i only. Terms that read the same reduced indices stay one term, combined as written
where sympy would cancel them (`codegen/ir/ieee.py`), so `X[i,j] + c[i] - X[i,j]` is
`sum_j (X - X) + c`: c whatever the order of the terms, NaN where X holds an infinity.

Only the top level of the body is opened: sums (`+`, `-`, and the IEEE sums kept as written)
and products (`*`, `/`: a quotient is its numerator's terms, each divided). A function's
argument, a power's base and a denominator are not top-level (`exp(X[i,j] + c[i])` is summed as
one term, and so is `abs(1 + v[i]^2)`, which sympy simplifies to a sum: `Whole`). A body whose
terms all read the same reduced indices is kept as written.

>>> from codegen.ir.nest import index_symbol, tensor_base
>>> b, i, o, r = (index_symbol(n) for n in "bior")
>>> X, W, A, B = (tensor_base(n) for n in "XWAB")
>>> lora = X[b, i] * (W[i, o] + A[i, r] * B[r, o])
>>> [(sorted(map(str, reads)), body) for reads, body in einstein_terms(lora, (i, r))]
[(['i', 'r'], A[i, r]*B[r, o]*X[b, i]), (['i'], W[i, o]*X[b, i])]
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import sympy

from codegen.ir.ieee import IeeeAdd, IeeeDiv, IeeeMul, cancels, ieee

__all__ = ["AmbiguousSum", "Whole", "einstein_terms", "unwrapped"]


class Whole(sympy.Function):
    """A function call whose value sympy simplified into a sum (`abs(1 + v[i]^2)`
    is `1 + v[i]^2` for real v, `expm1(x)` is `exp(x) - 1`): one term, as the call the user
    wrote is; the translator wraps such values, and `unwrapped` removes the wrapper once the
    terms are formed."""

    def _eval_is_real(self) -> bool | None:
        return self.args[0].is_real


def unwrapped(expr: sympy.Expr) -> sympy.Expr:
    """`expr` without `Whole` wrappers."""
    return expr.replace(lambda e: isinstance(e, Whole), lambda e: e.args[0])


#: One group of terms: the reduced indices they read and their sum.
Group = tuple[frozenset[sympy.Symbol], sympy.Expr]


class AmbiguousSum(Exception):  # noqa: N818 (internal: lower turns it into a user error)
    """A product whose distributed terms would be summed over fewer indices than the
    product as a whole: the factors `product` share reduced index `index`, and each of them
    holds a term that does not read it (`(X[d] + 1) * (Y[d] + 1)`)."""

    def __init__(self, product: sympy.Expr, index: sympy.Symbol) -> None:
        super().__init__(f"{product}: {index}")
        self.product = product
        self.index = index


def einstein_terms(body: sympy.Expr, reduced: Sequence[sympy.Symbol]) -> tuple[Group, ...]:
    """The body's additive terms grouped by the reduced indices they read.

    Args:
        body: a sum's right-hand side.
        reduced: the reduced indices.

    Returns:
        `(reads, expression)` per group: those that read reduced indices first, in order
        of first appearance, then the one that reads none (if any). A body whose terms all
        read the same indices is one group holding `body` itself.

    Raises:
        AmbiguousSum: a product of sums that share a reduced index where each sum holds a
        term that does not read it.
    """
    groups = _split(body, frozenset(reduced))
    return tuple(sorted(groups, key=lambda g: not g[0]))  # stable: the order is kept


def _reads(expr: sympy.Expr, reduced: frozenset[sympy.Symbol]) -> frozenset[sympy.Symbol]:
    return frozenset(expr.free_symbols & reduced)


def _split(expr: sympy.Expr, reduced: frozenset[sympy.Symbol]) -> list[Group]:
    if isinstance(expr, sympy.Add):
        parts = [g for a in expr.args for g in _split(a, reduced)]
        return _merged(parts, expr)
    if isinstance(expr, IeeeAdd):
        return _merged([g for a in expr.args for g in _split(a, reduced)], expr)
    if isinstance(expr, (sympy.Mul, IeeeMul)):
        return _product(expr, [_split(a, reduced) for a in expr.args], reduced)
    if isinstance(expr, IeeeDiv):
        numerator, denominator = expr.args
        reads = _reads(denominator, reduced)
        split = [(s | reads, e) for s, e in _split(numerator, reduced)]
        if len(split) == 1:
            return [(split[0][0], expr)]
        _check_shared(expr, [split, [(reads, denominator)]], reduced)
        return _merged([(s, ieee("/", e, denominator)) for s, e in split], expr)
    return [(_reads(expr, reduced), expr)]


def _merged(parts: list[Group], whole: sympy.Expr) -> list[Group]:
    """Parts that read the same indices added in order, as IEEE arithmetic adds them; `whole`
    when there is one group (the body as written)."""
    groups: dict[frozenset[sympy.Symbol], sympy.Expr] = {}
    for reads, part in parts:
        if reads not in groups:
            groups[reads] = part
            continue
        before = groups[reads]
        total = before + part
        groups[reads] = ieee("+", before, part) if cancels("+", before, part, total) else total
    if len(groups) == 1:
        return [(next(iter(groups)), whole)]
    return list(groups.items())


def _product(
    expr: sympy.Expr, factors: list[list[Group]], reduced: frozenset[sympy.Symbol]
) -> list[Group]:
    """A product's terms: the product itself when every factor is one group, else every
    choice of one term per factor, multiplied as IEEE arithmetic multiplies them."""
    if all(len(f) == 1 for f in factors):
        return [(frozenset().union(*(f[0][0] for f in factors)), expr)]
    _check_shared(expr, factors, reduced)
    terms = []
    for choice in itertools.product(*factors):
        value = choice[0][1]
        for _, factor in choice[1:]:
            result = value * factor
            value = ieee("*", value, factor) if cancels("*", value, factor, result) else result
        terms.append((frozenset().union(*(reads for reads, _ in choice)), value))
    return _merged(terms, expr)


def _check_shared(
    expr: sympy.Expr, factors: list[list[Group]], reduced: frozenset[sympy.Symbol]
) -> None:
    """Refuse a product where distributing changes what a shared reduced index sums: two
    factors or more read it and each has a term that does not (`(X[d] + 1) * (Y[d] + 1)`
    summed term by term adds the `1*1` once, summed as a whole adds it once per d)."""
    for index in sorted(reduced, key=sympy.default_sort_key):
        reading = [f for f in factors if any(index in reads for reads, _ in f)]
        if len(reading) > 1 and all(any(index not in r for r, _ in f) for f in reading):
            raise AmbiguousSum(expr, index)
