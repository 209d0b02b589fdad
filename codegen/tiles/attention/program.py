"""Attention tile programs: FlashAttention's kernels as data, derived from loop nests.

Two nest forms become one kernel each (`codegen.tiles.attention.build.attention_program`
finds them; `tensordsl/backends/pallas/attention.py` lowers them):

* "online": the one-pass nest of a logsumexp and the softmax-weighted sum that reads it
  (`codegen.passes.online.pair`, attention's forward). One program instance per (outer
  indices, tile of rows): it walks the tiles of the reduced index (the keys), computes the
  score expression on a `[rows x keys]` tile (its nested sums, `q . k`, as tile dots, the
  rest, a bias, ALiBi, a soft-cap, as elementwise tile code), keeps a running max and sum
  per row, accumulates `p @ V` and writes O and the row logsumexp once (online softmax).
* "weighted": a sum `G[.., r, c] = sum_l a(r, l) * b(l, c)` whose weight `a` holds nested
  sums (attention's gradient nests dQ, dK, dV: the scores and `dO . V` recomputed from the
  saved logsumexp, the score expression's derivative as the project derived it), or two such
  sums packed along their columns (`codegen.cuda.attention.paired`: dK and dV in one kernel).
  One program instance per (outer indices, tile of rows) accumulates `a @ b` per member.

Every output element is written by one program instance: no atomics. Constraints on the
indices bound the reduced tiles per row tile (`LoopBound`: tiles past the causal diagonal or
outside a window are never visited) and are tested (a `where`) on boundary tiles only.

Nothing here imports JAX.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import sympy

from codegen.ir.affine import NotAffine, as_affine
from codegen.ir.nest import LoopNest, Reduce
from codegen.ir.source import Spell, as_written, constraint_source, expr_source
from codegen.tiles.precision import DotPrecision
from codegen.tiles.program import LoopBound, TileAxis


@dataclass(frozen=True)
class NestedDot:
    """A nested sum of the weight computed as `scale * (rows @ keys)` on tiles: `rows` reads
    the row index and `width.index`, `keys` the reduced (loop) index and `width.index`;
    `width` is the summed index, whole in one tile padded to a power of two."""

    node: Reduce
    rows: sympy.Expr
    keys: sympy.Expr
    scale: sympy.Expr
    width: TileAxis


@dataclass(frozen=True)
class Member:
    """One sum the kernel accumulates: `sum_l weight(r, l) * value(l, c)` over the columns
    `column` (whole in one tile, padded to a power of two)."""

    output: str
    weight: sympy.Expr
    value: sympy.Expr
    column: TileAxis


@dataclass(frozen=True)
class AttentionProgram:
    """An attention kernel as a tile program (module docstring)."""

    nest: LoopNest
    #: "online" (the forward) or "weighted" (a gradient nest, or a packed pair of them).
    kind: str
    #: One value per program instance each (batch, heads), in the output's order.
    outer: tuple[TileAxis, ...]
    #: The tiled free index (the queries of the forward and of dQ, the keys of dK and dV).
    rows: TileAxis
    #: The reduced index walked in tiles (the keys of the forward, the queries of dK, dV).
    loop: TileAxis
    #: Other reduced indices, one value at a time (grouped-query heads' group in dK, dV).
    singles: tuple[TileAxis, ...]
    members: tuple[Member, ...]
    dots: tuple[NestedDot, ...]
    #: The constraints that do not hold everywhere (concrete extents): a `where` on the
    #: tiles that cross them.
    constraints: tuple[sympy.Expr, ...]
    #: An array mask (`Term.guard`, concrete extents; `sympy.true`: none): tested per (row,
    #: loop value) pair on every tile, a pair it fails left out (no tile skipping).
    guard: sympy.Basic
    #: The loop bounds of `loop` per row tile that the affine constraints give.
    bounds: tuple[LoopBound, ...]
    #: The dtype scores and sums are computed and accumulated in.
    accumulate: str
    extents: tuple[tuple[sympy.Symbol, int], ...] = ()
    #: How its dots round (`codegen.tiles.precision`); None: the operands' own type.
    precision: DotPrecision | None = None
    #: Gradients of score parameters it computes too, as per-tile partial sums
    #: (`codegen.tiles.attention.partials.ParamPartial`; a weighted kernel only).
    partials: tuple = ()
    #: Nested sums that are no dot, computed per (row, loop value) pair on a `[rows x loop x
    #: width]` tile (float64 only: attention's exact `sum_e dO * (V - O)`).
    pairs: tuple[Reduce, ...] = ()

    @property
    def grid_shape(self) -> tuple[int, ...]:
        """Program instances: one per value of each outer index, then per row tile."""
        return (*(a.extent for a in self.outer), self.rows.count)

    @property
    def instances(self) -> int:
        total = 1
        for n in self.grid_shape:
            total *= n
        return total

    def tile_ranges(self) -> tuple[tuple[int, int], ...] | None:
        """Per row tile, the first and past-the-last tile of `loop` it visits; None when a
        bound reads an outer index (it then differs per program instance)."""
        names = {self.rows.index}
        if any(not (b.rest.free_symbols <= names) for b in self.bounds):
            return None
        ranges = []
        for tile in range(self.rows.count):
            low = self.rows.start + tile * self.rows.tile
            high = min(low + self.rows.tile, self.rows.start + self.rows.extent) - 1
            first, stop = 0, self.loop.count
            for bound in self.bounds:
                most = _most(bound.rest, {self.rows.index: (low, high)})
                first, stop = _narrowed(bound, most, self.loop, first, stop)
            if not _live(self.constraints, self.rows, low, high):
                stop = first
            ranges.append((first, max(first, stop)))
        return tuple(ranges)

    def describe(self, *, spell: Spell | None = None, name: Callable[[str], str] = str) -> str:
        """The program for people (`explain(..., target="pallas")`); `spell` and `name` as
        `TileProgram.describe`'s."""
        names, spell = self.nest.operand_names, spell or as_written
        what = (
            "online softmax: a running max and sum per row, O and the row logsumexp "
            f"'{name(self.nest.online)}' written once"
            if self.kind == "online"
            else "weighted sums of tiles, each output tile written once (no atomics)"
        )
        grid = " x ".join(map(str, self.grid_shape))
        lines = [
            f"attention tile program for {name(self.nest.label)} ({self.kind}: {what}; accumulated "
            f"in {self.accumulate})",
            f"  grid: {grid} = {self.instances} program instance(s), one per "
            f"({', '.join(str(a.index) for a in self.outer) or '-'}) and {self.rows.index} tile",
            f"    rows {self.rows.describe()}",
            f"    loop {self.loop.describe()}",
        ]
        lines += [f"    one value at a time: {a.describe()}" for a in self.singles]
        lines.append("  launch: the default warps and stages (no tuning row for attention)")
        if self.precision is not None:
            p = self.precision
            lines.append(
                f"  dots on a GPU: {p.words} (precision {p.name}, tolerance {p.tolerance:g}); "
                "exact float32 in interpret mode"
            )
        for dot in self.dots:
            lines.append(
                f"  dot: [{self.rows.index} x {dot.width.index}] @ [{dot.width.index} x "
                f"{self.loop.index}] for {expr_source(spell(dot.node), names)} "
                f"({dot.width.index}: {dot.width.extent} padded to {dot.width.tile})"
            )
        for node in self.pairs:
            lines.append(
                f"  per ({self.rows.index}, {self.loop.index}) pair: "
                f"{expr_source(spell(node), names)} (no dot: elementwise on [{self.rows.index} x "
                f"{self.loop.index} x {node.index}])"
            )
        for member in self.members:
            role = "score" if self.kind == "online" else "weight"
            lines.append(
                f"  {name(member.output)}: {role} {expr_source(spell(member.weight), names)} "
                "(elementwise tile code, nested sums as the dots above)"
            )
            if self.kind == "online":
                lines.append("    p = exp(score - running max), the running sum and O rescaled")
            lines.append(
                f"    dot: [{self.rows.index} x {self.loop.index}] @ [{self.loop.index} x "
                f"{member.column.index}] with {expr_source(spell(member.value), names)} "
                f"({member.column.index}: {member.column.extent} padded to {member.column.tile})"
            )
        lines += [p.describe(self) for p in self.partials]
        lines += [f"  bound {b.describe()} (tiles outside never visited)" for b in self.bounds]
        if self.guard != sympy.true:
            dropped = "score -inf" if self.kind == "online" else "weight 0"
            lines.append(
                f"  where {expr_source(spell(self.guard), names)}: on every tile (a pair it fails "
                f"left out: {dropped}, its product with the values 0)"
            )
        if self.constraints:
            tested = ", ".join(constraint_source(c) for c in self.constraints)
            lines.append(f"  where {tested}: on boundary tiles only")
        ranges = self.tile_ranges()
        if ranges is not None:
            visited = sum(stop - first for first, stop in ranges)
            total = self.rows.count * self.loop.count
            per = ", ".join(str(a.index) for a in self.outer) or "call"
            lines.append(
                f"  tiles per ({per}): {visited} of {total} visited, {total - visited} skipped"
            )
            shown = ", ".join(f"{n}: [{a}, {b})" for n, (a, b) in enumerate(ranges[:8]))
            more = f", ... ({len(ranges)} row tiles)" if len(ranges) > 8 else ""
            lines.append(f"    {self.loop.index} tiles per {self.rows.index} tile: {shown}{more}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.describe()


def _corner(expr: sympy.Expr, box: Mapping[sympy.Symbol, tuple[int, int]], most: bool) -> int:
    form = as_affine(expr, tuple(box))
    value = int(form.constant)
    for index, c in form.coefficients:
        lo, hi = box[index]
        value += c * (hi if (c > 0) == most else lo)
    return value


def _most(expr: sympy.Expr, box: Mapping[sympy.Symbol, tuple[int, int]]) -> int:
    return _corner(expr, box, most=True)


def _narrowed(
    bound: LoopBound, most: int, loop: TileAxis, first: int, stop: int
) -> tuple[int, int]:
    """`first` and `stop` (tiles of `loop`) narrowed by `bound` where its rest is at most
    `most` over the row tile."""
    c = bound.coefficient
    if c > 0:  # index >= ceil(-rest / c)
        lowest = -(most // c)
        return max(first, (lowest - loop.start) // loop.tile), stop
    highest = most // -c  # index <= floor(rest / -c)
    return first, min(stop, (highest - loop.start) // loop.tile + 1)


def _live(constraints: tuple[sympy.Expr, ...], rows: TileAxis, low: int, high: int) -> bool:
    """False when a constraint on the rows alone excludes the whole row tile."""
    for constraint in constraints:
        if constraint.free_symbols <= {rows.index}:
            try:
                if _most(constraint, {rows.index: (low, high)}) < 0:
                    return False
            except NotAffine:
                continue
    return True
