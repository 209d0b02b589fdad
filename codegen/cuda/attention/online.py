"""The "online" and "weighted" strategies of the CUDA emitter: a logsumexp and its
softmax-weighted sum in one pass (`codegen.passes.online`), FlashAttention's forward as SIMT
code, for any nest of that form (the score is whatever the program computes: a dot
product, a bias, a mask); and the same kernel for a sum `O[r, c] = sum_k a(r, k) * b(k, c)`
whose weight `a` holds nested reductions (`codegen.cuda.layout.split_weighted`:
attention's gradient nests dQ, dK, dV), where `a` plays the score and `b` the weights.

One block computes `rows` (schedule field, 64; 32 with float64) consecutive values of the
row index (attention's query rows `i`) for one value of the outer free indices (batch,
head), with `cols` (4; 8 with float64) threads, the lanes, per row (the lanes of a row are
neighbours in one warp). The output columns (attention's `e`) are split among a row's lanes: lane
`l` owns the columns `l, l + lanes, ...` of a pass of `ONLINE_COLUMNS` (128) and keeps
their sums in registers; more columns take further passes over the keys. The block walks
the key range of its rows (the reduced index `j`) in tiles of `tile_k` (32) keys:

1. the weights of the tile (attention's `V[j, :]`, which do not read the row:
   `codegen.passes.online.pair`) are staged in shared memory `ws_[keys][128]` by all
   threads, consecutive threads loading consecutive columns (coalesced); the keys' read
   of the score (`K[j, d]`) too where it has that form (`key_tiles`), and once per row
   tile the rows' read of the same sum (`Q[i, d]`, `query_tiles`);
2. each lane computes the scores of every `lanes`-th key of the tile for its row into
   `ss_[rows][pitch]` (the whole score expression, nested sums included, in registers);
3. after a barrier, each lane reads its row's scores. Online: the tile's largest (NaN
   counted) updates the running max `m`; the running sum `s` and the lane's sums are
   rescaled by `exp(m - m')` once per tile; then `p = exp(score - m')` is added to `s`
   and `p * ws_[key][column]` to each owned column. Weighted: `score * ws_[key][column]`.

The arrays in shared memory (`shared_arrays`) are static up to 48 KB, else views of dynamic
shared memory the launch opts in to (float32 attention's forward: about 60 KB).

At the end `O = o / s` (0 for a row with no key in range, as a sum over nothing) and
`L = m + log s` (the logsumexp's own result) are written once, L by lane 0; a weighted
sum writes `o` (0 where a test of the column alone fails).

Masks that are constraints on the indices (`j <= i`, a sliding window `i - w <= j`, a key
range) are loop bounds of `j` per row (`codegen.ir.bounds`). The block's key range is the
union of its rows' ranges: tiles outside it are never visited (causal attention skips the
tiles above the diagonal); a tile inside every row's range computes its scores without a
test, and only the tiles on a boundary test each (row, key) pair; there, each warp weights
only the keys that one of its rows has in range (`spans.row_keys`). Data masks (a padding
mask `M[i, j]` of -inf, a bias) are part of the score and cost nothing more; a mask that
reads arrays and is the term's guard (`doc[b, i] == doc[b, j]`) is tested at each key
(`spans.guard_test`): a key it drops is left out, never weighted by 0. Every output
element is written by one block: no atomics.

`codegen.cuda.attention.tile_counts` counts, for concrete shapes, the tiles visited and skipped and
the FMAs executed (a warp's rows times the most keys one of them has in range, on each
visited tile, as SIMT lanes pay for them) against the useful ones (the pairs in range):
`explain` prints them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import sympy

from codegen.cuda.attention import key_tiles, pair_tiles, query_tiles, spans
from codegen.cuda.attention.scores import score_pitch, scores, tile_shape, variant
from codegen.cuda.dialect import CudaEmitter
from codegen.cuda.geometry import ONLINE_COLUMNS, GpuGeometry
from codegen.cuda.layout import split_paired, split_weighted
from codegen.cuda.staged import shared
from codegen.emit.emitter import Lines, block_lines
from codegen.emit.loop_order import term_order
from codegen.ir.nest import LoopNest, Term


def launch(
    e: CudaEmitter,
) -> tuple[tuple[sympy.Expr, sympy.Expr, sympy.Expr], tuple[int, int, int]]:
    """The grid (row tiles on x, the outer free indices flattened on y) and the block."""
    *outer, row, _ = e.schedule.free_order
    rows, lanes, _, _ = tile_shape(e)
    grid = (e.count([row], {row: rows}), e.count(outer, {}), sympy.Integer(1))
    return grid, (rows * lanes, 1, 1)


def shared_arrays(nest: LoopNest, schedule: GpuGeometry, f: str) -> tuple[shared.Array, ...]:
    """The kernel's shared arrays (`codegen.cuda.staged.shared`) for accumulation type `f`."""
    rows, lanes, keys = schedule.rows, schedule.cols, schedule.tile_k
    paired = split_paired(nest) is not None  # a pair's second weights: `ss2_`
    arrays: list[shared.Array] = [("ws_", f, (keys, pair_tiles.pitch(paired)))]
    arrays.append(("ss_", f, (rows, score_pitch(keys, lanes))))
    if paired:
        arrays.append(("ss2_", f, (rows, score_pitch(keys, lanes))))
    staged = staged_keys(nest, schedule) if f == "float" else None
    if staged is not None:
        arrays.append(key_tiles.shared_array(keys))
        if staged_queries(nest, schedule, staged) is not None:
            arrays.append(query_tiles.shared_array(rows))
    arrays += [("rlo_", "idx_t", (rows,)), ("rhi_", "idx_t", (rows,))]
    arrays.append(("rany_", "int", (rows * lanes,)))
    return shared.widest_first(arrays, schedule.index_type)


