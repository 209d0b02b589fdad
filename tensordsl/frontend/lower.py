"""Lower a parsed statement to a loop nest: the pipeline's front half.

`lower` runs the stages in order: the reduction is checked, the right-hand side is translated
to sympy (`tensordsl/frontend/translate.py`), every index gets a range
(`tensordsl/frontend/ranges.py`), and the nest is assembled: operands in order of first appearance,
free indices from the left, reduced indices in order of first appearance. `Lowered` keeps what the
call-time shape checks (`tensordsl/frontend/shapes.py`) need.

>>> from tensordsl.frontend.parse import parse
>>> low = lower(parse("Y[i] := X[i+k] * W[k]"))
>>> low.nest.free[0].stop
-W.shape[0] + X.shape[0] + 1
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, replace

import sympy

from codegen.ir.nest import LoopNest, Operand, Range, Term, index_symbol, tensor_base
from codegen.ir.reductions import USER_REDUCTIONS
from codegen.ir.source import expr_source
from codegen.passes.factor import factor_sums
from codegen.passes.guards import bound_guards
from tensordsl.errors import ReductionError, close_match
from tensordsl.frontend.einstein import AmbiguousSum, einstein_terms, unwrapped
from tensordsl.frontend.gathers import Gather
from tensordsl.frontend.indices import size_placeholder, walk
from tensordsl.frontend.left import diagonal_mask, left_forms, left_ranges
from tensordsl.frontend.one_hot import one_hot_gathers
from tensordsl.frontend.parse import Access, Span, Statement
from tensordsl.frontend.ranges import index_ranges
from tensordsl.frontend.selections import selection
from tensordsl.frontend.translate import AccessUse, Translation, translate
from tensordsl.frontend.typos import index_typos

__all__ = ["LANGUAGE_REDUCTIONS", "USER_REDUCTIONS", "Lowered", "check_reduction", "lower"]


@dataclass(frozen=True)
class Lowered:
    """A lowered statement plus what call-time checks need."""

    nest: LoopNest
    statement: Statement
    accesses: tuple[AccessUse, ...]  # every tensor access, in source order
    index_spans: tuple[tuple[str, Span], ...]  # first occurrence of every index
    explicit: frozenset[str]  # indices whose range came from `ranges=`
    operand_spans: tuple[tuple[str, Span], ...] = ()  # first use of every operand
    # every index's range as inferred, before the nest passes (guards as bounds, factored
    # sums) narrow or nest them: free indices first, then reduced ones
    ranges: tuple[Range, ...] = ()
    gathers: tuple[Gather, ...] = ()  # operands gathered through index arrays

    @property
    def gathered(self) -> frozenset[str]:
        """The names of the gathered operands (computed by the call, not given)."""
        return frozenset(g.name for g in self.gathers)

    @property
    def unread(self) -> frozenset[str]:
        """Tables and index arrays the nest does not read (read only through gathers): the
        nest gives them no gradient."""
        read = {str(b.label) for t in self.nest.terms for b in t.body.atoms(sympy.IndexedBase)}
        used = {n for g in self.gathers for n in (g.table, *g.arrays)}
        return frozenset(used - read)

    @property
    def copied_gather(self) -> str | None:
        """The gathered operand when the statement only copies it (`E[b,t,d] := W[tok[b,t],
        d]`): the call returns it and runs no nest."""
        terms = self.nest.terms
        if len(self.gathers) != 1 or len(terms) != 1 or terms[0].reduced or not self.nest.free:
            return None
        g = self.gathers[0]
        free = tuple(r.index for r in self.nest.free)
        if g.indices != tuple(i.name for i in free) or any(r.start != 0 for r in self.nest.free):
            return None
        return g.name if terms[0].body == tensor_base(g.name)[free] else None

    @property
    def inputs(self) -> tuple[str, ...]:
        """What a caller gives: the nest's operands but the gathered ones."""
        return tuple(n for n in self.nest.operand_names if n not in self.gathered)

    @property
    def reduced_ranges(self) -> tuple[Range, ...]:
        return self.ranges[len(self.nest.free) :]

    def index_span(self, name: str) -> Span | None:
        return dict(self.index_spans).get(name)

    def unshifted_uses(self, name: str) -> tuple[tuple[AccessUse, int], ...]:
        """`(access, axis)` for every axis indexed by `name` alone."""
        index = index_symbol(name)
        return tuple(
            (access, axis)
            for access in self.accesses
            for axis, affine in enumerate(access.axes)
            if affine.bare_index == index and access.plain(axis)
        )

    def constraining_uses(self, name: str) -> int:
        """How many axes read `name` and constrain its range (not mod, clamp or pad(e))."""
        index = index_symbol(name)
        return sum(
            1
            for access in self.accesses
            for axis, affine in enumerate(access.axes)
            if affine.coefficient(index) and access.widths(axis) is not None
        )


