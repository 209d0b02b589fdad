"""A nested sum inside a vectorised nested reduction, computed for a vector of its values.

A feature map summed against a contraction, ChebyKAN's X gradient
`dX[b, i] = f(X[b, i]) * sum_d g(X[b, i], d) * sum_o C[i, o, d]*dY[b, o]`, is a nested
reduction over `d` (the `#pragma omp simd` loop of `Emitter.nested_lines`) around a nested
sum over `o`. Written as it reads, the sum over `o` is a loop inside the simd loop: the
compiler does not vectorise across it, and each `d` adds one product after the other, a
chain of scalar additions. Where the inner sum reads `d` contiguously (`C[i, o, d]`) and
nothing the outer loop computes, the loops are swapped for chunks of `d`: for each `o`, one
simd loop adds the products of a vector of `d` values into a lane array; then the outer
reduction runs over the chunk as before, reading the inner sums from it. Each inner sum
still adds its products in the same order, so the numbers do not change.
"""

from __future__ import annotations

from typing import Any

import sympy

from codegen.emit.staging import Assign, Loop
from codegen.ir.reductions import REDUCTIONS

Lines = list[str]


def lane_sum_lines(e: Any, loop: Loop) -> Lines | None:
    """The lines of `loop` (an `Emitter`'s nested reduction, outside any simd loop) with its
    one nested sum computed in lane arrays (see the module docstring); None where it does
    not qualify: not exactly one nested sum, deeper nesting, bounds or values of the inner
    sum that read the outer index's other statements, or no contiguous read of the outer
    index inside it."""
    inner = [st for st in loop.inner if isinstance(st, Loop)]
    if len(inner) != 1:
        return None
    (sub,) = inner
    if sub.reduction != "sum" or any(isinstance(st, Loop) for st in sub.inner):
        return None
    bounds = sympy.sympify(sub.start).free_symbols | sympy.sympify(sub.stop).free_symbols
    local = {st.symbol for st in loop.inner}
    exprs = [sub.value, *(st.expr for st in sub.inner if isinstance(st, Assign))]
    reads = set().union(*(sympy.sympify(x).free_symbols for x in exprs))
    if loop.index in bounds or reads & local or not _contiguous(exprs, loop.index):
        return None
    reducer = REDUCTIONS[loop.reduction]
    state = (f"{loop.symbol.name}a", f"{loop.symbol.name}b")
    kinds = e.state_types(reducer)
    lines = [f"{kind} {name} = {init};" for kind, name, init in zip(kinds, state, reducer.init)]
    width = 8 if e.f == "float" else 4  # one vector register
    start, lo, hi = f"{loop.symbol.name}k", e.printer.index(loop.start), e.printer.index(loop.stop)
    lines.append(f"{e.index_type} {start} = {lo};")
    chunk = _chunk(e, loop, sub, state, start, width)
    lines += _for(f"; {start} + {width} <= {hi}; {start} += {width}", chunk(str(width)))
    lines += [f"if ({start} < {hi}) {{", *("    " + x for x in chunk(f"{hi} - {start}")), "}"]
    return [*lines, f"const {e.f} {loop.symbol.name} = {e.fmt(reducer.result, state)};"]


def _chunk(e: Any, loop: Loop, sub: Loop, state: tuple[str, str], start: str, width: int):
    """The lines of one chunk of `count` values of the outer index from `start`."""
    lane, buffer = f"{loop.symbol.name}l", f"{sub.symbol.name}l"
    at = f"const {e.index_type} {e.printer.index(loop.index)} = {start} + {lane};"
    o = e.printer.index(sub.index)
    o_lo, o_hi = e.printer.index(sub.start), e.printer.index(sub.stop)
    fill = [at, *e.statement_lines(sub.inner, True)]
    fill += [f"{buffer}[{lane}] += {e.printer.doprint(sub.value)};", *e.fma_hook()]
    rest = [st for st in loop.inner if st is not sub]
    use = [at, f"const {e.f} {sub.symbol.name} = {buffer}[{lane}];"]
    use += [*e.statement_lines(rest, True), f"const {e.f} nv_ = {e.printer.doprint(loop.value)};"]
    use += [e.fmt(REDUCTIONS[loop.reduction].update, state, value="nv_"), *e.fma_hook()]
    pragma = [e.simd_sum_pragma.format(state=state[0])] if loop.reduction == "sum" else []

    def lines(count: str) -> Lines:
        lanes = f"int64_t {lane} = 0; {lane} < {count}; ++{lane}"
        sums = ["#pragma omp simd", *_for(lanes, fill)]
        return [
            f"{e.f} {buffer}[{width}] = {{0}};",
            *_for(f"{e.index_type} {o} = {o_lo}; {o} < {o_hi}; ++{o}", sums),
            *pragma,
            *_for(lanes, use),
        ]

    return lines


def _contiguous(exprs: list[sympy.Expr], index: sympy.Symbol) -> bool:
    """Whether some access in `exprs` reads `index` in its last axis with coefficient 1."""
    for expr in exprs:
        for access in sympy.sympify(expr).atoms(sympy.Indexed):
            *outer, last = access.indices
            if sympy.diff(last, index) == 1 and not any(index in x.free_symbols for x in outer):
                return True
    return False


def _for(head: str, body: Lines) -> Lines:
    return [f"for ({head}) {{", *("    " + x for x in body), "}"]
