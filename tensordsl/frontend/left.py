"""Left-hand sides beyond distinct index names: a repeated index and a new axis of length 1.

* `D[i,i] := A[i]` writes a diagonal: the second `i` becomes a new free index `i1` over the
  same range, and the body is multiplied by `(i == i1)`, so the rest of the output is zero
  (Tullio's `D[i,i] := ...`; its gradient reads only the diagonal).
* `Y[0,j] := A[j]` (or `Y[_,j]` when `_` is on no right-hand side) adds an axis of length 1:
  a new free index over `[0, 1)` that nothing reads. Positions count from 0, so Tullio's
  `Y[1,j]` is `Y[0,j]` here; any other constant is an error.

`lower` calls `left_forms` before translating and `apply_left_forms` after; the translator
sees plain, distinct names.

>>> from tensordsl.frontend.parse import parse
>>> forms = left_forms(parse("D[i,i] := A[i]"))
>>> [n.name for n in forms.statement.indices], forms.diagonal, forms.unit
(['i', 'i1'], (('i1', 'i'),), ())
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import sympy

from codegen.ir.functions import indicator
from codegen.ir.nest import Range, index_symbol
from tensordsl.errors import IndexExpressionError
from tensordsl.frontend.indices import POSITIONS, walk
from tensordsl.frontend.parse import Expr, Name, Number, Statement


@dataclass(frozen=True)
class LeftForms:
    """A statement whose left side lists distinct names, and what they stand for."""

    statement: Statement
    diagonal: tuple[tuple[str, str], ...]  # (new name, the index it repeats)
    unit: tuple[str, ...]  # new names of axes of length 1


def left_forms(statement: Statement) -> LeftForms:
    """Rename a repeated left index and a left `0` (or `_`) to new index names.

    Raises:
        IndexExpressionError: a constant other than 0 on the left.
    """
    if not statement.indices:
        return LeftForms(statement, (), ())
    body_names = {n.name for n in walk(statement.body) if isinstance(n, Name)}
    taken = body_names | {n.name for n in statement.indices if isinstance(n, Name)}
    seen: set[str] = set()
    diagonal: list[tuple[str, str]] = []
    unit: list[str] = []
    indices: list[Expr] = []
    for node in statement.indices:
        if isinstance(node, Number) and node.text == "0" or _unit_name(node, body_names):
            name = _fresh("one", taken)
            unit.append(name)
            indices.append(Name(name, node.span))
            continue
        if isinstance(node, Number):
            raise IndexExpressionError(
                f"the constant '{node.text}' on the left-hand side",
                statement.source,
                node.span,
                expected="an index name, or 0 for a new axis of length 1 (positions count "
                "from 0: Tullio's 'Y[1,j]' is 'Y[0,j]' here)",
            )
        if isinstance(node, Name) and node.name not in POSITIONS and node.name in seen:
            name = _fresh(node.name, taken)
            diagonal.append((name, node.name))
            indices.append(Name(name, node.span))
            continue
        if isinstance(node, Name):
            seen.add(node.name)
        indices.append(node)  # anything else: the translator words the error
    if not diagonal and not unit:
        return LeftForms(statement, (), ())
    renamed = replace(statement, indices=tuple(indices))
    return LeftForms(renamed, tuple(diagonal), tuple(unit))


def _unit_name(node: object, body_names: set[str]) -> bool:
    return isinstance(node, Name) and node.name == "_" and "_" not in body_names


def _fresh(base: str, taken: set[str]) -> str:
    name = next(f"{base}{n}" for n in itertools.count(1) if f"{base}{n}" not in taken)
    taken.add(name)
    return name


def diagonal_mask(forms: LeftForms) -> sympy.Expr:
    """The factor that keeps a diagonal: `(i == i1)` for each repeated index."""
    mask = sympy.Integer(1)
    for new, old in forms.diagonal:
        mask *= indicator(sympy.Eq(index_symbol(old), index_symbol(new)))
    return mask


def left_ranges(forms: LeftForms, found: dict[str, Range]) -> dict[str, Range]:
    """The ranges of the new names: a repeated index's own, `[0, 1)` for a unit axis."""
    ranges = {name: Range(index_symbol(name), 0, 1) for name in forms.unit}
    for new, old in forms.diagonal:
        ranges[new] = Range(index_symbol(new), found[old].start, found[old].stop)
    return ranges
