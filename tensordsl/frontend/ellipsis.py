"""`...`: leading batch axes, as one index flattened at each call.

`Y[..., o] := X[..., i] * W[i, o]` reads `...` as one index, the first axis of every tensor
written with it. A call flattens the leading axes those tensors share (every axis before the
ones the index list names after `...`) into that one axis, runs the nest, and gives the
output its leading axes back. Any number of leading axes, none included, runs the same
kernel; jit, grad and vmap see a reshape, which they handle. An output without `...` sums
over them (`s[o] := X[..., o]`).

In a program (`leading_axes`) every input read with `...` shares the same leading
axes; an intermediate defined with `...` on its left holds them as its one first axis and is
read with `...` wherever it is read (and one defined without it, without), so a statement
never reads the flattened axis under another name.

>>> from tensordsl.frontend.parse import parse
>>> batched = leading_axes([parse("Y[..., o] := X[..., i] * W[i, o]")], "")
>>> batched
Batched(ranks=(('X', 2),), output=True, defined=('Y',))
>>> lead = batch_shape(batched, {"X": (4, 5, 3), "W": (3, 2)}, "")
>>> lead, flat_shapes(batched, {"X": (4, 5, 3), "W": (3, 2)}, lead)
((4, 5), {'X': (20, 3), 'W': (3, 2)})
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tensordsl.errors import IndexExpressionError, ShapeError, UnsupportedError
from tensordsl.frontend.indices import ELLIPSIS, walk
from tensordsl.frontend.parse import Access, Expr, Name, Statement


@dataclass(frozen=True)
class Batched:
    """The tensors read with `...` (their rank in the nest: `...` counts one axis), and
    whether the output has `...`."""

    ranks: tuple[tuple[str, int], ...]
    output: bool
    #: in a program, the statement outputs whose left side starts with `...`
    defined: tuple[str, ...] = ()


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


def flatten(
    batched: Batched, names: Sequence[str], values: Sequence[Any], source: str
) -> tuple[list[Any], dict[str, tuple[int, ...]], tuple[int, ...]]:
    """A call's arrays with the leading axes `...` stands for flattened into one.

    Returns:
        The arrays (reshaped where `...` reads them), their shapes by name, and the leading
        axes (`restore` gives them back to the results).
    """
    shapes = {name: tuple(v.shape) for name, v in zip(names, values)}
    lead = batch_shape(batched, shapes, source)
    flat = flat_shapes(batched, shapes, lead)
    reshaped = [v.reshape(flat[n]) if flat[n] != shapes[n] else v for n, v in zip(names, values)]
    return reshaped, flat, lead


def restore(
    batched: Batched, names: Sequence[str], results: Sequence[Any], lead: tuple[int, ...]
) -> tuple[Any, ...]:
    """The results whose left side starts with `...` with the leading axes given back."""
    return tuple(
        r.reshape((*lead, *r.shape[1:])) if name in batched.defined else r
        for name, r in zip(names, results)
    )


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


def _leads(indices: tuple[Expr, ...] | None) -> bool:
    """True for an index list (of an access or a left side) that starts with `...`."""
    return bool(indices) and isinstance(indices[0], Name) and indices[0].name == ELLIPSIS


def leading_axes(statements: Sequence[Statement], source: str) -> Batched | None:
    """Where a kernel's or a program's statements use `...`, else None: the inputs read
    with it (an index array included), and the statements defining their output with it.

    Raises:
        UnsupportedError: an input read with `...` in one place and without it in another,
            or an intermediate read otherwise than its statement defines it (with or
            without `...`): the flattened axis would be read under another name.

    >>> from tensordsl.frontend.parse import parse
    >>> leading_axes([parse("H[..., o] := X[..., i] * W[i, o]"),
    ...                       parse("Y[..., o] := tanh(H[..., o])")], "")
    Batched(ranks=(('X', 2),), output=True, defined=('H', 'Y'))
    """
    defined: dict[str, bool] = {}
    inputs: dict[str, tuple[bool, int, Access]] = {}
    for st in statements:
        for node in walk(st.body):
            if not isinstance(node, Access):
                continue
            batched = _leads(node.indices)
            if node.name in defined:
                if defined[node.name] != batched:
                    raise _mixed(node, source, intermediate=True, batched=batched)
            elif node.name in inputs:
                if inputs[node.name][0] != batched:
                    raise _mixed(node, source, intermediate=False, batched=batched)
            else:
                inputs[node.name] = (batched, len(node.indices), node)
        defined[st.output] = _leads(st.indices)
    ranks = tuple((name, rank) for name, (batched, rank, _) in inputs.items() if batched)
    outputs = tuple(name for name, batched in defined.items() if batched)
    if not ranks and not outputs:
        return None
    return Batched(ranks, bool(outputs), outputs)


def _mixed(node: Access, source: str, *, intermediate: bool, batched: bool) -> UnsupportedError:
    what = "defined" if intermediate else "read elsewhere"
    other = "without" if batched else "with"
    return UnsupportedError(
        f"'{node.name}' is read {'with' if batched else 'without'} '...' here but {what} "
        f"{other} it",
        source,
        node.span,
        expected=f"'{node.name}' read {other} '...' here too: '...' stands for the same "
        "leading axes, flattened into one, in every statement",
        hint="write the batch axes out (as in 'X[b, t, i]') in every statement, or in none",
    )
