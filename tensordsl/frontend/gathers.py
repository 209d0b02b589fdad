"""Index arrays: an access whose index reads an integer array (`W[tok[b,t], d]`), a gather.

An axis of such an access is an affine expression of loop indices plus integer multiples of
reads of index arrays (`inds[i] + j`, `2*pos[i] - 1`); each read has affine indices of its
own (an index array read inside another's index is refused). The translator replaces the
access by a plain read of a *gathered operand* (`W__at12[b, t, d]`): an operand of the nest
indexed by the loop indices the access mentions, each over `[0, stop)` of that index's range,
that the binding computes before the nest runs (`tensordsl/binding/gather.py`), reading the
table once per element. The loop nest, its gradient nests, schedules and back ends then see
ordinary affine accesses; the table and the index arrays stay operands of the nest (for
their extents; unread, they get no gradient from it), and the table's gradient comes from
the gather's own transpose: a deterministic segmented sum, each element written once.

Ranges: the index arrays' reads are ordinary accesses (`tok[b,t]` gives b and t the extents
of tok's axes); an axis that reads an index array gives its indices no range (`j` in
`A[inds[i] + j]` needs another access or `ranges=`); a plain axis of the table (`d` in
`W[tok[b,t], d]`) gives one as any access does. Where an index array points is checked when
the call runs: out of the table's axis, eagerly an error, traced (jit, vmap, grad) NaN.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> low = lower(parse("E[b,t,d] := W[tok[b,t], d]"))
>>> print(low.nest.terms[0].body, low.nest.operand_names)
W__at12[b, t, d] ('W', 'tok', 'W__at12')
>>> g = low.gathers[0]
>>> g.table, g.indices, [str(a.reads[0].array) for a in g.axes if a.reads]
('W', ('b', 't', 'd'), ['tok'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy

from codegen.ir.affine import Affine, NotAffine, as_affine
from codegen.ir.nest import extent_symbol, index_symbol, scalar_symbol, tensor_base
from tensordsl.errors import IndexExpressionError, UnsupportedError
from tensordsl.frontend.indices import AccessUse, IndexExpressions, text_of, walk
from tensordsl.frontend.parse import Access, Expr, Name, Span


@dataclass(frozen=True)
class IndexRead:
    """`coefficient * array[axes]` inside an index expression."""

    coefficient: int
    array: str
    axes: tuple[Affine, ...]
    span: Span


@dataclass(frozen=True)
class GatherAxis:
    """One axis of a gathered access: `affine` (loop indices) plus `reads` (index arrays)."""

    affine: Affine
    reads: tuple[IndexRead, ...] = ()


@dataclass(frozen=True)
class Gather:
    """A gathered operand: `name[indices] = table[axes]`, every index over `[0, stop)`."""

    name: str
    table: str
    indices: tuple[str, ...]
    axes: tuple[GatherAxis, ...]
    span: Span
    #: a one-hot pick (`frontend/one_hot.py`): a position outside the table reads 0, never
    #: a `RangeError`, and an index array may hold floats (a whole number picks, else none)
    masked: bool = False

    @property
    def arrays(self) -> tuple[str, ...]:
        """The index arrays it reads, in order of appearance."""
        return tuple(dict.fromkeys(r.array for a in self.axes for r in a.reads))


def reads_array(node: Access) -> bool:
    """Whether an index of `node` reads a tensor (an index array)."""
    return any(isinstance(n, Access) for index in node.indices for n in walk(index))


def gathered_name(table: str, span: Span, taken: set[str]) -> str:
    """A name for the gathered operand no user name can be: the table's and the offset of
    the access in the source (unique in a program, whose spans are offsets into all of it)."""
    name = f"{table}__at{span[0]}"
    while name in taken:
        name += "_"
    return name


def gather_access(tr: Any, node: Access) -> Any:
    """Translate a gathered access (the translator `tr` is `IndexExpressions`); returns the
    read of its gathered operand and records the `Gather` in `tr.gathers`."""
    tr.register(node.name, len(node.indices), node.name_span)
    axes, uses = [], []
    for axis, index in enumerate(node.indices):
        reads = [n for n in walk(index) if isinstance(n, Access)]
        if not reads:
            affine = tr.affine(index, extent_symbol(node.name, axis))
            axes.append(GatherAxis(affine))
            uses.append(affine)
            continue
        axes.append(_gathered_axis(tr, node, axis, index, reads))
        uses.append(Affine((), sympy.Integer(0)))  # gives its indices no range
    spans = tuple(i.span for i in node.indices)
    through = tuple(n for n, a in enumerate(axes) if a.reads)
    tr.accesses.append(AccessUse(node.name, tuple(uses), node.span, spans, gathered=through))
    indices = tuple(
        dict.fromkeys(
            s.name
            for a in axes
            for s in (*a.affine.indices, *(i for r in a.reads for x in r.axes for i in x.indices))
        )
    )
    name = gathered_name(node.name, node.span, _names(tr))
    tr.register(name, len(indices), node.name_span)
    tr.gathers.append(Gather(name, node.name, indices, tuple(axes), node.span))
    if not indices:
        return scalar_symbol(name)
    return tensor_base(name)[tuple(index_symbol(n) for n in indices)]


def _names(tr: Any) -> set[str]:
    return {getattr(n, "name", "") for n in walk(tr.st.body)} | set(tr.ranks) | {tr.st.output}


def _gathered_axis(tr: Any, node: Access, axis: int, index: Expr, reads: list[Access]) -> Any:
    """An axis that reads index arrays: each read becomes a stand-in symbol, the expression
    must be affine in the loop indices and the stand-ins together."""
    stand_ins: dict[int, sympy.Symbol] = {}
    found: dict[sympy.Symbol, Access] = {}
    for n, read in enumerate(reads):
        if any(isinstance(m, Access) for i in read.indices for m in walk(i)):
            raise UnsupportedError(
                f"index array '{read.name}' is read with an index that reads another array",
                tr.src,
                read.span,
                expected="index arrays read at affine indices, as in 'W[tok[b,t], d]'",
                hint="gather the inner index first in its own statement or with jnp.take",
            )
        if read.name == node.name:
            raise UnsupportedError(
                f"'{node.name}' is read inside its own index",
                tr.src,
                read.span,
                expected="an index array other than the table it indexes",
            )
        symbol = sympy.Symbol(f"_read{n}", integer=True)
        stand_ins[id(read)], found[symbol] = symbol, read
    tr.stand_ins = stand_ins
    saved = tr.index_symbols
    tr.index_symbols = (*saved, *found)
    try:
        tr.extent = extent_symbol(node.name, axis)
        expr = tr.index_expr(index, index)
    finally:
        tr.stand_ins, tr.index_symbols = {}, saved
    loop = [
        index_symbol(n.name)
        for n in walk(index)
        if isinstance(n, Name) and n.name not in ("begin", "end")
    ]
    try:
        affine = as_affine(expr, [*dict.fromkeys(loop), *found])
    except NotAffine:
        raise IndexExpressionError(
            f"index expression '{text_of(tr.src, index.span)}' is not affine in its indices "
            "and index-array reads",
            tr.src,
            index.span,
            expected="loop indices and index-array reads with integer coefficients, such as "
            "'inds[i] + j'",
        ) from None
    plain = Affine(tuple((s, c) for s, c in affine.coefficients if s not in found), affine.constant)
    index_reads = []
    for symbol, read in found.items():
        coefficient = affine.coefficient(symbol)
        tr.access(read)  # registers the index array and its access (ranges, shape checks)
        if coefficient:
            index_reads.append(IndexRead(coefficient, read.name, tr.accesses[-1].axes, read.span))
    return GatherAxis(plain, tuple(index_reads))


class GatheredAccesses(IndexExpressions):
    """`IndexExpressions` that also take index arrays: a gathered access is translated by
    `gather_access`, and an index-array read inside it by its stand-in symbol."""

    gathers: list[Gather]
    #: the stand-in symbol of each index-array read while a gathered axis is translated
    stand_ins: dict[int, sympy.Symbol] = {}  # noqa: RUF012 (replaced, never mutated)
    st: Any

    def access(self, node: Access) -> Any:
        if node.indices and reads_array(node):
            return gather_access(self, node)
        return super().access(node)

    def index_expr(self, node: Expr, whole: Expr) -> sympy.Expr:
        if isinstance(node, Access) and id(node) in self.stand_ins:
            return self.stand_ins[id(node)]
        return super().index_expr(node, whole)
