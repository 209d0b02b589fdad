"""Fusing a program's statements: which intermediates are recomputed, which are stored.

A program is a sequence of nests, each reading inputs and earlier statements' outputs. Every
intermediate that is not an output is either *stored* (computed by a nest of its own and read
back) or *inlined* into the statements that read it (`codegen.passes.inline`: recomputed where it
is read, as a nested reduction when it reduces). `codegen.passes.cost.decide` chooses, per
intermediate, from the FLOPs and bytes of each choice counted with the call's extents:

* an output, or an intermediate read by a pure contraction (which runs as XLA's dot,
  `codegen.ir.contraction`, faster than any loop nest we generate), is stored; a pure
  contraction read elementwise stays a dot;
* a reduction is never recomputed inside a loop that does not index it (the MLP's hidden
  layer inside the loop over the output features), nor where a reader's gradient would
  recompute it per element, unless it is larger than every input and output and computed
  once per element forward (attention's `T x T` scores, whose weighted sum the one-pass
  strategy pairs with the logsumexp);
* otherwise the cheaper of the two estimates wins (an elementwise intermediate read once is
  recomputed).

`force` overrides a decision per intermediate ("inline" or "store"), and `fuse=` on
`td.program` passes it; `Fused.decisions` says what was chosen and why (`explain`).

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
>>> fused = fuse((double, total), outputs=("s",), shapes={"X": (5,), "T": (5,), "s": ()})
>>> fused.inlined, [str(n) for n in fused.stored]
(('T',), ['s := 2*X[i]'])
>>> print(fused.decisions[0])
T: recomputed where read (cheaper to recompute); estimated cost inline 10, store 90
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.ir.nest import LoopNest, Reduce, Term
from codegen.passes.cost import INLINE_REDUCTIONS, Decision, decide
from codegen.passes.factor import factor_sums
from codegen.passes.guards import bound_guards, guard_masks, identity_of
from codegen.passes.inline import CannotInline, inline
from codegen.passes.online import pair
from codegen.passes.softmax_weights import softmax_weights

#: What `force` may say of an intermediate.
CHOICES = ("inline", "store")


@dataclass(frozen=True)
class Fused:
    """The nests to run, in order, the intermediates recomputed inside them, and the
    decision taken for each intermediate."""

    stored: tuple[LoopNest, ...]
    inlined: tuple[str, ...]
    decisions: tuple[Decision, ...] = ()


def unconstrained(nest: LoopNest) -> LoopNest:
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
    statements: Sequence[LoopNest],
    *,
    outputs: Sequence[str],
    shapes: Mapping[str, Sequence[int]],
    force: Mapping[str, str] | None = None,
    order: int = 1,
    beside: bool = False,
) -> Fused:
    """Decide and carry out the inlining of a program's intermediates (module docstring).

    Args:
        statements: one nest per statement, in program order; each reads inputs and earlier
            statements' outputs by name.
        outputs: the statements whose results the program returns.
        shapes: the shape of every input and every statement's output, for this call.
        force: "inline" or "store" per intermediate, instead of the cost model's choice.
        order: how many times the call is differentiated (`codegen.passes.cost.decide`).
        beside: store an intermediate with an input read beside it (`decide`).

    Returns:
        A `Fused`: the nests to run in order (outputs and stored intermediates), the names of
        the intermediates recomputed inside them, and the decisions.
    """
    force = dict(force or {})
    names = [nest.output for nest in statements]
    intermediates = [name for name in names if name not in outputs]
    expanded: dict[str, LoopNest] = {}  # intermediates to recompute, in terms of stored ones
    stored: list[LoopNest] = []
    inlined: list[str] = []
    decisions: list[Decision] = []
    for n, nest in enumerate(statements):
        for name in [n for n in nest.operand_names if n in expanded]:
            nest = inline(nest, expanded[name])
        readers = [r for r in statements[n + 1 :] if nest.output in r.operand_names]
        if nest.output in outputs or not readers:
            stored.append(guard_masks(factor_sums(bound_guards(nest))))
            continue
        decision = decide(
            nest,
            readers,
            outputs=outputs,
            shapes=shapes,
            paired=_paired(nest, readers, shapes),
            intermediates=intermediates,
            order=order,
            beside=beside,
        )
        if nest.output in force:
            choice = force[nest.output]
            decision = dataclasses.replace(decision, choice=choice, reason="forced by fuse=")
        decisions.append(decision)
        if decision.choice == "inline":
            expanded[nest.output] = unconstrained(nest)
            inlined.append(nest.output)
            continue
        stored.append(guard_masks(factor_sums(bound_guards(nest))))
    return Fused(softmax_weights(stored), tuple(inlined), tuple(decisions))


def inlinable(nest: LoopNest) -> bool:
    """Whether `nest` can be recomputed where read (`fuse` may be forced to): elementwise,
    or a sum or logsumexp, of one term unless a sum."""
    if len(nest.terms) > 1 and nest.reduction != "sum":
        return False
    return not any(t.reduced for t in nest.terms) or nest.reduction in INLINE_REDUCTIONS


def _paired(
    producer: LoopNest, readers: Sequence[LoopNest], shapes: Mapping[str, Sequence[int]]
) -> tuple[str, ...]:
    """The readers whose reads of `producer`, recomputed, the one-pass strategy computes
    together with a logsumexp reader's (`codegen.passes.online.pair`): attention's weighted
    sum, paired with the logsumexp of the same scores. Their loops are compared for the
    call's `shapes`, as the runners pair them (a relative-bias table's `R[h, i - j + T - 1]`
    gives ranges that agree for the shapes only)."""
    if producer.reduction not in INLINE_REDUCTIONS:
        return ()
    raw = unconstrained(producer)
    found = []
    for lse in readers:
        if lse.reduction != "logsumexp":
            continue
        for weighted in readers:
            if lse.output not in weighted.operand_names:
                continue
            try:
                one = inline(lse, raw), inline(weighted, raw)
            except CannotInline:
                continue
            lse_nest, weighted_nest = (factor_sums(bound_guards(nest)) for nest in one)
            if pair(lse_nest, _rows_as_read(weighted_nest, lse.output), shapes) is not None:
                found.append(weighted.output)
    return tuple(found)


def _rows_as_read(weighted: LoopNest, lse: str) -> LoopNest:
    """`weighted` with its free ranges in the order its read of the logsumexp `lse` lists
    them, the last kept last: attention in a (B, T, H, E) layout reads `L[b, h, i]` from
    `O[b, i, h, e]`. Only the cost model looks at this order: the one-pass kernel itself
    pairs nests whose orders agree (`codegen.passes.online.pair`), elsewhere the two nests
    run as they are, the scores recomputed in both and never stored."""
    reads = [a for t in weighted.terms for a in t.body.atoms(sympy.Indexed) if a.base.name == lse]
    if len(reads) != 1 or not weighted.free:
        return weighted
    by_index = {r.index: r for r in weighted.free[:-1]}
    if set(reads[0].indices) != set(by_index) or len(reads[0].indices) != len(by_index):
        return weighted
    order = [by_index[index] for index in reads[0].indices]
    return dataclasses.replace(weighted, free=(*order, weighted.free[-1]))


def nested_ranges(nest: LoopNest) -> tuple[Reduce, ...]:
    """The nested reductions of a nest (their ranges must not be empty at call time: masks
    are bounded through them on that assumption, see `codegen.passes.guards`)."""
    found: list[Reduce] = []
    for term in nest.terms:
        found += [r for r in term.body.atoms(Reduce) if r not in found]
    return tuple(found)
