"""The row-passes strategy of the C emitter: each row's reductions, then its elements.

An elementwise nest whose body carries nested reductions over a row (a program's row
statistics recomputed inside the statement that reads them, `codegen.passes.row_passes`:
softmax's `exp(X[i, j] - max_k X[i, k]) / sum_k exp(X[i, k] - max_l X[i, l])`, LayerNorm's
mean and variance) is run one row at a time: the threads share the rows; in each row the
nested reductions (staged at the row's level by `codegen.emit.staging`, each computed once
per row, a reduction read by another computed before it) run as passes over the row, then
one `#pragma omp simd` loop over the last free index writes the row's elements. The row is
read by every pass while it is in the core's cache, and the whole program runs as one
kernel with one parallel region.

The rule (`row_passes_applies`, `codegen.passes.row_passes.row_statistics`) takes a nest of
one term with no reduced index of its own and no constraint, whose last free index every
access reads in its last axis (contiguous rows) and no nested reduction reads (each is a
statistic of the row, not of an element).
"""

from __future__ import annotations

import dataclasses

import sympy

from codegen.c.geometry import CpuGeometry
from codegen.c.reductions.simple import parallel_loop
from codegen.c.threads import body_cost, update_cost
from codegen.emit.emitter import Emitter, Lines, block_lines
from codegen.emit.printer import TensorView
from codegen.emit.staging import Loop, Plan
from codegen.ir.nest import LoopNest, Reduce, tensor_base
from codegen.ir.reductions import REDUCTIONS
from codegen.passes.row_passes import kept_body

#: Reductions whose passes run in vector lanes, each lane its own running value, combined
#: at the end (a max or min with a branch per value does not vectorise; a sum does, under
#: its `omp simd reduction`, and ran faster so than in lanes).
LANE_REDUCTIONS = ("max", "min")
#: The output row read back as a tensor (no user's tensor has this name).
KEPT = "#kept"
#: Lanes of such a pass: one AVX2 vector of floats (two of doubles).
LANES = 8


def row_passes(e: Emitter[CpuGeometry]) -> Lines:
    """One row at a time (module docstring): the row's statements, then its elements."""
    free = e.free_symbols()
    rows, last = free[:-1], free[-1]
    # a sum's values kept in the output row for the elements to scale (`kept_body`), where
    # the output is stored in the accumulation type (so the kept value is exact)
    kept = None
    if e.storage[e.dtypes[e.nest.output]] == e.f:
        kept = kept_body(e.nest, _kept_read(e.nest, e.nest.free[-1].index))
    if kept is not None:
        e.printer.tensors[KEPT] = TensorView("out_", e.out_strides, "{}")
        e = e.variant(terms=[dataclasses.replace(e.nest.terms[0], body=kept[1])])
    plan = e.plan(0, [[], rows, [last]])
    value = e.store(e.printer.doprint(plan.value))
    element = [f"out_[{e.out_offset()}] = {value};"]
    inner = e.level_lines(plan, 2, element, simd=True)
    lines = ["#pragma omp simd", *block_lines(e.free_loop(last), inner)]
    lines = _row_level(e, plan, lines, kept[0] if kept else None)
    for r in reversed(rows):
        lines = block_lines(e.free_loop(r), lines)
    return e.level_lines(plan, 0, parallel_loop(e, len(rows), lines))


def row_passes_work(nest: LoopNest) -> sympy.Expr:
    """The work units of a row-passes kernel: per row, each nested reduction once (a pass
    over the row, the reductions it reads computed before it, with its update's calls: a
    logsumexp's `exp`, `threads.update_cost`) and the row's elements; not
    each element's nested reductions again, as `work_expression` counts them (for a tile,
    which computes them per tile row), which would start a team for a small softmax.

    >>> from codegen.c.threads import work_expression
    >>> from codegen.ir.examples import softmax_program
    >>> from codegen.passes.row_passes import SOFTMAX_SHAPES, row_passes
    >>> (P,), _ = row_passes(softmax_program(), outputs=("P",), shapes=SOFTMAX_SHAPES)
    >>> extents = {s: 64 for s in work_expression(P).free_symbols}
    >>> int(row_passes_work(P).subs(extents)), int(work_expression(P).subs(extents))
    (577536, 52195328)
    """
    *rows, last = nest.free
    body = nest.terms[0].body

    def alone(expr: sympy.Expr) -> sympy.Expr:  # its nested reductions as computed values
        return expr.xreplace({r: sympy.Symbol(f"r{n}_") for n, r in enumerate(expr.atoms(Reduce))})

    per_row = sympy.Add(
        *(
            sympy.Max(r.stop - r.start, 0) * (body_cost(alone(r.body)) + update_cost(r.reduction))
            for r in body.atoms(Reduce)
        )
    )
    length = sympy.Max(last.stop - last.start, 0)
    count = sympy.Mul(*(sympy.Max(r.stop - r.start, 0) for r in rows))
    return count * (per_row + length * (1 + body_cost(alone(body))))


