"""Index expressions: every axis of a tensor access as an `Affine` form, worded errors.

`codegen/ir/affine.py` decides what is affine; this part of the translator builds each
index expression with its `combine` (so nothing non-affine is ever built), reads Tullio's
positions `begin`/`end` as numbers of the axis, records every access with its spans for range
inference and the call-time checks, and words the refusals with the source underlined.
`tensordsl.frontend.translate` mixes it into its translator.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import sympy

from codegen.ir.affine import (
    DIVISION,
    FUNCTION,
    NON_INTEGER,
    NOT_INT64,
    POWER,
    PRODUCT,
    Affine,
    NotAffine,
    as_affine,
    combine,
)
from codegen.ir.functions import select
from codegen.ir.nest import extent_symbol, index_symbol, tensor_base
from tensordsl.errors import IndexExpressionError
from tensordsl.frontend.boundaries import BOUNDARY_FORMS, Boundary, boundary_form
from tensordsl.frontend.parse import Access, Binary, Call, Compare, Expr, Name, Number, Span, Unary

#: Tullio's positions inside an index expression: `D[i,end]` reads the last position of that
#: axis, `D[i,begin]` the first (0); neither is an index.
POSITIONS = ("begin", "end")
#: Leading batch axes (`Y[..., o] := X[..., i] * W[i, o]`): one index over the leading axes,
#: flattened into one at each call (`tensordsl/frontend/ellipsis.py`).
ELLIPSIS = "..."
#: The extent of an index inside an expression: `size(j)`, and names users try for it.
SIZE = "size"
SIZE_HINTS = {
    name: "the extent of an index is size(j)" for name in ("len", "length", "extent", "count", "n")
}


def size_placeholder(index: str) -> sympy.Symbol:
    """The symbol `size(index)` stands for until `lower` knows the index's range."""
    return sympy.Symbol(f"size({index})", integer=True, nonnegative=True)


#: The IEEE infinity literal: `-inf` in a mask (`where(j <= i, 0, -inf)`), never a scalar input.
INFINITY = "inf"
_AFFINE_EXAMPLE = "an affine expression of indices with integer coefficients, such as 'i+k', '2i+1'"
#: How the translator words each reason of `codegen.ir.affine.NotAffine`.
_NOT_AFFINE = {
    PRODUCT: "a product of indices",
    DIVISION: "a division by an index or zero",
    POWER: "a power of indices",
    FUNCTION: "it contains a function call",
}


@dataclass(frozen=True)
class AccessUse:
    """One tensor access: its affine axes and where it is in the source."""

    tensor: str
    axes: tuple[Affine, ...]
    span: Span
    axis_spans: tuple[Span, ...]
    gathered: tuple[int, ...] = ()  # axes read through index arrays: checked when gathered
    # per axis: the boundary form (mod, clamp, pad) the axis is read through, or None
    boundaries: tuple[Boundary | None, ...] = ()

    def widths(self, axis: int) -> tuple[int, int] | None:
        """How far the index expression of `axis` may leave it at each end (0, 0 for a
        plain read); None when it constrains no index (mod, clamp, pad without widths)."""
        boundary = self.boundaries[axis] if self.boundaries else None
        return (0, 0) if boundary is None else boundary.widths

    def plain(self, axis: int) -> bool:
        """Whether `axis` is read without a boundary form."""
        return not self.boundaries or self.boundaries[axis] is None


def walk(node: Expr) -> Iterator[Expr]:
    """`node` and every node below it, in source order."""
    yield node
    if isinstance(node, Access):
        children: tuple[Expr, ...] = node.indices
    elif isinstance(node, Call):
        children = node.args
    elif isinstance(node, Unary):
        children = (node.operand,)
    elif isinstance(node, Binary | Compare):
        children = (node.left, node.right)
    else:
        children = ()
    for child in children:
        yield from walk(child)


def text_of(source: str, span: Span) -> str:
    return source[span[0] : span[1]]


