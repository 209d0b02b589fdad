"""The "online" strategy of the C emitter: a logsumexp and its softmax-weighted sum in one
pass (`codegen.passes.online`; FlashAttention's forward on the CPU).

Rows (the free indices but the packed last one) go in blocks of `ROWS` consecutive values
of the innermost row index (attention's `i`). The block's reduced range (the union of its
rows' ranges: a causal block's longest row) is cut into chunks of `CHUNK` values. Per chunk:

* each row computes its scores into its own buffer (the logsumexp's `chunk_fill`:
  attention's dot products 8 at a time in vectors), -inf outside its own range;
* each row's largest score (the logsumexp's first pass, NaN counted) gives its running max
  `m'`; its sum `s` and weighted sums `o` so far are rescaled by `exp(m - m')`, and each
  score becomes its weight `p = exp(score - m')` (zero while `m'` is -inf, where
  `exp(-inf - -inf)` would be NaN), added to `s`;
* `o[r, k] += p[r, j] * W[j, k]` for the block's rows at once, each row only over the keys
  it computed a score for (a key a row's bounds or tests leave out adds nothing, not
  `0 * W`, which is NaN where W is NaN or inf), the last free index `k` in simd lanes:
  each row of W read serves every row of the block (the weights must not read the row
  index, `codegen.passes.online.pair`).

At the end `L = m + log s` (the logsumexp's own result, with its NaN and infinity rules) and
`O[k] = o[k] / s`, or 0 for a row with no score at all (a sum over nothing): as the two
nests would give, NaN included (all scores -inf gives 0/0, as `exp(-inf - -inf)` does there).
Rows go in blocks of 8: one row at a time, the weighted sums read W once per row, and the
one pass was no faster than the two nests; a block shares each row of W among its rows
(`benchmarks/attention.py` times both).
"""

from __future__ import annotations

import sympy

from codegen.c.geometry import CpuGeometry
from codegen.c.reductions.simple import CHUNK, buffer_pass, chunk_fill, parallel_loop
from codegen.emit.emitter import Emitter, Lines, block_lines, indent_lines

#: Rows of a block: each row of the weights read serves them all.
ROWS = 8


def online(e: Emitter[CpuGeometry]) -> Lines:
    """The whole function body of a one-pass nest (module docstring)."""
    nest, f, kind = e.nest, e.f, e.index_type
    last = nest.free[-1]
    k = e.printer.index(last.index)
    width, first = e.idx(last.stop - 1 - last.start), e.idx(last.start)
    *outer, row = e.free_symbols()[:-1]
    rows = next(r for r in nest.free if r.index == row)
    i = e.printer.index(row)
    j = e.printer.index(e.term_order(0)[-1])
    plan, fill, lo, hi = chunk_fill(e, 0, also=f" any_[ri_] = 1; in_[ri_][{j} - C0_] = 1;")
    each_row = f"for (int ri_ = 0; ri_ < {ROWS}; ++ri_)"
    at_row = f"const {kind} {i} = i0_ + ri_;"
    scores = [
        f"const {kind} c0_ = tdsl_imax(rlo_[ri_], C0_), ce_ = tdsl_imin(rhi_[ri_], C0_ + CN_);",
        *block_lines(
            "if (c0_ < ce_)",
            [f"const {kind} cn_ = ce_ - c0_;", f"{f} *chunk_ = ch_[ri_] + (c0_ - C0_);", *fill],
        ),
    ]
    chunk = [
        f"const {kind} CN_ = tdsl_imin({CHUNK}, bhi_ - C0_);",
        *block_lines(
            each_row,
            [
                *block_lines(
                    f"for ({kind} q_ = 0; q_ < CN_; ++q_)",
                    ["ch_[ri_][q_] = -INFINITY;", "in_[ri_][q_] = 0;"],
                ),
                *block_lines("if (ri_ < rn_)", [at_row, *e.level_lines(plan, 0, scores)]),
                *block_lines("", _rescale(e)),
            ],
        ),
        *_weighted_sums(e, j, k, first),
    ]
    bounds = [
        f"{kind} blo_ = INT64_MAX, bhi_ = INT64_MIN, rlo_[{ROWS}], rhi_[{ROWS}];",
        *block_lines(
            "for (int ri_ = 0; ri_ < rn_; ++ri_)",
            [
                at_row,
                f"{kind} lo_ = {lo}, hi_ = {hi};",
                *_skip_masked(e, j),
                "rlo_[ri_] = lo_; rhi_[ri_] = hi_;",
                *block_lines(
                    "if (lo_ < hi_)",
                    ["blo_ = tdsl_imin(blo_, lo_);", "bhi_ = tdsl_imax(bhi_, hi_);"],
                ),
            ],
        ),
    ]
    result = e.fmt(e.reducer.result, ("m_[ri_]", "s_[ri_]"))
    block = [
        f"const {kind} rn_ = tdsl_imin({ROWS}, {e.idx(rows.stop)} - i0_);",
        f"const {kind} ne_ = {width};",
        f"{f} m_[{ROWS}], s_[{ROWS}], ch_[{ROWS}][{CHUNK}];",
        f"int any_[{ROWS}];",
        f"unsigned char in_[{ROWS}][{CHUNK}];",
        f"{f} o_[{ROWS}][ne_ > 0 ? ne_ : 1];",
        *block_lines(
            each_row,
            [
                "m_[ri_] = -INFINITY; s_[ri_] = 0; any_[ri_] = 0;",
                *block_lines(f"for ({kind} k_ = 0; k_ < ne_; ++k_)", ["o_[ri_][k_] = 0;"]),
            ],
        ),
        *bounds,
        *block_lines(f"for ({kind} C0_ = blo_; C0_ < bhi_; C0_ += {CHUNK})", chunk),
        *block_lines(
            "for (int ri_ = 0; ri_ < rn_; ++ri_)",
            [
                at_row,
                *block_lines(
                    f"for ({kind} k_ = 0; k_ <= ne_; ++k_)",
                    [
                        f"const {kind} {k} = {first} + k_;",
                        f"const {f} v_ = k_ == ne_ ? {result} : "
                        "any_[ri_] ? o_[ri_][k_]/s_[ri_] : 0;",
                        f"out_[{e.out_offset()}] = {e.store('v_')};",
                    ],
                ),
            ],
        ),
    ]
    head = f"for ({kind} i0_ = {e.idx(rows.start)}; i0_ < {e.idx(rows.stop)}; i0_ += {ROWS})"
    lines = block_lines(head, block)
    for r in reversed(outer):
        lines = block_lines(e.free_loop(r), lines)
    return parallel_loop(e, len(outer) + 1, lines)


