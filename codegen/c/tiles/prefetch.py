"""Software prefetch of the operands a tile reads down their columns.

A tile over a row index `j` and a vector index `e`, summed over `i`, reads an operand
`S[i, j]` at its `rows` values of `j` (part of one cache line) once per step of `i`: each
step moves a whole row of `S` on, so the tile walks down a column of `S`, a new page every
few steps (attention's gradient of V, `sum_i exp(S[i, j] - L[i]) * dO[i, e]`, the scores
`S[b, h, i, j]` read along `i`). Where `S` is out of cache (computed long before, as a
forward pass's scores are for the backward pass) that walk waits on memory at every step,
and neither the hardware prefetchers nor a prefetch a few steps ahead in the walk recover
it; prefetched once in memory order, the part of `S` that a row of tiles reads
(`S[b, h, :, :]`, the tiles of one `b, h`) is in cache when its columns are walked, at a
small cost where it was in cache already (benchmarks/RESULTS.md, "column_prefetch").

So the first tile of each row of tiles (its row and vector tile numbers 0) prefetches, for
every read of that shape, the span of memory between the read's first and last element
over the reduced index's range and the row index's range, one cache line at a time, up to
`LIMIT` bytes (what a core's L2 cache holds). A read of that shape: its last axis reads the
row index and not the vector index, the innermost reduced index moves it along another
axis, and its other indices are free indices outside the tile (so the span is the same for
every tile of the row). A read along the vector lanes is a contiguous run per step, a
stream the hardware follows.

>>> import sympy
>>> i, j, e = sympy.symbols("i j e", integer=True)
>>> S = sympy.IndexedBase("S")
>>> column_reads(S[i, j] * sympy.IndexedBase("G")[i, e], reduced=i, row=j, vector=e)
(S[i, j],)
"""

from __future__ import annotations

import sympy

from codegen.emit.emitter import Emitter, Lines, block_lines
from codegen.ir.nest import accesses

#: Bytes of one cache line, the prefetch step.
LINE = 64
#: The most bytes prefetched per read and row of tiles: about a core's L2 cache (larger
#: spans would evict their own start before the tiles read it).
LIMIT = 1 << 20


def column_reads(
    body: sympy.Basic, *, reduced: sympy.Symbol, row: sympy.Symbol, vector: sympy.Symbol
) -> tuple[sympy.Indexed, ...]:
    """The reads of `body` that walk down a column as `reduced` steps: the last axis reads
    `row` (not `reduced`) and no axis reads `vector`; `reduced` is read on another axis."""
    found = []
    for access in accesses(body):
        *outer, last = (sympy.sympify(x).free_symbols for x in access.indices)
        if vector in set().union(last, *outer) or row not in last or reduced in last:
            continue
        if any(reduced in axis for axis in outer):
            found.append(access)
    return tuple(found)


def slice_prefetch_lines(e: Emitter) -> Lines:
    """The first tile of each row of tiles prefetches the spans of the column reads (see
    the module's docstring); no lines where no term has such a read."""
    s = e.schedule
    if not s.row or not s.vector:
        return []
    row, vector = (sympy.Symbol(name, integer=True) for name in (s.row, s.vector))
    lines: Lines = []
    for k, (base, first, final) in enumerate(_spans(e, row, vector)):
        step = f"(int64_t)({LINE} / sizeof(*{base}))"
        limit = f"(int64_t)({LIMIT} / sizeof(*{base}))"
        start, end = f"pa{k}_", f"pz{k}_"
        # integer arithmetic: a gradient's row range may reach past the operand's end
        address = f"(uintptr_t){base} + sizeof(*{base}) * (uintptr_t)k_"
        lines += [
            f"const int64_t {start} = {first};",
            f"const int64_t {end} = tdsl_imin({final}, {start} + {limit});",
            *block_lines(
                f"for (int64_t k_ = {start}; k_ <= {end}; k_ += {step})",
                [f"__builtin_prefetch((const void *)({address}));"],
            ),
        ]
    if not lines:
        return []
    first_tile = " && ".join(f"{e.tile_name('ti', x)} == 0" for x in (row, vector))
    return block_lines(f"if ({first_tile})", lines)


def _spans(e: Emitter, row: sympy.Symbol, vector: sympy.Symbol) -> list[tuple[str, str, str]]:
    """Per column read whose other indices are free indices outside the tile: the C name
    of its operand, and the offsets of its first and last element over the innermost
    reduced index's range and the row index's range (each span once)."""
    outside = {x for x in e.nest.free_indices if x not in (row, vector)}
    row_range = next(r for r in e.nest.free if r.index == row)
    spans: list[tuple[str, str, str]] = []
    for n, term in enumerate(e.nest.terms):
        order = e.term_order(n)
        if not order:
            continue
        reduced = next(r for r in term.reduced if r.index == order[-1])
        known = {*outside, reduced.index, row, *e.params.values()}
        for read in column_reads(e.hoist(term.body), reduced=reduced.index, row=row, vector=vector):
            if not set().union(*(sympy.sympify(x).free_symbols for x in read.indices)) <= known:
                continue
            ends = []
            for last in (False, True):  # the loops' own parameters: last = stop - 1
                corner = {
                    r.index: e.hoist(r.stop) - 1 if last else e.hoist(r.start)
                    for r in (reduced, row_range)
                }
                ends.append(e.printer.offset(read.xreplace(corner), zeros=False))
            span = (e.printer.tensors[str(read.base.name)].cname, ends[0], ends[1])
            if span not in spans:
                spans.append(span)
    return spans