def _row_level(
    e: Emitter[CpuGeometry], plan: Plan, inner: Lines, kept: Reduce | None = None
) -> Lines:
    """The row's statements, then `inner`: a max or min over the row in vector lanes, the
    sum `kept` (`_kept_values`) writing each value it adds into the output row."""
    if plan.tests[1]:
        return e.level_lines(plan, 1, inner)
    lines: Lines = []
    for statement in plan.statements[1]:
        if not isinstance(statement, Loop):
            lines += e.statement_lines([statement], False)
            continue
        keep = kept is not None and statement.index == kept.index
        lanes = _lane_pass(e, statement, keep)
        if lanes is None:
            lanes = _keeping_sum(e, statement) if keep else e.statement_lines([statement], False)
        lines += lanes
    return [*lines, *inner]


def _lane_pass(e: Emitter[CpuGeometry], loop: Loop, keep: bool) -> Lines | None:
    """A nested max or min as `LANES` running values updated in one simd loop, combined
    pairwise after the row (a fixed order); each value also stored in the output row where
    `keep`. None for other reductions, or one with a nested loop inside."""
    if loop.reduction not in LANE_REDUCTIONS or any(isinstance(s, Loop) for s in loop.inner):
        return None
    reducer = REDUCTIONS[loop.reduction]
    name, lanes = loop.symbol.name, f"{loop.symbol.name}l"
    index = e.printer.index(loop.index)
    lo, hi = e.printer.index(loop.start), e.printer.index(loop.stop)
    kind, at = e.index_type, f"{name}at_"
    store = [f"{e.printer.doprint(_kept_read(e.nest, loop.index))} = nv_;"] if keep else []

    def update(target: str, at: str) -> Lines:
        return [
            f"const {kind} {index} = {at};",
            *e.statement_lines(loop.inner, True),
            f"const {e.f} nv_ = {e.printer.doprint(loop.value)};",
            *store,
            e.fmt(reducer.update, (target, ""), value="nv_"),
        ]

    whole = block_lines(
        f"for ({kind} l_ = 0; l_ < {LANES}; ++l_)", update(f"{lanes}[l_]", f"{at} + l_")
    )
    return [
        f"{e.f} {lanes}[{LANES}];",
        f"for (int l_ = 0; l_ < {LANES}; ++l_) {lanes}[l_] = {reducer.init[0]};",
        f"const {kind} lo_{name} = {lo}, hi_{name} = {hi};",
        f"{kind} {at} = lo_{name};",
        *block_lines(
            f"for (; {at} + {LANES} <= hi_{name}; {at} += {LANES})", ["#pragma omp simd", *whole]
        ),
        *block_lines(f"for (; {at} < hi_{name}; ++{at})", update(f"{lanes}[0]", at)),
        *block_lines(  # combined pairwise: three steps of latency, not seven
            f"for (int w_ = {LANES // 2}; w_ > 0; w_ /= 2)",
            [
                "#pragma omp simd",
                *block_lines(
                    "for (int l_ = 0; l_ < w_; ++l_)",
                    [e.fmt(reducer.combine, (f"{lanes}[l_]", ""), (f"{lanes}[l_ + w_]", ""))],
                ),
            ],
        ),
        f"const {e.f} {name} = {lanes}[0];",
    ]


def _kept_read(nest: LoopNest, last: sympy.Symbol) -> sympy.Indexed:
    """The output's element of this row at the last index `last`, read back."""
    *rows, end = nest.free
    return tensor_base(KEPT)[(*(r.index - r.start for r in rows), last - end.start)]


def _keeping_sum(e: Emitter[CpuGeometry], loop: Loop) -> Lines:
    """A nested sum over the row whose every value is also stored at its place in the
    output row (`_kept_values`)."""
    at = e.printer.doprint(_kept_read(e.nest, loop.index))
    lines = e.nested_lines(loop, False)
    value = "const " + e.f + " nv_ = "
    where = next(n for n, line in enumerate(lines) if line.strip().startswith(value))
    indent = lines[where][: len(lines[where]) - len(lines[where].lstrip())]
    return [*lines[: where + 1], f"{indent}{at} = nv_;", *lines[where + 1 :]]
