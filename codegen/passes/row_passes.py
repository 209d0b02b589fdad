"""A program's row statistics recomputed inside the statement that reads them, for the
forward: one kernel that runs each row's passes back to back while the row is in cache.

Softmax written as a program stores two row statistics and reads the row three times, in
three kernels (three calls, three parallel regions)::

    (max) M[i] := X[i,j]
    Z[i] := exp(X[i,j] - M[i])
    P[i,j] := exp(X[i,j] - M[i]) / Z[i]

`row_passes` rewrites the nests a fused program runs forward (`codegen.passes.fusion`'s
stored nests) so that an elementwise statement (P) computes the reductions it reads (Z, and
M, read by both) as nested reductions over its row: `exp(X[i, j] - max_k X[i, k]) / sum_k
exp(X[i, k] - max_k X[i, k])`, the same maximum once (`_shared`). The C strategy
`row_passes` (`codegen.c.reductions.statistics`) then computes, per row, each statistic as a
pass over the row and the row's elements in vector lanes: one kernel, which keeps each
`exp(X - m)` of the sum's pass in the output row for the elements to scale.

A reduction is absorbed into its reader where:

* it is an intermediate (not an output) whose every reader in the run is the elementwise
  nest absorbing it, or another reduction absorbed into it;
* the reader is elementwise (no reduced index), of rows (two or more free indices), and
  every nested reduction it then carries is a statistic of its row: none reads its last
  free index (`row_statistics`);
* it pays: the reader evaluates a function that a sum among them evaluates too, at the same
  element (`kept_body`: softmax's `exp(X - M)`), which the one kernel then evaluates once;
  the row the passes re-read is short enough to stay in cache (`ROW_LIMIT`), and there are
  enough rows to share among threads (`MIN_ROWS`). Without a shared function (LayerNorm's
  mean and variance, RMSNorm's mean square) the statistics keep their kernels (dot products
  over 4 rows at a time): one kernel of passes measured no faster there
  (benchmarks/RESULTS.md, "Row passes").

The rewrite is for the forward alone: gradients are taken of the stored nests, which keep
their statistics (the backward reads them; `tensordsl.binding.program_grad`).

>>> from codegen.ir.examples import softmax_program
>>> runs, decisions = row_passes(softmax_program(), outputs=("P",), shapes=SOFTMAX_SHAPES)
>>> [n.output for n in runs], decisions
(['P'], ('P: M, Z recomputed as passes over each row of P (one kernel)',))
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import sympy

from codegen.ir.nest import LoopNest, Reduce, index_symbol
from codegen.ir.reductions import REDUCTIONS
from codegen.passes.fusion import unconstrained
from codegen.passes.inline import CannotInline, inline

#: The longest row (elements of the last free index) whose passes re-read it: beyond, a
#: row of float32 no longer fits a core's L2 cache (256 KiB here) with its output.
ROW_LIMIT = 16384
#: The fewest rows for which one kernel over rows pays: fewer rows give fewer threads work.
MIN_ROWS = 4

Shapes = Mapping[str, Sequence[int]]
#: The shapes of `codegen.ir.examples.softmax_program` in the doctests.
SOFTMAX_SHAPES = {"X": (64, 96), "M": (64,), "Z": (64,), "P": (64, 96)}


def row_statistics(nest: LoopNest) -> tuple[Reduce, ...]:
    """The nested reductions of `nest` where it has the row-passes form: one term, no reduced
    index, constraint or guard of its own, two or more free indices, and nested reductions
    none of which reads the last free index; else ().

    >>> from codegen.ir.examples import softmax_program
    >>> [str(r) for r in row_statistics(softmax_program()[-1])]
    []
    """
    if len(nest.terms) != 1 or len(nest.free) < 2 or nest.online:
        return ()
    term = nest.terms[0]
    if term.reduced or term.constraints or term.guard != sympy.true:
        return ()
    last = nest.free[-1].index
    nested = tuple(sorted(term.body.atoms(Reduce), key=str))
    if any(last in r.free_symbols for r in nested):
        return ()
    return nested


def kept_body(nest: LoopNest, read: sympy.Expr) -> tuple[Reduce, sympy.Expr] | None:
    """(a nested sum of `nest` over its last free range, `nest`'s body with that sum's value
    at the element replaced by `read`) where the body is that value times other factors
    (under the same `where` as the sum's, if any), and the value calls a function: then the
    sum's pass can keep its values for the elements to scale, and the function runs once per
    element, not twice (softmax's `exp(X[i, j] - m)`). None where there is no such sum.

    >>> from codegen.ir.examples import softmax_program
    >>> (P,), _ = row_passes(softmax_program(), outputs=("P",), shapes=SOFTMAX_SHAPES)
    >>> kept, body = kept_body(P, sympy.Symbol("e"))
    >>> body == sympy.Symbol("e") / kept
    True
    """
    body, last = nest.terms[0].body, nest.free[-1]
    for r in sorted(body.atoms(Reduce), key=str):
        if r.reduction != "sum" or (r.start, r.stop) != (last.start, last.stop):
            continue
        value = r.body.xreplace({r.index: last.index})
        if value.has(r) or not value.atoms(sympy.Function):
            continue
        if value in sympy.Mul.make_args(body):
            return r, body.xreplace({value: read})
        outer, inner = _masked(body), _masked(value)
        if outer is None or inner is None or outer[1] != inner[1]:
            continue
        if inner[0] in sympy.Mul.make_args(outer[0]):
            kept = outer[0].xreplace({inner[0]: read})
            return r, sympy.Piecewise((kept, outer[1]), (0, True))
    return None


def _masked(expr: sympy.Expr) -> tuple[sympy.Expr, sympy.Basic] | None:
    """(value, test) of `where(test, value, 0)`."""
    if not isinstance(expr, sympy.Piecewise) or len(expr.args) != 2:
        return None
    (value, test), (other, rest) = expr.args
    return (value, test) if other == 0 and rest == sympy.true else None


def row_passes(
    runs: Sequence[LoopNest], *, outputs: Sequence[str], shapes: Shapes
) -> tuple[tuple[LoopNest, ...], tuple[str, ...]]:
    """The forward's nests with row statistics absorbed into their readers (module
    docstring), and one line per reader that absorbed some (for `explain`).

    Args:
        runs: the nests a fused program runs, in order.
        outputs: the program's outputs (never absorbed).
        shapes: the shape of every tensor the nests name, for this call.

    Returns:
        The nests to run forward, in order, and the decisions.
    """
    found = list(runs)
    decisions = []
    for reader in runs:
        taken = _absorbed(reader, found, outputs, shapes)
        if not taken:
            continue
        expanded: dict[str, LoopNest] = {}
        for nest in found:  # in run order: each statistic with those it reads inlined
            if nest.output in taken:
                expanded[nest.output] = _inlined(unconstrained(nest), expanded)
        rewritten = _inlined(unconstrained(reader), expanded)
        if not row_statistics(rewritten) or taken & set(rewritten.operand_names):
            continue
        names = ", ".join(n.output for n in runs if n.output in taken)
        if kept_body(rewritten, sympy.Dummy()) is None:
            decisions.append(
                f"{reader.output}: {names} kept stored (no function their passes and "
                f"{reader.output}'s elements would both evaluate)"
            )
            continue
        found = [rewritten if n is reader else n for n in found if n.output not in taken]
        decisions.append(
            f"{reader.output}: {names} recomputed as passes over each row of "
            f"{reader.output} (one kernel)"
        )
    return tuple(found), tuple(decisions)


def _absorbed(
    reader: LoopNest, runs: Sequence[LoopNest], outputs: Sequence[str], shapes: Shapes
) -> set[str]:
    """The statistics `reader` absorbs (module docstring), by output name; empty if none."""
    if len(reader.free) < 2 or any(t.reduced for t in reader.terms) or reader.online:
        return set()
    if reader.output not in shapes or len(shapes[reader.output]) != len(reader.free):
        return set()
    *rows, length = shapes[reader.output]
    if length > ROW_LIMIT or math.prod(rows) < MIN_ROWS:
        return set()
    by_name = {n.output: n for n in runs}
    taken: set[str] = set()
    pending = [name for name in reader.operand_names if name in by_name]
    while pending:
        name = pending.pop()
        nest = by_name[name]
        if name in taken or name in outputs or not _statistic(nest, shapes):
            continue
        taken.add(name)
        pending += [n for n in nest.operand_names if n in by_name]
    # a statistic another nest reads stays stored (and so do those only it reads)
    while True:
        kept = {
            name
            for name in taken
            for n in runs
            if name in n.operand_names and n.output not in taken and n is not reader
        }
        if not kept:
            return taken
        taken -= kept


def _statistic(nest: LoopNest, shapes: Shapes) -> bool:
    """A reduction whose reduced ranges are no longer than `ROW_LIMIT` and which computes
    one value per element (not positions or several values: argmax, topk)."""
    reduction = REDUCTIONS[nest.reduction]
    if nest.online or reduction.positional or reduction.selects:
        return False
    if not all(t.reduced for t in nest.terms):
        return False
    return all(
        not isinstance(n := _length(r.stop - r.start, nest, shapes), int) or n <= ROW_LIMIT
        for t in nest.terms
        for r in t.reduced
    )


def _length(expr: sympy.Expr, nest: LoopNest, shapes: Shapes) -> int | None:
    from codegen.ir.extents import evaluate_int, extent_values

    try:
        return evaluate_int(expr, extent_values(nest, shapes))
    except (KeyError, TypeError, ValueError):
        return None


def _inlined(nest: LoopNest, expanded: Mapping[str, LoopNest]) -> LoopNest:
    """`nest` with every read of an `expanded` statistic recomputed, the same reduction
    computed once (`_shared`)."""
    for name in [n for n in nest.operand_names if n in expanded]:
        try:
            nest = inline(nest, expanded[name])
        except CannotInline:
            return nest
    return dataclasses.replace(
        nest, terms=tuple(dataclasses.replace(t, body=_shared(t.body)) for t in nest.terms)
    )


def _shared(expr: sympy.Expr) -> sympy.Expr:
    """`expr` with nested reductions that differ only in the names of their indices made
    one node (named by their first), so that the emitter computes each once: softmax's
    maximum read by the elements and by the sum."""
    names: dict[tuple, sympy.Symbol] = {}
    placeholder = index_symbol("row_passes_placeholder_")

    def visit(node: sympy.Basic) -> sympy.Basic:
        if not node.args or not node.has(Reduce):
            return node
        args = [visit(a) for a in node.args]
        if not isinstance(node, Reduce):
            return node.func(*args)
        body, index, start, stop = args[1:]
        key = (node.reduction, body.xreplace({index: placeholder}), start, stop)
        shared = names.setdefault(key, index)
        return Reduce(node.reduction, body.xreplace({index: shared}), shared, start, stop)

    return visit(expr)