class IndexExpressions:
    """The translator's accesses and index expressions (see the module docstring); the
    translator provides `src`, `register`, `accesses`, `index_symbols` and `extent`."""

    src: str
    accesses: list[AccessUse]
    index_symbols: Any
    extent: sympy.Expr

    def register(self, name: str, rank: int, span: Span) -> None:
        raise NotImplementedError

    def access(self, node: Access) -> Any:
        if not node.indices:
            raise IndexExpressionError(
                f"'{node.name}[]' has no indices",
                self.src,
                node.span,
                expected=f"a scalar written without brackets: '{node.name}'",
            )
        self.register(node.name, len(node.indices), node.name_span)
        forms = [boundary_form(index, self.src) for index in node.indices]
        axes = tuple(
            self.affine(inner, extent_symbol(node.name, axis))
            for axis, (inner, _) in enumerate(forms)
        )
        boundaries = tuple(boundary for _, boundary in forms)
        spans = tuple(i.span for i in node.indices)
        self.accesses.append(AccessUse(node.name, axes, node.span, spans, boundaries=boundaries))
        reads, masks = [], []
        for axis, (affine, boundary) in enumerate(zip(axes, boundaries, strict=True)):
            if boundary is None:
                reads.append(affine.expr())
                continue
            extent = extent_symbol(node.name, axis)
            reads.append(boundary.index(affine.expr(), extent))
            masks.append(boundary.mask(affine.expr(), extent))
        read = tensor_base(node.name)[tuple(reads)]
        mask = sympy.And(*masks)
        return read if mask == sympy.true else select(mask, read, sympy.Integer(0))

    def affine(self, node: Expr, extent: sympy.Expr) -> Affine:
        """The affine form of one index expression on an axis of length `extent`, its
        indices in order of appearance."""
        self.extent = extent
        expr = self.index_expr(node, node)
        names = dict.fromkeys(
            n.name for n in walk(node) if isinstance(n, Name) and n.name not in POSITIONS
        )
        try:
            return as_affine(expr, [index_symbol(n) for n in names])
        except NotAffine as error:
            if error.reason == NOT_INT64:
                raise self.not_int64(node, error) from None
            if error.reason != NON_INTEGER:
                raise self.not_affine(node, _NOT_AFFINE[error.reason]) from None
            raise IndexExpressionError(
                f"index expression '{text_of(self.src, node.span)}' has a non-integer coefficient",
                self.src,
                node.span,
                expected=_AFFINE_EXAMPLE,
            ) from None

    def not_int64(self, node: Expr, error: NotAffine) -> IndexExpressionError:
        where = "offset" if error.index is None else "coefficient"
        of = "" if error.index is None else f" of '{error.index}'"
        return IndexExpressionError(
            f"index expression '{text_of(self.src, node.span)}' has {where} "
            f"{error.coefficient}{of}, beyond int64",
            self.src,
            node.span,
            expected="offsets and coefficients of magnitude at most 2**63 - 1 "
            "(generated code computes indices in int64)",
        )

    def index_expr(self, node: Expr, whole: Expr) -> sympy.Expr:
        """The sympy form of (part of) the index expression `whole`, built by the rules of
        `codegen.ir.affine.combine`."""
        if isinstance(node, Number):
            if not node.text.isdigit():
                raise self.not_affine(whole, f"'{node.text}' is not an integer")
            return sympy.Integer(int(node.text))
        if isinstance(node, Name):
            if node.name == INFINITY:
                raise self.not_affine(whole, f"'{INFINITY}' is infinity, not an index")
            if node.name in POSITIONS:
                return self.extent - 1 if node.name == "end" else sympy.Integer(0)
            return index_symbol(node.name)
        if isinstance(node, Unary | Binary) and node.op in ("not", "and", "or"):
            raise self.not_affine(whole, "it contains a condition")
        if isinstance(node, Binary) and node.op in ("//", "%"):
            raise IndexExpressionError(
                f"index expression '{text_of(self.src, whole.span)}' is not affine: "
                f"'{node.op}' rounds",
                self.src,
                node.span,
                expected="an affine index; 'mod(e)' wraps an index into its axis, as in "
                "'A[mod(i - j)]', and a value 'i // 2' or 'i % 2' may be computed outside "
                "the brackets",
            )
        if isinstance(node, Unary):
            operand = self.index_expr(node.operand, whole)
            return -operand if node.op == "-" else operand
        if isinstance(node, Call) and node.name in BOUNDARY_FORMS:
            raise IndexExpressionError(
                f"'{node.name}(...)' is part of the index expression "
                f"'{text_of(self.src, whole.span)}'",
                self.src,
                node.span,
                expected=f"'{node.name}' around the whole index of an axis, as in "
                f"'A[{node.name}(i + 1)]'",
            )
        if not isinstance(node, Binary):
            kind = {Access: "a tensor read", Call: "a function call"}.get(
                type(node), "a comparison"
            )
            raise self.not_affine(whole, f"it contains {kind}")
        left, right = self.index_expr(node.left, whole), self.index_expr(node.right, whole)
        try:
            return combine(node.op, left, right, self.index_symbols)
        except NotAffine as error:
            raise self.not_affine(whole, _NOT_AFFINE[error.reason]) from None

    def not_affine(self, whole: Expr, why: str) -> IndexExpressionError:
        return IndexExpressionError(
            f"index expression '{text_of(self.src, whole.span)}' is not affine: {why}",
            self.src,
            whole.span,
            expected=_AFFINE_EXAMPLE,
        )
