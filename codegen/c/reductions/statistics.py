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
from codegen.emit.emitter import Emitter, Lines, block_lines
from codegen.emit.printer import TensorView
from codegen.emit.staging import Loop, Plan
from codegen.ir.nest import LoopNest, Reduce, tensor_base
from codegen.ir.reductions import REDUCTIONS

#: Reductions whose passes run in vector lanes, each lane its own running value, combined
#: at the end: the order they see the values in does not change their result.
LANE_REDUCTIONS = ("max", "min")
#: The output row read back as a tensor (no user's tensor has this name).
KEPT = "#kept"
#: Lanes of such a pass (8 floats: one AVX2 vector; doubles take two).
LANES = 8


def row_passes(e: Emitter[CpuGeometry]) -> Lines:
    """One row at a time (module docstring): the row's statements, then its elements."""
    free = e.free_symbols()
    rows, last = free[:-1], free[-1]
    kept = _kept_values(e)
    if kept is not None:
        e.printer.tensors[KEPT] = TensorView("out_", e.out_strides, "{}")
        body = kept[1].xreplace({kept[2]: _kept_read(e.nest, e.nest.free[-1].index)})
        e = e.variant(terms=[dataclasses.replace(e.nest.terms[0], body=body)])
    plan = e.plan(0, [[], rows, [last]])
    value = e.store(e.printer.doprint(plan.value))
    element = [f"out_[{e.out_offset()}] = {value};"]
    inner = e.level_lines(plan, 2, element, simd=True)
    lines = ["#pragma omp simd", *block_lines(e.free_loop(last), inner)]
    lines = _row_level(e, plan, lines, kept[0] if kept else None)
    for r in reversed(rows):
        lines = block_lines(e.free_loop(r), lines)
    return e.level_lines(plan, 0, parallel_loop(e, len(rows), lines))


def _kept_values(e: Emitter[CpuGeometry]) -> tuple[Reduce, sympy.Expr, sympy.Expr] | None:
    """(a nested sum over the row's last index, the body, the factor of the body that is
    the sum's value at the element) where the sum's pass can keep its values in the output
    row for the elements to scale: softmax's `exp(X[i, j] - m)`, computed once, not twice.
    Only where the factor calls a function (else recomputing it is as cheap as a load) and
    the output is stored in the accumulation type (the kept value is then exact)."""
    nest: LoopNest = e.nest
    if e.storage[e.dtypes[nest.output]] != e.f:
        return None
    body, last = nest.terms[0].body, nest.free[-1]
    factors = sympy.Mul.make_args(body)
    for r in sorted(body.atoms(Reduce), key=str):
        if r.reduction != "sum" or (r.start, r.stop) != (last.start, last.stop):
            continue
        value = r.body.xreplace({r.index: last.index})
        if value in factors and value.atoms(sympy.Function) and not value.has(r):
            return r, body, value
    return None


def _row_level(
    e: Emitter[CpuGeometry], plan: Plan, inner: Lines, kept: Reduce | None = None
) -> Lines:
    """The row's statements, then `inner`: a max or min over the row in vector lanes, the
    sum `kept` (`_kept_values`) writing each value it adds into the output row."""
    if plan.tests[1]:
        return e.level_lines(plan, 1, inner)
    lines: Lines = []
    for statement in plan.statements[1]:
        if kept is not None and isinstance(statement, Loop) and statement.index == kept.index:
            lines += _keeping_sum(e, statement)
            continue
        lanes = _lane_pass(e, statement) if isinstance(statement, Loop) else None
        lines += lanes if lanes is not None else e.statement_lines([statement], False)
    return [*lines, *inner]


def _lane_pass(e: Emitter[CpuGeometry], loop: Loop) -> Lines | None:
    """A nested max or min as `LANES` running values updated in one simd loop, combined
    after the row (a scalar loop with a branch per value does not vectorise); None for
    other reductions, or one with a nested loop inside."""
    if loop.reduction not in LANE_REDUCTIONS or any(isinstance(s, Loop) for s in loop.inner):
        return None
    reducer = REDUCTIONS[loop.reduction]
    name, lanes = loop.symbol.name, f"{loop.symbol.name}l"
    index = e.printer.index(loop.index)
    lo, hi = e.printer.index(loop.start), e.printer.index(loop.stop)
    kind = e.index_type

    def update(target: str, at: str) -> Lines:
        return [
            f"const {kind} {index} = {at};",
            *e.statement_lines(loop.inner, True),
            f"const {e.f} nv_ = {e.printer.doprint(loop.value)};",
            e.fmt(reducer.update, (target, ""), value="nv_"),
        ]

    whole = block_lines(
        f"for ({kind} l_ = 0; l_ < {LANES}; ++l_)", update(f"{lanes}[l_]", "b_ + l_")
    )
    return [
        f"{e.f} {lanes}[{LANES}];",
        f"for (int l_ = 0; l_ < {LANES}; ++l_) {lanes}[l_] = {reducer.init[0]};",
        f"const {kind} lo_{name} = {lo}, hi_{name} = {hi};",
        f"{kind} b_ = lo_{name};",
        *block_lines(
            f"for (; b_ + {LANES} <= hi_{name}; b_ += {LANES})", ["#pragma omp simd", *whole]
        ),
        *block_lines(f"for (; b_ < hi_{name}; ++b_)", update(f"{lanes}[0]", "b_")),
        f"{e.f} {name}a = {lanes}[0];",
        *block_lines(
            f"for (int l_ = 1; l_ < {LANES}; ++l_)",
            [e.fmt(reducer.combine, (f"{name}a", ""), (f"{lanes}[l_]", ""))],
        ),
        f"const {e.f} {name} = {name}a;",
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
