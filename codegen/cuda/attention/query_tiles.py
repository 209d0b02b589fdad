"""The rows' operand of the online strategy's scores, staged in shared memory per row tile.

Attention's score `sum_d Q[b,h,i,d] * K[b,h,j,d]` reads, for every (row, key) pair, the
row's `Q[b,h,i,:]`: read as written, each element of Q is loaded from global memory once per
key. When the key tile stages K (`codegen.cuda.attention.key_tiles`), `query_tile` finds the read of
the same nested reduction that reads the row index `i` and `d` (each in one axis, with
coefficient 1) and not the key index; the kernel (`codegen.cuda.attention.online`) loads the block's
`rows x len(d)` elements once per row tile into `qs_` (consecutive threads on consecutive
`d`: coalesced where `d` is the contiguous axis), and the scores read
`qs_[i - i0_][d - start]`. Each element of Q is then read from global memory once.
A nested range longer than `DEPTH` (checked at run time) reads Q as written (a tile of
64 rows of 128 would add 33 KB to the block's shared memory).
"""

from __future__ import annotations

import dataclasses

import sympy

from codegen.cuda.attention import key_tiles
from codegen.cuda.attention.key_tiles import KeyTile, axis_with
from codegen.cuda.dialect import CudaEmitter
from codegen.emit.emitter import Lines, block_lines
from codegen.emit.printer import TensorView
from codegen.ir.nest import LoopNest, Reduce, Term, extent_of, tensor_base

#: The longest nested range (attention's head dim) whose row tile is staged.
DEPTH = 64
#: The row length of `qs_`: odd, so that the rows of a warp (each row's lanes read the same
#: element, a broadcast) read distinct banks.
PITCH = DEPTH + 1
#: The tensor name of the staged tile in the rewritten score.
STAGED = "QS_"
#: The first row of the block's row tile, a C variable of the kernel.
ORIGIN = sympy.Dummy("i0_", integer=True)


def query_tile(nest: LoopNest, row: sympy.Symbol, keys: KeyTile) -> sympy.Indexed | None:
    """The read of the staged key tile's nested reduction to stage per row tile (module
    docstring), or None."""
    d = keys.nested.index
    indices = {*nest.free_indices, d}
    for access in sorted(keys.nested.body.atoms(sympy.Indexed), key=str):
        used = set().union(*(x.free_symbols for x in access.indices))
        if access == keys.access or row not in used or d not in used:
            continue
        if not used <= indices | {s for s in used if extent_of(s) is not None}:
            continue
        row_axis, d_axis = axis_with(access, row), axis_with(access, d)
        if row_axis is not None and d_axis is not None and row_axis != d_axis:
            return access
    return None


def staged_term(term: Term, access: sympy.Indexed, keys: KeyTile, row: sympy.Symbol) -> Term:
    """`term` with `access` replaced by `QS_[row - i0_, d - start]`."""
    staged = tensor_base(STAGED)[row - ORIGIN, keys.nested.index - keys.nested.start]
    return dataclasses.replace(term, body=term.body.xreplace({access: staged}))


#: What the kernel calls the staged tiles' inner product of one (row, key) pair.
DOT = sympy.Dummy("sd_", real=True)


def dot_term(term: Term) -> Term | None:
    """`term` with its staged sum `sum_d QS_[...] * KS_[...]` replaced by `DOT`, or None when
    the score has no such sum (a product of the two staged reads alone)."""
    for nested in term.body.atoms(Reduce):
        if nested.reduction != "sum" or not isinstance(nested.body, sympy.Mul):
            continue
        factors = sorted(str(f.base) for f in nested.body.args if isinstance(f, sympy.Indexed))
        if len(nested.body.args) == 2 and factors == [key_tiles.STAGED, STAGED]:
            return dataclasses.replace(term, body=term.body.xreplace({nested: DOT}))
    return None


def declarations(e: CudaEmitter) -> Lines:
    """Whether this call stages the tile (`qst_`, with the key tile's `kst_` and length
    `kd_`); registers the tile's view with the printer. The kernel declares the shared
    array (`shared_array`)."""
    e.printer.tensors[STAGED] = TensorView("qs_", ("qp_", None), "{}")
    return [
        f"const idx_t qp_ = {PITCH};",
        f"const bool qst_ = kst_ && kd_ <= {DEPTH};",
    ]


def stage(e: CudaEmitter, access: sympy.Indexed, keys: KeyTile, row: str, stop: str) -> Lines:
    """The loads of the block's rows from `i0_` (zeros past `stop`), `kd_` values of d; the
    kernel's next barrier orders them before the scores."""
    rows, threads = e.schedule.rows, e.schedule.rows * e.schedule.cols
    d = e.printer.index(keys.nested.index)
    value = e.printer.doprint(e.hoist(access))
    body = [
        f"const idx_t {row} = i0_ + r0_;",
        f"const idx_t {d} = {e.idx(keys.nested.start)} + dd_;",
        f"qs_[r0_*qp_ + dd_] = {row} < {stop} ? ({e.f})({value}) : ({e.f})0;",
    ]
    loop = key_tiles.tile_loop(rows, "kd_", threads, ("r0_", "dd_"), body)
    return block_lines("if (qst_)", loop)


def shared_array(rows: int) -> tuple[str, str, tuple[int, ...]]:
    """The float tile `qs_` as (name, type, shape)."""
    return ("qs_", "float", (rows * PITCH,))
