"""Fusing a program's statements: which intermediates are recomputed, which are stored.

A program is a sequence of nests, each reading inputs and earlier statements' outputs. Every
intermediate that is not an output is either *stored* (computed by a nest of its own and read
back) or *inlined* into the statements that read it (`codegen.passes.inline`: recomputed where it
is read, as a nested reduction when it reduces). The rule, per intermediate:

* elementwise (nothing reduced): inlined — recomputing costs a few operations and saves a
  round trip through memory;
* a sum or a logsumexp larger than the largest input or output (attention's scores, `T x T`
  against `T x d`): inlined — never materialised, forward or backward;
* otherwise (a row statistic such as a mean or a logsumexp, or a max/min/prod, whose
  gradient through a nested reduction is not derived): stored.

Pure contractions run as XLA's dot (`codegen.ir.contraction`), faster than any loop nest we
generate, so recomputing never costs one: an intermediate is stored when a reader is a pure
contraction (the MLP's `Y[b,o] := A[b,u] * W2[u,o]` keeps reading a stored GELU output `A`),
and a pure contraction is recomputed only inside readers that reduce over its result
(attention's scores inside the logsumexp and the weighted sum), never inside an elementwise
one (the MLP's `H[b,u] := X[b,f] * W1[f,u]` stays a dot).

The stored nests then go through the passes of single statements (guards as loop bounds,
sum factorisation), so a causal mask inside inlined scores still bounds the loops.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, j = index_symbol("i"), index_symbol("j")
>>> X, T = tensor_base("X"), tensor_base("T")
>>> double = LoopNest("T", (Range(i, 0, extent_symbol("X", 0)),), (Term(2 * X[i]),),
...     (Operand("X", 1),))
>>> total = LoopNest("s", (), (Term(T[i], (Range(i, 0, extent_symbol("T", 0)),)),),
...     (Operand("T", 1),))
>>> fused = fuse((double, total), outputs=("s",), sizes={"X": 5, "T": 5, "s": 1})
>>> fused.inlined, [str(n) for n in fused.stored]
(('T',), ['s := 2*X[i]'])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.ir.contraction import contraction
from codegen.ir.nest import LoopNest, Reduce, Term
from codegen.passes.factor import factor_sums
from codegen.passes.guards import bound_guards, identity_of
from codegen.passes.inline import inline

#: Reductions an intermediate may have and still be recomputed inside its readers (their
#: gradients through a nested reduction are derived; see `codegen.passes.grad`).
INLINE_REDUCTIONS = ("sum", "logsumexp")


@dataclass(frozen=True)
class Fused:
    """The nests to run, in order, and the intermediates recomputed inside them."""

    stored: tuple[LoopNest, ...]
    inlined: tuple[str, ...]


def _reduces(nest: LoopNest) -> bool:
    return any(t.reduced for t in nest.terms)


def _inline_it(
    nest: LoopNest,
    readers: Sequence[LoopNest],
    outputs: Sequence[str],
    sizes: Mapping[str, int],
) -> bool:
    if nest.output in outputs:
        return False
    if any(contraction(r) is not None for r in readers):
        return False
    if contraction(nest) is not None and not all(_reduces(r) for r in readers):
        return False
    if len(nest.terms) > 1 and nest.reduction != "sum":
        return False  # its terms could not be added inside a reader
    if not _reduces(nest):
        return True
    largest = max((n for name, n in sizes.items() if name != nest.output), default=0)
    return nest.reduction in INLINE_REDUCTIONS and sizes[nest.output] > largest


def _raw(nest: LoopNest) -> LoopNest:
    """`nest` as one term per summand without constraints or guards, so that it can be
    inlined: a term's constraints and guard become a `where` around its body, whose other
    branch is the reduction's identity."""
    identity = identity_of(nest.reduction)
    terms = []
    for term in nest.terms:
        conditions = [sympy.Ge(c, 0) for c in term.constraints]
        if term.guard != sympy.true:
            conditions.append(term.guard)
        body = term.body
        if conditions:
            body = sympy.Piecewise((body, sympy.And(*conditions)), (identity, True))
        terms.append(Term(body, term.reduced))
    return dataclasses.replace(nest, terms=tuple(terms))


def fuse(
    statements: Sequence[LoopNest], *, outputs: Sequence[str], sizes: Mapping[str, int]
) -> Fused:
    """Decide and carry out the inlining of a program's intermediates (module docstring).

    Args:
        statements: one nest per statement, in program order; each reads inputs and earlier
            statements' outputs by name.
        outputs: the statements whose results the program returns.
        sizes: the number of elements of every input and every statement's output.

    Returns:
        A `Fused`: the nests to run in order (outputs and stored intermediates) and the
        names of the intermediates recomputed inside them.
    """
    expanded: dict[str, LoopNest] = {}  # intermediates to recompute, in terms of stored ones
    stored: list[LoopNest] = []
    inlined: list[str] = []
    for n, nest in enumerate(statements):
        for name in [n for n in nest.operand_names if n in expanded]:
            nest = inline(nest, expanded[name])
        readers = [r for r in statements[n + 1 :] if nest.output in r.operand_names]
        if _inline_it(nest, readers, outputs, sizes):
            expanded[nest.output] = _raw(nest)
            inlined.append(nest.output)
            continue
        stored.append(factor_sums(bound_guards(nest)))
    return Fused(tuple(stored), tuple(inlined))


def nested_ranges(nest: LoopNest) -> tuple[Reduce, ...]:
    """The nested reductions of a nest (their ranges must not be empty at call time: masks
    are bounded through them on that assumption, see `codegen.passes.guards`)."""
    found: list[Reduce] = []
    for term in nest.terms:
        found += [r for r in term.body.atoms(Reduce) if r not in found]
    return tuple(found)
