"""Build a `TileProgram` from a loop nest and concrete shapes.

The choices, and why:

* The sizes come from the tuning table (`codegen.tiles.tuning`), by the program's
  `TuningKey` (`tuning_key`), or its default row where it has none.
* Tiles are powers of two (Triton's blocks must be). The last two free indices are tiled
  (up to the row's `free_tile` values each), the others get tiles of one value: a tile is at
  most a matrix, which is what a tensor-core `dot` takes.
* A term's last reduced index is looped over in tiles of up to the row's `reduced_tile`
  values (a term of another kind than the program's: its kind's default), its other
  reduced indices (and every one of a prod, which Triton cannot reduce) one value at a time;
  an elementwise tile (output tile x reduced tile) stays within `ELEMENTWISE_BUDGET` values.
* A term is a `dot` when it is a sum over one reduced index of a product whose factors split
  into a side reading the first tiled free index and a side reading the second (with the
  reduced index on both). A constraint that reads the reduced index zeroes the side whose
  indices it reads; the others mask the dot's result (an output tile they exclude whole
  runs no loop): the contractions, causal scores, and their gradient nests. Dot tiles are
  at least `DOT_MIN` wide, as Triton's `tl.dot` needs.
* A nested reduction in a body (an intermediate a program inlined) is computed over its
  whole range inside each tile, up to `NESTED_LIMIT` values.
* An affine constraint with one reduced index and otherwise free indices bounds that
  index's tile loop per output tile; every constraint, the guard and partial tiles are a
  `where`, applied on boundary tiles only.

>>> from codegen.ir.examples import matmul
>>> program = tile_program(matmul(), {"A": (50, 37), "B": (37, 24)})
>>> program.grid_shape, program.block, program.terms[0].dot is not None
((2, 1), (32, 32), True)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy

from codegen.errors import Unsupported
from codegen.ir.affine import NotAffine, as_affine
from codegen.ir.extents import evaluate_int, extent_values
from codegen.ir.nest import LoopNest, Reduce, Term, accesses, default_dtypes
from codegen.ir.reductions import REDUCTIONS
from codegen.tiles import tuning
from codegen.tiles.hoist import hoist_nested
from codegen.tiles.precision import dot_precision
from codegen.tiles.program import LoopBound, TermTiles, TileAxis, TileDot, TileLoad, TileProgram

#: The smallest side of a dot's tiles (Triton's `tl.dot` takes 16 and up).
DOT_MIN = 16
#: The most values of one elementwise tile (output tile x reduced tile).
ELEMENTWISE_BUDGET = 4096
#: The reductions a tile program accumulates across tiles.
TILE_REDUCTIONS = ("sum", "max", "min", "prod", "logsumexp", "argmax", "argmin")
#: The longest nested reduction (an inlined intermediate) computed whole inside a tile.
NESTED_LIMIT = 1024
#: Half types are computed and accumulated in float32.
_HALF = ("float16", "bfloat16")


def tile_program(
    nest: LoopNest,
    shapes: Mapping[str, Sequence[int]],
    dtypes: Mapping[str, str] | None = None,
    *,
    precision: str = "default",
    tuned: tuning.TuningRow | None = None,
) -> TileProgram:
    """The tile program of `nest` for the shapes of every tensor it names.

    Args:
        nest: the loop nest.
        shapes: the shape of every tensor the nest's ranges name.
        dtypes: dtype names of the operands and the output (default float32).
        precision: how float32 dots round, a key of `codegen.tiles.precision.MODES`.
        tuned: the tuning row to use (a sweep's candidate); default: the table's row of
            the program's `tuning_key`.

    Returns:
        The `TileProgram`.

    Raises:
        Unsupported: the nest needs what tile programs do not have yet (worded).
    """
    nest = hoist_nested(nest)  # a nested sum holding another: into the term's loops
    _check(nest)
    dtypes = dict(dtypes or default_dtypes(nest))
    extents = extent_values(nest, shapes)
    free = [_axis(r, extents) for r in nest.free]
    dots = [_find_dot(nest, term, free) for term in nest.terms]
    key = _key(nest, dots, dtypes, extents)
    row = tuned if tuned is not None else tuning.lookup(key)
    tiles = _free_tiles(free, any(d is not None for d in dots), row.free_tile)
    grid = tuple(TileAxis(a.index, a.start, a.extent, t) for a, t in zip(free, tiles))
    terms = tuple(
        _term(nest, term, grid, dot, extents, _reduced_tile(key, row, dot))
        for term, dot in zip(nest.terms, dots)
    )
    out = str(dtypes.get(nest.output, "float32"))
    if REDUCTIONS[nest.reduction].positional:  # the values compared: the operands' float type
        floats = [str(dtypes.get(op.name)) for op in nest.operands]
        out = "float64" if "float64" in floats else "float32"
    accumulate = "float32" if out in _HALF else out
    known = tuple(sorted(extents.items(), key=lambda item: item[0].name))
    rounding = dot_precision(precision, key.dtype) if key.kind == "dot" else None
    return TileProgram(nest, grid, terms, accumulate, known, rounding, row)


def tuning_key(
    nest: LoopNest, shapes: Mapping[str, Sequence[int]], dtypes: Mapping[str, str] | None = None
) -> tuning.TuningKey:
    """The tuning table's key of `nest`'s tile program (`codegen.tiles.tuning`).

    >>> from codegen.ir.examples import matmul
    >>> tuning_key(matmul(), {"A": (50, 37), "B": (37, 24)}).describe()
    'dot, float32, reduced extent <= 64, mask none'
    """
    _check(nest)
    extents = extent_values(nest, shapes)
    free = [_axis(r, extents) for r in nest.free]
    dots = [_find_dot(nest, term, free) for term in nest.terms]
    return _key(nest, dots, dict(dtypes or default_dtypes(nest)), extents)


def _key(
    nest: LoopNest,
    dots: Sequence[TileDot | None],
    dtypes: Mapping[str, str],
    extents: Mapping[sympy.Symbol, int],
) -> tuning.TuningKey:
    """Kind, data dtype, reduced-extent bucket and mask kind (see `codegen.tiles.tuning`)."""
    longest = 0
    for term, dot in zip(nest.terms, dots):
        ranges = [r for r in term.reduced if dot is None or r.index == dot.reduced]
        if ranges:
            longest = max(longest, evaluate_int(ranges[-1].stop - ranges[-1].start, extents))
    if any(d is not None for d in dots):
        kind = "dot"
    else:
        kind = "reduce" if any(term.reduced for term in nest.terms) else "elementwise"
    # The data's dtype: the widest float operand's (the output's where none is a float).
    floats = {str(dtypes.get(op.name)) for op in nest.operands}
    widest = [d for d in ("float64", "float32", *_HALF) if d in floats]
    dtype = widest[0] if widest else str(dtypes.get(nest.output, "float32"))
    mask = "none"
    for term in nest.terms:
        constraints = [c.xreplace(extents) for c in term.constraints]
        free_indices = [r.index for r in nest.free]
        if _bounds(constraints, free_indices, [r.index for r in term.reduced]):
            mask = "bounded"
        elif mask == "none" and (constraints or term.guard is not sympy.true):
            mask = "masked"
    return tuning.TuningKey(kind, dtype, tuning.bucket(max(0, longest)), mask)


def _reduced_tile(key: tuning.TuningKey, row: tuning.TuningRow, dot: TileDot | None) -> int:
    """The largest reduced tile of a term: the row's for a term of the program's kind, the
    default of its own kind for another (a bias term beside a dot)."""
    kind = "dot" if dot is not None else ("reduce" if key.kind == "dot" else key.kind)
    return row.reduced_tile if kind == key.kind else tuning.DEFAULTS[kind]["reduced_tile"]


def _check(nest: LoopNest) -> None:
    if nest.online:
        raise Unsupported(
            f"'{nest.label}' is a one-pass softmax-weighted sum; tile programs run it as its "
            "two nests (online softmax tiles are not built yet)"
        )
    if nest.reduction not in TILE_REDUCTIONS:
        raise Unsupported(
            f"tile programs do not reduce with '{nest.reduction}' yet ('{nest.output}')",
            expected=f"one of {', '.join(TILE_REDUCTIONS)}",
        )
    for term in nest.terms:
        for node in term.body.atoms(Reduce):
            if node.reduction not in TILE_REDUCTIONS or node.atoms(Reduce) - {node}:
                raise Unsupported(
                    f"'{nest.output}' has a nested reduction '{node.reduction}' (an inlined "
                    "intermediate) that tile programs do not compute yet"
                )


def _check_nested(nest: LoopNest, term: Term, extents: Mapping[sympy.Symbol, int]) -> None:
    """A nested reduction runs over its whole range inside each tile: bound its length."""
    for node in term.body.atoms(Reduce):
        length = evaluate_int(node.stop - node.start, extents)
        if length > NESTED_LIMIT:
            raise Unsupported(
                f"'{nest.output}' has a nested reduction over {node.index} of {length} values; "
                f"tile programs compute one of at most {NESTED_LIMIT} inside a tile"
            )


def _axis(r: object, extents: Mapping[sympy.Symbol, int]) -> TileAxis:
    start = evaluate_int(r.start, extents)  # type: ignore[attr-defined]
    stop = evaluate_int(r.stop, extents)  # type: ignore[attr-defined]
    return TileAxis(r.index, start, max(0, stop - start), 1)  # type: ignore[attr-defined]


def _power_of_two(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def _free_tiles(free: Sequence[TileAxis], dot: bool, largest: int) -> tuple[int, ...]:
    """Tiles of up to `largest` for the last two free indices (at least DOT_MIN for a dot),
    one value for the others."""
    tiles = []
    for position, axis in enumerate(free):
        if position < len(free) - 2:
            tiles.append(1)
            continue
        tile = min(largest, _power_of_two(axis.extent))
        tiles.append(max(tile, DOT_MIN) if dot else tile)
    return tuple(tiles)


def _indices_in(expr: sympy.Basic, loops: set[sympy.Symbol]) -> set[sympy.Symbol]:
    return {s for s in expr.free_symbols if s in loops}


def _find_dot(nest: LoopNest, term: Term, free: Sequence[TileAxis]) -> TileDot | None:
    """The term as `scale * (left @ right)`, or None (see the module docstring)."""
    if nest.reduction != "sum" or len(term.reduced) != 1 or len(free) < 2:
        return None
    reduced = term.reduced[0].index
    if reduced in term.guard.free_symbols:
        return None
    rows, columns = free[-2].index, free[-1].index
    single = {a.index for a in free[:-2]}  # one value per program instance
    loops = {*single, rows, columns, reduced}
    left_masks, right_masks = [], []
    for constraint in term.constraints:
        reads = _indices_in(constraint, loops)
        if reduced not in reads:
            continue  # masks the dot's result
        if reads <= {rows, reduced, *single}:
            left_masks.append(constraint)
        elif reads <= {columns, reduced, *single}:
            right_masks.append(constraint)
        else:
            return None
    left, right, scale = [], [], []
    for factor in sympy.Mul.make_args(term.body):
        reads = _indices_in(factor, loops)
        if reduced not in reads:
            scale.append(factor)
        elif reads <= {rows, reduced, *single}:
            left.append(factor)
        elif reads <= {columns, reduced, *single}:
            right.append(factor)
        else:
            return None
    if not left or not right:
        return None
    if not any(rows in _indices_in(f, loops) for f in left):
        return None
    if not any(columns in _indices_in(f, loops) for f in right):
        return None
    return TileDot(
        sympy.Mul(*left),
        sympy.Mul(*right),
        rows,
        columns,
        reduced,
        sympy.Mul(*scale),
        tuple(left_masks),
        tuple(right_masks),
    )


def _term(
    nest: LoopNest,
    term: Term,
    grid: tuple[TileAxis, ...],
    dot: TileDot | None,
    extents: Mapping[sympy.Symbol, int],
    largest: int,
) -> TermTiles:
    _check_nested(nest, term, extents)
    ranges = [_axis(r, extents) for r in term.reduced]
    per_output = 1
    for axis in grid:
        per_output *= axis.tile
    reduced = []
    for position, axis in enumerate(ranges):
        if position < len(ranges) - 1 or nest.reduction == "prod":
            tile = 1  # prod: Triton has no product reduction; one value per step
        elif dot is not None:
            tile = max(DOT_MIN, min(largest, _power_of_two(axis.extent)))
        else:
            budget = max(1, ELEMENTWISE_BUDGET // per_output)
            tile = min(largest, _power_of_two(axis.extent), _power_of_two(budget + 1) // 2)
        reduced.append(TileAxis(axis.index, axis.start, axis.extent, tile))
    loops = {a.index for a in grid} | {a.index for a in reduced}
    constraints = [c.xreplace(extents) for c in term.constraints]
    partial = dot is None and any(a.partial for a in reduced)  # a dot zeroes its tile's tail
    masked = bool(constraints) or term.guard is not sympy.true or partial
    return TermTiles(
        term=term,
        reduced=tuple(reduced),
        loads=tuple(_load(a, loops) for a in accesses(term.body)),
        dot=dot,
        bounds=_bounds(constraints, [a.index for a in grid], [a.index for a in reduced]),
        masked=masked,
    )


def _load(access: sympy.Indexed, loops: set[sympy.Symbol]) -> TileLoad:
    """The tile an access reads and how (see `TileLoad`)."""
    axes = sorted(str(s) for s in _indices_in(access, loops))
    kind = "tile"
    for index in access.indices:
        reads = _indices_in(index, loops)
        offset = sympy.expand(index - sum(reads)) if len(reads) == 1 else None
        if index.atoms(sympy.Indexed) or offset is None or not offset.is_Integer:
            if reads or index.atoms(sympy.Indexed):
                return TileLoad(access, tuple(axes), "gather")
            continue  # a constant position: part of the tile's address
        if offset != 0:
            kind = "shifted"
    return TileLoad(access, tuple(axes), kind)


def _bounds(
    constraints: Sequence[sympy.Expr],
    free: Sequence[sympy.Symbol],
    reduced: Sequence[sympy.Symbol],
) -> tuple[LoopBound, ...]:
    """The loop bounds of reduced indices that constraints give (see `LoopBound`)."""
    found = []
    for constraint in constraints:
        try:
            form = as_affine(constraint, (*free, *reduced))
        except NotAffine:
            continue
        if not form.constant.is_Integer:
            continue
        inner = [r for r in reduced if form.coefficient(r)]
        if len(inner) != 1:
            continue
        index = inner[0]
        coefficient = form.coefficient(index)
        found.append(LoopBound(index, coefficient, sympy.expand(constraint - coefficient * index)))
    return tuple(found)
