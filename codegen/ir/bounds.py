"""Loop bounds of a term for a given loop order, and host-side parameters.

A term's constraints `c >= 0` are affine in the loop indices. For a loop order, each
constraint bounds the innermost reduced index it involves: `a*r + rest >= 0` gives
`r >= ceil(-rest / a)` for `a > 0` and `r <= floor(rest / -a)` for `a < 0`. Constraints
that involve free indices only are tests made once per output element.

>>> from codegen.ir.nest import Range, Term, index_symbol, tensor_base
>>> p, k = index_symbol("p"), index_symbol("k")
>>> term = Term(tensor_base("W")[k], (Range(k, 0, 3),), constraints=(p - k, k - p + 5))
>>> b = loop_bounds(term, (k,))
>>> b.starts[k], b.stops[k]
(Max(0, p - 5), Min(3, p + 1))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from codegen.ir.affine import affine_parts
from codegen.ir.functions import CeilDiv, FloorDiv
from codegen.ir.nest import Term, extent_of


@dataclass(frozen=True)
class LoopBounds:
    """Per reduced index: `start <= r < stop`; plus tests on the free indices alone."""

    starts: dict[sympy.Symbol, sympy.Expr]
    stops: dict[sympy.Symbol, sympy.Expr]
    free_tests: tuple[sympy.Expr, ...]  # each must be >= 0, else the term contributes nothing


def loop_bounds(term: Term, order: Sequence[sympy.Symbol]) -> LoopBounds:
    """Tight bounds of `term`'s reduced indices when looped in `order` (outermost first)."""
    assert set(order) == set(term.reduced_indices), (order, term.reduced_indices)
    starts = {r.index: [r.start] for r in term.reduced}
    stops = {r.index: [r.stop] for r in term.reduced}
    free_tests = []
    for constraint in term.constraints:
        coefficients = affine_parts(constraint, order)
        if not coefficients:
            free_tests.append(constraint)
            continue
        innermost = max(coefficients, key=order.index)
        a = coefficients[innermost]
        rest = sympy.expand(constraint - a * innermost)
        if a > 0:
            starts[innermost].append(CeilDiv(-rest, a))
        else:
            stops[innermost].append(FloorDiv(rest, -a) + 1)
    return LoopBounds(
        {r: sympy.Max(*s) for r, s in starts.items()},
        {r: sympy.Min(*s) for r, s in stops.items()},
        tuple(free_tests),
    )


def hoist_parameters(
    expr: sympy.Basic, params: dict[sympy.Basic, sympy.Symbol], prefix: str = "P"
) -> sympy.Basic:
    """Replace each largest sub-expression of extents alone by a parameter symbol.

    The host evaluates parameters once per call, so generated code sees plain integers.
    `params` maps each hoisted expression to its symbol and is extended in place. Parameters
    are `sympy.Dummy`s (sympy prints them `_P0`, the C printer `P0`), so that no symbol of the
    user's, an index named `P0` say, is ever taken for one.

    >>> from codegen.ir.nest import extent_symbol, index_symbol
    >>> params = {}
    >>> n, k, i = extent_symbol("X", 0), extent_symbol("W", 0), index_symbol("i")
    >>> hoist_parameters(sympy.Min(i + 1, n - k + 1), params)
    Min(_P0, i + 1)
    >>> params
    {-W.shape[0] + X.shape[0] + 1: _P0}
    """
    symbols = expr.free_symbols
    extents_only = symbols and all(extent_of(s) is not None for s in symbols)
    # Parameters are integers: a value such as `1/X.shape[1]` (a mean's scale) keeps its
    # division in the generated code, with its integer parts hoisted.
    if extents_only and not expr.is_Symbol and expr.is_integer:
        if expr not in params:
            params[expr] = sympy.Dummy(f"{prefix}{len(params)}", integer=True)
        return params[expr]
    if not expr.args or isinstance(expr, sympy.IndexedBase):
        return expr
    if isinstance(expr, sympy.Indexed):
        return expr.base[tuple(hoist_parameters(i, params, prefix) for i in expr.indices)]
    return expr.func(*(hoist_parameters(a, params, prefix) for a in expr.args))
