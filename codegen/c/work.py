"""What a nest's bodies compute per row or per value: the facts about a body's costly work
the CPU schedule heuristic (`codegen.c.schedule`) picks a strategy by."""

from __future__ import annotations

import sympy

from codegen.ir.nest import LoopNest, Reduce


def costly_per_row(nest: LoopNest, vector: str) -> bool:
    """Whether some term computes a nested reduction or a function call that does not read
    the vector index (so the tile computes it once per row and tile)."""
    for term in nest.terms:
        if not term.reduced:
            continue
        for node in sympy.preorder_traversal(term.body):
            if isinstance(node, Reduce | sympy.Function) and not any(
                s.name == vector for s in node.free_symbols if isinstance(s, sympy.Symbol)
            ):
                return True
    return False


def nested_per_value(nest: LoopNest, reduced: tuple[tuple[str, ...], ...]) -> bool:
    """Whether a term of a sum computes a nested reduction that reads its innermost reduced
    index (a score modifier's gradient: the weights `sum_e dO[i, e]*V[j, e]` per key `j`).
    Dot products in lanes of that index would compute each nested sum lane by lane,
    reading its rows across the lanes; one output at a time, the nested sums run along their
    own contiguous axes, 8 values at a time (`codegen.c.strategies.scalar`)."""
    if nest.reduction != "sum" or not all(reduced):
        return False
    symbols = {s.name: s for t in nest.terms for s in t.reduced_indices}
    return any(
        symbols[order[-1]] in r.free_symbols
        for term, order in zip(nest.terms, reduced, strict=True)
        for r in term.body.atoms(Reduce)
    )