#: The reductions a statement may ask for: the table's user rows, and `mean`, which `lower`
#: writes as a sum of the body divided by the number of values it reduces.
MEAN = "mean"
LANGUAGE_REDUCTIONS = ("sum", MEAN, *(r for r in USER_REDUCTIONS if r != "sum"))

#: Reductions users reach for that the language does not have, and how to write them today.
MISSING_REDUCTIONS = {
    "avg": "a mean is reduce='mean' (or the prefix '(mean)')",
    "average": "a mean is reduce='mean' (or the prefix '(mean)')",
}

#: Names users reach for that the language spells topk/argtopk (KeOps' Kmin, argKmin).
SELECTIONS = {
    **{
        name: "the k largest are '(topk 5) V[i,r] := X[i,j]' (r the rank, 0 for the largest); "
        "the k smallest '(topk 5) V[i,r] := -X[i,j]'"
        for name in ("top_k", "kmin", "kmax", "sort")
    },
    **{
        name: "the positions of the k largest are '(argtopk 5) N[i,r] := X[i,j]'; of the "
        "k smallest (nearest neighbours) '(argtopk 5) N[i,r] := -D[i,j]'"
        for name in ("argkmin", "argkmax", "argsort", "arg_top_k", "argtop_k")
    },
}


def reduction_hint(name: object) -> str | None:
    """A hint for an unknown reduction: how to write a missing one, else a close match."""
    if isinstance(name, str) and name.lower() in MISSING_REDUCTIONS:
        return MISSING_REDUCTIONS[name.lower()]
    return close_match(name, LANGUAGE_REDUCTIONS)  # type: ignore[arg-type]


def check_reduction(name: object, source: str, span: Span | None = None) -> None:
    """Refuse a reduction the language does not have, with a hint.

    Raises:
        ReductionError: an unknown name (a hint for top-k's other spellings).
    """
    if name in LANGUAGE_REDUCTIONS:
        return
    if isinstance(name, str) and name.lower() in SELECTIONS:
        raise ReductionError(
            f"unknown reduction '{name}'",
            source,
            span,
            expected="one of " + ", ".join(LANGUAGE_REDUCTIONS),
            hint=SELECTIONS[name.lower()],
        )
    raise ReductionError(
        f"unknown reduction '{name}'",
        source,
        span,
        expected="one of " + ", ".join(LANGUAGE_REDUCTIONS),
        hint=reduction_hint(name),
    )


def _reduction(statement: Statement, reduce: str | None) -> str:
    prefix = statement.reduction
    src, span = statement.source, statement.reduction_span
    if prefix is not None and reduce is not None and prefix != reduce:
        raise ReductionError(
            f"the statement asks for reduction '{prefix}' but reduce='{reduce}' was given",
            src,
            span,
            expected="one reduction: the prefix or reduce=, or both the same",
        )
    name = prefix if prefix is not None else (reduce if reduce is not None else "sum")
    check_reduction(name, src, span if prefix is not None else None)
    return name


def _sizes(translation: Translation, found: Mapping[str, Range]) -> Translation:
    """`size(j)` replaced by the extent of `j`'s inferred range in the body."""
    sizes = {size_placeholder(name): r.stop - r.start for name, r in found.items()}
    if not translation.body.free_symbols & set(sizes):
        return translation
    return dataclasses.replace(
        translation,
        body=translation.body.xreplace(sizes),
    )


def _mean(terms: tuple[Term, ...]) -> tuple[Term, ...]:
    """A mean: each summed term divided by the number of values it sums (the product of its
    reduced ranges' lengths, as inferred: a mask in the body does not change it, as in
    `jnp.mean` of a `jnp.where`); a term added once, outside the sum, is its own mean."""
    return tuple(
        dataclasses.replace(t, body=t.body / sympy.Mul(*(r.stop - r.start for r in t.reduced)))
        if t.reduced
        else t
        for t in terms
    )


def _terms(
    translation: Translation, reduction: str, reduced: tuple[Range, ...], statement: Statement
) -> tuple[Term, ...]:
    """The nest's terms: in a sum (and a mean), Einstein's rule term by term
    (`tensordsl/frontend/einstein.py`): each additive term is summed over the reduced indices
    it reads, one that reads none is added once (`X[b,i] * W[i,o] + c[o]` adds c once, not
    once per i). Other reductions reduce the whole body over every reduced index (max, min
    and logsumexp give the same value either way; prod is a product of the whole body).

    >>> from tensordsl.frontend.parse import parse
    >>> [(t.body, t.reduced_indices) for t in lower(parse("Y[o] := X[i]*W[i,o] + c[o]")).nest.terms]
    [(W[i, o]*X[i], (i,)), (c[o], ())]
    """
    if reduction not in ("sum", MEAN) or not reduced:
        return (Term(unwrapped(translation.body), reduced),)
    try:
        groups = einstein_terms(translation.body, tuple(r.index for r in reduced))
    except AmbiguousSum as err:
        err.product = unwrapped(err.product)
        raise _ambiguous(err, statement, tuple(n for n, _ in translation.operands)) from None
    return tuple(
        Term(unwrapped(body), tuple(r for r in reduced if r.index in reads))
        for reads, body in groups
    )


