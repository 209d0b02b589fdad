"""The scores of the online strategy's key tiles (`codegen.cuda.attention.online`): each
lane's keys of the tile, from the global operands as written, the staged key tile
(`codegen.cuda.attention.key_tiles`) or both staged tiles
(`codegen.cuda.attention.query_tiles`), where the last computes all of a lane's inner
products in one pass over `d`.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy

from codegen.cuda.attention import key_tiles, pair_tiles, query_tiles
from codegen.cuda.dialect import CudaEmitter
from codegen.cuda.geometry import ONLINE_COLUMNS, GpuGeometry
from codegen.cuda.staged.tiles import BANKS
from codegen.emit.emitter import Lines, block_lines, indent_lines
from codegen.ir.nest import Term


def tile_shape(e: CudaEmitter) -> tuple[int, int, int, int]:
    """(rows, lanes, keys, owned columns per thread) of the emitter's schedule."""
    s = e.schedule
    return s.rows, s.cols, s.tile_k, ONLINE_COLUMNS // s.cols


def variant(e: CudaEmitter, terms: Sequence[Term], schedule: GpuGeometry) -> CudaEmitter:
    """`e` with other terms and schedule (same parameters, printer and names)."""
    other = e.variant(terms=terms, schedule=schedule)
    assert isinstance(other, CudaEmitter)
    return other


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


def pair_score(e: CudaEmitter) -> Lines:
    """The score of the pair (`v_`), the term's tests around it; both weights of a pair of
    members (`codegen.cuda.attention.paired`: a tuple, planned together) in `v_` and `w_`."""
    plan = e.plan(0, [e.reduced_levels(0)[-1]])
    values = plan.value if isinstance(plan.value, sympy.Tuple) else (plan.value,)
    sets = [f"{v} = {e.printer.doprint(x)};" for v, x in zip(("v_", "w_"), values)]
    return e.level_lines(plan, 0, [*sets, "any_ = 1;"])


def scores(
    e: CudaEmitter, j: str, staged: key_tiles.KeyTile | None, query: sympy.Indexed | None
) -> Lines:
    """Each lane's keys of the tile: the score where the pair is in range, else -inf (from
    the staged key tile, and the staged row tile, where this call stages them)."""
    _, lanes, keys, _ = tile_shape(e)
    element = pair_score(e)
    weights = pair_tiles.staged_term(e.nest, e.term_order(0)[-1])
    if weights is not None:  # a pair's scores read the staged weights (`wst_`; no key tile)
        e.printer.tensors[pair_tiles.STAGED] = pair_tiles.VIEW
        fast = indent_lines(pair_score(variant(e, (weights[0], e.nest.terms[1]), e.schedule)))
        return _key_loop(e, j, ["if (wst_) {", *fast, "} else {", *indent_lines(element), "}"])
    if staged is not None:
        key = e.term_order(0)[-1]
        score = key_tiles.staged_term(e.nest.terms[0], staged, key)
        fast = indent_lines(pair_score(variant(e, (score, e.nest.terms[1]), e.schedule)))
        element = ["if (kst_) {", *fast, "} else {", *indent_lines(element), "}"]
        if query is not None:
            row = e.free_range(e.schedule.free_order[-2]).index
            both = query_tiles.staged_term(score, query, staged, row)
            fastest = indent_lines(pair_score(variant(e, (both, e.nest.terms[1]), e.schedule)))
            element = ["if (qst_) {", *fastest, "} else", *element]
            dot = query_tiles.dot_term(both)
            if dot is not None:  # all of a lane's keys at once in the tiles without tests
                return _keys_at_once(e, j, dot, _key_loop(e, j, element))
    return _key_loop(e, j, element)


def _key_loop(e: CudaEmitter, j: str, element: Lines) -> Lines:
    """Each lane's keys `ln_, ln_ + lanes, ...` of the tile (`_key`)."""
    _, lanes, keys, _ = tile_shape(e)
    return block_lines(f"for (int c_ = ln_; c_ < {keys}; c_ += {lanes})", _key(e, j, element))


def _key(e: CudaEmitter, j: str, element: Lines) -> Lines:
    """Key `c_` of the tile: `element` sets the score `v_` where the pair is in range, else
    it is -inf."""
    paired = isinstance(e.nest.terms[0].body, sympy.Tuple)
    return [
        f"const idx_t {j} = j0_ + c_;",
        f"{e.f} v_ = {e.reducer.init[0]};",
        *([f"{e.f} w_ = {e.reducer.init[0]};"] if paired else []),
        *block_lines(f"if (live_ && c_ < jn_ && (full_ || ({j} >= lo_ && {j} < hi_)))", element),
        "ss_[r_][c_] = v_;",
        *(["ss2_[r_][c_] = w_;"] if paired else []),
    ]


def _keys_at_once(e: CudaEmitter, j: str, dot: Term, otherwise: Lines) -> Lines:
    """In a tile inside every row's key range (`full_`, the same for the whole block) where
    both tiles are staged (`qst_`), the inner products of all of a lane's keys in one pass
    over `d`: each `qs_` value read once for the lane's `keys / lanes` keys (a register
    tile of 1 row x 8 keys: 1.125 shared loads per FMA instead of 2), each summed in the
    nest's order; then the rest of the score (`dot`: the sum replaced by `sd_`) per key.
    `otherwise`: the key loop of the other tiles (a boundary tile tests each pair first)
    and of the calls that do not stage both tiles."""
    _, lanes, keys, _ = tile_shape(e)
    per = keys // lanes
    element = [
        f"const {e.f} sd_ = sd8_[m_];",
        *pair_score(variant(e, (dot, e.nest.terms[1]), e.schedule)),
    ]
    products = [
        f"const {e.f} q_ = qs_[r_*qp_ + d_];",
        "#pragma unroll",
        f"for (int m_ = 0; m_ < {per}; ++m_) sd8_[m_] += q_*ks_[(ln_ + {lanes}*m_)*kp_ + d_];",
        *e.fma_hook(per),
    ]
    staged = [
        f"{e.f} sd8_[{per}];",
        "#pragma unroll",
        f"for (int m_ = 0; m_ < {per}; ++m_) sd8_[m_] = 0;",
        # A row past the end (or without keys) has nothing to add: its lanes wait.
        *block_lines("if (live_)", block_lines("for (idx_t d_ = 0; d_ < kd_; ++d_)", products)),
        "#pragma unroll",
        *block_lines(
            f"for (int m_ = 0; m_ < {per}; ++m_)",
            [f"const int c_ = ln_ + {lanes}*m_;", *_key(e, j, element)],
        ),
    ]
    head = ["if (qst_ && full_) {", *indent_lines(staged), "} else {"]
    return [*head, *indent_lines(otherwise), "}"]
