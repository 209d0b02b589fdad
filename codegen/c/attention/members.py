"""The members strategy: a multi-output nest (`codegen.ir.members`) as one loop nest.

The last free index before the packed member axis is the *row*; the free points are taken
`rows` rows at a time (a tile; the rows past the end of a partial tile recompute the last
row and store nothing), one accumulator array `acc<k>_[rows][lanes]` per member. Each term's
reduced loops run once per tile: its innermost reduced index in chunks of `lanes` values,
and for each chunk every row of the tile in turn, its members' bodies in one
`#pragma omp simd` loop over the chunk. The bodies are planned together
(`codegen.emit.staging.plan` of the tuple of bodies), so a sub-expression they share (the
Gaussian kernel's exponential) is computed once per iteration, and what does not depend on
the row (the loads of `X[i, :]` for a chunk of `i`) serves all the rows of the tile. Then
each member's element is written, once: the lanes added in order.

A tile of one row is used where a reduced loop's bounds depend on the row (the heuristic
sets `rows`): then the row is bound before the term's loops.
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from codegen.c.geometry import CpuGeometry
from codegen.c.reductions.simple import parallel_loop
from codegen.emit.emitter import Emitter, Lines, block_lines, indent_lines
from codegen.emit.printer import TensorView
from codegen.emit.staging import Assign, Plan
from codegen.ir.members import member_bodies
from codegen.ir.nest import extent_of, tensor_base


def members(e: Emitter[CpuGeometry]) -> Lines:
    """The loops of a multi-output nest (see the module docstring)."""
    bodies = member_bodies(e.nest)
    assert bodies is not None, "the members strategy is for multi-output nests"
    rows, lanes = e.schedule.rows, e.schedule.lanes
    accumulators = [f"acc{k}_" for k in range(len(bodies[0]))]
    free = e.free_symbols()[:-1]
    row = free[-1] if free else None
    tile: Lines = []
    for a in accumulators:
        tile += [f"{e.f} {a}[{rows}][{lanes}];"]
        tile += block_lines(
            f"for (int64_t w_ = 0; w_ < {rows}; ++w_)",
            [f"for (int64_t l_ = 0; l_ < {lanes}; ++l_) {a}[w_][l_] = 0;"],
        )
    kind = e.index_type
    across = row is not None and e.schedule.vector == row.name
    step = lanes if across else rows
    if row is not None:
        r = next(x for x in e.nest.free if x.index == row)
        start, stop = e.idx(r.start), e.idx(r.stop)
        tile.insert(0, f"const {kind} o_r_ = {start} + tr_*{step};")
        if rows == 1 and not across:
            tile.insert(1, f"const {kind} {e.printer.index(row)} = o_r_;")
    if across:
        whole = [x for n in range(len(e.nest.terms)) for x in _across(e, n, bodies[n], row, False)]
        edge = [x for n in range(len(e.nest.terms)) for x in _across(e, n, bodies[n], row, True)]
        tile += [*block_lines(f"if (o_r_ + {lanes} <= {stop})", whole)[:-1], "} else {"]
        tile += [*indent_lines(edge), "}"]
    else:
        for n in range(len(e.nest.terms)):
            tile += _term_lines(e, n, bodies[n], accumulators, row)
    stores: Lines = []
    for k, a in enumerate(accumulators):
        if across:
            stores.append(f"out_[{_offset(e, k)}] = {e.store(f'{a}[0][l_]')};")
            continue
        stores += [
            f"{e.f} tot{k}_ = 0;",
            f"for (int64_t l_ = 0; l_ < {lanes}; ++l_) tot{k}_ += {a}[w_][l_];",
        ]
        stores.append(f"out_[{_offset(e, k)}] = {e.store(f'tot{k}_')};")
    if across:
        at_row = f"const {kind} {e.printer.index(row)} = o_r_ + l_;"
        head = f"for (int64_t l_ = 0; l_ < {lanes} && o_r_ + l_ < {stop}; ++l_)"
        tile += block_lines(head, [at_row, *stores])
        lines = block_lines("for (int64_t tr_ = 0; tr_ < nt_; ++tr_)", tile)
    elif row is None:
        tile += ["{", "const int64_t w_ = 0;", *stores, "}"]
        lines = tile
    else:
        at_row = f"const {kind} {e.printer.index(row)} = o_r_ + w_;"
        head = f"for (int64_t w_ = 0; w_ < {rows} && o_r_ + w_ < {stop}; ++w_)"
        tile += block_lines(head, [at_row, *stores])
        lines = block_lines("for (int64_t tr_ = 0; tr_ < nt_; ++tr_)", tile)
    for index in reversed(free[:-1]):
        lines = block_lines(e.free_loop(index), lines)
    if row is None:
        return lines
    count = f"const {kind} nt_ = (tdsl_imax({stop} - {start}, 0) + {step - 1})/{step};"
    return [count, *parallel_loop(e, len(free), lines)]


def _across(
    e: Emitter[CpuGeometry], n: int, bodies: tuple[sympy.Expr, ...], row: sympy.Symbol, edge: bool
) -> Lines:
    """Term `n` with the row in vector lanes (`Schedule.vector`: the row is every access's
    contiguous axis, LayerNorm's `dgamma[c]` and `dbeta[c]`): its reduced loops outside, the
    members' bodies in one simd loop over the tile's rows (at the `edge`, the rows past the
    last recompute it)."""
    terms = list(e.nest.terms)
    terms[n] = replace(terms[n], body=sympy.Tuple(*bodies))
    here = e.variant(terms=terms)
    order = here.term_order(n)
    plan = here.plan(n, [[], *([r] for r in order), [row]])
    e.temporaries = here.temporaries
    kind, name = here.index_type, here.printer.index(row)
    value = "tdsl_imin(o_r_ + l_, nt_last_)" if edge else "o_r_ + l_"
    folds = [
        f"acc{k}_[0][l_] += {here.printer.doprint(v)};" for k, v in enumerate(plan.value) if v != 0
    ]
    lane = [
        f"const {kind} {name} = {value};",
        *here.level_lines(plan, len(order) + 1, folds, simd=True),
    ]
    lines = ["#pragma omp simd", *_for("l_", here.schedule.lanes, lane)]
    for depth in reversed(range(len(order))):
        r = order[depth]
        lines = here.level_lines(plan, depth + 1, lines)
        lo, hi = here.idx(here.bounds[n].starts[r]), here.idx(here.bounds[n].stops[r])
        index = here.printer.index(r)
        lines = block_lines(f"for ({kind} {index} = {lo}; {index} < {hi}; ++{index})", lines)
    lines = here.level_lines(plan, 0, lines)
    stop = next(x for x in e.nest.free if x.index == row).stop
    last = [f"const {kind} nt_last_ = {e.idx(stop)} - 1;"] if edge else []
    return ["{", *indent_lines([*last, *lines]), "}"]


def _term_lines(
    e: Emitter[CpuGeometry],
    n: int,
    bodies: tuple[sympy.Expr, ...],
    accumulators: list[str],
    row: sympy.Symbol | None,
) -> Lines:
    """Term `n` of a tile: its reduced loops, the members' bodies planned together."""
    order = e.term_order(n)
    tiled = row is not None and e.schedule.rows > 1
    outer, inner = (order[:-1], order[-1]) if order else ((), None)
    staged: list[tuple[str, sympy.Indexed]] = []
    if inner is not None:
        fixed = {*outer, *(s for s in e.free_symbols()[:-1] if s != row)}
        bodies, staged = _stage(e, bodies, inner, fixed)
    terms = list(e.nest.terms)
    terms[n] = replace(terms[n], body=sympy.Tuple(*bodies))
    here = e.variant(terms=terms)
    levels = [[], *([r] for r in outer), [row] if tiled else [], [inner] if inner else []]
    plan = here.plan(n, levels)
    e.temporaries = here.temporaries
    used = [(a, v) for a, v in zip(accumulators, plan.value, strict=True) if v != 0]
    lanes_level, row_level = len(levels) - 1, len(levels) - 2
    kind, rows = here.index_type, e.schedule.rows

    def lane_lines(lane: str, at: Plan) -> Lines:
        """The lane level of `at`, its values folded into lane `lane` of the accumulators."""
        folds = [f"{a}[w_][{lane}] += {here.printer.doprint(v)};" for a, v in used]
        return here.level_lines(at, lanes_level, folds, simd=True)

    def rows_of(inner_lines: Lines) -> Lines:
        """`inner_lines` for each row of the tile (the row's statements first)."""
        if not tiled:
            return [
                "{",
                "const int64_t w_ = 0;",
                *here.level_lines(plan, row_level, inner_lines),
                "}",
            ]
        at_row = f"const {kind} {here.printer.index(row)} = tdsl_imin(o_r_ + w_, nt_last_);"
        body = [at_row, *here.level_lines(plan, row_level, inner_lines)]
        return [
            f"#pragma GCC unroll {rows}",
            *block_lines(f"for (int64_t w_ = 0; w_ < {rows}; ++w_)", body),
        ]

    if inner is None:
        lines = rows_of(lane_lines("0", plan))
    else:
        lines = _chunks(here, n, plan, inner, lanes_level, lane_lines, rows_of, staged)
    for depth in reversed(range(len(outer))):
        r = outer[depth]
        lines = here.level_lines(plan, depth + 1, lines)
        name = here.printer.index(r)
        lo, hi = here.idx(here.bounds[n].starts[r]), here.idx(here.bounds[n].stops[r])
        lines = block_lines(f"for ({kind} {name} = {lo}; {name} < {hi}; ++{name})", lines)
    lines = here.level_lines(plan, 0, lines)
    if tiled:
        r = next(x for x in e.nest.free if x.index == row)
        lines = [f"const {kind} nt_last_ = {e.idx(r.stop)} - 1;", *lines]
    return ["{", *indent_lines(lines), "}"]


#: Values of the innermost reduced index per chunk where function calls are buffered.
CHUNK_VECTORS = 4
#: Functions printed inline (selects, min/max), not calls.
_INLINE = (sympy.Piecewise, sympy.Min, sympy.Max, sympy.Abs, sympy.sign)


def _calls(expr: sympy.Basic) -> bool:
    """Whether `expr` calls a math function (a vector call clobbers every register)."""
    return any(not isinstance(f, _INLINE) for f in expr.atoms(sympy.Function))


def _chunks(here, n, plan, inner, level, lane_lines, rows_of, staged) -> Lines:
    """The innermost reduced loop of term `n` in chunks. Without calls or staged reads,
    chunks of `lanes` values, each row's bodies in one simd loop. Else chunks of
    `CHUNK_VECTORS * lanes`, the staged reads loaded first (`_stage`); with calls (an exp),
    first each row's calls into buffers `<t>b_[row][value]`, one simd loop with nothing else
    alive across the calls; then the accumulation (from the buffers), one simd loop per
    `lanes` values, accumulators in registers throughout (a vector call in the accumulating
    loop would spill every accumulator around each call)."""
    kind, lanes, rows = here.index_type, here.schedule.lanes, here.schedule.rows
    name = here.printer.index(inner)
    bounds = here.bounds[n]
    lo, hi = here.idx(bounds.starts[inner]), here.idx(bounds.stops[inner])
    head = [f"const {kind} lo_ = {lo}, hi_ = {hi};", f"{kind} c_ = lo_;"]
    calls = [st for st in plan.statements[level] if isinstance(st, Assign) and _calls(st.expr)]
    at = f"const {kind} {name} = c_ + q_;"
    if not calls and not staged:
        chunk = [f"const {kind} q_ = l_;", at, *lane_lines("l_", plan)]
        full = rows_of(["#pragma omp simd", *_for("l_", lanes, chunk)])
        rest = rows_of(_for("l_", "hi_ - c_", chunk))
        lines = [
            *head,
            *block_lines(f"for (; c_ + {lanes} <= hi_; c_ += {lanes})", full),
            *block_lines("if (c_ < hi_)", rest),
        ]
        return ["{", *indent_lines(lines), "}"]
    size = CHUNK_VECTORS * lanes
    buffers = {st.symbol: f"{st.symbol.name}b_" for st in calls}
    stores = [f"{b}[w_][q_] = {s.name};" for s, b in buffers.items()]
    fill = [at, *here.level_lines(plan, level, stores, simd=True)]
    read = [
        Assign(st.symbol, sympy.Dummy(f"{buffers[st.symbol]}[w_][q_]", real=True))
        if st.symbol in buffers
        else st
        for st in plan.statements[level]
    ]
    reading = plan.with_level(level, read)
    fold = [at, *lane_lines("l_", reading)]
    filled = [f"const {kind} q_ = l0_ + l_;", *fill]
    fills = _for("l0_", size, rows_of(["#pragma omp simd", *_for("l_", lanes, filled)]), lanes)
    full = [
        *(fills if calls else []),
        *_for(
            "l0_",
            size,
            rows_of(
                ["#pragma omp simd", *_for("l_", lanes, [f"const {kind} q_ = l0_ + l_;", *fold])]
            ),
            step=lanes,
        ),
    ]
    rest_fold = [f"const {kind} q_ = l_;", at, *lane_lines("0", reading)]
    rest = [
        *(rows_of(_for("l_", "hi_ - c_", [f"const {kind} q_ = l_;", *fill])) if calls else []),
        *rows_of(_for("l_", "hi_ - c_", rest_fold)),
    ]
    lines = [
        *head,
        *(f"{here.f} {b}[{rows}][{size}];" for b in buffers.values()),
        *(f"{here.f} {name}[{size}];" for name, _ in staged),
        *block_lines(
            f"for (; c_ + {size} <= hi_; c_ += {size})",
            [*_staging(here, inner, staged, size), *full],
        ),
        *block_lines("if (c_ < hi_)", [*_staging(here, inner, staged, "hi_ - c_"), *rest]),
    ]
    return ["{", *indent_lines(lines), "}"]


#: The chunk's first value of the innermost reduced index, `c_` in the generated code.
_CHUNK_START = sympy.Dummy("c_", integer=True)


def _stage(e, bodies, inner, fixed) -> tuple[tuple[sympy.Expr, ...], list]:
    """`bodies` with each strided access read by the chunk's values of `inner` (the Gaussian
    kernel's `X[i, 0]` with `i` in vector lanes: 8 scalar loads per vector) replaced by a
    read of a buffer filled once per chunk, `sg<k>_[i - c_]`, which every row of the tile and
    both passes read as one vector. Only accesses whose other indices are fixed in the chunk
    (`fixed`: outer loops) are staged. Returns the bodies and the staged `(buffer, access)`."""
    staged: dict[sympy.Indexed, sympy.Indexed] = {}
    names = []
    for access in sorted(sympy.Tuple(*bodies).atoms(sympy.Indexed), key=sympy.default_sort_key):
        reads = {s for x in access.indices for s in x.free_symbols if extent_of(s) is None}
        if inner not in reads or not reads <= {inner, *fixed}:
            continue
        if e.printer.tensors[access.base.name].integer:
            continue  # compared with indices as integers: read where it is
        *outer, last = access.indices
        if not any(inner in x.free_symbols for x in outer) and sympy.diff(last, inner) == 1:
            continue  # contiguous: read as a vector already
        name = f"sg{len(names)}_"
        key = f"tdsl staged {name}"
        e.printer.tensors[key] = TensorView(name, (None,), "{}")
        staged[access] = tensor_base(key)[inner - _CHUNK_START]
        names.append((name, access))
    return tuple(b.xreplace(staged) for b in bodies), names


def _staging(here, inner, staged, count) -> Lines:
    """The loop that fills the staged buffers for the chunk's `count` values."""
    if not staged:
        return []
    name = here.printer.index(inner)
    fills = [f"{buffer}[l_] = {here.printer.doprint(here.hoist(a))};" for buffer, a in staged]
    body = [f"const {here.index_type} {name} = c_ + l_;", *fills]
    return ["#pragma omp simd", *_for("l_", count, body)]


def _for(index: str, stop: object, body: Lines, step: int = 1) -> Lines:
    advance = f"++{index}" if step == 1 else f"{index} += {step}"
    return block_lines(f"for (int64_t {index} = 0; {index} < {stop}; {advance})", body)


def _offset(e: Emitter[CpuGeometry], position: int) -> str:
    """The output offset of the current free point's element of member `position` (the
    packed member axis is the output's last, contiguous axis)."""
    parts = []
    for r, stride in zip(e.nest.free[:-1], e.out_strides[:-1], strict=True):
        index = e.printer.index(r.index)
        start = e.hoist(r.start)
        term = index if start == 0 else f"({index} - {e.printer.index(start)})"
        parts.append(f"{term}*{stride}")
    return " + ".join([*parts, str(position)])