def _skip_masked(e: Emitter[CpuGeometry], j: str) -> Lines:
    """Row `ri_`'s key range `[lo_, hi_)` narrowed to its first and last key that a mask
    which is not a loop bound keeps (the scores' guard, `codegen.passes.online`): a document
    mask `doc[b, i] == doc[b, j]` over sorted ids then visits the row's document only, and
    a block of rows the keys of its documents (FlexAttention's block mask, found at run time
    by one test per key left out). Exact for any mask: the keys in between are still tested
    one by one."""
    guard = e.nest.terms[0].guard
    if guard == sympy.true:
        return []
    kept = e.printer.doprint(e.hoist(guard))
    kind = e.index_type
    return [
        *block_lines(
            "while (lo_ < hi_)",
            [f"const {kind} {j} = lo_;", f"if ({kept}) break;", "++lo_;"],
        ),
        *block_lines(
            "while (hi_ > lo_)",
            [f"const {kind} {j} = hi_ - 1;", f"if ({kept}) break;", "--hi_;"],
        ),
    ]


def _rescale(e: Emitter[CpuGeometry]) -> Lines:
    """Row `ri_`'s running max, sum and weighted sums updated for the chunk's scores in
    `ch_[ri_]`, which become their weights."""
    f = e.f
    weights = [f"const {f} p_ = {e.exp}(chunk_[q_] - mn_);", "chunk_[q_] = p_;", "cs_ += p_;"]
    lanes = f"for ({e.index_type} q_ = 0; q_ < cn_; ++q_)"
    return [
        f"{f} *chunk_ = ch_[ri_];",
        f"const {e.index_type} cn_ = CN_;",
        *e.declare("c_"),
        *buffer_pass(e, e.reducer.passes[0], ("c_", "c_b_")),
        "if (c_b_ != 0) { c_ = NAN; }",
        f"const {f} mn_ = (c_ > m_[ri_] || c_ != c_) ? c_ : m_[ri_];",
        f"const {f} sc_ = mn_ != -INFINITY ? {e.exp}(m_[ri_] - mn_) : 1;",
        f"{f} cs_ = 0;",
        "if (mn_ != -INFINITY) {",
        "    #pragma omp simd reduction(+:cs_)",
        *indent_lines(block_lines(lanes, weights)),
        "} else {",
        *indent_lines(block_lines(lanes, ["chunk_[q_] = 0;"])),
        "}",
        "s_[ri_] = s_[ri_]*sc_ + cs_;",
        "m_[ri_] = mn_;",
        "if (sc_ != 1) {",
        "    #pragma omp simd",
        *indent_lines(
            block_lines(f"for ({e.index_type} k_ = 0; k_ < ne_; ++k_)", ["o_[ri_][k_] *= sc_;"])
        ),
        "}",
    ]


def _weighted_sums(e: Emitter[CpuGeometry], j: str, k: str, first: str) -> Lines:
    """`o_[r][k] += ch_[r][q] * W[j, k]` over the chunk for every row of the block whose
    range holds `j` (`in_[r][q]`, set where the row computed its score): a key outside a
    row's range adds nothing, also where W holds NaN or inf (its weight 0 times W would be
    NaN). The last free index in simd lanes: a row of W read once from memory serves the
    block's rows from the L1 cache. (Accumulating 8 rows x 8 lanes in registers instead walks W
    once per 8 lanes, which was slower.)"""
    f, kind = e.f, e.index_type
    weight = e.printer.doprint(e.hoist(e.nest.terms[1].body))
    lanes = block_lines(
        f"for ({kind} k_ = 0; k_ < ne_; ++k_)",
        [f"const {kind} {k} = {first} + k_;", f"o_[ri_][k_] += p_*{weight};"],
    )
    rows = block_lines(
        f"for (int ri_ = 0; ri_ < {ROWS}; ++ri_)",
        [
            "if (!in_[ri_][q_]) continue;",
            f"const {f} p_ = ch_[ri_][q_];",
            "#pragma omp simd",
            *lanes,
        ],
    )
    return block_lines(
        f"for ({kind} q_ = 0; q_ < CN_; ++q_)", [f"const {kind} {j} = C0_ + q_;", *rows]
    )
