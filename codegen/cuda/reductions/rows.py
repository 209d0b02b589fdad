"""The rows strategy of the CUDA emitter: a group of lanes per output element.

See `codegen.cuda.schedule` for when it applies. The block's threads form groups of `width`
consecutive threads (a host parameter, a power of two: `row_width`); group `g` of block `b`
computes output element `b*per + g` (`per` = groups per block), then the grid strides on.
The lanes of a group stride the innermost reduced loop of every term (`lane_`,
`lane_ + width`, ...), so consecutive lanes read consecutive addresses of a row. A term
without reduced loops is folded by lane 0; a nested reduction computed outside the term's
loops (LayerNorm's `dM[b,t] := -sum_f(...)/...`) is strided the same way and combined across
the group before its value is used (every lane gets the same bits: each step adds the same
two states). Such nests keep `width` at most a warp.

The combine is a butterfly of `__shfl_xor_sync` within the group (the group's lanes as the
mask), then, for a group wider than a warp, each warp's lane 0 writes its state to shared
memory and the group's lane 0 folds the warps' states in order: a fixed order for given
shapes, so results are bitwise equal across calls. Every thread runs the same number of
iterations of the grid-stride loop (a group past the last element skips the terms, all its
lanes together, and stores nothing), so barriers and shuffles are reached by all threads
that name them.
"""

from __future__ import annotations

import sympy

from codegen.cuda.dialect import CudaEmitter
from codegen.emit.emitter import Lines, block_lines, indent_lines
from codegen.emit.staging import Loop, Plan
from codegen.ir.functions import CeilDiv, CeilPow2, FloorDiv
from codegen.ir.nest import Reduce, extent_of
from codegen.ir.reductions import REDUCTIONS, Reduction

WIDTH = "width"  # the host parameter: lanes per output element
WARP = 32
#: A row gets more lanes than a warp once each lane would read more values than this.
ROW_ELEMENTS = 32


def _nested(e: CudaEmitter) -> bool:
    return any(term.body.atoms(Reduce) for term in e.nest.terms)


def row_width(e: CudaEmitter) -> sympy.Expr:
    """Lanes per output element, an expression of extents: the row length rounded up to a
    power of two while it is at most a warp, then enough lanes for `ROW_ELEMENTS` values
    each, at most the block (a warp where nested reductions are strided, and where a row's
    length depends on the indices)."""
    top = min(e.schedule.threads, WARP) if _nested(e) else e.schedule.threads
    lengths: list[sympy.Expr] = []
    for n, term in enumerate(e.nest.terms):
        order = e.term_order(n)
        if order:
            lengths.append(e.bounds[n].stops[order[-1]] - e.bounds[n].starts[order[-1]])
        lengths += [r.stop - r.start for r in term.body.atoms(Reduce)]
    if not lengths or any(extent_of(s) is None for x in lengths for s in x.free_symbols):
        return sympy.Integer(min(top, WARP))
    length = sympy.Max(1, *lengths)
    wanted = sympy.Max(sympy.Min(length, WARP), CeilDiv(length, ROW_ELEMENTS))
    return sympy.Min(top, CeilPow2(wanted))


def rows_grid(e: CudaEmitter) -> sympy.Expr:
    """Blocks of the grid: one group per output element."""
    per_block = FloorDiv(e.schedule.threads, row_width(e))
    return CeilDiv(e.count(e.schedule.free_order, {}), per_block)


def butterfly(
    e: CudaEmitter, state: tuple[str, str], kinds: tuple[str, str], reducer: Reduction
) -> Lines:
    """Combine `state` (of C types `kinds`) across the group's lanes of a warp (`gm_`):
    every lane ends with the group's state."""
    count = len(reducer.init)
    other = (f"{state[0]}o_", f"{state[1]}o_")
    shuffles = [
        f"const {kind} {o} = __shfl_xor_sync(gm_, {s}, h_);"
        for kind, s, o in zip(kinds[:count], state, other, strict=False)
    ]
    head = f"for (int h_ = (int)({WIDTH} < {WARP} ? {WIDTH} : {WARP}) / 2; h_ > 0; h_ >>= 1)"
    return block_lines(head, [*shuffles, e.fmt(reducer.combine, state, other)])


