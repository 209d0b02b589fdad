"""Gradient nests: one gather-style loop nest per differentiable input.

For a nest `Y[o] = reduce_r f(..., A[a(o, r)], ...)` and a cotangent `dY`, the gradient of
`A` is a new nest whose free indices are A's axes. Each occurrence of A in each term gives
one term of it: the occurrence's index map is solved by a change of variables (`p = i + k`
eliminates `i = p - k`), the eliminated index's range becomes constraints on the indices that
remain, and the body is `dY[o] * df/dA` (sympy, with the other occurrences held constant).
Every element is accumulated in one register and written once: no scatter, no atomics.

Reductions other than sum:

* max/min: the cotangent goes to the FIRST position in iteration order (row-major over the
  reduced indices, in the order they appear) whose value equals the output; the forward
  saves that position (an `argmax`/`argmin` nest) and the gradient tests it.
* logsumexp: `dA = dY * exp(f - Y) * df/dA`, using the saved output Y.
* prod: the product of the other factors, as `jax.grad(jnp.prod)` gives it, from three
  saved nests: the product of the finite nonzero factors (an infinite one counts as its
  sign), the number of zero factors and the number of infinite ones. A zero or infinite
  factor is never divided by: `[2, inf, 1]` gives `[inf, 2, inf]`, `[0, inf, 3]` gives
  `[inf, 0, nan]`. A NaN factor's own gradient is NaN (jnp: the product of the others).

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> nest = lower(parse("Y[i] := X[i+k] * W[k]")).nest
>>> print(gradient(nest, "X").nest)
dX[p] := dY[p - k]*W[k]*(k <= p)*(p + W.shape[0] <= k + dX.shape[0])
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import sympy

from codegen import config
from codegen.cache import memo
from codegen.ir.nest import (
    LoopNest,
    Operand,
    Range,
    Reduce,
    Term,
    extent_of,
    extent_symbol,
    index_symbol,
    scalar_symbol,
)
from codegen.passes.factor import factor_sums
from codegen.passes.gradient_rules import (
    ARGUMENT,
    COTANGENT,
    FINITE_PROD,
    GRADIENT_RULES,
    INF_COUNT,
    OUTPUT,
    ZERO_COUNT,
    GradientNames,
    gradient_names,
    nested_weight,
    outermost_reductions,
    saved,
)
from codegen.passes.guards import bound_guards
from codegen.passes.index_maps import IndexSolver, fresh_names, simplify_constraints


@dataclass(frozen=True)
class Gradient:
    """A gradient nest and what each of its operands is.

    `roles` maps each operand of `nest` to "cotangent", "output", "input" (a forward
    operand of the same name), or the name of an auxiliary nest of the forward
    ("argument", "finite_prod", "zero_count", "inf_count"; see `auxiliary_nests`).
    """

    nest: LoopNest
    wrt: str
    roles: tuple[tuple[str, str], ...]


def _free_indices(nest: LoopNest, wrt: str) -> tuple[sympy.Symbol, ...]:
    """Readable names for the gradient's free indices: A's index names where they are bare."""
    rank = nest.operand(wrt).rank
    first = next((a for t in nest.terms for a in _occurrences(t.body, wrt)), None)
    taken = _names_in(nest)
    # An index bound by a nested reduction names nothing outside it.
    bound = {r.index for t in nest.terms for r in _reductions(t.body)}
    fresh = fresh_names(taken)
    names: list[str] = []
    for axis in range(rank):
        index = first.indices[axis] if first is not None else None
        if isinstance(index, sympy.Symbol) and index.name not in names and index not in bound:
            names.append(index.name)
        else:
            names.append(next(fresh))
    return tuple(index_symbol(n) for n in names)


def _occurrences(expr: sympy.Basic, wrt: str) -> list[sympy.Indexed]:
    found = [a for a in expr.atoms(sympy.Indexed) if a.base.name == wrt]
    return sorted(found, key=sympy.default_sort_key)


def _term_gradient(
    nest: LoopNest,
    term: Term,
    piece: Piece,
    scale: sympy.Expr,
    free: tuple[sympy.Symbol, ...],
    wrt_rank: int,
) -> Term | None:
    """The gradient term of one piece of the derivative with respect to one occurrence (an
    Indexed access, or a scalar symbol)."""
    derivative, lifted, occurrence = piece
    if derivative == 0:
        return None
    reduced = term.reduced + lifted
    shortcut = _saved_output_shortcut(nest, term, occurrence, derivative, lifted)
    if shortcut is not None:
        # The saved output already holds the reduction, its bounds and guards included.
        derivative, reduced, term = shortcut, (), _without_reduced(term)
    loop = {r.index: sympy.Dummy(r.index.name, integer=True) for r in nest.free + reduced}
    ranges = {loop[r.index]: r for r in nest.free + reduced}
    solver = IndexSolver(ranges, {}, [], [])
    if wrt_rank:
        access = occurrence.xreplace(loop)
        for axis, target in enumerate(free):
            solver.solve_axis(access.indices[axis], target, occurrence)

    def rewrite(expr: sympy.Basic) -> sympy.Basic:
        return expr.xreplace(loop).xreplace(solver.substitution)

    body = rewrite(scale * derivative)
    # Constraints and guards found before a later elimination still name its index.
    solved = [c.xreplace(solver.substitution) for c in solver.constraints]
    constraints = [rewrite(c) for c in term.constraints] + solved
    guards = [g.xreplace(solver.substitution) for g in solver.guards]
    guard = sympy.And(rewrite(term.guard), *guards)
    taken = {s.name for s in free}
    kept: list[Range] = []
    names = {}
    for dummy, r in solver.ranges.items():
        name = r.index.name if r.index.name not in taken else next(fresh_names(taken))
        taken.add(name)
        names[dummy] = index_symbol(name)
        kept.append(Range(names[dummy], r.start, r.stop))
    return Term(
        body.xreplace(names),
        tuple(kept),
        tuple(simplify_constraints(c.xreplace(names) for c in constraints)),
        guard.xreplace(names),
    )


#: One piece of a derivative: its value, the nested reductions' indices lifted to loops of
#: the gradient term, and the occurrence with those indices renamed as lifted.
Piece = tuple[sympy.Expr, tuple[Range, ...], sympy.Basic]


def _derivatives(body: sympy.Expr, occurrence: sympy.Basic, taken: set[str]) -> list[Piece]:
    """d body / d occurrence in pieces: one where the occurrence is read outside every nested
    reduction (the reductions held fixed), and one per outermost nested reduction that
    reads it, through that reduction, its indices lifted to loops of the gradient term
    (`d/dQ[i, p]` of `f(sum_d Q[i, d]*K[j, d])` is `f'(...) * K[j, d]` at `d = p`: the term
    loops over d and the solver eliminates it). An inlined statement's terms read an input
    both ways (`2*sum_r(T5*X[i, r]) + 2*T5*c`), and two sibling reductions may read it."""
    around = [r for r in outermost_reductions(body) if occurrence in r.body.atoms(type(occurrence))]
    held = {r: sympy.Dummy("r", real=True) for r in around}
    restore = {d: r for r, d in held.items()}
    fixed = body.xreplace(held)
    pieces: list[Piece] = []
    if occurrence in fixed.atoms(type(occurrence)):
        stand_in = sympy.Dummy("a", real=True)
        direct = sympy.diff(fixed.xreplace({occurrence: stand_in}), stand_in)
        direct = direct.xreplace({stand_in: occurrence}).xreplace(restore)
        # sign(x)' = 2*DiracDelta(x): zero wherever it is defined, as in JAX.
        direct = direct.replace(sympy.DiracDelta, lambda *_: sympy.Integer(0))
        pieces.append((direct, (), occurrence))
    for nested, stand_in in held.items():
        outer = sympy.diff(fixed, stand_in).xreplace(restore)
        weight = nested_weight(nested, "gradient")
        name = next(fresh_names(taken | {nested.index.name}))
        taken.add(name)
        index = index_symbol(name)
        lifted_weight = weight.xreplace({nested.index: index})
        renamed = occurrence.xreplace({nested.index: index})
        lifted_body = nested.body.xreplace({nested.index: index})
        for inner, deeper, deepest in _derivatives(lifted_body, renamed, taken):
            lifted = (Range(index, nested.start, nested.stop), *deeper)
            pieces.append((outer * lifted_weight * inner, lifted, deepest))
    return pieces or [(sympy.Integer(0), (), occurrence)]


def _reductions(expr: sympy.Basic) -> list[Reduce]:
    """The nested reductions in `expr`, outer ones before those inside them."""
    found: list[Reduce] = []

    def walk(node: sympy.Basic) -> None:
        if isinstance(node, Reduce) and node not in found:
            found.append(node)
        for arg in node.args:
            walk(arg)

    walk(expr)
    return found


def _names_in(nest: LoopNest) -> set[str]:
    """Every symbol name a nest uses, bound indices of nested reductions included."""
    names = {s.name for e in nest.expressions() for s in e.free_symbols if hasattr(s, "name")}
    for term in nest.terms:
        names |= {r.index.name for r in _reductions(term.body)}
        names |= {r.index.name for r in term.reduced}
    return names | {r.index.name for r in nest.free}


def _saved_output_shortcut(
    nest: LoopNest,
    term: Term,
    occurrence: sympy.Basic,
    derivative: sympy.Expr,
    lifted: tuple[Range, ...],
) -> sympy.Expr | None:
    """`g * Y` when `d body / d occurrence = g * body` with g free of the reduced indices
    and dividing by no value: then the sum over them of `g * body` is `g * Y`, the saved
    output, and the gradient skips the whole reduction (attention's
    `dL[i] = -sum_e dO[i, e] * O[i, e]`, O(N d) where recomputing the weights would cost
    O(N^2 d))."""
    if nest.reduction != "sum" or len(nest.terms) != 1 or lifted or not term.reduced:
        return None
    reduced = set(term.reduced_indices)
    if isinstance(occurrence, sympy.Indexed) and occurrence.free_symbols & reduced:
        return None
    try:
        ratio = sympy.cancel(derivative / term.body)
    except (sympy.PolynomialError, TypeError, ValueError):
        return None
    if ratio.free_symbols & reduced or any(
        a.free_symbols & reduced for a in ratio.atoms(sympy.Indexed, Reduce)
    ):
        return None
    if divides_by_a_value(ratio):
        return None
    return ratio * saved(nest.output, nest)


def divides_by_a_value(expr: sympy.Expr) -> bool:
    """Whether `expr` divides by (or takes a negative power of) anything but a constant.

    The shortcut is exact only where `g` is: `Y[i] := W[i] * X[i, j]` gives `g = 1/W[i]`,
    and `dY * Y / W` is NaN at `W = 0` (and inaccurate at a subnormal W) where the sum of
    `dY * X` is not, so such a gradient recomputes the sum instead."""
    _, denominator = sympy.fraction(sympy.together(expr), exact=True)
    if denominator.free_symbols:
        return True
    return any(
        p.exp.is_negative is not False and p.base.free_symbols for p in expr.atoms(sympy.Pow)
    )


def _without_reduced(term: Term) -> Term:
    """`term` without its reduced indices and the constraints and guard that mention them."""
    reduced = set(term.reduced_indices)
    constraints = tuple(c for c in term.constraints if not c.free_symbols & reduced)
    guard = term.guard if not term.guard.free_symbols & reduced else sympy.true
    return Term(term.body, (), constraints, guard)


def _operands(nest: LoopNest, terms: tuple[Term, ...], names: GradientNames) -> tuple:
    """The gradient nest's operands in a stable order, with their roles."""
    used = set()
    for t in terms:
        for expr in (t.body, t.guard):  # a guard reads arrays too (a document mask's ids)
            used |= {a.base.name for a in expr.atoms(sympy.Indexed)}
            used |= {s.name for s in expr.free_symbols if isinstance(s, sympy.Symbol)}
    candidates = [(names.cotangent, COTANGENT, len(nest.free))]
    candidates += [(op.name, "input", op.rank) for op in nest.operands]
    candidates += [(nest.output, OUTPUT, len(nest.free))]
    candidates += [
        (names.argument, ARGUMENT, len(nest.free)),
        (names.finite_prod, FINITE_PROD, len(nest.free)),
        (names.zero_count, ZERO_COUNT, len(nest.free)),
        (names.inf_count, INF_COUNT, len(nest.free)),
    ]
    operands, roles = [], []
    for name, role, rank in candidates:
        if name in used or role == COTANGENT:
            operands.append(Operand(name, rank))
            roles.append((name, role))
    return tuple(operands), tuple(roles)


