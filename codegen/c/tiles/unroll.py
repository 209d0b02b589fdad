"""The unroll strategy: a small constant last axis unrolled, the index before it in lanes.

For a nest whose last free index `p` runs over K values only (`codegen.ir.small_axes`:
GPT-J's `Y[..., f, p] := X[..., f, p]*C[t, f] + (2*p - 1)*X[..., f, 1 - p]*S[t, f]`), the
scalar strategy computes one element at a time, a loop of K iterations whose reads
`X[..., 1 - p]` run backwards. Here the K values of `p` are written out one after the other
(`const int64_t v_p = 0; ... v_p = 1; ...`, each a constant the compiler folds: `1 - p`
becomes a fixed offset, `2*p - 1` a sign) in the body of one `#pragma omp simd` loop over the
index before it, `f`: each vector computes 8 values of `f` for every `p`, the K reads of
an operand's pair interleaved loads with a constant stride K. The strides that make this so
(the output's and every operand's whose last axis reads `p`, next to last axis) are tested
at run time to be K, with `p` over all of `[0, K)`; any other call runs the scalar strategy.
The free loops outside are shared among threads as everywhere (`parallel_loop`).
"""

from __future__ import annotations

import copy
import dataclasses

from codegen.c.geometry import CpuGeometry
from codegen.c.reductions.simple import parallel_loop, scalar
from codegen.emit.emitter import Emitter, Lines, block_lines, indent_lines
from codegen.ir.nest import accesses


def unrolled(e: Emitter[CpuGeometry]) -> Lines:
    """The loops of the unroll strategy, and the scalar strategy for other calls (see the
    module docstring)."""
    count = e.schedule.width
    free = e.free_symbols()
    small, lanes = free[-1], free[-2]
    fast, checks = _constant_strides(e, count)
    points: Lines = []
    for value in range(count):
        point = [f"const {e.index_type} {e.printer.index(small)} = {value};", *fast.declare()]
        for n in range(len(e.nest.terms)):
            point += fast.term_lines(n)
        points += ["{", *indent_lines([*point, fast.store_line("")]), "}"]
    e.temporaries = fast.temporaries
    loop = ["#pragma omp simd", *block_lines(fast.free_loop(lanes), points)]
    for r in reversed(free[:-2]):
        loop = block_lines(fast.free_loop(r), loop)
    vector = parallel_loop(fast, len(free) - 2, loop)
    other = scalar(e.variant(schedule=dataclasses.replace(e.schedule, strategy="scalar")))
    head = f"if ({' && '.join(checks)})"
    return [*block_lines(head, vector)[:-1], "} else {", *indent_lines(other), "}"]


def _constant_strides(
    e: Emitter[CpuGeometry], count: int
) -> tuple[Emitter[CpuGeometry], list[str]]:
    """`e` with the next to last stride of the output and of every operand whose last axis
    reads the small index printed as `count`, and the run-time tests that make it so (the
    small index over `[0, count)`, each such stride `count`)."""
    small = e.free_symbols()[-1]
    r = next(x for x in e.nest.free if x.index == small)
    checks = [f"{e.idx(r.start)} == 0", f"{e.idx(r.stop)} == {count}"]
    reads = {
        access.base.name
        for term in e.nest.terms
        for access in accesses(term.body)
        if len(access.indices) >= 2 and small in access.indices[-1].free_symbols
    }
    fast = e.variant()
    free = tuple(dataclasses.replace(x, start=0) if x.index == small else x for x in e.nest.free)
    fast.nest = dataclasses.replace(e.nest, free=free)  # the tests make its start 0
    fast.printer = copy.copy(e.printer)
    fast.printer.tensors = dict(e.printer.tensors)
    for name in sorted(reads):
        view = fast.printer.tensors[name]
        checks.append(f"{view.strides[-2]} == {count}")
        strides = (*view.strides[:-2], str(count), None)
        fast.printer.tensors[name] = dataclasses.replace(view, strides=strides)
    fast.out_strides = (*e.out_strides[:-2], str(count), None)
    return fast, checks
