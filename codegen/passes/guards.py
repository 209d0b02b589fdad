"""Guards as loop bounds: affine conditions between indices become constraints of the term.

A `where(cond, x, y)` (a Piecewise) whose other branch makes the body the identity of the
reduction (0 for a sum, -inf for max and logsumexp, inf for min, 1 for prod) contributes
nothing where `cond` fails, so the term iterates only where it holds: `cond` joins the
term's constraints (`c >= 0`, affine in the indices, which the emitters turn into loop bounds
or per-element tests) and the Piecewise is replaced by its branch. A causal mask
`where(j <= i, ..., 0)` then does half the work, a band `abs(i - j) <= w` O(T w), and a
bias written `c[o] * (i == 0)` loops over one `i`.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, j = index_symbol("i"), index_symbol("j")
>>> S = tensor_base("S")
>>> body = sympy.Piecewise((S[i, j], j <= i), (0, True))
>>> nest = LoopNest("Y", (Range(i, 0, extent_symbol("S", 0)),),
...     (Term(body, (Range(j, 0, extent_symbol("S", 1)),)),), (Operand("S", 2),))
>>> bounded = bound_guards(nest).terms[0]
>>> bounded.body, bounded.constraints
(S[i, j], (i - j,))
"""

from __future__ import annotations

import dataclasses

import sympy

from codegen.ir.affine import NotAffine, as_affine
from codegen.ir.nest import LoopNest, Reduce, Term, extent_of
from codegen.ir.reductions import REDUCTIONS


def identity_of(reduction: str) -> sympy.Expr | None:
    """The reduction's neutral value as sympy (None for positional reductions)."""
    row = REDUCTIONS[reduction]
    if row.positional:
        return None
    if row.identity in (float("inf"), float("-inf")):
        return sympy.oo if row.identity > 0 else -sympy.oo
    return sympy.Integer(int(row.identity))


def _constraints(condition: sympy.Basic, indices: set[sympy.Symbol]) -> list[sympy.Expr] | None:
    """`condition` as constraints `c >= 0`, affine with integer coefficients in the indices
    (and extents); None when it is not such a condition."""
    if isinstance(condition, sympy.And):
        found = [_constraints(arg, indices) for arg in condition.args]
        return None if any(f is None for f in found) else [c for f in found for c in f]  # type: ignore[union-attr]
    if not isinstance(condition, sympy.core.relational.Relational) or isinstance(
        condition, sympy.Ne
    ):
        return None
    if condition.atoms(sympy.Indexed) or not condition.free_symbols & indices:
        return None
    # Only the term's own indices and extents: not an index bound inside a nested reduction.
    if any(extent_of(s) is None and s not in indices for s in condition.free_symbols):
        return None
    low, high = condition.lhs, condition.rhs
    if isinstance(condition, sympy.GreaterThan | sympy.StrictGreaterThan):
        low, high = high, low
    strict = isinstance(condition, sympy.StrictLessThan | sympy.StrictGreaterThan)
    if isinstance(condition, sympy.Eq):
        return (
            _pair(low, high, indices) + _pair(high, low, indices)
            if _affine(low - high, indices)
            else None
        )
    if isinstance(low, sympy.Abs):  # abs(x) <= w: -w <= x <= w
        x = low.args[0]
        above, below = _pair(x, high, indices, strict), _pair(-x, high, indices, strict)
        return [*above, *below] if above and below else None
    return _pair(low, high, indices, strict) or None


def _pair(low: sympy.Expr, high: sympy.Expr, indices: set[sympy.Symbol], strict: bool = False):
    """`low <= high` (`<` when strict) as `[high - low (- 1) >= 0]`, or [] if not affine."""
    c = sympy.expand(high - low - (1 if strict else 0))
    return [c] if _affine(c, indices) else []


def _affine(expr: sympy.Expr, indices: set[sympy.Symbol]) -> bool:
    try:
        as_affine(expr, tuple(sorted(indices, key=str)))
    except NotAffine:
        return False
    return bool(expr.is_integer)


def _bound_term(term: Term, identity: sympy.Expr, indices: set[sympy.Symbol]) -> Term:
    """Move every suitable Piecewise condition of the body into the constraints."""
    while True:
        for piecewise in sorted(term.body.atoms(sympy.Piecewise), key=sympy.default_sort_key):
            found = _split(term.body, piecewise, identity, indices)
            if found is not None:
                body, constraints = found
                term = dataclasses.replace(
                    term, body=body, constraints=(*term.constraints, *constraints)
                )
                break
        else:
            return term


def _split(body, piecewise, identity, indices):
    """`(body where the condition holds, constraints)` when the body is the reduction's
    identity wherever `piecewise`'s first condition fails, else None."""
    (value, condition), *rest = piecewise.args
    if condition == sympy.true or not rest:
        return None
    constraints = _constraints(condition, indices)
    if constraints is None and isinstance(condition, sympy.And):
        # `(j <= i) & (X[i,j] > 0)`: the affine part bounds the loops, the rest stays a test
        found = {arg: _constraints(arg, indices) for arg in condition.args}
        if not any(found.values()):
            return None
        constraints = [c for f in found.values() if f for c in f]
        kept = sympy.And(*(arg for arg, f in found.items() if not f))
        value = sympy.Piecewise((value, kept), *rest)
    if constraints is None:
        return None
    otherwise = sympy.Piecewise(*rest) if len(rest) > 1 or rest[0][1] != sympy.true else rest[0][0]
    if sympy.simplify(_finite(body.xreplace({piecewise: otherwise}))) != identity:
        return None
    return body.xreplace({piecewise: value}), constraints


