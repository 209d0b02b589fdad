"""One pass for a logsumexp and the softmax-weighted sum that reads it (online softmax).

Attention's forward is two statements over the same scores `X` (recomputed, never stored)::

    (logsumexp) L[b,h,i] := X[b,h,i,j]
    O[b,h,i,e] := exp(X[b,h,i,j] - L[b,h,i]) * V[b,h,j,e]

Run as two nests, the scores are computed twice and Q and K are read twice. `pair` turns the
two into one nest that computes both in one pass over j, as FlashAttention does: per row, a
running max `m` and sum `s` of `exp(X - m)`, the weighted sum rescaled when `m` grows, then
`O = acc / s` and `L = m + log s` (the C strategy "online", `codegen.c.attention.online`).

The paired nest (`LoopNest.online` names L) has two terms over the same reduced range and
constraints: `X` and the weight `W` (`V[b,h,j,e]` above). Its free ranges are O's with the
last one a position longer: the output packs `O[..., e]` and then `L[...]` along its last
axis. `unpair` gives the two nests back, for the back ends without a one-pass emitter and for
differentiation.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, j, e = index_symbol("i"), index_symbol("j"), index_symbol("e")
>>> X, V, L = tensor_base("X"), tensor_base("V"), tensor_base("L")
>>> rows = Range(i, 0, extent_symbol("X", 0))
>>> cols = (Range(j, 0, extent_symbol("X", 1)),)
>>> lse = LoopNest("L", (rows,), (Term(X[i, j], cols),), (Operand("X", 2),), "logsumexp")
>>> weighted = LoopNest("O", (rows, Range(e, 0, extent_symbol("V", 1))),
...     (Term(sympy.exp(X[i, j] - L[i]) * V[j, e], cols),),
...     (Operand("X", 2), Operand("L", 1), Operand("V", 2)))
>>> nest = pair(lse, weighted)
>>> nest.online, nest.free[-1].stop, [str(t.body) for t in nest.terms]
('L', V.shape[1] + 1, ['X[i, j]', 'V[j, e]'])
>>> [str(n) for n in unpair(nest)] == [str(lse), str(weighted)]
True

Differentiated in float64, the weighted sum is centred on its own output (`centred`):

>>> print(centred(lse, weighted))
O__centred[i, e] := exp(X[i, j] - L[i])*(V[j, e] - O[i, e])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import sympy

from codegen.ir.ieee import Shifted, shifted
from codegen.ir.nest import (
    LoopNest,
    Operand,
    Range,
    Reduce,
    Term,
    extent_symbol,
    map_expressions,
    rename,
    tensor_base,
)
from codegen.passes.guards import guard_mask, identity_of


def _single_term(nest: LoopNest, reduction: str) -> Term | None:
    if nest.reduction != reduction or nest.online or len(nest.terms) != 1:
        return None
    term = nest.terms[0]
    if len(term.reduced) != 1:
        return None
    return guard_mask(term, identity_of(reduction))


def _masked(term: Term, identity: sympy.Expr) -> Term:
    """`term` with its guard back as a `where` around its body (`guard_mask` undone)."""
    if term.guard == sympy.true:
        return term
    body = sympy.Piecewise((term.body, term.guard), (identity, True))
    return dataclasses.replace(term, body=body, guard=sympy.true)


def _whole(argument: sympy.Expr) -> sympy.Expr:
    """The weight's argument as one sum (a `Shifted` score, `codegen.passes.softmax_weights`,
    is `X - L` all the same)."""
    return sympy.Add(*argument.args) if isinstance(argument, Shifted) else argument


def _split_weight(body: sympy.Expr, read: sympy.Indexed) -> tuple[sympy.Expr, sympy.Expr] | None:
    """`(argument, weight)` where `body = exp(argument) * weight` and only the argument
    reads `read`."""
    found = [f for f in sympy.Mul.make_args(body) if f.has(read)]
    if len(found) != 1 or not isinstance(found[0], sympy.exp):
        return None
    weight = sympy.Mul(*(f for f in sympy.Mul.make_args(body) if f is not found[0]))
    if weight.has(tensor_base(read.base.name)) or weight.atoms(Reduce):
        return None
    return found[0].args[0], weight


Shapes = Mapping[str, Sequence[int]]


def _extents(nests: Sequence[LoopNest], shapes: Shapes | None) -> dict[sympy.Symbol, int]:
    """The value of every extent the nests name that `shapes` gives (none without shapes)."""
    found = {}
    for nest in nests:
        for name in nest.extent_tensors():
            for axis, n in enumerate((shapes or {}).get(name, ())):
                found[extent_symbol(name, axis)] = int(n)
    return found


def _loops(term: Term, free: Sequence[Range], extents: dict) -> tuple:
    """What decides which scores a term visits: its free and reduced ranges, constraints and
    guard, with the extents of this call substituted."""

    def value(expr: sympy.Basic) -> sympy.Basic:
        return sympy.sympify(expr).xreplace(extents)

    ranges = tuple(Range(r.index, value(r.start), value(r.stop)) for r in (*free, *term.reduced))
    return ranges, frozenset(value(c) for c in term.constraints), value(term.guard)


def pair(lse: LoopNest, weighted: LoopNest, shapes: Shapes | None = None) -> LoopNest | None:
    """The one-pass nest of a logsumexp `lse` and a sum `weighted` of `exp(X - L) * W` over
    the same reduced range, or None when they do not have that form (module docstring).

    Ranges are compared as written, or, where `shapes` (of the tensors the nests name, for
    one call) are given, as the loops they give for those shapes: `Min(K.shape[1],
    V.shape[1])` and `K.shape[1]` are the same loop when K and V have as many keys. The
    paired nest is then right for those shapes only, as every fused nest is
    (`codegen.passes.fusion`)."""
    lse_term, term = _single_term(lse, "logsumexp"), _single_term(weighted, "sum")
    if lse_term is None or term is None or len(weighted.free) != len(lse.free) + 1:
        return None
    free = weighted.free_indices[: len(lse.free)]
    read = tensor_base(lse.output)[free] if free else None
    reads = {a for a in term.body.atoms(sympy.Indexed) if a.base.name == lse.output}
    if read is None or reads != {read}:
        return None
    # The weighted sum's ranges may name L's extents: L's own ranges, which the pair keeps.
    own = {extent_symbol(lse.output, k): r.stop - r.start for k, r in enumerate(lse.free)}
    weighted = map_expressions(weighted, lambda e: e.xreplace(own))
    term = guard_mask(weighted.terms[0], identity_of("sum"))
    names = {a.name: b.name for a, b in zip(lse.free_indices, free)}
    names[lse_term.reduced[0].index.name] = term.reduced[0].index.name
    renamed = rename(lse, tensors={}, indices=names)
    scores = guard_mask(renamed.terms[0], -sympy.oo)
    extents = _extents((lse, weighted), shapes)
    lse_loops = _loops(scores, renamed.free, extents)
    if lse_loops != _loops(term, weighted.free[: len(lse.free)], extents):
        return None
    split = _split_weight(term.body, read)
    if split is None or _whole(split[0]) != scores.body - read:
        return None
    if free[-1] in split[1].free_symbols:
        return None  # a block of rows shares each weight (codegen.c.attention.online)
    last = weighted.free[-1]
    operands = {op.name: op for op in (*lse.operands, *weighted.operands) if op.name != lse.output}
    return dataclasses.replace(
        weighted,
        free=(*weighted.free[:-1], Range(last.index, last.start, last.stop + 1)),
        terms=(scores, dataclasses.replace(term, body=split[1])),
        operands=tuple(operands.values()),
        reduction="logsumexp",
        online=lse.output,
    )


def _reads(term: Term, operands: Sequence[Operand]) -> tuple[Operand, ...]:
    named = {a.base.name for a in term.body.atoms(sympy.Indexed)}
    named |= {s.name for s in term.body.free_symbols if not s.is_integer}
    return tuple(op for op in operands if op.name in named)


def unpair(nest: LoopNest) -> tuple[LoopNest, LoopNest]:
    """The logsumexp nest and the weighted sum that the one-pass `nest` stands for."""
    scores, weight = nest.terms
    free, last = nest.free[:-1], nest.free[-1]
    masked = _masked(scores, -sympy.oo)
    lse = LoopNest(nest.online, free, (masked,), _reads(masked, nest.operands), "logsumexp")
    read = tensor_base(nest.online)[tuple(r.index for r in free)]
    body = shifted(scores.body, read) * weight.body
    term = _masked(dataclasses.replace(weight, body=body), sympy.S.Zero)
    operands = (*nest.operands, Operand(nest.online, len(free)))
    weighted = dataclasses.replace(
        nest,
        free=(*free, Range(last.index, last.start, last.stop - 1)),
        terms=(term,),
        operands=_reads(term, operands),
        reduction="sum",
        online="",
    )
    return lse, weighted


def weights_total(nest: LoopNest) -> LoopNest:
    """The sum of each row's weights `exp(X - L)` of the one-pass `nest`, over the keys its
    weighted sum visits (named `<L>__total`): 1 but for the rounding of `L`. A weighted sum
    run as two nests is divided by it (`tensordsl.binding.one_pass.two_nests`), so that it
    is normalised by its own weights' sum as the one-pass kernels' is; a row's rounding of
    `L` then cancels from the scores' cotangent (`codegen.passes.softmax_weights`)."""
    scores, weight = nest.terms
    free = nest.free[:-1]
    read = tensor_base(nest.online)[tuple(r.index for r in free)]
    term = _masked(dataclasses.replace(weight, body=shifted(scores.body, read)), sympy.S.Zero)
    operands = (*nest.operands, Operand(nest.online, len(free)))
    return LoopNest(f"{nest.online}__total", free, (term,), _reads(term, operands))


