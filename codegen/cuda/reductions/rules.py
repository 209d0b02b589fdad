"""When the reduction strategies apply, what they check and their words (thread, tile,
block, split, rows, columns); their records are in `codegen.cuda.strategies`."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import sympy

from codegen.cuda.geometry import Ask, GpuGeometry
from codegen.cuda.layout import rectangular, reduction_layout
from codegen.emit.loop_order import bound_indices
from codegen.ir.nest import LoopNest, accesses

Shapes = Mapping[str, Sequence[int]] | None
Dtypes = Mapping[str, str] | None


def reduced_words(s: GpuGeometry) -> str:
    """Each term's reduced loops, outermost first, for `in_words`."""
    return " then ".join(", ".join(o) for o in s.reduced_order if o) or "nothing"


def _registers(s: GpuGeometry) -> str:
    reduced = reduced_words(s)
    return f"reducing {reduced} in registers" if reduced != "nothing" else "no reduction"


def threads_header(s: GpuGeometry) -> str:
    return f"threads={s.threads} index={s.index_type}"


# thread: the fallback of every nest, topk's one strategy.


def thread_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> GpuGeometry:
    return ask.base


def thread_words(s: GpuGeometry) -> str:
    return f"one output element per thread, {_registers(s)}"


# tile: `rows` consecutive values of the second-to-last free index per thread.


def _names_used(nest: LoopNest, index: str) -> bool:
    """True when some access of the nest does not use `index` (so a row tile saves loads)."""
    for term in nest.terms:
        for access in term.body.atoms(sympy.Indexed):
            if index not in {s.name for s in access.free_symbols}:
                return True
    return False


def _widest_misses(nest: LoopNest, index: str) -> bool:
    """True when an access of the highest rank does not use `index`."""
    found = [a for term in nest.terms for a in accesses(term.body)]
    rank = max((len(a.indices) for a in found), default=0)
    return any(
        len(a.indices) == rank and index not in {s.name for s in a.free_symbols} for a in found
    )


def tile_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> GpuGeometry | None:
    """A reduction whose second-to-last free index no bound reads and some access misses.
    Rows of a tile share the loads of a widest access that misses their index (Y[j,k]
    across rows i of pairwise distances' gradient dX[i,k]): that beats a warp per short
    row (measured on an H200 for the distances themselves, before they took pairwise:
    16384^2 over k 64, 119 ms with rows, 19.7 ms with tiles); else a row reduction takes
    the rows strategy first."""
    free = ask.base.free_order
    if len(free) < 2 or not any(t.reduced for t in nest.terms):
        return None
    row = free[-2]
    if row in bound_indices(nest, ask.base) or not _names_used(nest, row):
        return None
    if not _widest_misses(nest, row) and reduction_layout(nest, ask.base) == "rows":
        return None
    return dataclasses.replace(ask.base, strategy="tile", row=row, rows=4)


def tile_validate(nest: LoopNest, s: GpuGeometry) -> None:
    if s.row not in s.free_order or s.row in bound_indices(nest, s):
        raise ValueError(f"tile row {s.row!r} must be a free index loops don't use")


def tile_header(s: GpuGeometry) -> str:
    return f"tile={s.row}x1={s.rows}x1 {threads_header(s)}"


def tile_words(s: GpuGeometry) -> str:
    return f"{s.rows} consecutive {s.row} per thread, {_registers(s)}"


# block and split: no free index.


def _widest_contiguous(
    nest: LoopNest, reduced: tuple[tuple[str, ...], ...]
) -> tuple[tuple[str, ...], ...]:
    """Each term's reduced loops with the contiguous axis of its highest-rank access
    innermost (the split strategy's threads stride the innermost loop: LayerNorm's
    `dF := dV[b,t]*(X[b,t,f] - M[b,t])^2` strides f, not t, which more accesses read last)."""
    found = []
    for term, names in zip(nest.terms, reduced, strict=True):
        ranked = sorted(accesses(term.body), key=lambda a: -len(a.indices))
        last = {s.name for s in ranked[0].indices[-1].free_symbols} if ranked else set()
        inner = [name for name in names if name in last]
        if len(inner) == 1 and names and names[-1] != inner[0]:
            names = (*(n for n in names if n != inner[0]), inner[0])
        found.append(tuple(names))
    return tuple(found)


