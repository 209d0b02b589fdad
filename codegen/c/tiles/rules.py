"""When the register-tile strategies apply (tile, dot, unroll), what they check and their words.

Each record of `codegen.c.strategies` names its rule here: `*_applies(nest, shapes, dtypes,
ask)` returns the strategy's schedule of the nest (`ask.base` replaced) or None, where it
does not fit; `*_validate` raises ValueError where a schedule does not fit; `*_header` and
`*_words` are its words for the header comment and for `explain`.

The tile rule (step 3 of `codegen.c.schedule`'s heuristic): the output's last free index `v`
is vectorised when every access that uses it has it in its last axis; the register tile's
rows are the previous free index, or the one fewest reads along the reduced loops use
(`shared_row_last`; 6 x 32 float lanes). A window offset `v` (it shares an access axis with
a reduced index) carries a `small` schedule taken at run time when `v`'s extent is below the
tile width: a tile one vector wide, itself with a `small` dot schedule over two other free
indices. Costly work per row that does not read `v` (a function call, a nested reduction; in
an elementwise nest too) gets wider tiles, and below the tile width dot products where no
access reads `v`, a plain tile in an elementwise nest, else a tile half as wide. A dot tile
has rows only where some read does not read the row index (`shares_rows`): that read serves
every row of the tile.
"""

from __future__ import annotations

import dataclasses

import sympy

from codegen.c.geometry import Ask, CpuGeometry, Dtypes, Shapes
from codegen.emit import loop_order as orders
from codegen.ir.affine import NotAffine, affine_parts
from codegen.ir.nest import LoopNest, Reduce, accesses
from codegen.ir.reductions import REDUCTIONS
from codegen.ir.small_axes import small_extent


def symbols(nest: LoopNest) -> dict[str, sympy.Symbol]:
    """The nest's free and reduced indices by name."""
    found = {s.name: s for s in nest.free_indices}
    for term in nest.terms:
        found.update({s.name: s for s in term.reduced_indices})
    return found


def vector_friendly(nest: LoopNest, name: str) -> bool:
    """Every access that uses `name` has it only in its last axis, with coefficient +1."""
    symbol = symbols(nest)[name]
    for term in nest.terms:
        for access in accesses(term.body):
            *outer, last = access.indices
            if any(symbol in index.free_symbols for index in outer):
                return False
            if symbol in last.free_symbols and affine_parts(last, (symbol,)) != {symbol: 1}:
                return False
    return True


def bounded_affinely(nest: LoopNest, names: tuple[str | None, ...]) -> bool:
    """Whether every constraint that mentions one of the tiled indices `names` is affine in
    it, so that a tile's corners bound it for the whole tile (`tiles._tile_paths`). A bound
    such as `k <= floordiv(i, 2)` is not: the tile's loops over `k` would read `i`, which
    only the lanes define (the fuzzer's `where(j < i + 1, B[2i] + A[i, j], 0)`, whose
    gradient dB holds it)."""
    tiled = [symbol for name, symbol in symbols(nest).items() if name in names]
    for term in nest.terms:
        for c in term.constraints:
            try:
                linear = affine_parts(c, tiled)
            except NotAffine:
                return False
            if sympy.expand(c - sum(a * x for x, a in linear.items())).has(*tiled):
                return False
    return True


def wide(dtypes: Dtypes, nest: LoopNest) -> bool:
    """Whether the nest computes in float64 (half the lanes per vector)."""
    return dtypes is not None and "float64" in (dtypes.get(nest.output), *dtypes.values())


def _windowed(nest: LoopNest) -> frozenset[str]:
    """Free indices that share an access axis with a reduced index (`X[c, i + k]`)."""
    found: set[str] = set()
    for term in nest.terms:
        reduced = set(term.reduced_indices)
        for access in accesses(term.body):
            for axis in access.indices:
                if axis.free_symbols & reduced:
                    found.update(s.name for s in axis.free_symbols - reduced)
    return frozenset(found) & {s.name for s in nest.free_indices}


