"""Warnings for index names that look like typos.

`C[i,j] := A[i,k] * B[kk,j]` is valid, and sums `k` and `kk` separately (`sum(A) * sum(B)`
per element), but it almost certainly means `B[k,j]`. `index_typos` warns when two reduced
indices appear once each in the whole statement, in different factors of one product, with
names one edit apart. Two single letters (`x[i] * y[j]`) and names that differ only in a
digit (`k1`, `k2`) are deliberate more often than not, and are left alone.

>>> import warnings
>>> from tensordsl.frontend.parse import parse
>>> with warnings.catch_warnings(record=True) as caught:
...     warnings.simplefilter("always")
...     index_typos(parse("C[i,j] := A[i,k] * B[kk,j]"), ("k", "kk"))
>>> print(caught[0].message)
index 'kk' appears once, in another factor than 'k', which also appears once
  C[i,j] := A[i,k] * B[kk,j]
                       ~~
expected each reduced index in at least two places (a lone index reduces its factor alone)
hint: did you mean 'k'?
"""

from __future__ import annotations

import itertools
import os
import sys
import types
import warnings
from collections.abc import Iterator, Sequence

from tensordsl.errors import IndexNameWarning
from tensordsl.frontend.parse import Access, Binary, Call, Compare, Expr, Name, Statement, Unary

__all__ = ["index_typos"]


def _one_edit(a: str, b: str) -> bool:
    """Whether `a` and `b` are one insertion, deletion or substitution apart."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    if len(a) == len(b):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    short, long = sorted((a, b), key=len)
    return any(long[:n] + long[n + 1 :] == short for n in range(len(long)))


def _deliberate(a: str, b: str) -> bool:
    """Pairs that are one edit apart by design: two letters, or a digit changed."""
    if len(a) == len(b) == 1:
        return True
    differ = [x + y for x, y in zip(a, b, strict=False) if x != y]
    return len(a) == len(b) and all(c.isdigit() for c in "".join(differ))


def _children(node: Expr) -> tuple[Expr, ...]:
    if isinstance(node, Access):
        return node.indices
    if isinstance(node, Call):
        return node.args
    if isinstance(node, Unary):
        return (node.operand,)
    if isinstance(node, Binary | Compare):
        return (node.left, node.right)
    return ()


def _factors(node: Expr) -> list[Expr]:
    """The factors of a product chain (`a * b / c` has a, b, c)."""
    if isinstance(node, Binary) and node.op in ("*", "/"):
        return _factors(node.left) + _factors(node.right)
    return [node]


def _products(node: Expr) -> Iterator[list[Expr]]:
    """The factors of every product in the tree (outermost first)."""
    factors = _factors(node)
    if len(factors) > 1:
        yield factors
    for part in factors:
        for child in _children(part):
            yield from _products(child)


def _index_names(node: Expr, inside: bool = False) -> Iterator[Name]:
    """The names used inside index brackets below `node`."""
    if isinstance(node, Name) and inside:
        yield node
    for child in _children(node):
        yield from _index_names(child, inside or isinstance(node, Access))


def _caller_level() -> int:
    """The `stacklevel` of the first frame outside tensordsl: the user's call."""
    package = os.path.dirname(os.path.abspath(__file__))
    frame: types.FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(package):
        frame, level = frame.f_back, level + 1
    return level


def index_typos(statement: Statement, summed: Sequence[str]) -> None:
    """Warn (`IndexNameWarning`) about reduced indices whose names look like a typo.

    Args:
        statement: from `parse`.
        summed: the statement's reduced index names.
    """
    uses = list(_index_names(statement.body))
    once = {n for n in summed if sum(u.name == n for u in uses) == 1}
    if len(once) < 2:
        return
    for factors in _products(statement.body):
        where = {u.name: (n, u) for n, f in enumerate(factors) for u in _index_names(f)}
        lone = sorted((u.span, name, n) for name, (n, u) in where.items() if name in once)
        for (_, a, fa), (span, b, fb) in itertools.combinations(lone, 2):
            if fa != fb and _one_edit(a, b) and not _deliberate(a, b):
                warnings.warn(
                    IndexNameWarning(
                        f"index '{b}' appears once, in another factor than '{a}', "
                        "which also appears once",
                        statement.source,
                        span,
                        expected="each reduced index in at least two places (a lone index "
                        "reduces its factor alone)",
                        hint=f"did you mean '{a}'?",
                    ),
                    stacklevel=_caller_level(),
                )
                return
