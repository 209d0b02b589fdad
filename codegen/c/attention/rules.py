"""When the strategies of attention's nests apply (online, members), what they check and their
words (see `codegen.c.tiles.rules` for the form of a rule).

`online` is the one and only strategy of a one-pass softmax-weighted sum (`LoopNest.online`);
`members` the one strategy of a multi-output nest (`codegen.ir.members`: attention's dK and
dV together).
"""

from __future__ import annotations

import dataclasses

import sympy

from codegen.c.geometry import Ask, CpuGeometry, Dtypes, Shapes
from codegen.c.tiles.rules import vector_friendly, wide
from codegen.ir.members import member_bodies
from codegen.ir.nest import LoopNest


def online_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> CpuGeometry:
    """Every one-pass nest (the heuristic gives it no other record)."""
    return dataclasses.replace(ask.base, strategy="online")


def members_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> CpuGeometry | None:
    """`codegen.c.attention.members`: the row (last free index but the member axis) in the
    lanes where all read it contiguously, else 4 rows (1 if a bound reads it) by lanes of the
    reduction."""
    if member_bodies(nest) is None:
        return None
    free, is_wide = ask.base.free_order, wide(dtypes, nest)
    order = (*(n for n in free if n != nest.free[-1].index.name), nest.free[-1].index.name)
    row = order[-2] if len(order) > 1 else None
    limits = [x for t in nest.terms for x in t.expressions() if x is not t.body]
    base = dataclasses.replace(ask.base, free_order=order, strategy="members", row=row)
    if row in {s.name for x in limits for s in sympy.sympify(x).free_symbols}:
        return dataclasses.replace(base, lanes=4 if is_wide else 8)
    if row and vector_friendly(nest, row):
        return dataclasses.replace(base, vector=row, lanes=16 if is_wide else 32)
    return dataclasses.replace(base, lanes=4 if is_wide else 8, rows=4 if row else 1)


def members_validate(nest: LoopNest, schedule: CpuGeometry) -> None:
    """A multi-output nest, its member axis innermost."""
    last = nest.free[-1].index.name if nest.free else None
    if member_bodies(nest) is None or schedule.free_order[-1:] != (last,):
        raise ValueError("the members strategy is for multi-output nests, member axis innermost")


def members_header(s: CpuGeometry) -> tuple[str, ...]:
    return (f"rows={s.row or '-'}x{s.rows} lanes={s.lanes}",)


def online_words(s: CpuGeometry, inside: str, reduced: str) -> str:
    return "one pass over each row's scores with a running max (online softmax), blocks of 8 rows"


def members_words(s: CpuGeometry, inside: str, reduced: str) -> str:
    return f"every member at once ({s.lanes} lanes, {s.rows} rows), {inside}"
