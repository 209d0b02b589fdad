"""What the C and CUDA emitters share for topk and argtopk (`Reduction.selects`): the code
of one output row, whatever strategy visits the rows.

An output row is every free index but the last, the rank. Its values of the body over the
reduced loops go one after another into two arrays of k slots kept sorted, best first:
values and flat positions (`Reduction.update`, an insertion that moves down the slots the
new value beats). The k values (or positions) are then stored along the rank. The scores
are never stored: KeOps' argKmin, a k-nearest-neighbour search over distances computed in
the loop. k is the rank's stop, a constant up to `MAX_SELECTION` (the slots stay in
registers or on the stack).
"""

from __future__ import annotations

from collections.abc import Callable

import sympy

from codegen.emit.emitter import Emitter, Lines, block_lines, indent_lines
from codegen.errors import Unsupported
from codegen.ir.nest import LoopNest
from codegen.ir.reductions import MAX_SELECTION


def selection_count(nest: LoopNest, target: str = "the compiled back ends") -> int:
    """k: the rank's stop (the slots kept; a slice of the ranks stores only its own).

    Raises:
        Unsupported: a rank whose range is not constant, or more than `MAX_SELECTION`.
    """
    rank = nest.free[-1]
    if not isinstance(rank.stop, sympy.Integer) or not isinstance(rank.start, sympy.Integer):
        raise Unsupported(f"a top-k whose k is not a constant (rank range {rank})")
    k = int(rank.stop)
    if k > MAX_SELECTION:
        raise Unsupported(
            f"'{nest.reduction}' keeps {k} values; {target} keep at most {MAX_SELECTION} "
            f"(two arrays of k slots per output row): use k <= {MAX_SELECTION}, or "
            "backend='reference'"
        )
    return k


def update_template(e: Emitter) -> str:
    """The insertion of `{v}` at `{pos}` into the slots, k filled in."""
    return e.reducer.update.replace("{k}", str(selection_count(e.nest)))


def term_lines(e: Emitter) -> Lines:
    """The reduced loops, each value inserted into the slots as it is computed."""
    plan = e.plan(0, [[], *e.reduced_levels(0)])
    fold = e.fold_lines(0, plan, "", update=update_template(e))
    return ["{", *indent_lines(e.level_lines(plan, 0, e.loops(0, fold, plan=plan))), "}"]


def row_lines(e: Emitter, term: Callable[[Emitter], Lines] = term_lines) -> Lines:
    """One output row: the slots declared and emptied, the reduced loops folding each value
    in (`term`), the slots stored along the rank (its loop inside the row)."""
    nest = e.nest
    if len(nest.terms) != 1:
        raise Unsupported(f"a '{nest.reduction}' nest of {len(nest.terms)} terms")
    k = selection_count(nest)
    rank = nest.free[-1]
    value, position = e.names()
    empty = [f"{value}[s_] = -INFINITY;", f"{position}[s_] = -1;"]
    kept = e.fmt(e.reducer.result.replace("{r}", e.printer.index(rank.index)), e.names())
    store = block_lines(e.free_loop(rank.index), [f"out_[{e.out_offset()}] = {e.store(kept)};"])
    return [
        *e.declare(dims=f"[{k}]"),
        *block_lines(f"for (int s_ = 0; s_ < {k}; ++s_)", empty),
        *term(e),
        *store,
    ]


def row_indices(e: Emitter) -> list[sympy.Symbol]:
    """The free indices of the rows, in the schedule's order (the rank left out)."""
    rank = e.nest.free[-1].index
    return [s for s in e.free_symbols() if s != rank]