def _finite(expr: sympy.Expr) -> sympy.Expr:
    """`expr` with every tensor read replaced by a finite real stand-in, so that sympy decides
    `x + (-oo) = -oo` and `exp(-oo) * y = 0`, and nested reductions of what no longer reads
    their index collapsed (over a range assumed non-empty: the program runner checks it)."""
    reads = sorted(expr.atoms(sympy.Indexed), key=sympy.default_sort_key)
    stand_ins = {a: sympy.Symbol(f"read{n}_", real=True, finite=True) for n, a in enumerate(reads)}
    return _collapse(expr.xreplace(stand_ins))


_COUNT = sympy.Symbol("count_", integer=True, positive=True)


def _collapse(expr: sympy.Basic) -> sympy.Basic:
    """Nested reductions whose body no longer reads their index, as that constant reduced."""
    if not expr.args:
        return expr
    expr = expr.func(*(_collapse(a) for a in expr.args))
    if isinstance(expr, Reduce) and expr.index not in expr.body.free_symbols:
        repeated = REDUCTIONS[expr.reduction].repeated
        return expr if repeated is None else repeated(expr.body, _COUNT)  # None: not folded
    return expr


def _function_of_kept(kept: sympy.Expr, condition: sympy.Basic) -> bool:
    """Whether `condition` reads arrays, only those that `kept` reads (relu's `S > 0` beside
    `S`): an elementwise function of the value, not a mask. Left a value, a sum of it times
    another operand stays a contraction whose prologue XLA's dot takes
    (`codegen.ir.contraction`); made a guard, it would be a kernel of its own."""
    reads = condition.atoms(sympy.Indexed)
    return bool(reads) and reads <= kept.atoms(sympy.Indexed)


def guard_mask(term: Term, identity: sympy.Expr | None) -> Term:
    """`term` with a mask that is not a loop bound (`where(doc[i] == doc[j], x, identity)`,
    alone or as a factor of a sum's body, the reduction's `identity` in the other branch)
    made its guard, when it has none: the kernels test it per element and leave out what it
    fails (not `0 * W`, NaN where W is), and the gradients of the body are those of the kept
    branch (attention's `dL = -sum_e dO * O` from the saved output, not a pass over every
    pair), under the same guard. A condition on the kept value alone (relu's `S > 0`) is a
    function of it, not a mask, and stays in the body (`_function_of_kept`)."""
    if identity is None or term.guard != sympy.true:
        return term
    factors = sympy.Mul.make_args(term.body) if identity == 0 else (term.body,)
    masks = [
        f
        for f in factors
        if isinstance(f, sympy.Piecewise)
        and len(f.args) == 2
        and f.args[1] == (identity, sympy.true)
        and not f.args[0].cond.atoms(sympy.Piecewise, Reduce)
        and not _function_of_kept(*f.args[0])
    ]
    if len(masks) != 1:
        return term
    kept, condition = masks[0].args[0]
    body = sympy.Mul(kept, *(f for f in factors if f is not masks[0]))
    return dataclasses.replace(term, body=body, guard=condition)


def guard_masks(nest: LoopNest, /) -> LoopNest:
    """`nest` with each term's mask that is not a loop bound made its guard (`guard_mask`)."""
    identity = identity_of(nest.reduction)
    terms = tuple(guard_mask(term, identity) for term in nest.terms)
    return dataclasses.replace(nest, terms=terms)


def bound_guards(nest: LoopNest, /) -> LoopNest:
    """`nest` with affine guards between indices moved into its terms' constraints (see the
    module docstring). Nests whose reduction has no neutral value (argmax) are returned as
    they are."""
    identity = identity_of(nest.reduction)
    if identity is None:
        return nest
    terms = []
    for term in nest.terms:
        indices = {*nest.free_indices, *term.reduced_indices}
        for part in _split_sum(term, nest.reduction, identity, indices):
            terms.append(_bound_term(part, identity, indices))
    return dataclasses.replace(nest, terms=tuple(terms))


def _split_sum(term: Term, reduction: str, identity: sympy.Expr, indices) -> list[Term]:
    """A summed term whose body adds parts, some of them guarded by a reduced index
    (`c[o] * (i == 0)` summed over i): those parts as terms of their own, so that their guard
    bounds their loops, and the rest as one term."""
    if reduction != "sum" or not isinstance(term.body, sympy.Add):
        return [term]
    reduced = set(term.reduced_indices)
    guarded: list[sympy.Expr] = []
    rest: list[sympy.Expr] = []
    for part in term.body.args:
        bounded = _bound_term(dataclasses.replace(term, body=part), identity, indices)
        new = bounded.constraints[len(term.constraints) :]
        # Only a guard that bounds a reduced loop pays for a term of its own; one on free
        # indices alone (`p == 0`) is a select the lanes share with the other parts.
        (guarded if any(c.free_symbols & reduced for c in new) else rest).append(part)
    if not guarded:
        return [term]
    parts = [sympy.Add(*rest)] if rest else []
    return [dataclasses.replace(term, body=body) for body in (*parts, *guarded)]