def _full(nest: LoopNest, ask: Ask, strategy: str) -> GpuGeometry:
    reduced = ask.base.reduced_order
    if ask.loop_order is None:
        reduced = _widest_contiguous(nest, reduced)
    return dataclasses.replace(ask.base, strategy=strategy, reduced_order=reduced)


def split_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> GpuGeometry | None:
    """A full reduction (no free index) with reduced loops."""
    if ask.base.free_order or not any(ask.base.reduced_order):
        return None
    return _full(nest, ask, "split")


def split_header(s: GpuGeometry) -> str:
    return f"threads={s.threads} blocks<={s.blocks} index={s.index_type}"


def split_words(s: GpuGeometry) -> str:
    return (
        f"the reduction over {reduced_words(s)} split across up to {s.blocks} blocks, "
        "then combined in order by one block"
    )


def block_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> GpuGeometry | None:
    """No free index and no reduced loop (nested reductions only)."""
    return None if ask.base.free_order else _full(nest, ask, "block")


def block_words(s: GpuGeometry) -> str:
    return (
        f"one block of {s.threads} threads per output element, splitting "
        f"{reduced_words(s)} across its threads"
    )


# rows and columns: the layout of the largest access.


def rows_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> GpuGeometry | None:
    """A row reduction (`codegen.cuda.layout.reduction_layout`)."""
    if reduction_layout(nest, ask.base) != "rows":
        return None
    return dataclasses.replace(ask.base, strategy="rows")


def needs_free(nest: LoopNest, s: GpuGeometry) -> None:
    if not s.free_order:
        raise ValueError(f"the {s.strategy} strategy needs a free index")


def rows_words(s: GpuGeometry) -> str:
    return (
        f"a group of lanes per output element striding {reduced_words(s)} (coalesced), "
        "combined by warp shuffles"
    )


def columns_applies(nest: LoopNest, shapes: Shapes, dtypes: Dtypes, ask: Ask) -> GpuGeometry | None:
    """A column reduction (`codegen.cuda.layout.reduction_layout`)."""
    if reduction_layout(nest, ask.base) != "columns":
        return None
    return dataclasses.replace(ask.base, strategy="columns")


def columns_validate(nest: LoopNest, s: GpuGeometry) -> None:
    if not (any(t.reduced for t in nest.terms) and rectangular(nest, s)):
        raise ValueError("the columns strategy needs reduced loops bounded by extents alone")
    needs_free(nest, s)


def columns_words(s: GpuGeometry) -> str:
    return (
        f"one output element per thread along the contiguous axis, {reduced_words(s)} "
        "cut into slices across blocks, then combined in order"
    )


# The static report's figures (`codegen.cuda.report`).


def tile_share(s: GpuGeometry, access: sympy.Indexed) -> float:
    """A tile's rows share a load that does not read the row index."""
    return 1 / s.rows if s.row not in {x.name for x in access.free_symbols} else 1.0


def tile_redundancy(
    nest: LoopNest, s: GpuGeometry, sizes: Mapping[str, int], extents: Mapping
) -> float:
    """The last partial tile recomputes its last row."""
    rows = sizes[s.row or ""]
    return math.ceil(rows / s.rows) * s.rows / rows


def always(width: int) -> bool:
    """Block and split: consecutive lanes step the innermost reduced loop."""
    return True


def grouped(width: int) -> bool:
    """Rows: consecutive lanes step the row where a group has more than one lane."""
    return width > 1
