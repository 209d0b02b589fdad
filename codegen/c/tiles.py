"""The tile and dot strategies of the C emitter: register tiles over two free indices.

See `codegen.c.schedule` for what the strategies are and `docs/architecture.md` for how tiles
treat the constraints of gradient nests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sympy

from codegen.c.row_dots import DOT_ROWS, batchable_sum, plain_reads, row_dot_lines, row_of
from codegen.c.schedule import Schedule
from codegen.c.strategies import omp_parallel
from codegen.emit.emitter import Emitter, Lines, block_lines, indent_lines
from codegen.emit.staging import Assign, Loop, Plan, Statement
from codegen.ir.affine import affine_parts
from codegen.ir.nest import Term, extent_of

CEmitter = Emitter[Schedule]


def _lanes(
    e: CEmitter,
    rn: str,
    wn: str,
    inner: Lines,
    simd: bool = True,
    plan: Plan | None = None,
    level: int = 0,
    around: tuple[Lines, Lines] = ([], []),
) -> Lines:
    """Loops over the register tile: rows (if any) outside, simd lanes inside. With a `plan`,
    the row loop's body starts with the plan's level `level` and the lane loop's with the
    next one (or the lane loop's with `level` when there is no row). `around` are lines of
    the lane loop before and after its level (outside that level's tests)."""
    s = e.schedule
    vector = sympy.Symbol(s.vector or "", integer=True)
    vec, vec0 = e.printer.index(vector), e.tile_name("o", vector)
    vector_level = level + 1 if s.row else level
    if plan is not None:
        inner = e.level_lines(plan, vector_level, inner, simd=simd)
    lane = [f"const int64_t {vec} = {vec0} + w_;", *around[0], *inner, *around[1]]
    lines = block_lines(f"for (int64_t w_ = 0; w_ < {wn}; ++w_)", lane)
    # Fully unrolled tile loops keep the accumulators in registers.
    lines = (["#pragma omp simd"] if simd else [f"#pragma GCC unroll {s.width}"]) + lines
    if s.row is None:
        return lines
    batched: Lines = []
    if plan is not None:
        plan, batched, sums = _batch_row_sums(e, plan, level, rn)
        plan, calls = _batch_row_calls(e, plan, level, rn, sums)
        batched += calls
        lines = e.level_lines(plan, level, lines)
    return batched + _row_loop(e, rn, lines)


def _declare_row(e: CEmitter) -> str:
    """The row index of the tile's row `r_`."""
    row_index = sympy.Symbol(e.schedule.row or "", integer=True)
    return f"const int64_t {e.printer.index(row_index)} = {e.tile_name('o', row_index)} + r_;"


def _row_loop(e: CEmitter, rn: str, body: Lines) -> Lines:
    """The tile's rows, unrolled, each binding its row index before `body`."""
    return [
        f"#pragma GCC unroll {e.schedule.rows}",
        *block_lines(f"for (int64_t r_ = 0; r_ < {rn}; ++r_)", [_declare_row(e), *body]),
    ]


def _batch_row_sums(
    e: CEmitter, plan: Plan, level: int, rn: str
) -> tuple[Plan, Lines, dict[sympy.Symbol, sympy.Expr]]:
    """The nested sums of the row level computed for all the tile's rows in one loop.

    A nested sum per row (attention's `sum_d Q[i, d]*K[j, d]` in a tile over `i`) is a chain
    of dependent additions; computing the rows' sums in the same loop gives `rows` independent
    chains, which the core overlaps. A sum is batched
    when nothing else of the row level feeds it; it is then read from `<t>a[r_]`. The rows'
    sums are computed outside the row level's tests, and the sums of masked rows go unused
    (which sums qualify: `batchable_sum`). A dot product of two contiguous float32 rows runs
    in vectors (`codegen.c.row_dots`). Also returns each batched sum's symbol with its array
    element.
    """
    statements = plan.statements[level]
    tested = bool(plan.tests[level])
    local = {st.symbol for st in statements}
    batched: Lines = []
    kept: list[Statement] = []
    ready: dict[sympy.Symbol, sympy.Expr] = {}
    for st in statements:
        if not isinstance(st, Loop) or not batchable_sum(st, local, tested):
            kept.append(st)
            continue
        state = f"{st.symbol.name}a"
        vector = None
        if e.schedule.rows == DOT_ROWS:
            vector = row_dot_lines(e, st, state, rn, e.schedule.row or "", _declare_row(e))
        batched += vector or _row_sums_in_scalars(e, st, state, rn)
        ready[st.symbol] = sympy.Dummy(f"{state}[r_]", real=True)
        kept.append(Assign(st.symbol, ready[st.symbol]))
    return (plan.with_level(level, kept) if batched else plan), batched, ready


def _row_sums_in_scalars(e: CEmitter, st: Loop, state: str, rn: str) -> Lines:
    """The sums of the tile's rows in one scalar accumulator each (`<state><r>`), then
    gathered into `<state>[r_]`. GCC vectorises a simd reduction into an array
    (`reduction(+:a[:4])`) through memory; into scalars it keeps the partial sums in
    registers (attention's dQ nest runs about twice as fast). In a partial tile the rows
    past the last compute the last row's sum again (`row_of`)."""
    rows = e.schedule.rows
    index = e.printer.index(st.index)
    lo, hi = e.printer.index(st.start), e.printer.index(st.stop)
    loop = f"for (int64_t {index} = {lo}; {index} < {hi}; ++{index})"
    inner = [_declare_row(e), *e.statement_lines(st.inner, True)]
    value = e.printer.doprint(st.value)
    names = [f"{state}{r}" for r in range(rows)]
    per_row = []
    for r, name in enumerate(names):
        body = [f"const int64_t r_ = {row_of(r, rn, rows)};", *inner, f"{name} += {value};"]
        per_row += ["{", *indent_lines(body), "}"]
    return [
        f"{e.f} {', '.join(f'{name} = 0' for name in names)};",
        f"#pragma omp simd reduction(+:{', '.join(names)})",
        *block_lines(loop, per_row),
        f"const {e.f} {state}[{rows}] = {{{', '.join(names)}}};",
    ]


def _batch_row_calls(
    e: CEmitter, plan: Plan, level: int, rn: str, sums: dict[sympy.Symbol, sympy.Expr]
) -> tuple[Plan, Lines]:
    """The function calls of the row level computed for all the tile's rows in one simd
    loop into `<t>r[r_]`, where they read nothing of that level but the batched `sums`.

    Attention's weights `exp(S[i, j] - L[i])` are one call per (row, j): unrolled over the
    rows they are scalar libm calls, in a simd loop one vector call (libmvec) for the rows
    (attention's weighted sum and its gradients at T=1024: about 5% faster). Under the row
    level's tests (a causal mask) only a call whose reads are plain accesses, in bounds for
    every row and every value of the loop indices: a test may guard a read (a gradient's
    `dY[p - k]`).
    """
    statements = plan.statements[level]
    tested = bool(plan.tests[level])
    local = {st.symbol for st in statements}
    ready = dict(sums)
    kept: list[Statement] = []
    lines: Lines = []
    for st in statements:
        if not isinstance(st, Assign) or st.symbol in ready:
            kept.append(st)
            continue
        calls = [f for f in st.expr.atoms(sympy.Function) if not isinstance(f, sympy.Piecewise)]
        local_reads = st.expr.free_symbols & local
        if not calls or not local_reads <= set(ready) or (tested and not plain_reads(st.expr)):
            kept.append(st)
            continue
        array = f"{st.symbol.name}r"
        value = e.printer.doprint(st.expr.xreplace(ready))
        lines += [
            f"{e.f} {array}[{e.schedule.rows}];",
            "#pragma omp simd",
            *block_lines(
                f"for (int64_t r_ = 0; r_ < {rn}; ++r_)",
                [_declare_row(e), f"{array}[r_] = {value};"],
            ),
        ]
        ready[st.symbol] = sympy.Dummy(f"{array}[r_]", real=True)
        kept.append(Assign(st.symbol, ready[st.symbol]))
    return (plan.with_level(level, kept) if lines else plan), lines


def _lane_levels(e: CEmitter) -> list[list[sympy.Symbol]]:
    """The levels of the tile's row (if any) and vector lanes."""
    s = e.schedule
    names = [s.row, s.vector] if s.row else [s.vector]
    return [[sympy.Symbol(name or "", integer=True)] for name in names]


TileBody = Callable[[CEmitter, str, str, Sequence[Sequence[sympy.Expr]]], Lines]


@dataclass(frozen=True)
class _TilePaths:
    """Interior tiles run `interior` unmasked; other tiles run `edge` with per-lane tests, or
    `reduced_edge` when only the constraints that bound a reduced loop fail (those on the
    tiled indices alone hold for the whole tile: a causal bound does not make every lane
    test an extent)."""

    condition: tuple[str, ...]  # C conditions (>= 0 tests) of an interior tile
    interior: CEmitter
    edge: CEmitter
    tests: tuple[tuple[sympy.Expr, ...], ...]  # per term, per-lane tests of the edge path
    #: Per tiled index: the interior conditions on that index's tile start alone (with a
    #: tile width of one), whose other symbols are extents.
    alone: dict[sympy.Symbol, tuple[sympy.Expr, ...]]
    free_condition: tuple[str, ...] = ()  # the conditions of constraints on free indices only
    reduced_edge: CEmitter | None = None
    reduced_tests: tuple[tuple[sympy.Expr, ...], ...] = ()


def _tile_paths(e: CEmitter) -> _TilePaths:
    """Split each term's constraints on the tiled indices into a tile test and lane tests.

    A constraint `c >= 0` that mentions a tiled index holds for a whole tile (and every
    value of the reduced indices in their ranges) when it holds at the box's worst corner
    (it is affine), so interior tiles drop it. Other tiles loop over the bounds of the
    constraint at its best corner (a superset) and test the constraint per lane. Corners
    use the tile's actual width (`rn_`, `wn_`), so a narrow tile can be interior too.
    """
    s = e.schedule
    sizes: dict[str | None, int] = {s.vector: s.width, **({s.row: s.rows} if s.row else {})}
    tiled = {x: sizes[x.name] for x in e.nest.free_indices if x.name in sizes}
    starts, widths = {}, {}
    for x in tiled:
        starts[x] = e.tile_symbol("o", x)
        widths[x] = sympy.Dummy("rn_" if x.name == s.row else "wn_", integer=True, positive=True)
    condition: list[str] = []
    free_condition: list[str] = []
    alone: dict[sympy.Symbol, list[sympy.Expr]] = {x: [] for x in tiled}
    inner: list[Term] = []
    edge: list[Term] = []
    reduced_edge: list[Term] = []
    tests: list[tuple[sympy.Expr, ...]] = []
    reduced_tests: list[tuple[sympy.Expr, ...]] = []
    edge_origin: list[int] = []  # the term of `e` each term of `edge` comes from
    reduced_origin: list[int] = []
    # Only a sum (or a one-pass nest) holds several terms (`LoopNest`): a max, min or prod
    # with a one-sided mask keeps its edge tiles tested per lane, unsplit.
    split = e.nest.reduction == "sum" or bool(e.nest.online)
    for n, term in enumerate(e.nest.terms):
        kept, relaxed, lane, relaxed_reduced, lane_reduced = [], [], [], [], []
        for c in term.constraints:
            coefficients = affine_parts(c, tuple(tiled))
            if not coefficients:
                kept.append(c)
                continue
            worst = {
                x: starts[x] + (0 if a > 0 else widths[x] - 1) for x, a in coefficients.items()
            }
            best = {x: starts[x] + (tiled[x] - 1 if a > 0 else 0) for x, a in coefficients.items()}
            for r in term.reduced:
                a = affine_parts(c, (r.index,)).get(r.index, 0)
                if a:
                    worst[r.index] = r.start if a > 0 else r.stop - 1
            test = sympy.expand(c.xreplace(worst))
            condition.append(f"{e.idx(test)} >= 0")
            if c.free_symbols & set(term.reduced_indices):
                relaxed_reduced.append(sympy.expand(c.xreplace(best)))
                lane_reduced.append(c)
            else:
                free_condition.append(condition[-1])
            x = next(iter(coefficients)) if len(coefficients) == 1 else None
            if x is not None and all(
                extent_of(y) is not None for y in test.free_symbols - {starts[x], widths[x]}
            ):
                alone[x].append(test.xreplace({widths[x]: 1}))
            relaxed.append(sympy.expand(c.xreplace(best)))
            lane.append(c)
        inner.append(dataclasses.replace(term, constraints=tuple(kept)))
        for terms, term_tests, origin, relaxed_here, lane_here in (
            (edge, tests, edge_origin, relaxed, lane),
            (reduced_edge, reduced_tests, reduced_origin, relaxed_reduced, lane_reduced),
        ):
            parts = _tested_parts(term, kept, relaxed_here, lane_here, tiled, starts, split)
            terms += [part for part, _ in parts]
            term_tests += [lanes for _, lanes in parts]
            origin += [n] * len(parts)
    found = {x: tuple(found) for x, found in alone.items()}
    if not condition:
        return _TilePaths((), e, e, tuple(() for _ in e.nest.terms), found)
    edge_e = _split_variant(e, edge, edge_origin)
    paths = _TilePaths(tuple(condition), e.variant(inner), edge_e, tuple(tests), found)
    if not free_condition or len(free_condition) == len(condition):
        return paths
    return dataclasses.replace(
        paths,
        free_condition=tuple(free_condition),
        reduced_edge=_split_variant(e, reduced_edge, reduced_origin),
        reduced_tests=tuple(reduced_tests),
    )


def _split_variant(e: CEmitter, terms: list[Term], origin: list[int]) -> CEmitter:
    """`e` with `terms`, term `k` a part of `e`'s term `origin[k]` (same loop order)."""
    order = tuple(e.schedule.reduced_order[n] for n in origin)
    return e.variant(terms, dataclasses.replace(e.schedule, reduced_order=order))


def _tested_parts(
    term: Term,
    kept: list[sympy.Expr],
    relaxed: list[sympy.Expr],
    lane: list[sympy.Expr],
    tiled: dict[sympy.Symbol, int],
    starts: dict[sympy.Symbol, sympy.Symbol],
    split: bool = True,
) -> list[tuple[Term, tuple[sympy.Expr, ...]]]:
    """`term` in a tile whose lanes test `lane` (with the loops bounded by `relaxed`), as
    terms with their lane tests. A single lane constraint that bounds a reduced loop (a
    causal mask, `j <= i`) splits the loop: where it holds at the tile's worst corner, for
    every row and lane of a full tile, the loop runs untested; the rest is tested per lane.
    A causal tile then tests its last `rows` values of j rather than all of them."""
    tested = dataclasses.replace(term, constraints=(*kept, *relaxed))
    if not split or len(lane) != 1 or not lane[0].free_symbols & set(term.reduced_indices):
        return [(tested, tuple(lane))]
    (c,) = lane
    coefficients = affine_parts(c, tuple(tiled))
    worst = {x: starts[x] + (0 if a > 0 else tiled[x] - 1) for x, a in coefficients.items()}
    holds = sympy.expand(c.xreplace(worst))
    untested = dataclasses.replace(term, constraints=(*kept, holds))
    rest = dataclasses.replace(term, constraints=(*kept, *relaxed, -holds - 1))
    return [(untested, ()), (rest, (c,))]


TILE_HELPERS = """\
/* Tiles of S along [s, z) with the interior part [a, e) (s <= a <= e <= z) tiled from a:
 * chunks of at most S in [s, a), in [a, e) and in [e, z). */
static inline int64_t tdsl_tiles(int64_t s, int64_t a, int64_t e, int64_t z, int64_t S) {
    return (a - s + S - 1) / S + (e - a + S - 1) / S + (z - e + S - 1) / S;
}
static inline int64_t tdsl_tile(int64_t t, int64_t s, int64_t a, int64_t e, int64_t z,
                                int64_t S, int64_t *n) {
    const int64_t na = (a - s + S - 1) / S, ni = (e - a + S - 1) / S;
    const int64_t x0 = t < na ? s + t * S : t < na + ni ? a + (t - na) * S : e + (t - na - ni) * S;
    *n = tdsl_imin(S, (t < na ? a : t < na + ni ? e : z) - x0);
    return x0;
}"""


def _interior_range(
    e: CEmitter, x: sympy.Symbol, conditions: Sequence[sympy.Expr]
) -> tuple[str, str]:
    """C expressions of `[a, e)`: the tile starts `x0` of one-wide tiles that satisfy every
    condition (each `c(x0) >= 0`, affine in `x0`)."""
    x0 = e.tile_symbol("o", x)
    lows, highs = [], []
    for c in conditions:
        a = affine_parts(c, (x0,))[x0]
        rest = e.idx(sympy.expand(c - a * x0))
        if a > 0:
            lows.append(f"tdsl_ceildiv(-({rest}), {a})")
        else:
            highs.append(f"tdsl_floordiv({rest}, {-a}) + 1")
    low, high = (lows or [""])[0], (highs or [""])[0]
    for more in lows[1:]:
        low = f"tdsl_imax({low}, {more})"
    for more in highs[1:]:
        high = f"tdsl_imin({high}, {more})"
    return low, high


def _tiled(e: CEmitter, body: TileBody) -> Lines:
    """Tile loops over the row and vector indices.

    Along each tiled index the tiles start where the interior conditions on that index alone
    begin to hold, so every tile in between is interior and only the tiles at the ends need
    per-lane tests (a convolution's input gradient: its first and last `K - 1` columns).
    Full interior tiles get constant trip counts and no per-lane tests.
    """
    s = e.schedule
    free = e.free_symbols()
    paths = _tile_paths(e)
    grid, tile, full = [], [], []
    for x in (x for x in free if x.name in (s.row, s.vector)):
        size, width = (s.rows, "rn_") if x.name == s.row else (s.width, "wn_")
        first, last, count, number, origin = (
            e.tile_name(role, x) for role in ("ta", "te", "nt", "ti", "o")
        )
        r = next(r for r in e.nest.free if r.index == x)
        lo, hi = e.idx(r.start), e.idx(r.stop)
        low, high = _interior_range(e, x, paths.alone[x])
        a = f"tdsl_imin(tdsl_imax({low}, {lo}), {hi})" if low else lo
        end = f"tdsl_imin(tdsl_imax({high}, {first}), {hi})" if high else hi
        grid += [
            f"const int64_t {first} = {a};",
            f"const int64_t {last} = {end};",
            f"const int64_t {count} = tdsl_tiles({lo}, {first}, {last}, {hi}, {size});",
        ]
        tile += [
            f"int64_t {width};",
            f"const int64_t {origin} = "
            f"tdsl_tile({number}, {lo}, {first}, {last}, {hi}, {size}, &{width});",
        ]
        full.append(f"{width} == {size}")
    check = " && ".join(full)
    none = tuple(() for _ in e.nest.terms)
    interior = _either(
        check,
        body(paths.interior, str(s.rows), str(s.width), none),
        body(paths.interior, "rn_", "wn_", none),
    )
    if paths.condition:
        masked = body(paths.edge, str(s.rows), str(s.width), paths.tests)
        edge = _either(check, masked, body(paths.edge, "rn_", "wn_", paths.tests))
        if paths.reduced_edge is not None:
            full = body(paths.reduced_edge, str(s.rows), str(s.width), paths.reduced_tests)
            part = body(paths.reduced_edge, "rn_", "wn_", paths.reduced_tests)
            edge = _either(" && ".join(paths.free_condition), _either(check, full, part), edge)
        interior = _either(" && ".join(paths.condition), interior, edge)
    lines = [*tile, *interior]
    for x in reversed(free):
        if x.name in (s.row, s.vector):
            number, count = e.tile_name("ti", x), e.tile_name("nt", x)
            lines = block_lines(
                f"for (int64_t {number} = 0; {number} < {count}; ++{number})", lines
            )
        else:
            lines = block_lines(e.free_loop(x), lines)
    return grid + omp_parallel(e, len(free)) + lines


def _either(check: str, yes: Lines, no: Lines) -> Lines:
    return [f"if ({check}) {{", *indent_lines(yes), "} else {", *indent_lines(no), "}"]


def tile(e: CEmitter) -> Lines:
    dims = f"[{e.schedule.rows}][{e.schedule.width}]" if e.schedule.row else f"[{e.schedule.width}]"
    sub = "[r_][w_]" if e.schedule.row else "[w_]"
    lanes = _lane_levels(e)

    def body(p: CEmitter, rn: str, wn: str, tests: Sequence[Sequence[sympy.Expr]]) -> Lines:
        if not any(t.reduced for t in p.nest.terms):
            return _elementwise(p, rn, wn, tests)
        lines = [*p.declare(dims=dims), *_lanes(p, rn, wn, p.init(sub))]
        for n in range(len(p.nest.terms)):
            levels = [[], *p.reduced_levels(n), *lanes]
            plan = p.plan(n, levels, tests[n])
            first_lane = len(levels) - len(lanes)
            lane = _lanes(p, rn, wn, p.fold_lines(n, plan, sub), plan=plan, level=first_lane)
            loops = p.loops(n, lane, plan=plan)
            lines += ["{", *indent_lines(p.level_lines(plan, 0, loops)), "}"]
        return lines + _lanes(p, rn, wn, [p.store_line(sub)])

    return _tiled(e, body)


def _elementwise(p: CEmitter, rn: str, wn: str, tests: Sequence[Sequence[sympy.Expr]]) -> Lines:
    """Each lane computes and stores its element (no accumulator tile). One term's row-only
    sub-expressions are computed once per row, unless a test outside the lane guards them
    (every lane must still store its element); several terms are evaluated per lane."""
    lanes = _lane_levels(p)
    if len(p.nest.terms) == 1:
        plan = p.plan(0, [[], *lanes], tests[0])
        if not any(plan.tests[:-1]):
            around = ([*p.declare()], [p.store_line()])
            lines = _lanes(p, rn, wn, p.fold_lines(0, plan, ""), plan=plan, level=1, around=around)
            return p.level_lines(plan, 0, lines)
    lane = [*p.declare()]
    for n in range(len(p.nest.terms)):
        plan = p.plan(n, [[sym for level in lanes for sym in level]], tests[n])
        lane += ["{", *indent_lines(p.level_lines(plan, 0, p.fold_lines(n, plan, ""))), "}"]
    return _lanes(p, rn, wn, [*lane, p.store_line()])


def _lanes_inside(
    p: CEmitter,
    n: int,
    outer: list[list[sympy.Symbol]],
    rn: str,
    wn: str,
    tests: Sequence[sympy.Expr],
    sub: str,
) -> tuple[Plan, Lines]:
    """The dot strategy's lanes over `u` innermost: rows, then columns, then `u`'s lanes."""
    order = p.term_order(n)
    u, u0 = p.printer.index(order[-1]), p.tile_name("o", order[-1])
    tile_levels = _lane_levels(p)
    plan = p.plan(n, [*outer, *tile_levels, [order[-1]]], tests)
    level = len(outer) + len(tile_levels)
    lane = [
        f"const int64_t {u} = {u0} + l_;",
        *p.level_lines(plan, level, p.fold_lines(n, plan, sub + "[l_]"), simd=True),
    ]
    loop = f"for (int64_t l_ = 0; l_ < {p.schedule.lanes}; ++l_)"
    vector = ["#pragma omp simd", *block_lines(loop, lane)]
    return plan, _lanes(p, rn, wn, vector, simd=False, plan=plan, level=len(outer))


def _lane_major(
    p: CEmitter,
    n: int,
    outer: list[list[sympy.Symbol]],
    rn: str,
    wn: str,
    tests: Sequence[sympy.Expr],
    sub: str,
) -> tuple[Plan, Lines] | None:
    """The dot strategy's lanes when a function call depends on a row and `u` but not on the
    column index: per row, one simd loop over `u`'s lanes computes what does not read the
    column into lane arrays, then each column's simd loop reads them, so the call runs once
    per (row, lane) for all the columns instead of once per column (the Gaussian kernel's
    `dX[i, p]`: one `exp` per (i, j) for the three coordinates p). None when no such call
    exists."""
    s = p.schedule
    order = p.term_order(n)
    u, u0 = p.printer.index(order[-1]), p.tile_name("o", order[-1])
    row_level = [[sympy.Symbol(s.row, integer=True)]] if s.row else []
    column = sympy.Symbol(s.vector or "", integer=True)
    numbered = p.temporaries
    plan = p.plan(n, [*outer, *row_level, [order[-1]], [column]], tests)
    lane_level = len(outer) + len(row_level)
    shared = plan.statements[lane_level]
    if not any(isinstance(st, Assign) and st.expr.has(sympy.Function) for st in shared):
        p.temporaries = numbered  # the other form numbers its temporaries alike
        return None
    names = [st.symbol.name for st in shared]
    lane = f"const int64_t {u} = {u0} + l_;"
    loop = f"for (int64_t l_ = 0; l_ < {s.lanes}; ++l_)"
    stores = [f"{name}lane[l_] = {name};" for name in names]  # `<t>a` is a nested state
    first = [lane, *p.level_lines(plan, lane_level, stores, simd=True)]
    reloads = [f"const {p.f} {name} = {name}lane[l_];" for name in names]
    inner = [*reloads, *p.level_lines(plan, lane_level + 1, p.fold_lines(n, plan, sub + "[l_]"))]
    conditions = plan.tests[lane_level]
    if conditions:
        inner = block_lines(f"if ({' && '.join(p.printer.doprint(t) for t in conditions)})", inner)
    vec, vec0 = p.printer.index(column), p.tile_name("o", column)
    column_body = [
        f"const int64_t {vec} = {vec0} + w_;",
        "#pragma omp simd",
        *block_lines(loop, [lane, *inner]),
    ]
    lines = [
        *(f"{p.f} {name}lane[{s.lanes}];" for name in names),
        "#pragma omp simd",
        *block_lines(loop, first),
        f"#pragma GCC unroll {s.width}",
        *block_lines(f"for (int64_t w_ = 0; w_ < {wn}; ++w_)", column_body),
    ]
    if s.row:
        lines = _row_loop(p, rn, p.level_lines(plan, len(outer), lines))
    return plan, lines


def dot(e: CEmitter) -> Lines:
    s = e.schedule
    lanes = s.lanes
    dims = f"[{s.rows}][{s.width}][{lanes}]" if s.row else f"[{s.width}][{lanes}]"
    sub = "[r_][w_]" if s.row else "[w_]"
    tile_levels = _lane_levels(e)

    def body(p: CEmitter, rn: str, wn: str, tests: Sequence[Sequence[sympy.Expr]]) -> Lines:
        init = block_lines(f"for (int64_t l_ = 0; l_ < {lanes}; ++l_)", p.init(sub + "[l_]"))
        lines = [*p.declare(dims=dims), *_lanes(p, rn, wn, init, simd=False)]
        for n in range(len(p.nest.terms)):
            order = p.term_order(n)
            u, u0 = p.printer.index(order[-1]), p.tile_name("o", order[-1])
            lo, hi = p.idx(p.bounds[n].starts[order[-1]]), p.idx(p.bounds[n].stops[order[-1]])
            outer = [[], *p.reduced_levels(n, len(order) - 1)]
            # The vector part: dot-product lanes over the innermost reduced index u.
            plan, vector = _lane_major(p, n, outer, rn, wn, tests[n], sub) or _lanes_inside(
                p, n, outer, rn, wn, tests[n], sub
            )
            # The rest of u, one value at a time.
            rest_plan = p.plan(n, [*outer, [order[-1]], *tile_levels], tests[n])
            rest_lanes = _lanes(
                p,
                rn,
                wn,
                p.fold_lines(n, rest_plan, sub + "[0]"),
                simd=False,
                plan=rest_plan,
                level=len(outer) + 1,
            )
            rest = block_lines(
                f"for (int64_t {u} = {u0}; {u} < {hi}; ++{u})",
                p.level_lines(rest_plan, len(outer), rest_lanes),
            )
            inner = [
                f"int64_t {u0} = {lo};",
                *block_lines(f"for (; {u0} + {lanes} <= {hi}; {u0} += {lanes})", vector),
                *rest,
            ]
            plans = [plan, rest_plan]
            loops = p.loops(n, ["{", *indent_lines(inner), "}"], stop_at=len(order) - 1, plan=plans)
            lines += ["{", *indent_lines(p.level_lines(plans, 0, loops)), "}"]
        combine = p.fmt(p.reducer.combine, p.names("tot_"), p.names("acc_", sub + "[l_]"))
        store = [
            *p.declare("tot_"),
            *block_lines(f"for (int64_t l_ = 0; l_ < {lanes}; ++l_)", [combine]),
            p.store_line(base="tot_"),
        ]
        return lines + _lanes(p, rn, wn, store, simd=False)

    return _tiled(e, body)