def _strided(e: CudaEmitter, loop: Loop) -> Lines:
    """A nested reduction strided across the group, then combined by `butterfly`."""
    reducer = REDUCTIONS[loop.reduction]
    state = (f"{loop.symbol.name}a", f"{loop.symbol.name}b")
    kinds = e.state_types(reducer)
    lines = [f"{kind} {name} = {init};" for kind, name, init in zip(kinds, state, reducer.init)]
    name = e.printer.index(loop.index)
    lo, hi = e.printer.index(loop.start), e.printer.index(loop.stop)
    body = [
        *e.statement_lines(loop.inner, True),
        f"const {e.f} nv_ = {e.printer.doprint(loop.value)};",
        e.fmt(reducer.update, state, value="nv_"),
        *e.fma_hook(),
    ]
    head = f"for (idx_t {name} = {lo} + lane_; {name} < {hi}; {name} += {WIDTH})"
    lines += block_lines(head, body)
    lines += butterfly(e, state, kinds, reducer)
    return [*lines, f"const {e.f} {loop.symbol.name} = {e.fmt(reducer.result, state)};"]


def _outer_level(e: CudaEmitter, plan: Plan, inner: Lines) -> Lines:
    """Level 0 of a term (outside its reduced loops): nested reductions strided across the
    group, the rest as usual, under the level's tests (which read free indices only, so a
    group takes them together)."""
    lines: Lines = []
    for statement in plan.statements[0]:
        if isinstance(statement, Loop) and _nested(e):
            lines += _strided(e, statement)
        else:
            lines += e.statement_lines([statement], False)
    lines += inner
    tests = plan.tests[0]
    if not tests:
        return lines
    return block_lines(f"if ({' && '.join(e.printer.doprint(t) for t in tests)})", lines)


def _block_combine(e: CudaEmitter) -> Lines:
    """For groups wider than a warp: the warps' states folded in order by lane 0."""
    a, b = e.names()
    count = len(e.reducer.init)
    writes = [f"sa_[threadIdx.x / {WARP}] = {a};", f"sb_[threadIdx.x / {WARP}] = {b};"][:count]
    other = (f"sa_[threadIdx.x / {WARP} + w_]", f"sb_[threadIdx.x / {WARP} + w_]")
    fold = block_lines(
        f"for (int w_ = 1; w_ < (int)({WIDTH} / {WARP}); ++w_)",
        [e.fmt(e.reducer.combine, (a, b), other)],
    )
    inner = [
        *block_lines(f"if ((threadIdx.x & {WARP - 1}) == 0)", writes),
        "__syncthreads();",
        *block_lines("if (lane_ == 0)", fold),
        "__syncthreads(); /* sa_ is reused by the next output element */",
    ]
    return block_lines(f"if ({WIDTH} > {WARP})", inner)


def rows(e: CudaEmitter) -> Lines:
    """Groups of `width` lanes, one per output element (see the module docstring)."""
    s = e.schedule
    e.named.append((WIDTH, row_width(e)))
    total = e.idx(e.count(s.free_order, {}))
    body = [f"const idx_t e_ = r_ + (idx_t)threadIdx.x / {WIDTH};"]
    body += [*e.decode("e_", s.free_order, {}), *e.declare()]
    terms: Lines = []
    for n, term in enumerate(e.nest.terms):
        plan = e.plan(n, [[], *e.reduced_levels(n)])
        fold = e.fold_lines(n, plan, "")
        if not term.reduced:
            fold = block_lines("if (lane_ == 0)", fold)
        loops = e.loops(n, fold, step=("lane_", WIDTH), plan=plan)
        terms += ["{", *indent_lines(_outer_level(e, plan, loops)), "}"]
    # A group past the last element keeps its initial state (its lanes all skip together).
    body += block_lines(f"if (e_ < {total})", terms)
    if any(term.reduced for term in e.nest.terms):  # else lane 0 alone holds a state
        body += butterfly(e, e.names(), e.state_types(), e.reducer)
        body += _block_combine(e)
    body += block_lines(f"if (lane_ == 0 && e_ < {total})", [e.store_line("")])
    ta, tb = e.state_types()
    warps = max(s.threads // WARP, 1)
    shared = [f"__shared__ {ta} sa_[{warps}];"]
    if len(e.reducer.init) > 1:
        shared.append(f"__shared__ {tb} sb_[{warps}];")
    head = [
        f"const idx_t lane_ = (idx_t)threadIdx.x % {WIDTH}, per_ = (idx_t)blockDim.x / {WIDTH};",
        # The group's lanes within its warp: the mask of its shuffles.
        f"const unsigned gm_ = {WIDTH} >= {WARP} ? 0xffffffffu : "
        f"((1u << {WIDTH}) - 1u) << ((threadIdx.x & {WARP - 1}u) & ~(unsigned)({WIDTH} - 1));",
    ]
    loop = f"for (idx_t r_ = (idx_t)blockIdx.x*per_; r_ < {total}; r_ += (idx_t)gridDim.x*per_)"
    return [*shared, *head, *block_lines(loop, body)]
