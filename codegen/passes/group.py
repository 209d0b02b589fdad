"""Gradient nests that share their loops, grouped into one multi-output nest.

The gradients of one forward nest often loop over the same indices and recompute the same
values: the Gaussian kernel `Y[i] = sum_j exp(-|X[i] - Z[j]|^2) B[j]` gives `dZ[j, p]` and
`dB[j]`, both free `j` and summed over `i`, both evaluating the exponential. Run apart,
each evaluates it. Grouped, one nest (`codegen.ir.members`) computes them together: the
exponential once per `(j, i)`, one accumulator per output element, each element written
once (no atomics, the same bits on every run).

Members. A gradient's axis whose index is read only by tests `p == c` against constants
(`X[i, 0], X[i, 1], X[i, 2]` spelled out give `dX[i, p] = where(p == 0, ...) + ...`) is
split into one member per constant (`dX[i, 0]`, ...; the other positions are zero); any
other gradient is one member. Members group when, for the call's extents, their free ranges
are the same, each term's reduced ranges, guard and constraints are the same (a constraint
that holds everywhere on its loops is dropped first: `j < Z.shape[0]` where `j` runs over
`B.shape[0] == Z.shape[0]`), their reduction is a sum and their dtype the same. A gradient
one of whose members would be left alone is not split; a group needs two members.

>>> from codegen.ir.examples import gaussian
>>> from codegen.passes.grad import gradient
>>> nests = {f"d{x}": gradient(gaussian(), x).nest for x in "XZB"}
>>> shapes = {"X": (5, 2), "Z": (7, 2), "B": (7,), "dX": (5, 2), "dZ": (7, 2), "dB": (7,)}
>>> [[str(m) for m in g.members] for g in group_gradients(nests, shapes)]
[['dX[:, 0]', 'dX[:, 1]'], ['dZ[:, 0]', 'dZ[:, 1]', 'dB']]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.ir.affine import holds_everywhere
from codegen.ir.extents import extent_values
from codegen.ir.members import MAX_MEMBERS, switch
from codegen.ir.nest import LoopNest, Operand, Range, Reduce, Term, index_symbol

Shapes = Mapping[str, Sequence[int]]


@dataclass(frozen=True)
class Member:
    """One output of a group: gradient `output` whole (`axis` None) or its positions
    `position` along `axis` (the rest of that axis is zero)."""

    output: str
    nest: LoopNest  # its nest alone: the pinned axis removed from the free ranges
    axis: int | None = None
    position: int = 0

    def __str__(self) -> str:
        if self.axis is None:
            return self.output
        rank = len(self.nest.free) + 1
        at = [":"] * rank
        at[self.axis] = str(self.position)
        return f"{self.output}[{', '.join(at)}]"


@dataclass(frozen=True)
class Group:
    """A multi-output nest and its members, in the order of its packed last axis."""

    nest: LoopNest
    members: tuple[Member, ...]


def group_gradients(nests: Mapping[str, LoopNest], shapes: Shapes) -> tuple[Group, ...]:
    """The groups of two or more members among gradient nests (keyed by their output).

    Args:
        nests: gradient nests by output name, in the order to keep.
        shapes: the shape of every tensor the nests name.

    Returns:
        The groups; a gradient in none of them runs as its own nest.
    """
    alone: set[str] = set()  # split gradients run whole: a member of theirs had no partner
    while True:
        keyed: dict[tuple, list[tuple[Member, tuple]]] = {}
        for name, nest in nests.items():
            members = (Member(name, nest),) if name in alone else split_members(name, nest)
            for member in members:
                found = _signature(member.nest, shapes)
                if found is None and member.axis is not None:
                    alone.add(name)
                elif found is not None:
                    keyed.setdefault(found[0], []).append((member, found[1]))
        lonely = {
            ms[0][0].output for ms in keyed.values() if len(ms) == 1 and ms[0][0].axis is not None
        }
        if lonely <= alone:
            break
        alone |= lonely
    groups = []
    for members in keyed.values():
        for start in range(0, len(members), MAX_MEMBERS):
            part = members[start : start + MAX_MEMBERS]
            if len(part) > 1:
                groups.append(_packed(part, set(nests)))
    return tuple(groups)


def split_members(output: str, nest: LoopNest) -> tuple[Member, ...]:
    """`nest` as members: one per constant of its first axis read only by `p == c` tests
    (see the module docstring), else the whole nest."""
    if nest.reduction != "sum" or nest.online:
        return (Member(output, nest),)
    for axis, r in enumerate(nest.free):
        positions = _pinned_positions(nest, r)
        if positions:
            free = nest.free[:axis] + nest.free[axis + 1 :]
            return tuple(
                Member(output, _pinned(nest, free, r.index, c), axis, c) for c in positions
            )
    return (Member(output, nest),)


def _pinned_positions(nest: LoopNest, r: Range) -> tuple[int, ...]:
    """The constants `c` of the tests `p == c` when they are all that reads `p`, else ()."""
    p = r.index
    if r.start != 0:
        return ()
    found: set[int] = set()
    for term in nest.terms:
        others = [
            *term.constraints,
            term.guard,
            *(x for q in term.reduced for x in (q.start, q.stop)),
        ]
        if any(p in sympy.sympify(x).free_symbols for x in others):
            return ()
        tests = [e for e in term.body.atoms(sympy.Eq) if p in e.free_symbols]
        for test in tests:
            others = [a for a in test.args if a != p]
            if len(others) != 1 or not others[0].is_Integer:
                return ()
            found.add(int(others[0]))
        if p in term.body.xreplace({t: sympy.false for t in tests}).free_symbols:
            return ()
        if term.body.xreplace({t: sympy.false for t in tests}) != 0:
            return ()
    return tuple(sorted(found)) if found and min(found) >= 0 else ()


def _pinned(nest: LoopNest, free: tuple[Range, ...], p: sympy.Symbol, c: int) -> LoopNest:
    terms = []
    for term in nest.terms:
        tests = {
            e: sympy.Eq(c, e.args[0] if e.args[1] == p else e.args[1])
            for e in term.body.atoms(sympy.Eq)
            if p in e.free_symbols
        }
        body = term.body.xreplace({t: sympy.true if v else sympy.false for t, v in tests.items()})
        if body != 0:
            terms.append(Term(body, term.reduced, term.constraints, term.guard))
    if not terms:
        terms = [Term(sympy.Integer(0))]
    return LoopNest(nest.output, free, tuple(terms), nest.operands, nest.reduction)


def _signature(nest: LoopNest, shapes: Shapes) -> tuple[tuple, tuple] | None:
    """(the key members group by, the nest's terms keyed by their loops), or None when it
    cannot group (not a sum, or its loop indices are bound again inside its body)."""
    if nest.reduction != "sum" or nest.online:
        return None
    extents = {s: sympy.Integer(v) for s, v in extent_values(nest, shapes).items()}
    names = {r.index: index_symbol(f"f{d}_") for d, r in enumerate(nest.free)}
    free_key = tuple(_concrete(x, names, extents) for r in nest.free for x in (r.start, r.stop))
    terms: dict[tuple, list] = {}
    for term in nest.terms:
        bound = {r.index for r in term.body.atoms(Reduce)}
        loops = {*names, *term.reduced_indices}
        if bound & loops:
            return None
        local = dict(names)
        local |= {r.index: index_symbol(f"r{d}_") for d, r in enumerate(term.reduced)}
        outer, inner = _box(nest.free, names, extents), _box(term.reduced, local, extents)
        if outer is None or inner is None:
            return None
        box = outer | inner
        constraints = []
        for c in term.constraints:
            value = _concrete(c, local, extents)
            if not holds_everywhere(value, box):
                constraints.append((value, c))
        key = (
            tuple(_concrete(x, local, extents) for r in term.reduced for x in (r.start, r.stop)),
            tuple(sorted((str(v) for v, _ in constraints))),
            _concrete(term.guard, local, extents),
        )
        kept = tuple(c for _, c in constraints)
        terms.setdefault(key, []).append(Term(term.body, term.reduced, kept, term.guard))
    merged = {k: _merge(ts) for k, ts in terms.items()}
    # The loop indices by name: gradients of one forward nest name a loop they share alike
    # (renamed, `dZ[j] = sum_i` would pair with `dX[i] = sum_j`, sharing nothing).
    ordered = tuple(sorted(merged.items(), key=lambda kv: str(kv[0])))
    loops = (nest.free_indices, tuple(t.reduced_indices for _, t in ordered))
    return (free_key, tuple(k for k, _ in ordered), str(loops)), ordered


def _merge(terms: list[Term]) -> Term:
    """Terms with the same loops as one term (their bodies added)."""
    return Term(
        sympy.Add(*(t.body for t in terms)), terms[0].reduced, terms[0].constraints, terms[0].guard
    )


def _concrete(expr: sympy.Basic, names: Mapping, extents: Mapping) -> sympy.Basic:
    return sympy.sympify(expr).xreplace(names).xreplace(extents)


def _box(ranges: Sequence[Range], names: Mapping, extents: Mapping) -> dict | None:
    """Each range's concrete [start, stop - 1] by its renamed index; None when a range is
    not concrete (its bounds depend on another index)."""
    box = {}
    for r in ranges:
        lo, hi = (_concrete(x, names, extents) for x in (r.start, r.stop))
        if not (lo.is_Integer and hi.is_Integer):
            return None
        box[names[r.index]] = (int(lo), int(hi) - 1)
    return box


def _packed(members: Sequence[tuple[Member, tuple]], taken: set[str]) -> Group:
    """The multi-output nest of `members` (each with its terms keyed by their loops)."""
    first = members[0][0].nest
    index = index_symbol("m")
    while index in {s for m, _ in members for e in m.nest.expressions() for s in e.free_symbols}:
        index = index_symbol(index.name + "_")
    keys = [k for k, _ in members[0][1]]
    renames = []
    for member, terms in members:
        free = {r.index: f.index for r, f in zip(member.nest.free, first.free, strict=True)}
        renames.append((free, dict(terms)))
    bodies_terms = []
    for n, key in enumerate(keys):
        model = members[0][1][n][1]
        bodies = []
        for free, terms in renames:
            term = terms[key]
            mapping = dict(free)
            mapping |= {r.index: f.index for r, f in zip(term.reduced, model.reduced, strict=True)}
            bodies.append(_renamed(term.body, mapping))
        bodies_terms.append(
            Term(switch(index, bodies), model.reduced, model.constraints, model.guard)
        )
    operands: dict[str, Operand] = {}
    for member, _ in members:
        for op in member.nest.operands:
            operands.setdefault(op.name, op)
    output = "_".join(dict.fromkeys(m.output for m, _ in members))
    while output in taken or output in operands:
        output += "_"
    free = (*first.free, Range(index, 0, len(members)))
    nest = LoopNest(output, free, tuple(bodies_terms), tuple(operands.values()), "sum")
    return Group(nest, tuple(m for m, _ in members))


def _renamed(expr: sympy.Basic, mapping: Mapping) -> sympy.Basic:
    """`expr` with its loop indices renamed at once (through stand-ins, so swaps work)."""
    stand = {old: sympy.Dummy(old.name, integer=True) for old in mapping}
    back = {stand[old]: new for old, new in mapping.items()}
    return expr.xreplace(stand).xreplace(back)
