"""Selections: `(topk 5) V[i,r] := body` keeps, for each `i`, the 5 largest values of the body
over the reduced indices in descending order along the last left index `r` (the *rank*, of
length k); `(argtopk 5) N[i,r] := ...` their flat positions (as argmax's).

The nest is an ordinary `LoopNest` whose last free range is the rank `[0, k)` and whose
reduction is "topk" or "argtopk": element `(i, r)` is the r-th largest value, so every pass
that takes a nest (batching, gradients, tangents) takes it unchanged, and the gradient is
max's (the cotangent at the saved position of each rank, summed over the ranks).

>>> from tensordsl.frontend.parse import parse
>>> selection(parse("(topk 3) V[i,r] := X[i,j]"), "topk", None)
Selection(rank='r', k=3)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from tensordsl.errors import IndexExpressionError, RangeError, ReductionError
from tensordsl.frontend.indices import walk
from tensordsl.frontend.parse import Name, Statement

#: The reductions that keep k values along a rank index.
SELECTIONS = ("topk", "argtopk")

_EXAMPLE = "'(topk 5) V[i,r] := X[i,j]': the 5 largest X[i,j] over j, r in [0, 5)"


@dataclass(frozen=True)
class Selection:
    """The rank index (the last one on the left) and how many values it keeps."""

    rank: str
    k: int


def _count(statement: Statement, reduction: str) -> int | None:
    """k as the prefix writes it, else None (then ranges= must give the rank's extent)."""
    src = statement.source
    if statement.count is None:
        return None
    if reduction not in SELECTIONS:
        raise ReductionError(
            f"'({statement.reduction} {statement.count})': only topk and argtopk take a count",
            src,
            statement.count_span,
            expected=f"'({statement.reduction})' without a number",
        )
    k = float(statement.count)
    if k != int(k) or k < 1:
        raise ReductionError(
            f"'{statement.count}' is not a count of values to keep",
            src,
            statement.count_span,
            expected="a whole number k >= 1, as in " + _EXAMPLE,
        )
    return int(k)


def selection(
    statement: Statement, reduction: str, ranges: Mapping[str, int | range] | None
) -> Selection | None:
    """The statement's selection (None for other reductions), its form checked.

    Raises:
        ReductionError: a count on another reduction, a count that is not a whole number
            >= 1, no count at all, a count that disagrees with ranges=.
        IndexExpressionError: no left index for the rank, a rank that is not a plain name,
            or one the body reads.
    """
    k = _count(statement, reduction)
    if reduction not in SELECTIONS:
        return None
    src = statement.source
    span = statement.reduction_span or statement.output_span
    if not statement.indices or not isinstance(statement.indices[-1], Name):
        raise IndexExpressionError(
            f"'{reduction}' keeps k values along a new last index of '{statement.output}', "
            "and the left side has none",
            src,
            statement.output_span,
            expected="an index name last on the left, as in " + _EXAMPLE,
        )
    rank = statement.indices[-1]
    if sum(isinstance(n, Name) and n.name == rank.name for n in statement.indices) > 1:
        raise IndexExpressionError(
            f"the rank index '{rank.name}' of '{reduction}' is repeated on the left",
            src,
            rank.span,
            expected="a new index name last on the left, as in " + _EXAMPLE,
        )
    for node in walk(statement.body):
        if isinstance(node, Name) and node.name == rank.name:
            raise IndexExpressionError(
                f"the body reads '{rank.name}', the rank of the '{reduction}' values",
                src,
                node.span,
                expected=f"a body that does not read '{rank.name}' (it numbers the k values "
                "kept, largest first)",
                hint="name the rank with an index the body does not use",
            )
    given = (ranges or {}).get(rank.name)
    if isinstance(given, range):
        given = len(given) if given.start == 0 and given.step == 1 else -1
    if k is None and given is None:
        raise ReductionError(
            f"'{reduction}' needs the number of values to keep",
            src,
            span,
            expected="the count in the prefix, as in " + _EXAMPLE,
            hint=f"or ranges={{'{rank.name}': 5}}",
        )
    if k is not None and given is not None and given != k:
        raise ReductionError(
            f"'({reduction} {k})' keeps {k} values but ranges= gives '{rank.name}' {given}",
            src,
            statement.count_span,
            expected=f"ranges={{'{rank.name}': {k}}}, or no entry for '{rank.name}'",
        )
    return Selection(rank.name, k if k is not None else int(given))  # type: ignore[arg-type]


def check_count(lowered, values: Mapping[str, tuple[int, int]]) -> None:
    """A call's check: a selection keeps at most as many values as it reduces over.

    Raises:
        RangeError: k larger than the number of values (as `jax.lax.top_k` refuses it).
    """
    nest = lowered.nest
    if nest.reduction not in SELECTIONS:
        return
    names = [r.index.name for r in lowered.ranges]
    free, reduced = names[: len(nest.free)], names[len(nest.free) :]
    k = values[free[-1]][1] - values[free[-1]][0]
    count = math.prod(max(values[n][1] - values[n][0], 0) for n in reduced)
    if k <= count:
        return
    statement = lowered.statement
    where = ", ".join(f"{n} in [{values[n][0]}, {values[n][1]})" for n in reduced)
    raise RangeError(
        f"'{nest.reduction}' keeps {k} values of '{nest.output}' but reduces over {count}"
        + (f" ({where})" if where else ""),
        statement.source,
        statement.count_span or statement.reduction_span or statement.output_span,
        expected=f"k at most {count}, the number of values reduced",
        hint="a smaller k, or inputs with more values along the reduced indices",
    )
