"""Solving an occurrence's index map for a gradient's free indices: the change of variables.

Each axis of an access `A[..., c0 + sum_m c_m v_m, ...]` names one free index `p` of the
gradient nest; the solver eliminates one loop index per axis (a unit coefficient preferred,
the forward's free indices first), turns its forward range into two affine constraints on
the indices that remain, and keeps a divisibility guard where no coefficient is a unit
(`codegen.passes.grad` differentiates; this module only solves). See
../shared/NOTES-GRADIENTS.md for the index algebra.

>>> import sympy
>>> from codegen.ir.nest import Range, index_symbol
>>> i, k, p = (index_symbol(n) for n in "ikp")
>>> solver = IndexSolver({i: Range(i, 0, 8), k: Range(k, 0, 3)}, {}, [], [])
>>> solver.solve_axis(i + k, p, sympy.Symbol("X[i + k]"))
>>> solver.substitution, list(solver.ranges)
({i: -k + p}, [k])
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import sympy

from codegen.errors import Unsupported
from codegen.ir.affine import NotAffine, affine_parts
from codegen.ir.functions import Clamp, FloorDiv, Padded, Wrap
from codegen.ir.nest import Range


def fresh_names(taken: set[str]) -> itertools.chain:
    """Index names for new loops, not in `taken`: p, q, s, ... then p1, q1, ..."""
    singles = ("p", "q", "s", "t", "u", "v", "w")
    numbered = (f"{base}{n}" for n in itertools.count(1) for base in singles)
    return itertools.chain(
        (n for n in singles if n not in taken), (n for n in numbered if n not in taken)
    )


def affine_or_unsupported(expr: sympy.Expr, loop: list[sympy.Symbol], where: sympy.Basic) -> dict:
    """`affine_parts(expr, loop)`, or `Unsupported` naming the access `where`."""
    try:
        return affine_parts(expr, loop)
    except NotAffine as error:
        raise Unsupported(
            f"the gradient cannot solve the access {where}: index {error.index} has the "
            f"non-integer coefficient {error.coefficient} after a change of variables"
        ) from None


@dataclass
class IndexSolver:
    """Solves one occurrence's index map for the loop indices, axis by axis."""

    ranges: dict[sympy.Symbol, Range]  # the forward loop indices still to be looped over
    substitution: dict[sympy.Symbol, sympy.Expr]
    constraints: list[sympy.Expr]
    guards: list[sympy.Basic]

    def solve_axis(
        self, axis_expr: sympy.Expr, target: sympy.Symbol, access: sympy.Indexed
    ) -> None:
        if isinstance(axis_expr, Padded):
            # a padded read counts only where its index is inside the axis, and there the
            # index is the expression itself: solved like a plain read
            axis_expr = axis_expr.args[0]
        if isinstance(axis_expr, Wrap | Clamp):
            # mod/clamp map many points to one: each point tests whether it reads `target`
            self.guards.append(sympy.Eq(target, axis_expr.xreplace(self.substitution)))
            return
        expr = sympy.expand(axis_expr.xreplace(self.substitution))
        coefficients = affine_or_unsupported(expr, list(self.ranges), access)
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


def simplify_constraints(constraints) -> list[sympy.Expr]:
    """Drop constraints that always hold (a nonnegative constant) and duplicates."""
    kept: list[sympy.Expr] = []
    for c in constraints:
        c = sympy.expand(c)
        if c.is_number and c >= 0:
            continue
        if c not in kept:
            kept.append(c)
    return kept
