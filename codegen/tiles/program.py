"""Tile programs: a loop nest as a grid of program instances over output tiles.

A `TileProgram` is the level between a `LoopNest` and a tile compiler (Pallas' Triton
lowering today, `tensordsl/backends/pallas/`). Every extent is known (a tile program is made
for concrete shapes), so it holds plain integers:

* `grid`: one `TileAxis` per free index; the program instance at grid point `g` computes the
  output tile `[start + g*tile, start + (g+1)*tile)` of each axis and writes it once (no
  atomics: each output element has one writer);
* per term, `reduced`: the loops over tiles of its reduced indices, `bounds`: the per-tile
  loop bounds that its affine constraints give (tiles past a causal diagonal are never
  visited), `loads`: the operand tiles it reads, `dot`: the tile contraction when the body
  is a product of two sides with the reduced index between them, and `masked`: whether a
  `where` is needed (constraints, a guard or a partial tile) — on boundary tiles only.

Nothing here imports JAX: a tile program is printed by `explain` and tested as data.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from codegen.ir.nest import LoopNest, Term
from codegen.ir.source import Spell, as_written, constraint_source, expr_source
from codegen.tiles.precision import DotPrecision
from codegen.tiles.tuning import TuningRow


@dataclass(frozen=True)
class TileAxis:
    """`index` runs over `[start, start + extent)` in tiles of `tile` values."""

    index: sympy.Symbol
    start: int
    extent: int
    tile: int

    @property
    def count(self) -> int:
        """The number of tiles (0 for an empty range)."""
        return -(-self.extent // self.tile) if self.extent > 0 else 0

    @property
    def partial(self) -> bool:
        """Whether the last tile runs past the range (a mask is needed there)."""
        return self.extent % self.tile != 0

    def describe(self) -> str:
        stop = self.start + self.extent
        return f"{self.index} in [{self.start}, {stop}): {self.count} tiles of {self.tile}"


@dataclass(frozen=True)
class TileLoad:
    """One operand tile a term reads: `access` over the tile axes `axes`.

    `kind` is "tile" when every index of the access is one loop index plus a constant
    ("shifted" when a constant is not 0), else "gather" (index arithmetic, index arrays)."""

    access: sympy.Indexed
    axes: tuple[str, ...]
    kind: str

    @property
    def tensor(self) -> str:
        return str(self.access.base.name)


@dataclass(frozen=True)
class TileDot:
    """`left @ right` on tiles: `left` reads `rows` and the reduced index, `right` the
    reduced index and `columns`; `scale` is the rest of the product (free of the reduced
    index), applied to the dot's result."""

    left: sympy.Expr
    right: sympy.Expr
    rows: sympy.Symbol
    columns: sympy.Symbol
    reduced: sympy.Symbol
    scale: sympy.Expr
    #: Constraints (`c >= 0`) that read the reduced index, zeroing the left tile (they read
    #: rows and the reduced index) or the right one (the reduced index and columns).
    left_masks: tuple[sympy.Expr, ...] = ()
    right_masks: tuple[sympy.Expr, ...] = ()


@dataclass(frozen=True)
class LoopBound:
    """`coefficient * index + rest >= 0`, with `rest` affine in free indices only: over one
    output tile, the reduced `index` needs only the tiles where that can hold."""

    index: sympy.Symbol
    coefficient: int
    rest: sympy.Expr

    def describe(self) -> str:
        return f"{self.index}: {constraint_source(self.coefficient * self.index + self.rest)}"


@dataclass(frozen=True)
class TermTiles:
    """One term of the nest as tile code (see the module docstring)."""

    term: Term
    reduced: tuple[TileAxis, ...]
    loads: tuple[TileLoad, ...]
    dot: TileDot | None
    bounds: tuple[LoopBound, ...]
    masked: bool


@dataclass(frozen=True)
class TileProgram:
    """A loop nest as tile code (see the module docstring)."""

    nest: LoopNest
    grid: tuple[TileAxis, ...]
    terms: tuple[TermTiles, ...]
    #: The dtype tiles are computed and accumulated in (float32 for half types).
    accumulate: str
    #: The value of every extent symbol the nest names.
    extents: tuple[tuple[sympy.Symbol, int], ...] = ()
    #: How its dots round (`codegen.tiles.precision`); None: it has no dot.
    precision: DotPrecision | None = None
    #: The tuning row its tiles and launch settings come from (`codegen.tiles.tuning`).
    tuning: TuningRow | None = None

    @property
    def reduction(self) -> str:
        return self.nest.reduction

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Program instances along each free axis (one instance for a 0-d output)."""
        return tuple(a.count for a in self.grid) or (1,)

    @property
    def block(self) -> tuple[int, ...]:
        """The output tile's shape."""
        return tuple(a.tile for a in self.grid) or (1,)

    @property
    def padded_shape(self) -> tuple[int, ...]:
        """The output as the program writes it: whole tiles, cut to the output after."""
        return tuple(n * t for n, t in zip(self.grid_shape, self.block))

    @property
    def instances(self) -> int:
        return math.prod(self.grid_shape)

    def describe(self, *, spell: Spell | None = None, name: Callable[[str], str] = str) -> str:
        """The program for people (`explain(..., target="pallas")`): `spell` rewrites each
        expression before it is printed and `name` each output's name (`explain` shows a
        gathered operand as the access the user wrote, `tensordsl.explain.spelling`)."""
        names, spell = self.nest.operand_names, spell or as_written
        lines = [
            f"tile program for {name(self.nest.label)} ({self.reduction}, accumulated in "
            f"{self.accumulate})",
            f"  grid: {' x '.join(map(str, self.grid_shape))} = {self.instances} program "
            f"instance(s), output tile {' x '.join(map(str, self.block))}",
        ]
        lines += [f"    {axis.describe()}" for axis in self.grid]
        if self.tuning is not None:
            lines.append(f"  {self.tuning.describe()}")
        if self.precision is not None:
            p = self.precision
            lines.append(
                f"  dots on a GPU: {p.words} (precision {p.name}, tolerance {p.tolerance:g}); "
                "exact float32 in interpret mode"
            )
        for n, t in enumerate(self.terms):
            lines.append(f"  term {n}: {expr_source(spell(t.term.body), names)}")
            lines += [f"    loop {axis.describe()}" for axis in t.reduced]
            for load in t.loads:
                axes = ", ".join(load.axes) or "scalar"
                lines.append(f"    load {spell(load.access)} over ({axes}): {load.kind}")
            if t.dot is not None:
                d = t.dot
                lines.append(
                    f"    dot: [{d.rows} x {d.reduced}] @ [{d.reduced} x {d.columns}], "
                    f"scaled by {expr_source(spell(d.scale), names)}"
                )
                for side, masks in (("left", d.left_masks), ("right", d.right_masks)):
                    lines += [
                        f"    {side} tile zeroed where not {constraint_source(c)}" for c in masks
                    ]
            else:
                lines.append("    elementwise tile code, reduced over the loop tiles")
            lines += [f"    bound {b.describe()} (tiles outside never visited)" for b in t.bounds]
            if t.masked:
                lines.append("    where: on boundary tiles only")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()