def dot_schedule(
    nest: LoopNest,
    base: CpuGeometry,
    free: tuple[str, ...],
    reduced: tuple[tuple[str, ...], ...],
    wide: bool,
) -> CpuGeometry | None:
    """The dot strategy's schedule over the free order `free`, or None where it does not fit."""
    if not all(reduced) or not REDUCTIONS[nest.reduction].simd:
        return None
    if not bounded_affinely(nest, free[-2:]):
        return None
    # 4 x 4 dot products of one vector register each (8 float / 4 double lanes): 16
    # accumulator registers plus 8 loads per step (measured best of 2..6 x 3..8 x 8..16).
    # Rows serve the tile only through a read they share (one that does not read the row
    # index); where every read reads it, each row is a stream of its own: one row of 4.
    row = free[-2] if len(free) > 1 else None
    return dataclasses.replace(
        base,
        free_order=free,
        reduced_order=reduced,
        strategy="dot",
        row=row,
        vector=free[-1],
        rows=4 if row and shares_rows(nest, row) else 1,
        width=4,
        lanes=4 if wide else 8,
    )


def unroll_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> CpuGeometry | None:
    """A small constant last axis (`codegen.ir.small_axes`) kept last: written out."""
    free = ask.base.free_order
    count = small_extent(nest)
    if count is None or free[-1] != nest.free[-1].index.name:
        return None
    if not bounded_affinely(nest, free[-2:]):
        return None
    return dataclasses.replace(ask.base, strategy="unroll", vector=free[-2], width=count)


