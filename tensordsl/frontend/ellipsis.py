"""`...`: leading batch axes, as one index flattened at each call.

`Y[..., o] := X[..., i] * W[i, o]` reads `...` as one index, the first axis of every tensor
written with it. A call flattens the leading axes those tensors share (every axis before the
ones the index list names after `...`) into that one axis, runs the nest, and gives the
output its leading axes back. Any number of leading axes, none included, runs the same
kernel; jit, grad and vmap see a reshape, which they handle. An output without `...` sums
over them (`s[o] := X[..., o]`).

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> batched = leading_axes(lower(parse("Y[..., o] := X[..., i] * W[i, o]")).nest)
>>> batched
Batched(ranks=(('X', 2),), output=True)
>>> lead = batch_shape(batched, {"X": (4, 5, 3), "W": (3, 2)}, "")
>>> lead, flat_shapes(batched, {"X": (4, 5, 3), "W": (3, 2)}, lead)
((4, 5), {'X': (20, 3), 'W': (3, 2)})
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from codegen.ir.nest import LoopNest, accesses, index_symbol
from tensordsl.errors import IndexExpressionError, ShapeError
from tensordsl.frontend.indices import ELLIPSIS, walk
from tensordsl.frontend.parse import Access, Name, Statement


@dataclass(frozen=True)
class Batched:
    """The tensors read with `...` (their rank in the nest: `...` counts one axis), and
    whether the output has `...`."""

    ranks: tuple[tuple[str, int], ...]
    output: bool


def leading_axes(nest: LoopNest) -> Batched | None:
    """Where `nest` uses `...`, else None."""
    batch = index_symbol(ELLIPSIS)
    names = {
        read.base.name
        for term in nest.terms
        for read in accesses(term.body)
        if read.indices and read.indices[0] == batch
    }
    output = bool(nest.free) and nest.free[0].index == batch
    if not names and not output:
        return None
    return Batched(tuple((op.name, op.rank) for op in nest.operands if op.name in names), output)


def batch_shape(
    batched: Batched, shapes: Mapping[str, tuple[int, ...]], source: str
) -> tuple[int, ...]:
    """The leading axes `...` stands for in a call with `shapes` (the same in every tensor).

    Raises:
        ShapeError: a tensor with fewer axes than its index list names after `...`, or two
            tensors whose leading axes differ (no broadcasting).
    """
    lead: tuple[int, ...] | None = None
    first = ""
    for name, rank in batched.ranks:
        shape = tuple(shapes[name])
        count = len(shape) - (rank - 1)
        if count < 0:
            raise ShapeError(
                f"'{name}' has {len(shape)} axes, fewer than the {rank - 1} its index list "
                "names after '...'",
                source,
                expected=f"'{name}' with {rank - 1} axes or more ('...' takes the leading ones)",
            )
        if lead is None:
            lead, first = shape[:count], name
        elif shape[:count] != lead:
            raise ShapeError(
                f"'...' stands for the leading axes {lead} of '{first}' but {shape[:count]} "
                f"of '{name}'",
                source,
                expected="the same leading axes in every tensor read with '...'",
                hint="'...' does not broadcast: jnp.broadcast_to the inputs first",
            )
    return lead or ()


def flat_shapes(
    batched: Batched, shapes: Mapping[str, tuple[int, ...]], lead: tuple[int, ...]
) -> dict[str, tuple[int, ...]]:
    """`shapes` with the leading axes of the tensors read with `...` flattened into one."""
    names = {name for name, _ in batched.ranks}
    return {
        name: (math.prod(lead), *shape[len(lead) :]) if name in names else tuple(shape)
        for name, shape in shapes.items()
    }


def check_placement(st: Statement, src: str) -> None:
    """`...` stands for leading batch axes: only the first index of an index list."""
    allowed = {
        id(node.indices[0]) for node in walk(st.body) if isinstance(node, Access) and node.indices
    }
    allowed |= {id(st.indices[0])} if st.indices else set()
    nodes = [*walk(st.body), *(n for i in st.indices or () for n in walk(i))]
    span = st.output_span if st.output == ELLIPSIS else None
    for node in nodes:
        if isinstance(node, Name) and node.name == ELLIPSIS and id(node) not in allowed:
            span = node.span
            break
    if span is not None:
        raise IndexExpressionError(
            "'...' is not the first index of an index list",
            src,
            span,
            expected="'...' for the leading (batch) axes, first in an index list, as in "
            "'Y[..., o] := X[..., i] * W[i, o]'",
        )
