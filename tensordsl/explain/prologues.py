"""Extents read from shapes, and the prologues of XLA's dot, for `tensordsl.explain`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy

from codegen.ir.contraction import xla_contraction, xla_plan
from codegen.ir.nest import LoopNest, Range, extent_of, extent_symbol
from codegen.ir.source import expr_source
from tensordsl.explain.spelling import Spelling, spell


def substitute(
    expr: sympy.Basic, shapes: Mapping[str, tuple[int, ...]] | None, aliases: Mapping[str, str]
) -> sympy.Basic:
    """`expr` with each extent symbol replaced by its number in `shapes`, or renamed by
    `aliases` (a gradient nest's operand names back to the user's)."""
    mapping = {}
    for s in expr.free_symbols:
        found = extent_of(s)
        if found is None:
            continue
        name = aliases.get(found[0], found[0])
        if shapes is not None and name in shapes:
            mapping[s] = sympy.Integer(shapes[name][found[1]])
        elif name != found[0]:
            mapping[s] = extent_symbol(name, found[1])
    return expr.xreplace(mapping)


def prologue_lines(
    nest: LoopNest,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    aliases: Mapping[str, str] | None = None,
    spelled: Sequence[Spelling] = (),
) -> list[str]:
    """How XLA computes a nest whose elementwise factors are evaluated apart before its dot
    (`codegen.ir.contraction.prologue_contraction`); nothing for other nests. Gathered
    operands show as the accesses they stand for (`spelled`).

    >>> from tensordsl.frontend.lower import lower
    >>> from tensordsl.frontend.parse import parse
    >>> nest = lower(parse("Y[b,o] := tanh(H[b,u]) * W[u,o]")).nest
    >>> print("\\n".join(prologue_lines(nest, {"H": (8, 32), "W": (32, 4)})))
    prologue 1: tanh(H[b, u]) evaluated once per (b, u): 256 times, not 1024 (per (b, o, u))
    then XLA's dot: einsum 'cb,ac->ab' of W, prologue 1
    """
    if not xla_contraction(nest):
        return []
    plan = xla_plan(nest)
    assert plan is not None
    lines = []
    for term, dot in zip(plan.terms, plan.dots):
        if dot is None or not dot.prologues:
            continue
        loops = {r.index: r for r in (*nest.free, *term.reduced)}
        every = ", ".join(str(i) for i in loops)
        for n, prologue in enumerate(dot.prologues, start=1):
            each = ", ".join(str(i) for i in prologue.indices)
            body = expr_source(spell(prologue.body, spelled))
            text = f"prologue {n}: {body} evaluated once per ({each})"
            few = _points([loops[i] for i in prologue.indices], shapes, aliases)
            many = _points(list(loops.values()), shapes, aliases)
            if few is not None and many is not None:
                text += f": {few} times, not {many} (per ({every}))"
            else:
                text += f", not per ({every})"
            lines.append(text)
        texts = {s.name: s.text for s in spelled}
        inputs = [texts.get(nest.operands[n].name, nest.operands[n].name) for n in dot.tensors]
        inputs += [f"prologue {n + 1}" for n in range(len(dot.prologues))]
        lines.append(f"then XLA's dot: einsum '{dot.subscripts}' of {', '.join(inputs)}")
    return lines


def _points(
    ranges: list[Range],
    shapes: Mapping[str, tuple[int, ...]] | None,
    aliases: Mapping[str, str] | None,
) -> int | None:
    """The number of points of these ranges for the shapes, or None without them."""
    if shapes is None:
        return None
    count = 1
    for r in ranges:
        length = substitute(r.stop - r.start, shapes, aliases or {})
        if not length.is_Integer:
            return None
        count *= max(int(length), 0)
    return count
