"""An elementwise tile's lane loop written once per value of a row's condition.

A `where` whose condition is computed outside the lane loop (a row's: logsumexp's gradient
`dL[i] * where(L[i] == -inf, 0, exp(S[i, j] - L[i]))`) is hoisted there by the staging
plan (`codegen.emit.staging`, `selection`) so that the compiler unswitches the lane loop on
it; gcc does not unswitch a tile's 32-lane `omp simd` loop, and the loop then selects per
vector between 0 and a function computed under a mask. Written out, `if (t_) { lanes with
the condition true } else { lanes with it false }`, each loop is plain arithmetic
(benchmarks/RESULTS.md, "column_prefetch").

>>> import sympy
>>> from codegen.emit.staging import Assign, Plan
>>> c, x = sympy.Dummy("c"), sympy.Symbol("x")
>>> value = sympy.Piecewise((0, c), (sympy.exp(x), True))
>>> plan = Plan([[Assign(c, x < 0)], []], [[], []], value, 1)
>>> cond, true, false = row_condition(plan, 1)
>>> cond == c, [str(s) for s in true.statements[1]], true.value, false.value
(True, ['wv0_ = 0'], _wv0_, exp(x))
"""

from __future__ import annotations

import dataclasses

import sympy

from codegen.c.tiles.lanes import CEmitter, lane_loops, rows_around
from codegen.emit.emitter import Lines, indent_lines
from codegen.emit.staging import Assign, Plan


def row_condition(plan: Plan, level: int) -> tuple[sympy.Symbol, Plan, Plan] | None:
    """The first condition of a `where` at `level` (the lanes') that a statement of an outer
    level computes, and the plan with it true and with it false; None where there is none
    (or the lanes compute a nested reduction)."""
    lanes = plan.statements[level]
    if not all(isinstance(s, Assign) for s in lanes):
        return None
    outer = {s.symbol for statements in plan.statements[:level] for s in statements}
    exprs = [plan.value, *(s.expr for s in lanes if isinstance(s, Assign))]
    for expr in exprs:
        for node in sympy.preorder_traversal(expr):
            if not isinstance(node, sympy.Piecewise):
                continue
            for _, cond in node.args:
                if cond in outer:
                    return (
                        cond,
                        _assume(plan, level, cond, True),
                        _assume(plan, level, cond, False),
                    )
    return None


def _assume(plan: Plan, level: int, cond: sympy.Symbol, truth: bool) -> Plan:
    """`plan` with `cond` taken as `truth` at `level` and in its value: each `where` on it
    replaced by its branch. A branch that is a number is named first (`const float wv0_ =
    0;`), so that sympy simplifies nothing around it: `t * 0` stays a product, NaN where `t`
    is NaN or infinite, as the `where` was."""
    value = sympy.true if truth else sympy.false
    named: list[Assign] = []

    def chosen(expr: sympy.Expr) -> sympy.Expr:
        branches = {}
        for node in sympy.preorder_traversal(expr):
            if isinstance(node, sympy.Piecewise) and cond in node.free_symbols:
                branch = node.xreplace({cond: value})
                if branch.is_number:
                    named.append(Assign(sympy.Dummy(f"wv{len(named)}_"), branch))
                    branch = named[-1].symbol
                branches[node] = branch
        return expr.xreplace(branches)

    lanes = [
        dataclasses.replace(s, expr=chosen(s.expr))
        for s in plan.statements[level]
        if isinstance(s, Assign)
    ]
    result = chosen(plan.value)
    return dataclasses.replace(plan.with_level(level, [*named, *lanes]), value=result)


def unswitched(
    p: CEmitter,
    rn: str,
    wn: str,
    plan: Plan,
    switched: tuple[sympy.Symbol, Plan, Plan],
    around: tuple[Lines, Lines],
) -> Lines:
    """The lane loop once with the row's condition true, once false (`codegen.c.tiles.unswitch`),
    inside the row loop where there is one."""
    cond, *cases = switched
    loops = [
        lane_loops(
            p, rn, wn, p.fold_lines(0, case, ""), plan=case, level=1, around=around, lanes_only=True
        )
        for case in cases
    ]
    lines = [f"if ({p.printer.doprint(cond)}) {{", *indent_lines(loops[0]), "} else {"]
    lines += [*indent_lines(loops[1]), "}"]
    return rows_around(p, rn, lines, plan, 1) if p.schedule.row else lines
