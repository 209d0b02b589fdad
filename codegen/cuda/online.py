"""The "online" strategy of the CUDA emitter: a logsumexp and its softmax-weighted sum in one
pass (`codegen.passes.online`), FlashAttention's forward as SIMT code, for any nest of that
form (the score is whatever the program computes: a dot product, a bias, a mask).

One block computes `ROWS` consecutive values of the row index (attention's query rows `i`)
for one value of the outer free indices (batch, head), with `LANES` threads per row
(`ROWS * LANES` threads; the lanes of a row are neighbours in one warp). The packed output
axis (attention's `e`, at most `COLUMNS` values) is split among a row's lanes: lane `l`
owns the columns `l, l + LANES, ...` and keeps their weighted sums in registers. The
block walks the key range of its rows (the reduced index `j`) in tiles of `KEYS` keys:

1. the weights of the tile (attention's `V[j, :]`, which do not read the row:
   `codegen.passes.online.pair`) are staged in shared memory `ws_[KEYS][COLUMNS]` by all
   threads, consecutive threads loading consecutive columns (coalesced);
2. each lane computes the scores of every `LANES`-th key of the tile for its row into
   `ss_[ROWS][KEYS + 1]` (the whole score expression, nested sums included, in registers);
3. after a barrier, each lane reads its row's scores: the tile's largest (NaN counted)
   updates the running max `m`; the running sum `s` and the lane's weighted sums are
   rescaled by `exp(m - m')` once per tile; then `p = exp(score - m')` is added to `s`
   and `p * ws_[key][column]` to each owned column.

At the end `O = o / s` (0 for a row with no key in range, as a sum over nothing) and
`L = m + log s` (the logsumexp's own result) are written once, L by lane 0.

Masks that are constraints on the indices (`j <= i`, a sliding window `i - w <= j`, a key
range) are loop bounds of `j` per row (`codegen.ir.bounds`). The block's key range is the
union of its rows' ranges: tiles outside it are never visited (causal attention skips the
tiles above the diagonal); a tile inside every row's range computes its scores without a
test, and only the tiles on a boundary test each (row, key) pair. Data masks (a padding
mask `M[i, j]` of -inf, a bias) are part of the score and cost nothing more.

`tile_counts` counts, for concrete shapes, the tiles visited and skipped and the score
evaluations executed (every pair of a visited tile, as SIMT lanes pay for them) against
the useful ones (the pairs in range): `explain` prints them.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.cuda import key_tiles
from codegen.cuda.dialect import CudaEmitter
from codegen.cuda.schedule import ONLINE_COLUMNS, GpuSchedule, choose_gpu_schedule
from codegen.cuda.smem import BANKS
from codegen.emit.emitter import Lines, block_lines, indent_lines
from codegen.emit.loop_order import term_order
from codegen.ir.bounds import loop_bounds
from codegen.ir.extents import extent_values
from codegen.ir.nest import LoopNest, Reduce


def _tile(e: CudaEmitter) -> tuple[int, int, int, int]:
    """(rows, lanes, keys, owned columns per thread) of the emitter's schedule."""
    s = e.schedule
    return s.rows, s.cols, s.tile_k, ONLINE_COLUMNS // s.cols


def launch(
    e: CudaEmitter,
) -> tuple[tuple[sympy.Expr, sympy.Expr, sympy.Expr], tuple[int, int, int]]:
    """The grid (row tiles on x, the outer free indices flattened on y) and the block."""
    *outer, row, _ = e.schedule.free_order
    rows, lanes, _, _ = _tile(e)
    grid = (e.count([row], {row: rows}), e.count(outer, {}), sympy.Integer(1))
    return grid, (rows * lanes, 1, 1)


def shared_bytes(nest: LoopNest, schedule: GpuSchedule, f: str) -> int:
    """Bytes of shared memory the kernel of `nest` declares (accumulation type `f`)."""
    rows, lanes, keys = schedule.rows, schedule.cols, schedule.tile_k
    size = 8 if f == "double" else 4
    index = 8 if schedule.index_type == "int64" else 4
    staged = keys * ONLINE_COLUMNS + rows * score_pitch(keys, lanes)
    found = (staged * size + 2 * rows * index + rows * lanes * 4,)
    if f == "float" and staged_keys(nest, schedule) is not None:
        found += (key_tiles.shared_bytes(keys),)
    return sum(found)