def shared_bytes(nest: LoopNest, schedule: GpuGeometry, f: str) -> int:
    """Bytes of shared memory the kernel of `nest` declares (accumulation type `f`)."""
    return sum(shared.sizes(shared_arrays(nest, schedule, f), schedule.index_type))


def staged_keys(nest: LoopNest, schedule: GpuGeometry) -> key_tiles.KeyTile | None:
    """The score's read staged per key tile (`codegen.cuda.attention.key_tiles`; float accumulation
    only), if any."""
    by_name = {s.name: s for s in nest.free_indices}
    key = term_order(nest, schedule, 0)[-1]
    view = dataclasses.replace(nest, terms=scores_and_weights(nest))
    if pair_tiles.staged_term(view, key) is not None:  # a pair reads them from `ws_`
        return None
    return key_tiles.key_tile(view, by_name[schedule.free_order[-2]], key)


def staged_queries(
    nest: LoopNest, schedule: GpuGeometry, keys: key_tiles.KeyTile
) -> sympy.Indexed | None:
    """The read of the score's staged nested reduction staged per row tile
    (`codegen.cuda.attention.query_tiles`), if any: one-pass nests only (with it, the weighted
    kernels of attention's gradient need more than their 128 registers and spill)."""
    if not nest.online:
        return None
    by_name = {s.name: s for s in nest.free_indices}
    view = dataclasses.replace(nest, terms=scores_and_weights(nest))
    return query_tiles.query_tile(view, by_name[schedule.free_order[-2]], keys)


def scores_and_weights(nest: LoopNest) -> tuple[Term, Term]:
    """The kernel's two terms over the keys: a one-pass nest's own (scores, weights), or a
    weighted sum's `a` and `b` (`codegen.cuda.layout.split_weighted`)."""
    if len(nest.terms) == 2:
        return nest.terms[0], nest.terms[1]
    paired = split_paired(nest)
    if paired is not None:  # two members (`codegen.cuda.attention.paired`): both weights, a tuple
        (term,) = nest.terms
        b = sympy.Piecewise(
            (paired.values[0], sympy.StrictLessThan(nest.free[-1].index, paired.split)),
            (paired.values[1], True),
        )
        a = dataclasses.replace(term, body=sympy.Tuple(*paired.weights))
        return a, dataclasses.replace(term, body=b)
    split = split_weighted(nest)
    assert split is not None, "the weighted strategy needs split_weighted"
    (term,) = nest.terms
    # Tests of the column alone are the store's (`column_tests`), not each pair's.
    kept = tuple(c for c in term.constraints if c not in column_tests(nest))
    a, b = (dataclasses.replace(term, body=x, constraints=kept) for x in split)
    return a, b


