"""Which way a reduction nest reads memory: along its reduced index ("rows": a group of lanes
per output element strides the row) or along its last free index ("columns": a thread per
output element, the reduced loops cut across blocks). `codegen.cuda.schedule` picks the
rows and columns strategies from it."""

from __future__ import annotations

from codegen.emit.loop_order import LoopOrder
from codegen.ir.bounds import loop_bounds
from codegen.ir.nest import LoopNest, Reduce, accesses, extent_of


def _row_indices(nest: LoopNest, order: LoopOrder) -> set[str]:
    """The indices a group of lanes may stride: each term's innermost reduced loop, or, in a
    term without reduced loops, the index of a nested reduction of its body."""
    found: set[str] = set()
    for n, term in enumerate(nest.terms):
        if order.reduced_order[n]:
            found.add(order.reduced_order[n][-1])
        else:
            found.update(r.index.name for r in term.body.atoms(Reduce))
    return found


def rectangular(nest: LoopNest, order: LoopOrder) -> bool:
    """Whether every reduced loop's bounds are expressions of extents alone (the columns
    strategy flattens them and counts their iterations on the host)."""
    for n, term in enumerate(nest.terms):
        names = order.reduced_order[n]
        by_name = {s.name: s for s in term.reduced_indices}
        bounds = loop_bounds(term, tuple(by_name[name] for name in names))
        for expr in (*bounds.starts.values(), *bounds.stops.values()):
            if any(extent_of(s) is None for s in expr.free_symbols):
                return False
    return True


def reduction_layout(nest: LoopNest, order: LoopOrder) -> str | None:
    """ "rows" when the largest access reads a reduced index contiguously (its last axis),
    "columns" when it reads the last free index there and a term has reduced loops, else
    None. The largest access is the one of highest rank; ties go to columns. An access
    whose last axis reads both (a convolution's `X[i + k]`) is neither, and the widest such
    access rules both out: a thread per output element already coalesces there.

    >>> from codegen.ir.examples import matmul as example
    >>> from codegen.emit.loop_order import default_loop_order
    >>> reduction_layout(example(), default_loop_order(example()))  # B[k,j]: j
    'columns'
    """
    if not nest.free or not any(t.reduced or t.body.atoms(Reduce) for t in nest.terms):
        return None
    rows, last = _row_indices(nest, order), order.free_order[-1]
    rank = {"rows": -1, "columns": -1, "both": -1}
    for term in nest.terms:
        for access in accesses(term.body):
            names = {s.name for s in access.indices[-1].free_symbols}
            kind = "both" if names & rows and last in names else "rows" if names & rows else None
            kind = kind or ("columns" if last in names else None)
            if kind is not None:
                rank[kind] = max(rank[kind], len(access.indices))
    if rank["rows"] > max(rank["columns"], rank["both"]):
        return "rows"
    if rank["columns"] >= max(rank["rows"], rank["both"], 0) and any(t.reduced for t in nest.terms):
        return "columns" if rectangular(nest, order) else None
    return None