@functools.lru_cache(maxsize=1024)
def gradient(nest: LoopNest, wrt: str) -> Gradient:
    """The gradient nest of `nest` with respect to its operand `wrt`.

    Derived once per process and kept on disk for the next one (codegen/c/run/records.py,
    keyed by the nest, `wrt` and the sources of tensordsl/ and codegen/).

    Args:
        nest: a loop nest (forward or itself a gradient nest).
        wrt: the name of one of its operands.

    Returns:
        A `Gradient`: the nest, whose output has `wrt`'s shape, and its operand roles.

    Raises:
        Unsupported: an access whose index map cannot be solved in gather form.
    """
    return memo.memo(
        config.cache_dir(),
        "gradient",
        (nest, wrt),
        lambda: _derive_gradient(nest, wrt),
        version=memo.source_version(memo.CODEGEN_ROOT),
        expected=Gradient,
    )


def _derive_gradient(nest: LoopNest, wrt: str) -> Gradient:
    """The gradient nest, derived (see `gradient`)."""
    names = gradient_names(nest, wrt)
    rank = nest.operand(wrt).rank
    free = _free_indices(nest, wrt)
    scale = GRADIENT_RULES[nest.reduction].scale(nest, names)
    terms = []
    for term in nest.terms:
        occurrences = _occurrences(term.body, wrt) if rank else [scalar_symbol(wrt)]
        for occurrence in occurrences:
            for piece in _derivatives(term.body, occurrence, _names_in(nest)):
                found = _term_gradient(nest, term, piece, scale, free, rank)
                if found is not None:
                    terms.append(found)
    if not terms:
        terms.append(Term(sympy.Integer(0)))
    extents = {}
    for t in terms:
        for e in t.expressions():
            for s in e.free_symbols:
                axis = extent_of(s)
                if axis is not None and axis[0] in (nest.output, wrt):
                    owner = names.cotangent if axis[0] == nest.output else names.gradient
                    extents[s] = extent_symbol(owner, axis[1])
    terms = [
        _drop_free_range_constraints(_rename_extents(t, extents), free, names.gradient)
        for t in terms
    ]
    operands, roles = _operands(nest, tuple(terms), names)
    gradient_nest = LoopNest(
        output=names.gradient,
        free=tuple(Range(p, 0, extent_symbol(names.gradient, d)) for d, p in enumerate(free)),
        terms=merge_terms(tuple(terms)),
        operands=operands,
        reduction="sum",
    )
    return Gradient(factor_sums(bound_guards(gradient_nest)), wrt, roles)