def column_tests(nest: LoopNest) -> tuple[sympy.Expr, ...]:
    """A weighted sum's constraints on the free indices alone that read its column (each
    `c >= 0`): where one fails, the column's sum is 0."""
    if nest.online or len(nest.terms) != 1:
        return ()
    column, reduced = nest.free[-1].index, set(nest.terms[0].reduced_indices)
    return tuple(
        c
        for c in nest.terms[0].constraints
        if column in c.free_symbols and not c.free_symbols & reduced
    )


def online(e: CudaEmitter) -> Lines:
    """The whole kernel body of a one-pass nest or a weighted sum (module docstring)."""
    order = e.schedule.reduced_order
    both = dataclasses.replace(e.schedule, reduced_order=(order[0], order[0]))
    by_column = column_tests(e.nest)
    # On `e`, not the variant below: the launch reads its dynamic shared memory.
    arrays = shared.declare(e, shared_arrays(e.nest, e.schedule, e.f))
    e = variant(e, scores_and_weights(e.nest), both)
    f = e.f
    R, P, K, M = tile_shape(e)
    *outer_names, row_name, packed_name = e.schedule.free_order
    rows, packed = e.free_range(row_name), e.free_range(packed_name)
    i, k = e.printer.index(rows.index), e.printer.index(packed.index)
    j_symbol = e.term_order(0)[-1]
    j = e.printer.index(j_symbol)
    bounds = e.bounds[0]
    lo, hi = e.idx(bounds.starts[j_symbol]), e.idx(bounds.stops[j_symbol])
    tests = " && ".join(["valid_", *(f"{e.idx(t)} >= 0" for t in bounds.free_tests)])
    first = e.idx(packed.start)
    ntiles = e.idx(e.count([row_name], {row_name: R}))
    nouter = e.idx(e.count(outer_names, {}))
    staged = staged_keys(e.nest, e.schedule) if f == "float" else None
    declared = key_tiles.declarations(e, staged, K) if staged else []
    weights = pair_tiles.staged_term(e.nest, j_symbol)
    if weights is not None:  # a pair's scores read `ws_` where it holds their reads
        ready = [f"{e.idx(c)} >= 0" for c in weights[1] if not (c.is_number and c >= 0)]
        declared.append(f"const bool wst_ = {' && '.join(ready or ['true'])};")
    query = staged_queries(e.nest, e.schedule, staged) if staged else None
    tile = [f"const idx_t i0_ = {e.idx(rows.start)} + bx_*{R};"]
    if query is not None:
        declared += query_tiles.declarations(e)
        tile += query_tiles.stage(e, query, staged, i, e.idx(rows.stop))  # type: ignore[arg-type]
    tile += [
        f"const idx_t {i} = i0_ + r_;",
        f"const bool valid_ = {i} < {e.idx(rows.stop)};",
        "idx_t lo_ = 0, hi_ = 0;",
        *block_lines(f"if ({tests})", [f"lo_ = {lo};", f"hi_ = {hi};"]),
        "const bool live_ = hi_ > lo_;",
        *block_lines("if (ln_ == 0)", ["rlo_[r_] = lo_;", "rhi_[r_] = hi_;"]),
        "__syncthreads();",
        *spans.block_range(R),
        *spans.warp_range(P),
    ]
    columns = [
        f"const idx_t ne_ = tdsl_imin({ONLINE_COLUMNS}, nc_ - cb_);",
        f"{f} m_ = -INFINITY, s_ = 0, o_[{M}];",
        "#pragma unroll",
        f"for (int q_ = 0; q_ < {M}; ++q_) o_[q_] = 0;",
        "int any_ = 0;",
        *block_lines(
            f"for (idx_t j0_ = blo_; j0_ < bhi_; j0_ += {K})",
            [
                f"const bool full_ = j0_ >= flo_ && j0_ + {K} <= fhi_;",
                f"const idx_t jn_ = tdsl_imin({K}, bhi_ - j0_);",
                *_stage_weights(e, j, k, first),
                *(key_tiles.stage(e, staged, j, K, R * P) if staged else []),
                *(["__syncthreads(); /* the scores read ws_ */"] if weights else []),
                *scores(e, j, staged, query),
                "__syncthreads();",
                *block_lines("if (live_)", _fold(e) if e.nest.online else _add(e)),
                "__syncthreads();",
            ],
        ),
        *(_store(e, k, first) if e.nest.online else _store_sums(e, k, first, by_column)),
    ]
    # Columns past a block's registers: the keys walked again for each 128 (weighted sums).
    head = f"for (idx_t cb_ = 0; cb_ == 0 || cb_ < nc_; cb_ += {ONLINE_COLUMNS})"
    tile += block_lines(head, columns)
    # Without it, a block with no key in range passes no barrier before its threads write
    # the next row tile's rlo_/rhi_ while others still read this one's.
    tile.append("__syncthreads(); /* rlo_, rhi_ are rewritten for the next row tile */")
    decode = e.decode("bz_", outer_names, {}) if outer_names else []
    loops = block_lines(f"for (idx_t bx_ = blockIdx.x; bx_ < {ntiles}; bx_ += gridDim.x)", tile)
    loops = block_lines(
        f"for (idx_t bz_ = blockIdx.y; bz_ < {nouter}; bz_ += gridDim.y)", [*decode, *loops]
    )
    return [
        *arrays,
        f"const int tid_ = threadIdx.x, r_ = tid_ / {P}, ln_ = tid_ % {P};",
        f"const idx_t nc_ = {e.idx(packed.stop - packed.start - (1 if e.nest.online else 0))};",
        *declared,
        *loops,
    ]


