"""The tile strategy of the C emitter: register tiles over two free indices (the dot strategy,
`codegen.c.tiles.dot`, shares their lanes and their grid).

See `codegen.c.schedule` for what the strategies are and `docs/architecture.md` for how tiles
treat the constraints of gradient nests.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import sympy

from codegen.c.reductions.simple import parallel_loop, scalar
from codegen.c.tiles.lanes import CEmitter, lane_levels, lane_loops
from codegen.c.tiles.outline import outlined_call
from codegen.c.tiles.padding import LaneMasks, inside_masks, lane_masks, prepare_lines
from codegen.c.tiles.prefetch import slice_prefetch_lines
from codegen.c.tiles.unswitch import row_condition, unswitched
from codegen.emit.emitter import Lines, block_lines, indent_lines
from codegen.ir.affine import affine_parts
from codegen.ir.nest import Term, extent_of

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
    #: The conditions of the constraints that do not mention the vector index, and the terms
    #: of a tile where those hold, tested on the vector index alone (`lane_edge`).
    row_condition: tuple[str, ...] = ()
    lane_edge: CEmitter | None = None
    lane_tests: tuple[tuple[sympy.Expr, ...], ...] = ()


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
    row_condition: list[str] = []
    alone: dict[sympy.Symbol, list[sympy.Expr]] = {x: [] for x in tiled}
    inner: list[Term] = []
    edge: list[Term] = []
    reduced_edge: list[Term] = []
    lane_edge: list[Term] = []
    tests: list[tuple[sympy.Expr, ...]] = []
    reduced_tests: list[tuple[sympy.Expr, ...]] = []
    lane_tests: list[tuple[sympy.Expr, ...]] = []
    edge_origin: list[int] = []  # the term of `e` each term of `edge` comes from
    reduced_origin: list[int] = []
    lane_origin: list[int] = []
    # Only a sum (or a one-pass nest) holds several terms (`LoopNest`): a max, min or prod
    # with a one-sided mask keeps its edge tiles tested per lane, unsplit.
    split = e.nest.reduction == "sum" or bool(e.nest.online)
    for n, term in enumerate(e.nest.terms):
        kept, relaxed, lane, relaxed_reduced, lane_reduced = [], [], [], [], []
        relaxed_vector, lane_vector = [], []
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
            if any(x.name == s.vector for x in coefficients):
                relaxed_vector.append(sympy.expand(c.xreplace(best)))
                lane_vector.append(c)
            else:
                row_condition.append(condition[-1])
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
            (lane_edge, lane_tests, lane_origin, relaxed_vector, lane_vector),
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
    if row_condition and len(row_condition) < len(condition):
        paths = dataclasses.replace(
            paths,
            row_condition=tuple(row_condition),
            lane_edge=_split_variant(e, lane_edge, lane_origin),
            lane_tests=tuple(lane_tests),
        )
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


def vector_extent(e: CEmitter) -> str:
    """C expression of the vector index's extent: where it is shorter than the tile, a
    narrower tile (`CpuGeometry.small`) takes over."""
    s = e.schedule
    r = next(r for r in e.nest.free if r.index.name == s.vector)
    return e.idx(sympy.expand(r.stop - r.start))


def tiled(
    e: CEmitter,
    body: TileBody,
    span: tuple[str, str, str] | None = None,
    prepared: bool = False,
    per_tile: Callable[[], Lines] | None = None,
) -> Lines:
    """Tile loops over the row and vector indices.

    Along each tiled index the tiles start where the interior conditions on that index alone
    begin to hold, so every tile in between is interior and only the tiles at the ends need
    per-lane tests (a convolution's input gradient: its first and last `K - 1` columns).
    Full interior tiles get constant trip counts and no per-lane tests. A vector axis whose
    interior is shorter than a tile runs whole tiles over its extent, tested per lane.
    `span` (C expressions `first, end, stored`): the vector tiles cover `[first, end)` only
    and store lanes from `stored` on (`codegen.c.emit`: the rest of a wide tile's axis).
    `prepared`: the caller allocated the padded copies and masks (`shared_masks`).
    `per_tile`: makes the lines each tile runs before its own (called last, so that
    the parameters it hoists come after the loops') (`codegen.c.tiles.prefetch`).
    """
    s = e.schedule
    free = e.free_symbols()
    paths = _tile_paths(e)
    vector = sympy.Symbol(s.vector or "", integer=True)
    masks = lane_masks(paths.edge, paths.tests, vector) if paths.condition else None
    edge_e, edge_tests = (masks.emitter, masks.tests) if masks else (paths.edge, paths.tests)
    inside = inside_masks(paths.lane_edge, paths.lane_tests, masks, vector)
    grid, tile, full = [], [], []
    # the int64 variables the grid's and the tiles' lines declare, as they are written: an
    # outlined case takes those it reads (`codegen.c.tiles.outline`)
    grid_names: list[str] = []
    tile_names: list[str] = []
    # An elementwise tile stores in its inner loop: a tile moved back (`tdsl_tile`'s skip)
    # takes the general path, so that whole tiles store every lane untested (a test there
    # is a masked store per vector, about 2x the time of softmax's P).
    elementwise = not any(t.reduced for t in e.nest.terms)
    for x in (x for x in free if x.name in (s.row, s.vector)):
        size, width = (s.rows, "rn_") if x.name == s.row else (s.width, "wn_")
        first, last, count, number, origin = (
            e.tile_name(role, x) for role in ("ta", "te", "nt", "ti", "o")
        )
        r = next(r for r in e.nest.free if r.index == x)
        lo, hi = e.idx(r.start), e.idx(r.stop)
        if span is not None and x.name == s.vector:
            lo, hi = span[:2]
        low, high = _interior_range(e, x, paths.alone[x])
        a = f"tdsl_imin(tdsl_imax({low}, {lo}), {hi})" if low else lo
        if x.name == s.vector and masks is not None:
            # Masked edge tiles cost about what interior ones do: whole tiles over the
            # extent, none of them partial (a partial one keeps its accumulators in memory).
            grid += [f"const int64_t {first} = {lo};", f"const int64_t {last} = {hi};"]
            grid_names += [first, last]
        elif x.name == s.vector and (low or high):
            # An interior shorter than a tile: whole tiles over the extent, tested where
            # they cross an edge (narrow tiles would keep their accumulators in memory).
            a0, e0 = f"{first}0_", f"{last}0_"
            end = f"tdsl_imin(tdsl_imax({high}, {a0}), {hi})" if high else hi
            grid += [
                f"const int64_t {a0} = {a};",
                f"const int64_t {e0} = {end};",
                f"const int64_t {first} = {e0} - {a0} >= {size} ? {a0} : {lo};",
                f"const int64_t {last} = {e0} - {a0} >= {size} ? {e0} : {hi};",
            ]
            grid_names += [a0, e0, first, last]
        else:
            end = f"tdsl_imin(tdsl_imax({high}, {first}), {hi})" if high else hi
            grid += [f"const int64_t {first} = {a};", f"const int64_t {last} = {end};"]
            grid_names += [first, last]
        grid += [
            f"const int64_t {count} = tdsl_tiles({lo}, {first}, {last}, {hi}, {size});",
        ]
        grid_names.append(count)
        skip = "sk_" if x.name == s.vector else "skr_"
        tile += [
            f"int64_t {width};",
            f"int64_t {skip};",
            f"const int64_t {origin} = "
            f"tdsl_tile({number}, {lo}, {first}, {last}, {hi}, {size}, &{width}, &{skip});",
        ]
        tile_names += [width, skip, origin]
        if span is not None and x.name == s.vector and span[2] != lo:
            tile.append(f"{skip} = tdsl_imax({skip}, {span[2]} - {origin});")
        full += [f"{width} == {size}", f"{skip} == 0"] if elementwise else [f"{width} == {size}"]
    check = " && ".join(full)
    none = tuple(() for _ in e.nest.terms)
    loops = [e.printer.index(x) for x in free if x.name not in (s.row, s.vector)]
    names = [(n, "const int64_t") for n in (*grid_names, *tile_names, *loops)]
    made = prepare_lines(e, masks) if masks is not None else None
    if made is not None:  # the padded copies and masks, made before the loops
        names += made.declared

    def case(p: CEmitter, rn: str, wn: str, tests: Sequence[Sequence[sympy.Expr]]) -> Lines:
        return outlined_call(p, body(p, rn, wn, tests), names)

    interior = _either(
        check,
        case(paths.interior, str(s.rows), str(s.width), none),
        case(paths.interior, "rn_", "wn_", none),
    )
    if paths.condition:
        masked = case(edge_e, str(s.rows), str(s.width), edge_tests)
        edge = _either(check, masked, case(edge_e, "rn_", "wn_", edge_tests))
        if paths.reduced_edge is not None:
            full = case(paths.reduced_edge, str(s.rows), str(s.width), paths.reduced_tests)
            part = case(paths.reduced_edge, "rn_", "wn_", paths.reduced_tests)
            edge = _either(" && ".join(paths.free_condition), _either(check, full, part), edge)
        if inside is not None:
            masked = case(inside.emitter, str(s.rows), str(s.width), inside.tests)
            edge = _either(" && ".join((*paths.row_condition, check)), masked, edge)
        interior = _either(" && ".join(paths.condition), interior, edge)
    lines = [*tile, *(per_tile() if per_tile else []), *interior]
    for x in reversed(free):
        if x.name in (s.row, s.vector):
            number, count = e.tile_name("ti", x), e.tile_name("nt", x)
            lines = block_lines(
                f"for (int64_t {number} = 0; {number} < {count}; ++{number})", lines
            )
        else:
            lines = block_lines(e.free_loop(x), lines)
    lines = grid + parallel_loop(e, len(free), lines)
    if made is None or prepared:
        return lines
    # Shifted reads padded, their lane tests a mask (`codegen.c.tiles.padding`); where the copies
    # cannot be allocated, the scalar strategy.
    return [*made.lines, *_either(made.allocated, lines, scalar(e)), *made.freed]


def _either(check: str, yes: Lines, no: Lines) -> Lines:
    return [f"if ({check}) {{", *indent_lines(yes), "} else {", *indent_lines(no), "}"]


def shared_masks(wide: CEmitter, narrow: CEmitter) -> LaneMasks | None:
    """The lane masks of two tile schedules over the same indices, where both tile
    strategies would prepare the same padded copies (then prepared once for both)."""
    found = []
    for e in (wide, narrow):
        paths = _tile_paths(e)
        vector = sympy.Symbol(e.schedule.vector or "", integer=True)
        found.append(lane_masks(paths.edge, paths.tests, vector) if paths.condition else None)
    if found[0] is None or found[1] is None or found[0].terms != found[1].terms:
        return None
    return found[0]


def tile(e: CEmitter, span: tuple[str, str, str] | None = None, prepared: bool = False) -> Lines:
    dims = f"[{e.schedule.rows}][{e.schedule.width}]" if e.schedule.row else f"[{e.schedule.width}]"
    sub = "[r_][w_]" if e.schedule.row else "[w_]"
    lanes = lane_levels(e)

    def body(p: CEmitter, rn: str, wn: str, tests: Sequence[Sequence[sympy.Expr]]) -> Lines:
        if not any(t.reduced for t in p.nest.terms):
            return _elementwise(p, rn, wn, tests)
        lines = [*p.declare(dims=dims), *lane_loops(p, rn, wn, p.init(sub))]
        for n in range(len(p.nest.terms)):
            levels = [[], *p.reduced_levels(n), *lanes]
            plan = p.plan(n, levels, tests[n])
            first_lane = len(levels) - len(lanes)
            vector_level = len(levels) - 1
            fold = p.selected_fold_lines(plan, vector_level, sub)
            selected = fold is not None
            fold = fold if fold is not None else p.fold_lines(n, plan, sub)
            lane = lane_loops(p, rn, wn, fold, plan=plan, level=first_lane, selected=selected)
            loops = p.loops(n, lane, plan=plan)
            lines += ["{", *indent_lines(p.level_lines(plan, 0, loops)), "}"]
        return lines + lane_loops(p, rn, wn, stored(p, [p.store_line(sub)]))

    return tiled(e, body, span, prepared, per_tile=lambda: slice_prefetch_lines(e))


def stored(e: CEmitter, lines: Lines, *, whole: bool = False) -> Lines:
    """A lane's stores, but for the first `skr_` rows and `sk_` lanes of a tile moved back to
    end where its part of the axis ends (`tdsl_tile`): the tile before it stores those.
    `whole`: a tile that skips nothing (an elementwise tile's constant path), untested."""
    if whole:
        return lines
    return block_lines(
        "if (w_ >= sk_ && r_ >= skr_)" if e.schedule.row else "if (w_ >= sk_)", lines
    )


def _elementwise(p: CEmitter, rn: str, wn: str, tests: Sequence[Sequence[sympy.Expr]]) -> Lines:
    """Each lane computes and stores its element (no accumulator tile). One term's row-only
    sub-expressions are computed once per row, unless a test outside the lane guards them
    (every lane must still store its element); several terms are evaluated per lane."""
    lanes = lane_levels(p)
    whole = wn != "wn_"  # the constant path: `tiled` sends it no tile that skips lanes
    if len(p.nest.terms) == 1:
        plan = p.plan(0, [[], *lanes], tests[0], hoist_conditions=True)  # staging.selection
        if not any(plan.tests[:-1]):
            around = ([*p.declare()], stored(p, [p.store_line()], whole=whole))
            switched = row_condition(plan, len(lanes))
            if switched is not None:
                return p.level_lines(plan, 0, unswitched(p, rn, wn, plan, switched, around))
            lines = lane_loops(
                p, rn, wn, p.fold_lines(0, plan, ""), plan=plan, level=1, around=around
            )
            return p.level_lines(plan, 0, lines)
    lane = [*p.declare()]
    for n in range(len(p.nest.terms)):
        # The row's and the outer levels' values are named and computed before the lane's,
        # inside the lane loop (the compiler hoists them): a row-only read left inside a
        # `where` arm would be a masked load of one address, which GCC does not vectorise.
        plan = p.plan(n, [[], *lanes], tests[n])
        lines = p.fold_lines(n, plan, "")
        for level in reversed(range(len(plan.statements))):
            lines = p.level_lines(plan, level, lines)
        lane += ["{", *indent_lines(lines), "}"]
    return lane_loops(p, rn, wn, [*lane, *stored(p, [p.store_line()], whole=whole)])
