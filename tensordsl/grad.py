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
* prod: the product of the other factors, from two saved nests (the product of the nonzero
  factors and the number of zero factors), so a zero factor never causes a division by 0.

>>> from tensordsl.lower import lower
>>> from tensordsl.parse import parse
>>> nest = lower(parse("Y[i] := X[i+k] * W[k]")).nest
>>> print(gradient(nest, "X").nest)
dX[p] := dY[p - k]*W[k]
"""

from __future__ import annotations

import functools
import itertools
import pathlib
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from codegen import config, trace_cache
from codegen.affine import NotAffine, affine_parts
from codegen.functions import FloorDiv
from codegen.ir import (
    LoopNest,
    Operand,
    Range,
    Term,
    extent_of,
    extent_symbol,
    index_symbol,
    scalar_symbol,
    tensor_base,
)
from tensordsl.errors import UnsupportedError

#: Roles of a gradient nest's operands.
COTANGENT, OUTPUT = "cotangent", "output"
ARGUMENT, NONZERO_PROD, ZERO_COUNT = "argument", "nonzero_prod", "zero_count"


@dataclass(frozen=True)
class Gradient:
    """A gradient nest and what each of its operands is.

    `roles` maps each operand of `nest` to "cotangent", "output", "input" (a forward
    operand of the same name), or the name of an auxiliary nest of the forward
    ("argument", "nonzero_prod", "zero_count"; see `auxiliary_nests`).
    """

    nest: LoopNest
    wrt: str
    roles: tuple[tuple[str, str], ...]


def _unique(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


@dataclass(frozen=True)
class _Names:
    """Names of the tensors a gradient nest of `nest` refers to."""

    cotangent: str
    gradient: str
    argument: str
    nonzero_prod: str
    zero_count: str


def _names(nest: LoopNest, wrt: str) -> _Names:
    taken = set(nest.operand_names) | {nest.output} | nest.extent_tensors()
    return _Names(
        cotangent=_unique("d" + nest.output, taken),
        gradient=_unique("d" + wrt, taken),
        argument=_unique(nest.output + "_argument", taken),
        nonzero_prod=_unique(nest.output + "_nonzero_prod", taken),
        zero_count=_unique(nest.output + "_zero_count", taken),
    )


def _fresh_names(taken: set[str]) -> itertools.chain:
    singles = ("p", "q", "s", "t", "u", "v", "w")
    numbered = (f"{base}{n}" for n in itertools.count(1) for base in singles)
    return itertools.chain(
        (n for n in singles if n not in taken), (n for n in numbered if n not in taken)
    )


def _free_indices(nest: LoopNest, wrt: str) -> tuple[sympy.Symbol, ...]:
    """Readable names for the gradient's free indices: A's index names where they are bare."""
    rank = nest.operand(wrt).rank
    first = next((a for t in nest.terms for a in _occurrences(t.body, wrt)), None)
    taken = {s.name for e in nest.expressions() for s in e.free_symbols}
    fresh = _fresh_names(taken)
    names: list[str] = []
    for axis in range(rank):
        index = first.indices[axis] if first is not None else None
        if isinstance(index, sympy.Symbol) and index.name not in names:
            names.append(index.name)
        else:
            names.append(next(fresh))
    return tuple(index_symbol(n) for n in names)


def _occurrences(expr: sympy.Basic, wrt: str) -> list[sympy.Indexed]:
    found = [a for a in expr.atoms(sympy.Indexed) if a.base.name == wrt]
    return sorted(found, key=sympy.default_sort_key)


def _affine(expr: sympy.Expr, loop: list[sympy.Symbol], where: sympy.Basic) -> dict:
    try:
        return affine_parts(expr, loop)
    except NotAffine as error:
        raise UnsupportedError(
            f"the gradient cannot solve the access {where}: index {error.index} has the "
            f"non-integer coefficient {error.coefficient} after a change of variables"
        ) from None


@dataclass
class _Solver:
    """Solves one occurrence's index map for the loop indices, axis by axis."""

    ranges: dict[sympy.Symbol, Range]  # the forward loop indices still to be looped over
    substitution: dict[sympy.Symbol, sympy.Expr]
    constraints: list[sympy.Expr]
    guards: list[sympy.Basic]

    def solve_axis(
        self, axis_expr: sympy.Expr, target: sympy.Symbol, access: sympy.Indexed
    ) -> None:
        expr = sympy.expand(axis_expr.xreplace(self.substitution))
        coefficients = _affine(expr, list(self.ranges), access)
        if not coefficients:
            self.guards.append(sympy.Eq(target, expr))
            return
        # Prefer a unit coefficient; among those, the forward's free indices (so the gradient
        # reads the cotangent shifted and keeps the reduced loops), then the first listed.
        order = list(self.ranges)
        v = min(
            coefficients,
            key=lambda u: (abs(coefficients[u]) != 1, abs(coefficients[u]), order.index(u)),
        )
        c = coefficients[v]
        rest = sympy.expand(expr - c * v)
        if abs(c) == 1:
            solution = sympy.expand(c * (target - rest))
        else:
            self.guards.append(sympy.Eq(sympy.Mod(target - rest, abs(c)), 0))
            solution = FloorDiv(target - rest, c)
        bounds = self.ranges.pop(v)
        self.substitution = {k: s.xreplace({v: solution}) for k, s in self.substitution.items()}
        self.substitution[v] = solution
        # start <= v < stop, multiplied through by c so that it stays affine.
        low, high = c * bounds.start, c * (bounds.stop - 1)
        if c < 0:
            low, high = high, low
        self.constraints += [sympy.expand(target - rest - low), sympy.expand(high - target + rest)]