def _stage_weights(e: CudaEmitter, j: str, k: str, first: str) -> Lines:
    """`ws_[c][col]` = the weight at key `j0_ + c` and column `col` (0 past the tile's keys),
    consecutive threads on consecutive columns."""
    rows, lanes, keys, _ = tile_shape(e)
    weight = e.printer.doprint(e.hoist(e.nest.terms[1].body))
    body = [
        f"const idx_t {j} = j0_ + c_;",
        f"const idx_t {k} = {first} + cb_ + kk_;",
        f"ws_[c_][kk_] = c_ < jn_ ? ({e.f})({weight}) : ({e.f})0;",
    ]
    return key_tiles.tile_loop(keys, "ne_", rows * lanes, ("c_", "kk_"), body)


def _fold(e: CudaEmitter) -> Lines:
    """The row's running max, sum and the lane's weighted sums updated for the tile."""
    f, exp = e.f, e.exp
    _, lanes, _, owned = tile_shape(e)
    columns = [f"const idx_t kk_ = ln_ + {lanes}*q_;", _weighted_column(e)]
    weights = [
        *spans.guarded_key(e),
        f"const {f} p_ = {exp}(ss_[r_][c_] - mn_);",
        "s_ += p_;",
        *e.fma_hook(),
        "#pragma unroll",
        *block_lines(f"for (int q_ = 0; q_ < {owned}; ++q_)", columns),
    ]
    return [
        spans.row_keys(),
        f"{f} cm_ = -INFINITY;",
        *block_lines(
            "for (idx_t c_ = c0_; c_ < c1_; ++c_)",
            [f"const {f} v_ = ss_[r_][c_];", "cm_ = (v_ > cm_ || v_ != v_) ? v_ : cm_;"],
        ),
        f"const {f} mn_ = (cm_ > m_ || cm_ != cm_) ? cm_ : m_;",
        f"const {f} sc_ = mn_ != -INFINITY ? {exp}(m_ - mn_) : 1;",
        *block_lines(
            "if (sc_ != 1)",
            [
                "s_ *= sc_;",
                "#pragma unroll",
                f"for (int q_ = 0; q_ < {owned}; ++q_) o_[q_] *= sc_;",
            ],
        ),
        "m_ = mn_;",
        *block_lines(
            "if (mn_ != -INFINITY)", block_lines("for (idx_t c_ = c0_; c_ < c1_; ++c_)", weights)
        ),
    ]


def _split(e: CudaEmitter) -> sympy.Expr | None:
    """The first packed column of a pair's second member (the kernel's terms are
    `scores_and_weights`: a tuple of two weights), else None."""
    if not isinstance(e.nest.terms[0].body, sympy.Tuple):
        return None
    (_, test), _ = e.nest.terms[1].body.args
    return test.rhs