def staged_keys(nest: LoopNest, schedule: GpuSchedule) -> key_tiles.KeyTile | None:
    """The score's read staged per key tile (`codegen.cuda.key_tiles`; float accumulation
    only), if any."""
    by_name = {s.name: s for s in nest.free_indices}
    key = term_order(nest, schedule, 0)[-1]
    return key_tiles.key_tile(nest, by_name[schedule.free_order[-2]], key)


def score_pitch(keys: int, lanes: int) -> int:
    """The row length of `ss_`: the first from `keys` on at which a warp's stores (thread
    `t` writes row `t / lanes`, key `t % lanes` and every `lanes`-th after it) and its
    reads (each row's lanes read one key) meet no bank conflict.

    >>> score_pitch(32, 4), score_pitch(16, 1)
    (36, 17)
    """
    rows = BANKS // lanes
    for pitch in range(keys, keys + BANKS + 1):
        banks = {(r * pitch + n) % BANKS for r in range(rows) for n in range(lanes)}
        if len(banks) == rows * lanes:
            return pitch
    return keys + 1


def online(e: CudaEmitter) -> Lines:
    """The whole kernel body of a one-pass nest (module docstring)."""
    f = e.f
    R, P, K, M = _tile(e)
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
    tile = [
        f"const idx_t {i} = {e.idx(rows.start)} + bx_*{R} + r_;",
        f"const bool valid_ = {i} < {e.idx(rows.stop)};",
        "idx_t lo_ = 0, hi_ = 0;",
        *block_lines(f"if ({tests})", [f"lo_ = {lo};", f"hi_ = {hi};"]),
        "const bool live_ = hi_ > lo_;",
        *block_lines("if (ln_ == 0)", ["rlo_[r_] = lo_;", "rhi_[r_] = hi_;"]),
        "__syncthreads();",
        *_block_range(R),
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
                *_scores(e, j, staged),
                "__syncthreads();",
                *block_lines("if (live_)", _fold(e)),
                "__syncthreads();",
            ],
        ),
        *_store(e, k, first),
    ]
    decode = e.decode("bz_", outer_names, {}) if outer_names else []
    loops = block_lines(f"for (idx_t bx_ = blockIdx.x; bx_ < {ntiles}; bx_ += gridDim.x)", tile)
    loops = block_lines(
        f"for (idx_t bz_ = blockIdx.y; bz_ < {nouter}; bz_ += gridDim.y)", [*decode, *loops]
    )
    return [
        f"__shared__ {f} ws_[{K}][{ONLINE_COLUMNS}];",
        f"__shared__ {f} ss_[{R}][{score_pitch(K, P)}];",
        f"__shared__ idx_t rlo_[{R}], rhi_[{R}];",
        f"__shared__ int rany_[{R * P}];",
        f"const int tid_ = threadIdx.x, r_ = tid_ / {P}, ln_ = tid_ % {P};",
        f"const idx_t ne_ = {e.idx(packed.stop - 1 - packed.start)};",
        *declared,
        *loops,
    ]


