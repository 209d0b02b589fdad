"""Which keys of a tile the one-pass kernel (`codegen.cuda.attention.online`) weights: the
block's and the warp's key ranges from its rows' loop bounds, and the test of a guard that is
not a loop bound (an array mask) at each key."""

from __future__ import annotations

import sympy

from codegen.cuda.dialect import CudaEmitter
from codegen.emit.emitter import Lines, block_lines


def block_range(rows: int) -> Lines:
    """The union `[blo_, bhi_)` of the block's live rows' key ranges, and their intersection
    `[flo_, fhi_)`: a tile inside it needs no test per pair."""
    return [
        "idx_t blo_ = 0, bhi_ = 0, flo_ = 0, fhi_ = 0;",
        "bool seen_ = false;",
        # Kept rolled: unrolled over 64 rows, ptxas (sm_90) spilled attention's dV kernel.
        "#pragma unroll 1",
        *block_lines(
            f"for (int q_ = 0; q_ < {rows}; ++q_)",
            [
                "if (rhi_[q_] <= rlo_[q_]) continue;",
                *block_lines(
                    "if (!seen_)",
                    ["blo_ = flo_ = rlo_[q_];", "bhi_ = fhi_ = rhi_[q_];", "seen_ = true;"],
                ),
                "blo_ = tdsl_imin(blo_, rlo_[q_]); bhi_ = tdsl_imax(bhi_, rhi_[q_]);",
                "flo_ = tdsl_imax(flo_, rlo_[q_]); fhi_ = tdsl_imin(fhi_, rhi_[q_]);",
            ],
        ),
    ]


def warp_range(lanes: int) -> Lines:
    """The union `[wlo_, whi_)` of the key ranges of the live rows of the thread's warp
    (`32 / lanes` consecutive rows)."""
    rows = 32 // lanes
    first = f"r_ / {rows} * {rows}"
    union = [
        "if (rhi_[q_] <= rlo_[q_]) continue;",
        "wlo_ = wseen_ ? tdsl_imin(wlo_, rlo_[q_]) : rlo_[q_];",
        "whi_ = wseen_ ? tdsl_imax(whi_, rhi_[q_]) : rhi_[q_];",
        "wseen_ = true;",
    ]
    head = f"for (int q_ = {first}; q_ < {first} + {rows}; ++q_)"
    return ["idx_t wlo_ = 0, whi_ = 0;", "bool wseen_ = false;", *block_lines(head, union)]


def row_keys() -> str:
    """The keys `[c0_, c1_)` of the tile in the range of the warp's rows: the other keys'
    scores are the reduction's identity (-inf, or 0 in a weighted sum) for every row of the
    warp and add nothing, so the warps off a 64-row tile's causal diagonal skip them instead
    of weighting each by 0. Per warp, not per row: the rows of a warp walk the same keys
    together and read each `ss_` and `ws_` column at once, without bank conflicts."""
    return "const idx_t c0_ = tdsl_imax(0, wlo_ - j0_), c1_ = tdsl_imin(jn_, whi_ - j0_);"


def guard_test(e: CudaEmitter) -> str:
    """` && (guard)` for a term with a guard that is not a loop bound (an array mask:
    `doc[b, i] == doc[b, j]`, `codegen.passes.guards.guard_mask`; its key is `guarded_key`),
    else "": a key the guard drops is left out, not weighted by 0 (0 times a NaN or inf
    there is NaN)."""
    guard = e.nest.terms[0].guard
    return "" if guard == sympy.true else f" && ({e.printer.doprint(guard)})"


def guarded_key(e: CudaEmitter) -> Lines:
    """The key index of tile column `c_`, declared where a guard reads it (`guard_test`)."""
    if e.nest.terms[0].guard == sympy.true:
        return []
    return [f"const idx_t {e.printer.index(e.term_order(0)[-1])} = j0_ + c_;"]