def centred(lse: LoopNest, weighted: LoopNest, shapes: Shapes | None = None) -> LoopNest | None:
    """The softmax-weighted sum `O = sum_j exp(X - L) * W` written as `C = sum_j exp(X - L) *
    (W - O)`, O read as an operand (its value) and the nest's output named `C` (`O__centred`),
    for differentiating with L and O held constant; None where `pair(lse, weighted, shapes)`
    does not pair them.

    Its gradient is the whole softmax's: the weights sum to 1, so `dO = sum_j P * (dX *
    (W - O) + dW)` and L gets no cotangent from O. At a key that takes all the weight (a
    one-hot row: float64 scores near 1e200) `W - O` is exactly 0, where FlashAttention's
    `dP - D` (`sum_e dO * W` less `sum_e dO * O`, two sums in different orders) leaves a
    rounding residue that the scores' slope then multiplies (docs/nn.md). C itself is 0 in
    exact arithmetic (NaN where O is not finite): a gradient that reads its saved output
    (`grad._saved_output_shortcut`: a row-constant bias, whose gradient is 0) must be given
    that, not O.
    """
    if pair(lse, weighted, shapes) is None:
        return None
    # The mask stays the term's guard: a pair it drops is never weighted (no 0 * NaN).
    term = guard_mask(weighted.terms[0], identity_of("sum"))
    read = tensor_base(lse.output)[weighted.free_indices[: len(lse.free)]]
    split = _split_weight(term.body, read)
    assert split is not None  # `pair` found this form
    own = tensor_base(weighted.output)[weighted.free_indices]
    body = sympy.exp(split[0]) * (split[1] - own)
    return dataclasses.replace(
        weighted,
        output=f"{weighted.output}__centred",
        terms=(dataclasses.replace(term, body=body),),
        operands=(*weighted.operands, Operand(weighted.output, len(weighted.free))),
    )


def pair_stored(stored: Sequence[LoopNest], shapes: Shapes | None = None) -> tuple[LoopNest, ...]:
    """`stored` (nests in run order) with each logsumexp and the weighted sum that reads it
    replaced by their one-pass nest, run where the weighted sum ran; a logsumexp read by a
    nest in between stays as it is. `shapes`: as `pair` takes them."""
    runs = list(stored)
    for n, lse in enumerate(stored):
        for m in range(n + 1, len(stored)):
            if lse.output not in stored[m].operand_names:
                continue
            paired = pair(lse, stored[m], shapes)
            if paired is not None and not any(
                lse.output in between.operand_names for between in stored[n + 1 : m]
            ):
                runs[runs.index(stored[m])] = paired
                runs.remove(lse)
            break
    return tuple(runs)
