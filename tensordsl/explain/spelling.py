"""Gathered operands as the user wrote them, for `explain` and `profile`.

The translator replaces an access through index arrays (`W[tok[i], d]`) by a read of a gathered
operand with an internal name (`W__at8[i, d]`, `tensordsl.frontend.gathers`). Nests, their
gradients and the back ends see that name; a user never wrote it. `explain` and `profile` show
the access instead, its indices renamed as each nest names them, and the gradient of the
gathered operand as the gradient of its table at that access (`dW[tok[i], d]`).

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> low = lower(parse("Y[i] := W[tok[i], d] * X[i,d]"))
>>> spelled = spellings(low)
>>> print(spell(low.nest.terms[0].body, spelled))
W[tok[i], d]*X[i, d]
>>> label("grad_W__at8", spelled), label("dW__at8", spelled), label("grad_X", spelled)
('grad_W[tok[i], d]', 'dW[tok[i], d]', 'grad_X')
>>> label("dV_dW__at8", spelled), label("dW__at80", spelled)
('dV_dW[tok[i], d]', 'dW__at80')
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass

import sympy

from codegen.ir.nest import LoopNest, extent_symbol, index_symbol, scalar_symbol, tensor_base
from codegen.ir.source import expr_source
from tensordsl.frontend.gathers import Gather
from tensordsl.frontend.lower import Lowered


@dataclass(frozen=True)
class Spelling:
    """A gathered operand `name[indices]` and the access it stands for, `access`, an
    expression of the same `indices` (`W[tok[i], d]`); `extents`: the extent of each axis of
    the gathered operand, as the range of its index (`tok.shape[0]`)."""

    name: str
    table: str
    indices: tuple[sympy.Symbol, ...]
    access: sympy.Expr
    extents: tuple[sympy.Expr, ...]

    @property
    def text(self) -> str:
        """The access as source: `W[tok[i], d]`."""
        return expr_source(self.access)

    def at(self, indices: Iterable[sympy.Expr]) -> sympy.Expr:
        """The access with its indices replaced by `indices` (as a nest names them)."""
        return self.access.xreplace(dict(zip(self.indices, indices, strict=True)))


def spellings(lowered: Iterable[Lowered] | Lowered) -> tuple[Spelling, ...]:
    """The spelling of every gathered operand of a statement (or of several: a program's)."""
    statements = (lowered,) if isinstance(lowered, Lowered) else tuple(lowered)
    found = []
    for low in statements:
        stops = {r.index: r.stop - r.start for r in low.ranges}
        for g in low.gathers:
            indices = tuple(index_symbol(n) for n in g.indices)
            extents = tuple(stops.get(i, extent_symbol(g.name, n)) for n, i in enumerate(indices))
            found.append(Spelling(g.name, g.table, indices, _access(g), extents))
    return tuple(found)


def _access(gather: Gather) -> sympy.Expr:
    """`table[axes]` as an expression: each axis its affine part plus its index reads."""
    axes = []
    for axis in gather.axes:
        reads = [
            r.coefficient * tensor_base(r.array)[tuple(a.expr() for a in r.axes)]
            for r in axis.reads
        ]
        axes.append(sympy.Add(axis.affine.expr(), *reads))
    return tensor_base(gather.table)[tuple(axes)] if axes else scalar_symbol(gather.table)


def spell(expr: sympy.Basic, spelled: Iterable[Spelling]) -> sympy.Basic:
    """`expr` with every read of a gathered operand replaced by its access, and every extent
    of one by the range of its index."""
    by_name = {s.name: s for s in spelled}
    if not by_name:
        return expr
    mapping: dict[sympy.Basic, sympy.Basic] = {}
    for read in expr.atoms(sympy.Indexed):
        found = by_name.get(str(read.base.label))
        if found is not None:
            mapping[read] = found.at(read.indices)
    for symbol in expr.free_symbols:
        found = by_name.get(getattr(symbol, "name", ""))
        if found is not None and not found.indices:
            mapping[symbol] = found.access
    for s in by_name.values():
        mapping.update({extent_symbol(s.name, n): e for n, e in enumerate(s.extents)})
    return expr.xreplace(mapping)


def label(name: str, spelled: Iterable[Spelling]) -> str:
    """A nest's name with a gathered operand's gradient named by its access: `grad_W__at8`
    (`profile`, a kernel's) or `dW__at8` (a program's) as `grad_W[tok[i], d]`, `dW[...]`,
    also as a part of a pair's name (`dV_dW__at8`, two gradient nests run as one) or of a
    member's (`dV_dW__at8[0:16]`)."""
    for s in spelled:
        for prefix in ("grad_", "d"):
            # a whole part: not inside a longer name (`dW__at80`, `odW__at8`)
            part = rf"(?<![A-Za-z0-9]){re.escape(prefix + s.name)}(?![A-Za-z0-9])"
            written = (prefix + s.text).replace("\\", "\\\\")  # as re.sub reads it
            name = re.sub(part, written, name)
    return name


def spelled_nest(nest: LoopNest, spelled: Iterable[Spelling]) -> LoopNest:
    """`nest` for printing only (`python -m tensordsl explain`'s "parsed"), its bodies read
    its gathered operands as written: `Y[i] := W[tok[i], d]*X[i, d]`."""
    spelled = tuple(spelled)
    terms = tuple(dataclasses.replace(t, body=spell(t.body, spelled)) for t in nest.terms)
    return dataclasses.replace(nest, terms=terms)


def gradient_lhs(spelled: Spelling, free: Iterable[sympy.Symbol]) -> str:
    """The left-hand side of the gradient nest of a gathered operand: `dW[tok[i], d]`."""
    return "d" + expr_source(spelled.at(tuple(free)))


def unread(nest: LoopNest, spelled: Iterable[Spelling]) -> frozenset[str]:
    """The tables and index arrays of `spelled` that are operands of `nest` but that its body
    does not read (read through gathers only: the nest gives them no gradient)."""
    read = {str(b.label) for t in nest.terms for b in t.body.atoms(sympy.IndexedBase)}
    read |= {getattr(x, "name", "") for t in nest.terms for x in t.body.free_symbols}
    used = {str(b.label) for s in spelled for b in s.access.atoms(sympy.IndexedBase)}
    return frozenset((used & set(nest.operand_names)) - read)