def _block_range(rows: int) -> Lines:
    """The union `[blo_, bhi_)` of the block's live rows' key ranges, and their intersection
    `[flo_, fhi_)`: a tile inside it needs no test per pair."""
    return [
        "idx_t blo_ = 0, bhi_ = 0, flo_ = 0, fhi_ = 0;",
        "bool seen_ = false;",
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


def _stage_weights(e: CudaEmitter, j: str, k: str, first: str) -> Lines:
    """`ws_[c][col]` = the weight at key `j0_ + c` and column `col` (0 past the tile's keys),
    consecutive threads on consecutive columns."""
    rows, lanes, keys, _ = _tile(e)
    weight = e.printer.doprint(e.hoist(e.nest.terms[1].body))
    body = [
        "const idx_t c_ = t_ / ne_, kk_ = t_ % ne_;",
        f"const idx_t {j} = j0_ + c_;",
        f"const idx_t {k} = {first} + kk_;",
        f"ws_[c_][kk_] = c_ < jn_ ? ({e.f})({weight}) : ({e.f})0;",
    ]
    head = f"for (idx_t t_ = tid_; t_ < {keys}*ne_; t_ += {rows * lanes})"
    return block_lines(head, body)


def _element(e: CudaEmitter) -> Lines:
    """The score of the pair (`v_`), the term's tests around it."""
    plan = e.plan(0, [e.reduced_levels(0)[-1]])
    value = e.printer.doprint(plan.value)
    return e.level_lines(plan, 0, [f"v_ = {value};", "any_ = 1;"])


def _scores(e: CudaEmitter, j: str, staged: key_tiles.KeyTile | None) -> Lines:
    """Each lane's keys of the tile: the score where the pair is in range, else -inf (from
    the staged key tile where this call stages it)."""
    _, lanes, keys, _ = _tile(e)
    element = _element(e)
    if staged is not None:
        key = e.term_order(0)[-1]
        terms = (key_tiles.staged_term(e.nest.terms[0], staged, key), e.nest.terms[1])
        fast = indent_lines(_element(e.variant(terms=terms)))
        element = ["if (kst_) {", *fast, "} else {", *indent_lines(element), "}"]
    body = [
        f"const idx_t {j} = j0_ + c_;",
        f"{e.f} v_ = -INFINITY;",
        *block_lines(f"if (live_ && c_ < jn_ && (full_ || ({j} >= lo_ && {j} < hi_)))", element),
        "ss_[r_][c_] = v_;",
    ]
    return block_lines(f"for (int c_ = ln_; c_ < {keys}; c_ += {lanes})", body)


def _fold(e: CudaEmitter) -> Lines:
    """The row's running max, sum and the lane's weighted sums updated for the tile."""
    f, exp = e.f, e.exp
    _, lanes, _, owned = _tile(e)
    columns = [
        f"const idx_t kk_ = ln_ + {lanes}*q_;",
        "if (kk_ < ne_) o_[q_] += p_*ws_[c_][kk_];",
    ]
    weights = [
        f"const {f} p_ = {exp}(ss_[r_][c_] - mn_);",
        "s_ += p_;",
        "#pragma unroll",
        *block_lines(f"for (int q_ = 0; q_ < {owned}; ++q_)", columns),
    ]
    return [
        f"{f} cm_ = -INFINITY;",
        *block_lines(
            "for (int c_ = 0; c_ < jn_; ++c_)",
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
            "if (mn_ != -INFINITY)", block_lines("for (int c_ = 0; c_ < jn_; ++c_)", weights)
        ),
    ]


def _store(e: CudaEmitter, k: str, first: str) -> Lines:
    """`O = o / s` (0 where no key was in range) by each lane for its columns, `L` by lane 0."""
    result = e.fmt(e.reducer.result, ("m_", "s_"))
    _, lanes, _, owned = _tile(e)
    columns = [
        f"const idx_t kk_ = ln_ + {lanes}*q_;",
        *block_lines(
            "if (kk_ < ne_)",
            [
                f"const idx_t {k} = {first} + kk_;",
                f"out_[{e.out_offset()}] = {e.store('anyr_ ? o_[q_]/s_ : 0')};",
            ],
        ),
    ]
    lse = [f"const idx_t {k} = {first} + ne_;", f"out_[{e.out_offset()}] = {e.store(result)};"]
    return [
        "rany_[tid_] = any_;",
        "__syncthreads();",
        "int anyr_ = 0;",
        f"for (int q_ = 0; q_ < {lanes}; ++q_) anyr_ |= rany_[r_*{lanes} + q_];",
        *block_lines(
            "if (valid_)",
            [
                "#pragma unroll",
                *block_lines(f"for (int q_ = 0; q_ < {owned}; ++q_)", columns),
                *block_lines("if (ln_ == 0)", lse),
            ],
        ),
    ]


@dataclass(frozen=True)
class TileCounts:
    """What the online kernel does for concrete shapes (`tile_counts`)."""

    blocks: int  # row tiles times outer values
    tiles: int  # key tiles of the whole key range, over every block
    visited: int  # key tiles a block walks (the rest are skipped)
    boundary: int  # visited tiles that test each pair
    executed_pairs: int  # (row, key) pairs of visited tiles, valid rows only
    useful_pairs: int  # pairs in range
    score_fmas: int  # FMAs of one score (the nested sums' lengths), at least 1
    columns: int  # packed columns less the logsumexp: FMAs of one weighted-sum update

    @property
    def skipped(self) -> int:
        return self.tiles - self.visited

    @property
    def executed_fmas(self) -> int:
        return self.executed_pairs * (self.score_fmas + self.columns)

    @property
    def useful_fmas(self) -> int:
        return self.useful_pairs * (self.score_fmas + self.columns)

    @property
    def ratio(self) -> float:
        return self.executed_fmas / self.useful_fmas if self.useful_fmas else 1.0


def _nested_length(body: sympy.Expr, extents: Mapping[sympy.Symbol, int]) -> int:
    """The FMAs of one evaluation of `body`: the product of its nested sums' lengths (those
    that depend on no index), summed over the nested sums; at least 1."""
    total = 0
    for nested in body.atoms(Reduce):
        length = sympy.sympify((nested.stop - nested.start).xreplace(extents))
        if length.is_Integer:
            total += max(int(length), 0) * _nested_length(nested.body, extents)
    return max(total, 1)


def tile_counts(
    nest: LoopNest, shapes: Mapping[str, Sequence[int]], schedule: GpuSchedule | None = None
) -> TileCounts:
    """Tiles visited and skipped, and score evaluations executed and useful, of the online
    kernel of the one-pass `nest` for `shapes` (every tensor the nest names) under
    `schedule` (the heuristic's by default)."""
    extents = extent_values(nest, shapes)
    order = schedule or choose_gpu_schedule(nest)
    tile_rows, tile_keys = order.rows, order.tile_k
    *outer, row, packed = (
        next(r for r in nest.free if r.index.name == n) for n in order.free_order
    )
    j_symbol = term_order(nest, order, 0)[-1]
    bounds = loop_bounds(nest.terms[0], (j_symbol,))
    free_symbols = [r.index for r in (*outer, row)]
    exprs = (bounds.starts[j_symbol], bounds.stops[j_symbol], *bounds.free_tests)
    functions = [sympy.lambdify(free_symbols, x.xreplace(extents), "math") for x in exprs]

    def value(r: object) -> int:
        return int(sympy.sympify(sympy.sympify(r).xreplace(extents)))

    outer_values = [range(value(r.start), value(r.stop)) for r in outer]
    rows = range(value(row.start), value(row.stop))
    key_range = nest.terms[0].reduced[0]
    keys = max(value(key_range.stop) - value(key_range.start), 0)
    depends = {s for x in exprs for s in x.free_symbols} & {r.index for r in outer}
    blocks = visited = boundary = executed = useful = 0
    for point in _points(outer_values if depends else [range(1) for _ in outer]):
        for start in range(rows.start, rows.stop, tile_rows):
            ranges = []
            for i in range(start, min(start + tile_rows, rows.stop)):
                lo, hi, *tests = (int(fn(*point, i)) for fn in functions)
                if all(t >= 0 for t in tests) and hi > lo:
                    ranges.append((lo, hi))
            blocks += 1
            if not ranges:
                continue
            blo, bhi = min(lo for lo, _ in ranges), max(hi for _, hi in ranges)
            flo, fhi = max(lo for lo, _ in ranges), min(hi for _, hi in ranges)
            for j0 in range(blo, bhi, tile_keys):
                visited += 1
                boundary += not (j0 >= flo and j0 + tile_keys <= fhi)
                executed += min(tile_rows, rows.stop - start) * min(tile_keys, bhi - j0)
            useful += sum(hi - lo for lo, hi in ranges)
    copies = 1 if depends else math.prod(len(r) for r in outer_values)
    tiles = blocks * -(-keys // tile_keys)
    body = nest.terms[0].body
    return TileCounts(
        blocks * copies,
        tiles * copies,
        visited * copies,
        boundary * copies,
        executed * copies,
        useful * copies,
        _nested_length(body, extents),
        max(value(packed.stop) - value(packed.start) - 1, 0),
    )


def _points(ranges: Sequence[range]) -> list[tuple[int, ...]]:
    points: list[tuple[int, ...]] = [()]
    for r in ranges:
        points = [(*p, v) for p in points for v in r]
    return points


__all__ = ["TileCounts", "launch", "online", "shared_bytes", "staged_keys", "tile_counts"]
