"""The keys' operand of the online strategy's scores, staged in shared memory per key tile.

Attention's score `sum_d Q[b,h,i,d] * K[b,h,j,d]` reads, for every (row, key) pair, a
row of K that every row of the block reads too. `key_tile` finds such a read in the score
of a one-pass nest: an access inside a nested reduction over `d` that reads the key index
`j` and `d` (each in one axis, with coefficient 1) and not the row index, the nested range
not depending on any index. The kernel (`codegen.cuda.attention.online`) then loads the tile's
`KEYS x len(d)` elements once into `ks_` (all threads, consecutive threads on consecutive
`d`: coalesced where `d` is the contiguous axis) and the scores read `ks_[j - j0_][d - start]`
instead: each element of K is read from global memory once per block instead of once per
row. A nested range longer than `DEPTH` (checked at run time) reads K as written; float64
accumulation never stages (the shared memory it would need is past the static limit).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import sympy

from codegen.cuda.dialect import CudaEmitter
from codegen.emit.emitter import Lines, block_lines
from codegen.emit.printer import TensorView
from codegen.ir.nest import LoopNest, Reduce, Term, extent_of, tensor_base

#: The longest nested range (attention's head dim) whose key tile is staged.
DEPTH = 128
#: The row length of `ks_`: odd, so the lanes of a row (reading keys `l, l + lanes, ...`)
#: read distinct banks.
PITCH = DEPTH + 1
#: The tensor name of the staged tile in the rewritten score (not a user's name: those
#: are identifiers without a trailing underscore).
STAGED = "KS_"
#: The origin of the key tile, a C variable of the kernel.
ORIGIN = sympy.Dummy("j0_", integer=True)


@dataclass(frozen=True)
class KeyTile:
    """The staged read: `access` inside the nested reduction `nested`."""

    access: sympy.Indexed
    nested: Reduce


def axis_with(access: sympy.Indexed, index: sympy.Symbol) -> int | None:
    """The one axis of `access` that reads `index`, with coefficient 1; else None."""
    axes = [n for n, x in enumerate(access.indices) if index in x.free_symbols]
    if len(axes) != 1:
        return None
    expr = sympy.expand(access.indices[axes[0]])
    return axes[0] if sympy.diff(expr, index) == 1 and expr.is_polynomial(index) else None


def key_tile(nest: LoopNest, row: sympy.Symbol, key: sympy.Symbol) -> KeyTile | None:
    """The read of the score (`nest.terms[0]`) to stage per key tile (module docstring),
    or None."""
    indices = {*nest.free_indices, key}
    for nested in sorted(nest.terms[0].body.atoms(Reduce), key=str):
        d = nested.index
        ends = (nested.start.free_symbols | nested.stop.free_symbols) - {ORIGIN}
        if any(extent_of(s) is None for s in ends if s.is_Symbol):
            continue
        for access in sorted(nested.body.atoms(sympy.Indexed), key=str):
            used = set().union(*(x.free_symbols for x in access.indices))
            if row in used or key not in used or d not in used:
                continue
            if not used <= indices | {d} | {s for s in used if extent_of(s) is not None}:
                continue
            key_axis, d_axis = axis_with(access, key), axis_with(access, d)
            if key_axis is None or d_axis is None or key_axis == d_axis:
                continue
            return KeyTile(access, nested)
    return None


def staged_term(term: Term, tile: KeyTile, key: sympy.Symbol) -> Term:
    """`term` with the staged read replaced by `KS_[key - j0_, d - start]`."""
    d = tile.nested.index
    staged = tensor_base(STAGED)[key - ORIGIN, d - tile.nested.start]
    nested = Reduce(
        tile.nested.reduction,
        tile.nested.body.xreplace({tile.access: staged}),
        d,
        tile.nested.start,
        tile.nested.stop,
    )
    return dataclasses.replace(term, body=term.body.xreplace({tile.nested: nested}))


def declarations(e: CudaEmitter, tile: KeyTile, keys: int) -> Lines:
    """The tile's row pitch and whether this call stages (`kst_`); registers the tile's
    view with the printer. The kernel declares the shared array (`shared_array`)."""
    e.printer.tensors[STAGED] = TensorView("ks_", ("kp_", None), "{}")
    length = e.idx(tile.nested.stop - tile.nested.start)
    return [
        f"const idx_t kp_ = {PITCH}, kd_ = {length};",
        f"const bool kst_ = kd_ >= 0 && kd_ <= {DEPTH};",
    ]


def tile_loop(
    rows: int | str, width: str, threads: int, names: tuple[str, str], body: Lines
) -> Lines:
    """The block's threads over a `rows x width` tile, consecutive threads on consecutive
    columns: `body` with the row and column `names` of each element. The row and column of
    a thread's next element are stepped from the last (`threads` is a multiple of the row
    and a remainder) instead of a division and a remainder by the run-time `width` per
    element, a dozen integer instructions or more each; nothing runs for a width of 0."""
    r, c = names
    step = [
        f"{c} += dc_;",
        f"const bool wrap_ = {c} >= {width};",
        f"{r} += dr_ + wrap_;",
        f"{c} -= wrap_ ? {width} : 0;",
    ]
    head = f"for (idx_t {r} = tid_ / {width}, {c} = tid_ % {width}; {r} < {rows};)"
    inner = [
        f"const idx_t dr_ = {threads} / {width}, dc_ = {threads} % {width};",
        *block_lines(head, [*body, *step]),
    ]
    return block_lines(f"if ({width} > 0)", inner)


def stage(e: CudaEmitter, tile: KeyTile, key: str, keys: int, threads: int) -> Lines:
    """The loads of the tile from `j0_`: `jn_` keys (zeros after them), `kd_` values of d."""
    d = e.printer.index(tile.nested.index)
    value = e.printer.doprint(e.hoist(tile.access))
    body = [
        f"const idx_t {key} = j0_ + c_;",
        f"const idx_t {d} = {e.idx(tile.nested.start)} + dd_;",
        f"ks_[c_*kp_ + dd_] = c_ < jn_ ? ({e.f})({value}) : ({e.f})0;",
    ]
    loop = tile_loop(keys, "kd_", threads, ("c_", "dd_"), body)
    return [*block_lines("if (kst_)", loop), "__syncthreads(); /* the scores read ks_ */"]


def shared_array(keys: int) -> tuple[str, str, tuple[int, ...]]:
    """The float tile `ks_` as (name, type, shape)."""
    return ("ks_", "float", (keys * PITCH,))