def _ambiguous(
    err: AmbiguousSum, statement: Statement, operands: tuple[str, ...]
) -> ReductionError:
    name = err.index.name
    return ReductionError(
        f"the product '{expr_source(err.product, operands)}' is ambiguous: its factors share the "
        f"summed index '{name}' and each holds a term that does not read '{name}'",
        statement.source,
        statement.body.span,
        expected="each term summed over the summed indices it reads (Einstein's rule): write "
        f"the product out as a sum of products, and multiply a term that does not read '{name}' "
        f"by size({name}) to add it once per value of '{name}'",
    )


def _shift_gathered(translation: Translation, found: Mapping[str, Range]) -> Translation:
    """A gathered operand holds its indices' ranges from their starts: read `G[i - start]`."""
    shifts = {}
    for g in translation.gathers:
        starts = [found[n].start for n in g.indices]
        if any(start != 0 for start in starts):
            base = tensor_base(g.name)
            symbols = [index_symbol(n) for n in g.indices]
            shifts[base[tuple(symbols)]] = base[tuple(s - a for s, a in zip(symbols, starts))]
    if not shifts:
        return translation
    return replace(
        translation,
        body=translation.body.xreplace(shifts),
    )


def _masked(
    translation: Translation, masked: tuple[Span, ...], statement: Statement
) -> Translation:
    """The gathers of one-hot picks masked (outside reads 0), and the operands in the order
    the user wrote them (the rewrite moves the index array into the table's access)."""
    first = {}
    for node in walk(statement.body):
        if isinstance(node, Access):
            first.setdefault(node.name, node.span[0])
    gathers = tuple(replace(g, masked=g.span in masked) for g in translation.gathers)
    order = sorted(translation.operands, key=lambda op: first.get(op[0], len(statement.source)))
    return replace(translation, gathers=gathers, operands=order)


def lower(
    statement: Statement,
    *,
    reduce: str | None = None,
    ranges: Mapping[str, int | range] | None = None,
) -> Lowered:
    """Lower a parsed statement to a loop nest with inferred ranges.

    Args:
        statement: from `parse`.
        reduce: the reduction ("sum" by default); must agree with a `(max)` prefix.
        ranges: an extent or a `range` (step 1) per index; these win over inference.

    Returns:
        A `Lowered`: the nest plus the accesses that `check_shapes` needs.

    Raises:
        TensorDSLError: a subclass naming the mistake (unknown name or reduction, non-affine
        index, an index that nothing constrains, ...).

    >>> from tensordsl.frontend.parse import parse
    >>> print(lower(parse("C[i,j] := A[i,k] * B[k,j]")).nest.terms[0].reduced)
    (Range(index=k, start=0, stop=A.shape[1]),)
    """
    reduction = _reduction(statement, reduce)
    chosen = selection(statement, reduction, ranges)
    if chosen is not None:  # the rank index runs over [0, k)
        ranges = {**(ranges or {}), chosen.rank: chosen.k}
    forms = left_forms(statement)
    masked: tuple[Span, ...] = ()
    if reduction == "sum":  # a one-hot pick `Z[b,v] * (Y[b] == v)` read as a gather
        picked, masked = one_hot_gathers(forms.statement, tuple(ranges or ()))
        forms = replace(forms, statement=picked)
    translation = translate(forms.statement, indices=tuple(ranges or ()))
    if masked:
        translation = _masked(translation, masked, statement)
    new = {name for name, _ in forms.diagonal} | set(forms.unit)
    if new:
        mask = diagonal_mask(forms)
        translation.body *= mask
        plain = replace(translation, free=[n for n in translation.free if n not in new])
        found = index_ranges(plain, ranges, statement.source)
        found.update(left_ranges(forms, found))
    else:
        found = index_ranges(translation, ranges, statement.source)
    translation = _sizes(translation, found)
    index_typos(forms.statement, translation.reduced)
    free = tuple(found[n] for n in translation.free)
    reduced = tuple(found[n] for n in translation.reduced)
    translation = _shift_gathered(translation, found)
    terms = _terms(translation, reduction, reduced, statement)
    nest = LoopNest(
        output=statement.output,
        free=free,
        terms=_mean(terms) if reduction == MEAN else terms,
        operands=tuple(Operand(name, rank) for name, rank in translation.operands),
        reduction="sum" if reduction == MEAN else reduction,
    )
    nest = factor_sums(bound_guards(nest))
    return Lowered(
        nest,
        statement,
        translation.accesses,
        translation.index_spans,
        frozenset(ranges or ()),
        tuple(translation.operand_spans.items()),
        free + reduced,
        translation.gathers,
    )