def _term_gradient(
    nest: LoopNest,
    term: Term,
    occurrence: sympy.Basic,
    scale: sympy.Expr,
    free: tuple[sympy.Symbol, ...],
    wrt_rank: int,
) -> Term | None:
    """The gradient term of one occurrence (an Indexed access, or a scalar symbol)."""
    stand_in = sympy.Dummy("a", real=True)
    derivative = sympy.diff(term.body.xreplace({occurrence: stand_in}), stand_in)
    derivative = derivative.xreplace({stand_in: occurrence})
    # sign(x)' = 2*DiracDelta(x): zero wherever it is defined, as in JAX.
    derivative = derivative.replace(sympy.DiracDelta, lambda *_: sympy.Integer(0))
    if derivative == 0:
        return None
    loop = {r.index: sympy.Dummy(r.index.name, integer=True) for r in nest.free + term.reduced}
    ranges = {loop[r.index]: r for r in nest.free + term.reduced}
    solver = _Solver(ranges, {}, [], [])
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
    reduced, names = [], {}
    for dummy, r in solver.ranges.items():
        name = r.index.name if r.index.name not in taken else next(_fresh_names(taken))
        taken.add(name)
        names[dummy] = index_symbol(name)
        reduced.append(Range(names[dummy], r.start, r.stop))
    return Term(
        body.xreplace(names),
        tuple(reduced),
        tuple(_simplify_constraints(c.xreplace(names) for c in constraints)),
        guard.xreplace(names),
    )


def _simplify_constraints(constraints) -> list[sympy.Expr]:
    """Drop constraints that always hold (a nonnegative constant) and duplicates."""
    kept: list[sympy.Expr] = []
    for c in constraints:
        c = sympy.expand(c)
        if c.is_number and c >= 0:
            continue
        if c not in kept:
            kept.append(c)
    return kept


def _no_auxiliary(nest: LoopNest, names: _Names) -> dict[str, LoopNest]:
    return {}


def _extreme_auxiliary(nest: LoopNest, names: _Names) -> dict[str, LoopNest]:
    """max/min: the position of the winning iteration (an argmax/argmin nest)."""
    return {
        ARGUMENT: LoopNest(
            names.argument, nest.free, nest.terms, nest.operands, "arg" + nest.reduction
        )
    }


def _prod_auxiliary(nest: LoopNest, names: _Names) -> dict[str, LoopNest]:
    """prod: the product of the nonzero factors and the number of zero factors."""
    (term,) = nest.terms
    is_zero = sympy.Eq(term.body, 0)
    factor = sympy.Piecewise((sympy.Integer(1), is_zero), (term.body, True))
    count = sympy.Piecewise((sympy.Integer(1), is_zero), (sympy.Integer(0), True))
    return {
        NONZERO_PROD: LoopNest(
            names.nonzero_prod,
            nest.free,
            (Term(factor, term.reduced, term.constraints, term.guard),),
            nest.operands,
            "prod",
        ),
        ZERO_COUNT: LoopNest(
            names.zero_count,
            nest.free,
            (Term(count, term.reduced, term.constraints, term.guard),),
            nest.operands,
            "sum",
        ),
    }


def _sum_scale(nest: LoopNest, names: _Names) -> sympy.Expr:
    return _saved(names.cotangent, nest)


def _logsumexp_scale(nest: LoopNest, names: _Names) -> sympy.Expr:
    """`dY * exp(f - Y)`, with the saved output Y."""
    (term,) = nest.terms
    return _saved(names.cotangent, nest) * sympy.exp(term.body - _saved(nest.output, nest))


def _extreme_scale(nest: LoopNest, names: _Names) -> sympy.Expr:
    """`dY` at the saved winning position, 0 elsewhere."""
    (term,) = nest.terms
    argument = _saved(names.argument, nest)
    return sympy.Piecewise(
        (_saved(names.cotangent, nest), sympy.Eq(_flat_position(term), argument)),
        (sympy.Integer(0), True),
    )


