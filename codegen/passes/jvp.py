"""Tangent nests: forward-mode differentiation of a loop nest as one more loop nest.

For a nest `Y[o] = reduce_r f(..., A[a(o, r)], ...)` and tangents `tA` of the perturbed
inputs, the tangent nest computes `tY[o] = sum_r w(o, r) * sum_A sum_occ df/dA * tA[a(o, r)]`:
the forward's free and reduced ranges, constraints and guards, a body linear in the tangents
(sympy differentiation, each occurrence of each perturbed input in turn, the others held
constant), and a weight `w` that is the gradient rule's scale with the cotangent set to one
(`codegen.passes.gradient_rules`), so that both modes read the same saved tensors:

* sum: 1;
* max/min: 1 at the saved winning position (the argmax/argmin nest), 0 elsewhere;
* logsumexp: `exp(f - Y)`, the softmax weights, with the saved output Y;
* prod: the product of the other factors, from the saved finite product and the counts of
  zero and infinite factors (never dividing by zero).

A nested reduction inside the body is differentiated through: a nested sum's tangent is the
sum of its body's tangent, a nested logsumexp's the softmax-weighted sum of it; other nested
reductions raise `Unsupported` (as their gradients do).

The tangent nest is itself a sum nest: it runs on every back end, batches, and is
differentiated again (its own tangent and gradient nests) like any other nest.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> nest = lower(parse("Y[i] := X[i+k] * W[k]")).nest
>>> print(tangent(nest, ("X", "W")).nest)
tY[i] := X[i + k]*tW[k] + W[k]*tX[i + k]
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass

import sympy

from codegen.errors import Unsupported
from codegen.ir.nest import (
    LoopNest,
    Operand,
    Reduce,
    Term,
    extent_of,
    extent_symbol,
    map_expressions,
    scalar_symbol,
    tensor_base,
)
from codegen.passes.gradient_rules import (
    ARGUMENT,
    FINITE_PROD,
    GRADIENT_RULES,
    INF_COUNT,
    OUTPUT,
    ZERO_COUNT,
    gradient_names,
    nested_weight,
    outermost_reductions,
    saved,
)

#: The role of a tangent nest's operand that holds an input's tangent.
TANGENT = "tangent"


@dataclass(frozen=True)
class Tangent:
    """A tangent nest and what each of its operands is.

    `roles` maps each operand of `nest` to "input" (the forward operand of the same name),
    "output" (the forward's output), an auxiliary nest's role ("argument", "finite_prod",
    "zero_count", "inf_count"; see `gradient_rules.auxiliary_nests`), or "tangent";
    `tangent_of` maps each tangent operand to the input it is the tangent of.
    """

    nest: LoopNest
    roles: tuple[tuple[str, str], ...]
    tangent_of: tuple[tuple[str, str], ...]


def _unique(name: str, taken: set[str]) -> str:
    while name in taken:
        name = "t" + name
    taken.add(name)
    return name


def _taken(nest: LoopNest) -> set[str]:
    """Every tensor, scalar and index name `nest` uses (names share one namespace in C)."""
    names = {nest.output, *nest.operand_names, *nest.extent_tensors()}
    for expr in nest.expressions():
        names |= {s.name for s in expr.free_symbols if hasattr(s, "name")}
        names |= {r.index.name for r in expr.atoms(Reduce)}
    for term in nest.terms:
        names |= {r.index.name for r in term.reduced}
    return names | {r.index.name for r in nest.free}


def _perturbed_occurrences(expr: sympy.Basic, tangents: Mapping[str, str]) -> list[sympy.Basic]:
    """The accesses (and scalar symbols) of perturbed inputs in `expr`, outside reductions."""
    accesses = [a for a in expr.atoms(sympy.Indexed) if a.base.name in tangents]
    tensors = {a.base.name for a in accesses}
    # A tensor's base label is a free symbol too: a scalar is a perturbed name never indexed.
    scalars = [
        s
        for s in expr.free_symbols
        if isinstance(s, sympy.Symbol)
        and s.name in tangents
        and s.name not in tensors
        and s == scalar_symbol(s.name)
    ]
    return sorted([*accesses, *scalars], key=sympy.default_sort_key)


def _tangent_of(occurrence: sympy.Basic, tangents: Mapping[str, str]) -> sympy.Expr:
    if isinstance(occurrence, sympy.Indexed):
        return tensor_base(tangents[occurrence.base.name])[occurrence.indices]
    return scalar_symbol(tangents[occurrence.name])


def directional(expr: sympy.Expr, tangents: Mapping[str, str]) -> sympy.Expr:
    """The derivative of `expr` in the direction of the tangents: `sum_occ d expr/d occ * t`.

    Args:
        expr: a body (accesses, scalars, nested reductions).
        tangents: perturbed input name -> the name of its tangent.

    Returns:
        An expression linear in the tangents (0 when `expr` does not depend on them).

    Raises:
        Unsupported: a nested reduction other than sum or logsumexp around a perturbed input.
    """
    reductions = outermost_reductions(expr)
    stand_ins = {r: sympy.Dummy("r", real=True) for r in reductions}
    back = {d: r for r, d in stand_ins.items()}
    flat = expr.xreplace(stand_ins)
    total: sympy.Expr = sympy.Integer(0)
    for occurrence in _perturbed_occurrences(flat, tangents):
        stand_in = sympy.Dummy("a", real=True)
        derivative = sympy.diff(flat.xreplace({occurrence: stand_in}), stand_in)
        derivative = derivative.xreplace({stand_in: occurrence})
        total += derivative * _tangent_of(occurrence, tangents)
    for reduction, stand_in in stand_ins.items():
        inner = _reduction_tangent(reduction, tangents)
        if inner != 0:
            total += sympy.diff(flat, stand_in) * inner
    # sign(x)' = 2*DiracDelta(x): zero wherever it is defined, as in JAX.
    total = total.replace(sympy.DiracDelta, lambda *_: sympy.Integer(0))
    return total.xreplace(back)


def _reduction_tangent(reduction: Reduce, tangents: Mapping[str, str]) -> sympy.Expr:
    """The tangent of a nested reduction: a nested sum of its body's weighted tangent."""
    inner = directional(reduction.body, tangents)
    if inner == 0:
        return sympy.Integer(0)
    weighted = nested_weight(reduction, "forward-mode derivative") * inner
    return Reduce("sum", weighted, reduction.index, reduction.start, reduction.stop)


@functools.lru_cache(maxsize=1024)
def tangent(nest: LoopNest, perturbed: tuple[str, ...]) -> Tangent:
    """The tangent nest of `nest` for tangents of the operands named in `perturbed`.

    Args:
        nest: a loop nest (not a one-pass nest: its two nests are differentiated in turn).
        perturbed: names of operands whose tangents are given (in that order).

    Returns:
        A `Tangent`: a sum nest whose output has the forward output's shape, linear in the
        tangent operands.

    Raises:
        Unsupported: a reduction without a derivative rule (argmax), a nested reduction other
            than sum or logsumexp.
    """
    assert not nest.online, "a one-pass nest is differentiated as its two nests"
    taken = _taken(nest)
    names = gradient_names(nest, "_")
    taken |= {names.argument, names.finite_prod, names.zero_count, names.inf_count}
    tangents = {name: _unique("t" + name, taken) for name in perturbed}
    output = _unique("t" + nest.output, taken)
    if nest.reduction not in GRADIENT_RULES or nest.reduction.startswith("arg"):
        raise Unsupported(f"no forward-mode derivative for the reduction '{nest.reduction}'")
    scale = GRADIENT_RULES[nest.reduction].scale(nest, names)
    weight = scale.xreplace({saved(names.cotangent, nest): sympy.Integer(1)})
    terms = []
    for term in nest.terms:
        slope = directional(term.body, tangents)
        if slope != 0:
            terms.append(Term(weight * slope, term.reduced, term.constraints, term.guard))
    if not terms:
        terms.append(Term(sympy.Integer(0)))
    tangent_nest = LoopNest(output, nest.free, tuple(terms), (), "sum")
    # The forward's own extents (a gradient nest's `dX.shape`) become the tangent output's.
    extents = {}
    for expr in tangent_nest.expressions():
        for s in expr.free_symbols:
            axis = extent_of(s)
            if axis is not None and axis[0] == nest.output:
                extents[s] = extent_symbol(output, axis[1])
    tangent_nest = map_expressions(tangent_nest, lambda e: e.xreplace(extents))
    operands, roles = _operands(tangent_nest, nest, names, tangents)
    tangent_of = tuple((t, name) for name, t in tangents.items() if (t, TANGENT) in roles)
    return Tangent(
        LoopNest(output, tangent_nest.free, tangent_nest.terms, operands, "sum"),
        roles,
        tangent_of,
    )


def _operands(
    tangent_nest: LoopNest, nest: LoopNest, names, tangents: Mapping[str, str]
) -> tuple[tuple[Operand, ...], tuple[tuple[str, str], ...]]:
    """The tangent nest's operands in a stable order (inputs, output, saved, tangents)."""
    used = set()
    for t in tangent_nest.terms:
        for expr in t.expressions():
            used |= {a.base.name for a in expr.atoms(sympy.Indexed)}
            used |= {s.name for s in expr.free_symbols if isinstance(s, sympy.Symbol)}
    rank = len(nest.free)
    candidates = [(op.name, "input", op.rank) for op in nest.operands]
    candidates += [
        (nest.output, OUTPUT, rank),
        (names.argument, ARGUMENT, rank),
        (names.finite_prod, FINITE_PROD, rank),
        (names.zero_count, ZERO_COUNT, rank),
        (names.inf_count, INF_COUNT, rank),
    ]
    candidates += [(t, TANGENT, nest.operand(name).rank) for name, t in tangents.items()]
    operands, roles = [], []
    for name, role, r in candidates:
        if name in used:
            operands.append(Operand(name, r))
            roles.append((name, role))
    return tuple(operands), tuple(roles)