def tile_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> CpuGeometry | None:
    """Register tiles with the last free index in vector lanes (the module docstring)."""
    base, reduced = ask.base, ask.base.reduced_order
    free = base.free_order
    free = orders.shared_row_last(nest, free) if ask.loop_order is None else free
    is_wide, vector = wide(dtypes, nest), free[-1]
    row = free[-2] if len(free) > 1 else None
    if not vector_friendly(nest, vector) or not bounded_affinely(nest, (row, vector)):
        return None
    # 6 rows x 32 float lanes: 24 accumulator vectors of 8 floats (measured best here).
    small = None
    windowed = _windowed(nest)
    if vector in windowed and ask.loop_order is None:
        # A window offset (`dW[o, c, k]`) is often short: then dot products over the
        # long reduced axis, tiled over two free indices that are no window offsets.
        plain = [name for name in free if name not in windowed]
        dot_free = (*(n for n in free if n not in plain[-2:]), *plain[-2:])
        small = dot_schedule(nest, base, dot_free, reduced, is_wide) if plain else None
        # Between the two, a tile one vector wide (conv2d's output 30 wide).
        small = _tile(base, free, row, vector, 6, 4 if is_wide else 8, small)
    # Costly work per row (a nested reduction, an exp) is done once per tile width of the
    # vector axis: wider tiles (8 x 64 floats) do it fewer times, and each value read
    # along the reduced axis (attention's K and V rows) serves 8 rows (attention's nests
    # ran faster than with 4 x 64). A vector axis shorter than the tile (the
    # Gaussian kernel's coordinates, `dX[i, p]`) runs as dot products instead, whose
    # lanes compute that work in vector form once for all the columns.
    costly = _costly_per_row(nest, vector)
    if costly and small is None and not reads(nest, vector):
        small = dot_schedule(nest, base, free, reduced, is_wide)
    if costly and small is None and not any(reduced):
        # An elementwise nest (a gate per row): the plain tile where `v` is shorter than
        # the wide one, which would store every tile lane by lane.
        small = _tile(base, free, row, vector, 6, 16 if is_wide else 32)
    width = (32 if costly else 16) if is_wide else (64 if costly else 32)
    tile = _tile(base, free, row, vector, 8 if costly else 6, width, small)
    if costly and small is None:
        # A vector axis read by the tile and shorter than it (attention's head width 32
        # under 64 float lanes) would run every tile on the edge path, whose trip counts
        # are known only at run time: a tile half as wide takes over there.
        tile = dataclasses.replace(tile, small=dataclasses.replace(tile, width=tile.width // 2))
    elif small is None and any(reduced):
        # The same for a plain contraction's short output axis (16 output channels of a
        # convolution under 32 float lanes): half as wide, twice the rows, as many
        # accumulators.
        tile = dataclasses.replace(
            tile,
            small=dataclasses.replace(
                tile, width=tile.width // 2, rows=tile.rows * 2 if row else 1
            ),
        )
    return tile


def _tile(
    base: CpuGeometry,
    free: tuple[str, ...],
    row: str | None,
    vector: str,
    rows: int,
    width: int,
    small: CpuGeometry | None = None,
) -> CpuGeometry:
    """A tile schedule over `free`: `rows` rows of `row` (one where there is none) by
    `width` lanes of `vector`, `small` taking over where `vector` is shorter than `width`."""
    return dataclasses.replace(
        base,
        free_order=free,
        strategy="tile",
        row=row,
        vector=vector,
        rows=rows if row else 1,
        width=width,
        small=small,
    )


def dot_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> CpuGeometry | None:
    """Dot-product-shaped nests (no free index is contiguous in the inputs), for the
    reductions that vectorise; not a sum that computes a nested reduction per value of its
    innermost reduced index (`nested_per_value`: `scalar` takes it)."""
    if nested_per_value(nest, ask.base.reduced_order):
        return None
    free = ask.base.free_order
    if ask.loop_order is None:
        free = orders.shared_row_last(nest, free)
    return dot_schedule(nest, ask.base, free, ask.base.reduced_order, wide(dtypes, nest))


def nested_per_value(nest: LoopNest, reduced: tuple[tuple[str, ...], ...]) -> bool:
    """Whether a term of a sum computes a nested reduction that reads its innermost reduced
    index (a score modifier's gradient: the weights `sum_e dO[i, e]*V[j, e]` per key `j`).
    Dot products in lanes of that index would compute each nested sum lane by lane,
    reading its rows across the lanes; one output at a time, the nested sums run along their
    own contiguous axes, 8 values at a time (`codegen.c.reductions.simple.scalar`). A nested
    reduction over at most `SHORT_NESTED` values fixed when the kernel is made (a top-k's
    ranks in its gradient, `sum_r where(e == A[t, r], dY[t, r], 0)`) is no such row: it
    runs in the lanes."""
    if nest.reduction != "sum" or not all(reduced):
        return False
    symbols = {s.name: s for t in nest.terms for s in t.reduced_indices}
    return any(
        symbols[order[-1]] in r.free_symbols and not _short(r)
        for term, order in zip(nest.terms, reduced, strict=True)
        for r in term.body.atoms(Reduce)
    )


#: The most values a nested reduction of a known count may have and still run in lanes.
SHORT_NESTED = 8


def _short(nested: Reduce) -> bool:
    length = sympy.sympify(nested.stop - nested.start)
    return bool(length.is_Integer) and int(length) <= SHORT_NESTED


def reads(nest: LoopNest, name: str) -> bool:
    """Whether some access of `nest` reads the index `name` (else only tests select by it)."""
    symbol = symbols(nest)[name]
    return any(
        symbol in index.free_symbols
        for term in nest.terms
        for access in accesses(term.body)
        for index in access.indices
    )


def shares_rows(nest: LoopNest, row: str) -> bool:
    """Whether some read does not read the index `row` (so a tile's rows share it)."""
    symbol = symbols(nest)[row]
    return any(
        symbol not in access.free_symbols for term in nest.terms for access in accesses(term.body)
    )


def _costly_per_row(nest: LoopNest, vector: str) -> bool:
    """Whether some term computes a nested reduction or a function call that does not read
    the vector index (so the tile computes it once per row and tile, per step of the
    reduced loops where there are some: a gate `sigmoid(E[n, c])` of an elementwise
    `X[n, c, s] * sigmoid(E[n, c])` too)."""
    for term in nest.terms:
        for node in sympy.preorder_traversal(term.body):
            if isinstance(node, Reduce | sympy.Function) and not any(
                s.name == vector for s in node.free_symbols if isinstance(s, sympy.Symbol)
            ):
                return True
    return False


def tile_validate(nest: LoopNest, schedule: CpuGeometry) -> None:
    """A tile (or dot) schedule tiles the innermost free loops, rows > 1 with a row index."""
    tiled = [schedule.row, schedule.vector] if schedule.row else [schedule.vector]
    if schedule.vector is None or tuple(schedule.free_order[-len(tiled) :]) != tuple(tiled):
        raise ValueError(
            f"a {schedule.strategy} schedule tiles the innermost free loops; "
            f"got free order {schedule.free_order}, tile {tiled}"
        )
    if schedule.row is None and schedule.rows != 1:
        raise ValueError("rows > 1 needs a row index")
    if not bounded_affinely(nest, tuple(tiled)):
        raise ValueError(f"a constraint of the nest is not affine in the tiled {tiled}")


def dot_validate(nest: LoopNest, schedule: CpuGeometry) -> None:
    """The tile's checks, a reduction that vectorises and a reduced index in every term."""
    tile_validate(nest, schedule)
    if not REDUCTIONS[nest.reduction].simd:
        raise ValueError(f"the dot strategy does not support the reduction {nest.reduction}")
    if any(not order for order in schedule.reduced_order):
        raise ValueError("the dot strategy needs a reduced index in every term")


def unroll_validate(nest: LoopNest, schedule: CpuGeometry) -> None:
    """The small last axis kept last and unrolled whole, the index before it in lanes."""
    free, last = schedule.free_order, nest.free[-1].index.name if nest.free else None
    if small_extent(nest) != schedule.width or free[-1:] != (last,) or schedule.vector != free[-2]:
        raise ValueError("the unroll strategy is for a small last axis, the index before in lanes")
    if not bounded_affinely(nest, free[-2:]):
        raise ValueError(f"a constraint of the nest is not affine in the tiled {free[-2:]}")


def tile_header(s: CpuGeometry) -> tuple[str, ...]:
    return (f"tile={s.row or '-'}x{s.vector}={s.rows}x{s.width}",)


def dot_header(s: CpuGeometry) -> tuple[str, ...]:
    return (*tile_header(s), f"lanes={s.lanes}")


def unroll_header(s: CpuGeometry) -> tuple[str, ...]:
    return (f"unroll={s.free_order[-1]}x{s.width} lanes={s.vector}",)


def _outputs(s: CpuGeometry) -> str:
    if s.row is None:
        return f"{s.width} {s.vector}"
    return f"{s.rows} {s.row} x {s.width} {s.vector}"


def tile_words(s: CpuGeometry, inside: str, reduced: str) -> str:
    return f"register tiles of {_outputs(s)} outputs ({s.vector} in vector lanes), " + inside


def dot_words(s: CpuGeometry, inside: str, reduced: str) -> str:
    return (
        f"{_outputs(s)} dot products at a time, each as {s.lanes} vector partial "
        f"sums over {reduced or 'nothing'}"
    )


def unroll_words(s: CpuGeometry, inside: str, reduced: str) -> str:
    return (
        f"its {s.width} values of {''.join(s.free_order[-1:])} written out, "
        f"{s.vector} in vector lanes"
    )


def lane_tiles_words(small: CpuGeometry, s: CpuGeometry) -> str | None:
    """A tile's words as the `small` schedule of `s`: its width where it keeps `s`'s lanes."""
    return f"{small.width}-lane tiles" if small.vector == s.vector else None