def merge_terms(terms: tuple[Term, ...]) -> tuple[Term, ...]:
    """Summed terms over the same reduced ranges and constraints as one term, so that the
    emitters compute what they share once (the three terms `p == 0, 1, 2` of a gradient
    with respect to `X[i, 0]`, `X[i, 1]`, `X[i, 2]`, say): a guard that differs between them
    moves into the body as a `where`."""
    groups: dict[tuple, list[Term]] = {}
    for term in terms:
        groups.setdefault((term.reduced, term.constraints), []).append(term)
    merged = []
    for (reduced, constraints), group in groups.items():
        if len(group) == 1:
            merged.append(group[0])
            continue
        guards = {t.guard for t in group}
        if len(guards) == 1:
            body = sympy.Add(*(t.body for t in group))
            merged.append(Term(body, reduced, constraints, group[0].guard))
            continue
        parts = [
            t.body if t.guard == sympy.true else sympy.Piecewise((t.body, t.guard), (0, True))
            for t in group
        ]
        merged.append(Term(sympy.Add(*parts), reduced, constraints))
    return tuple(merged)


def _rename_extents(term: Term, extents: dict) -> Term:
    return Term(
        term.body.xreplace(extents),
        tuple(
            Range(r.index, r.start.xreplace(extents), r.stop.xreplace(extents))
            for r in term.reduced
        ),
        tuple(c.xreplace(extents) for c in term.constraints),
        term.guard.xreplace(extents),
    )


def _drop_free_range_constraints(term: Term, free: tuple[sympy.Symbol, ...], output: str) -> Term:
    """Drop constraints that only restate a free index's range `0 <= p < dA.shape[d]`."""
    implied = set()
    for d, p in enumerate(free):
        implied |= {sympy.expand(p), sympy.expand(extent_symbol(output, d) - 1 - p)}
    kept = tuple(c for c in term.constraints if sympy.expand(c) not in implied)
    return Term(term.body, term.reduced, kept, term.guard)