def _weighted_column(e: CudaEmitter) -> str:
    """An owned column's sum plus the key's weight times its staged value (a pair's second
    member's columns, from `C1` on, its own weight `p2_`) where the key is in the row's range
    (out of it, on a boundary tile, the weight is 0, and 0 times NaN or inf is NaN)."""
    update = "o_[q_] += p_*ws_[c_][kk_];"
    split = _split(e)
    if split is not None:
        update = f"o_[q_] += (cb_ + kk_ < {e.idx(split)} ? p_ : p2_)*ws_[c_][kk_];"
    if e.count_fmas:
        update = f"{{ {update} {' '.join(e.fma_hook())} }}"
    kept = spans.guard_test(e)
    return f"if (kk_ < ne_ && (full_ || (j0_ + c_ >= lo_ && j0_ + c_ < hi_)){kept}) {update}"


def _store(e: CudaEmitter, k: str, first: str) -> Lines:
    """`O = o / s` (0 where no key was in range) by each lane for its columns, `L` by lane 0."""
    result = e.fmt(e.reducer.result, ("m_", "s_"))
    _, lanes, _, owned = tile_shape(e)
    columns = [
        f"const idx_t kk_ = ln_ + {lanes}*q_;",
        *block_lines(
            "if (kk_ < ne_)",
            [
                f"const idx_t {k} = {first} + cb_ + kk_;",
                f"out_[{e.out_offset()}] = {e.store('anyr_ ? o_[q_]/s_ : 0')};",
            ],
        ),
    ]
    lse = [f"const idx_t {k} = {first} + nc_;", f"out_[{e.out_offset()}] = {e.store(result)};"]
    return [
        "rany_[tid_] = any_;",
        "__syncthreads();",
        "int anyr_ = 0;",
        f"for (int q_ = 0; q_ < {lanes}; ++q_) anyr_ |= rany_[r_*{lanes} + q_];",
        "__syncthreads(); /* rany_ is rewritten by the next pass */",
        *block_lines(
            "if (valid_)",
            [
                "#pragma unroll",
                *block_lines(f"for (int q_ = 0; q_ < {owned}; ++q_)", columns),
                *block_lines("if (ln_ == 0)", lse),
            ],
        ),
    ]


def _add(e: CudaEmitter) -> Lines:
    """A weighted sum: the lane's sums plus each key's weight times its staged row."""
    _, lanes, _, owned = tile_shape(e)
    columns = [f"const idx_t kk_ = ln_ + {lanes}*q_;", _weighted_column(e)]
    weights = [
        *spans.guarded_key(e),
        f"const {e.f} p_ = ss_[r_][c_];",
        *([f"const {e.f} p2_ = ss2_[r_][c_];"] if _split(e) is not None else []),
        "#pragma unroll",
        *block_lines(f"for (int q_ = 0; q_ < {owned}; ++q_)", columns),
    ]
    return [spans.row_keys(), *block_lines("for (idx_t c_ = c0_; c_ < c1_; ++c_)", weights)]


def _store_sums(e: CudaEmitter, k: str, first: str, tests: Sequence[sympy.Expr]) -> Lines:
    """A weighted sum's columns, each by the lane that owns it (0 where a test on the free
    indices that reads the column fails: the term contributes nothing there)."""
    value = "o_[q_]"
    if tests:
        value = f"({' && '.join(f'{e.idx(t)} >= 0' for t in tests)} ? o_[q_] : 0)"
    _, lanes, _, owned = tile_shape(e)
    columns = [
        f"const idx_t kk_ = ln_ + {lanes}*q_;",
        *block_lines(
            "if (kk_ < ne_)",
            [f"const idx_t {k} = {first} + cb_ + kk_;", e.store_line("", value)],
        ),
    ]
    loop = block_lines(f"for (int q_ = 0; q_ < {owned}; ++q_)", columns)
    return block_lines("if (valid_)", ["#pragma unroll", *loop])


__all__ = [
    "launch",
    "online",
    "scores_and_weights",
    "shared_arrays",
    "shared_bytes",
    "staged_keys",
]