def _prod_scale(nest: LoopNest, names: _Names) -> sympy.Expr:
    """`dY` times the product of the other factors, never dividing by zero."""
    (term,) = nest.terms
    nonzero, zeros = _saved(names.nonzero_prod, nest), _saved(names.zero_count, nest)
    others = sympy.Piecewise(
        (nonzero / term.body, sympy.Eq(zeros, 0)),
        (nonzero, sympy.And(sympy.Eq(zeros, 1), sympy.Eq(term.body, 0))),
        (sympy.Integer(0), True),
    )
    return _saved(names.cotangent, nest) * others


def _no_scale(nest: LoopNest, names: _Names) -> sympy.Expr:
    raise UnsupportedError(f"no gradient for the reduction '{nest.reduction}'")


@dataclass(frozen=True)
class GradientRule:
    """How the gradient of a reduction is formed.

    `auxiliary` gives the nests the forward pass must also compute (by role); `scale` the
    factor multiplying `df/dA` in every gradient term (the cotangent, adjusted).
    """

    auxiliary: Callable[[LoopNest, _Names], dict[str, LoopNest]]
    scale: Callable[[LoopNest, _Names], sympy.Expr]


#: One rule per row of `codegen.reductions.REDUCTIONS`.
GRADIENT_RULES: dict[str, GradientRule] = {
    "sum": GradientRule(_no_auxiliary, _sum_scale),
    "max": GradientRule(_extreme_auxiliary, _extreme_scale),
    "min": GradientRule(_extreme_auxiliary, _extreme_scale),
    "prod": GradientRule(_prod_auxiliary, _prod_scale),
    "logsumexp": GradientRule(_no_auxiliary, _logsumexp_scale),
    "argmax": GradientRule(_no_auxiliary, _no_scale),
    "argmin": GradientRule(_no_auxiliary, _no_scale),
}


def auxiliary_nests(nest: LoopNest) -> dict[str, LoopNest]:
    """The nests the forward pass must also compute for the gradients of `nest`.

    Keys are roles ("argument", "nonzero_prod", "zero_count"); each nest's output has the
    name the gradient nests use for it.
    """
    return GRADIENT_RULES[nest.reduction].auxiliary(nest, _names(nest, "_"))


def _saved(name: str, nest: LoopNest) -> sympy.Expr:
    """The element of an output-shaped tensor at the current output position."""
    if not nest.free:
        return scalar_symbol(name)
    return tensor_base(name)[tuple(r.index - r.start for r in nest.free)]


def _flat_position(term: Term) -> sympy.Expr:
    """Row-major position of the current iteration over the term's reduced ranges."""
    position, stride = sympy.Integer(0), sympy.Integer(1)
    for r in reversed(term.reduced):
        position += (r.index - r.start) * stride
        stride *= r.stop - r.start
    return position


def _operands(nest: LoopNest, terms: tuple[Term, ...], names: _Names) -> tuple:
    """The gradient nest's operands in a stable order, with their roles."""
    used = set()
    for t in terms:
        used |= {a.base.name for a in t.body.atoms(sympy.Indexed)}
        used |= {s.name for s in t.body.free_symbols if isinstance(s, sympy.Symbol)}
    candidates = [(names.cotangent, COTANGENT, len(nest.free))]
    candidates += [(op.name, "input", op.rank) for op in nest.operands]
    candidates += [(nest.output, OUTPUT, len(nest.free))]
    candidates += [
        (names.argument, ARGUMENT, len(nest.free)),
        (names.nonzero_prod, NONZERO_PROD, len(nest.free)),
        (names.zero_count, ZERO_COUNT, len(nest.free)),
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

    Derived once per process and kept on disk for the next one (codegen/trace_cache.py,
    keyed by the nest, `wrt` and the sources of tensordsl/ and codegen/).

    Args:
        nest: a loop nest (forward or itself a gradient nest).
        wrt: the name of one of its operands.

    Returns:
        A `Gradient`: the nest, whose output has `wrt`'s shape, and its operand roles.

    Raises:
        UnsupportedError: an access whose index map cannot be solved in gather form.
    """
    return trace_cache.memo(
        config.cache_dir(),
        "gradient",
        (nest, wrt),
        lambda: _derive_gradient(nest, wrt),
        version=trace_cache.source_version(*_SOURCES),
        expected=Gradient,
    )


_SOURCES = (pathlib.Path(__file__).resolve().parent, pathlib.Path(trace_cache.__file__).parent)


def _derive_gradient(nest: LoopNest, wrt: str) -> Gradient:
    """The gradient nest, derived (see `gradient`)."""
    names = _names(nest, wrt)
    rank = nest.operand(wrt).rank
    free = _free_indices(nest, wrt)
    scale = GRADIENT_RULES[nest.reduction].scale(nest, names)
    terms = []
    for term in nest.terms:
        occurrences = _occurrences(term.body, wrt) if rank else [scalar_symbol(wrt)]
        for occurrence in occurrences:
            found = _term_gradient(nest, term, occurrence, scale, free, rank)
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
        terms=tuple(terms),
        operands=operands,
        reduction="sum",
    )
    return Gradient(gradient_nest, wrt, roles)


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
