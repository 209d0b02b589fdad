"""The "online" strategy of the C emitter: a logsumexp and its softmax-weighted sum in one
pass (`codegen.online`; FlashAttention's forward, one row at a time).

Per row (the free indices but the last), the scores are computed in chunks of `CHUNK`
values into a buffer (the logsumexp's `chunk_fill`, attention's dot products 8 at a time in
vectors). Per chunk:

* the chunk's largest score (the logsumexp's first pass, NaN counted) gives the running max
  `m'`; the sum `s` and the weighted sums `acc[k]` so far are rescaled by `exp(m - m')`;
* each score becomes its weight `p = exp(score - m')` (zero while `m'` is -inf, where
  `exp(-inf - -inf)` would be NaN), added to `s`;
* `acc[k] += p * W[j, k]` over the chunk, the last free index `k` in simd lanes.

At the end `L = m + log s` (the logsumexp's own result, with its NaN and infinity rules) and
`O[k] = acc[k] / s`, or 0 for a row with no score at all (a sum over nothing): as the two
nests would give, NaN included (all scores -inf gives 0/0, as `exp(-inf - -inf)` does there).
"""

from __future__ import annotations

from codegen.c_strategies import CHUNK, buffer_pass, chunk_fill, omp_parallel
from codegen.emitter import Emitter, Lines, block_lines, indent_lines
from codegen.schedule import Schedule


def online(e: Emitter[Schedule]) -> Lines:
    """The whole function body of a one-pass nest (module docstring)."""
    nest, f, kind = e.nest, e.f, e.index_type
    last = nest.free[-1]
    k = e.printer.index(last.index)
    width, first = e.idx(last.stop - 1 - last.start), e.idx(last.start)
    plan, fill, lo, hi = chunk_fill(e, 0, also=" any_ = 1;")
    m, s = e.names()
    weight = e.printer.doprint(e.hoist(nest.terms[1].body))
    j = e.printer.index(e.term_order(0)[-1])
    lanes = f"for ({kind} q_ = 0; q_ < cn_; ++q_)"
    each = f"for ({kind} k_ = 0; k_ < ne_; ++k_)"
    chunk = [
        f"const {kind} cn_ = tdsl_imin({CHUNK}, chi_ - c0_);",
        *fill,
        *e.declare("c_"),
        *buffer_pass(e, e.reducer.passes[0], ("c_", "c_b_")),
        "if (c_b_ != 0) { c_ = NAN; }",
        f"const {f} mn_ = (c_ > {m} || c_ != c_) ? c_ : {m};",
        f"const {f} sc_ = mn_ != -INFINITY ? {e.exp}({m} - mn_) : 1;",
        f"{f} cs_ = 0;",
        "if (mn_ != -INFINITY) {",
        "    #pragma omp simd reduction(+:cs_)",
        *indent_lines(
            block_lines(
                lanes,
                [f"const {f} p_ = {e.exp}(chunk_[q_] - mn_);", "chunk_[q_] = p_;", "cs_ += p_;"],
            )
        ),
        "} else {",
        *indent_lines(block_lines(lanes, ["chunk_[q_] = 0;"])),
        "}",
        f"{s} = {s}*sc_ + cs_;",
        f"{m} = mn_;",
        "if (sc_ != 1) {",
        "    #pragma omp simd",
        *indent_lines(block_lines(each, ["o_[k_] *= sc_;"])),
        "}",
        *_weighted_sums(e, j, k, first, weight),
    ]
    innermost = [
        f"const {kind} clo_ = {lo}, chi_ = {hi};",
        f"{f} chunk_[{CHUNK}];",
        *block_lines(f"for ({kind} c0_ = clo_; c0_ < chi_; c0_ += {CHUNK})", chunk),
    ]
    loops = e.loops(0, innermost, stop_at=len(e.term_order(0)) - 1, plan=plan)
    result = e.fmt(e.reducer.result, e.names())
    row = [
        *e.declare(),
        "int any_ = 0;",
        f"const {kind} ne_ = {width};",
        f"{f} o_[ne_ > 0 ? ne_ : 1];",
        *block_lines(each, ["o_[k_] = 0;"]),
        "{",
        *indent_lines(e.level_lines(plan, 0, loops)),
        "}",
        *block_lines(
            f"for ({kind} k_ = 0; k_ <= ne_; ++k_)",
            [
                f"const {kind} {k} = {first} + k_;",
                f"const {f} v_ = k_ == ne_ ? {result} : any_ ? o_[k_]/{s} : 0;",
                f"out_[{e.out_offset()}] = {e.store('v_')};",
            ],
        ),
    ]
    rows = e.free_symbols()[:-1]
    for r in reversed(rows):
        row = block_lines(e.free_loop(r), row)
    return omp_parallel(e, len(rows)) + row


#: Lanes of the weighted sums accumulated in registers over a chunk (4 vectors of 8 floats).
BLOCK = 32


def _weighted_sums(e: Emitter[Schedule], j: str, k: str, first: str, weight: str) -> Lines:
    """`o_[k_] += chunk_[q_] * W[j, k]` over the chunk: `BLOCK` lanes at a time in a local
    array the compiler keeps in registers for the whole chunk (then added to `o_`), the
    rest one lane at a time."""
    f, kind = e.f, e.index_type

    def over_chunk(lanes: str, target: str) -> Lines:
        inner = [f"const {kind} {k} = {first} + k0_ + l_;", f"{target} += p_*{weight};"]
        return block_lines(
            f"for ({kind} q_ = 0; q_ < cn_; ++q_)",
            [
                f"const {kind} {j} = c0_ + q_;",
                f"const {f} p_ = chunk_[q_];",
                "#pragma omp simd",
                *block_lines(f"for ({kind} l_ = 0; l_ < {lanes}; ++l_)", inner),
            ],
        )

    full = [
        f"{f} a_[{BLOCK}] = {{0}};",
        *over_chunk(str(BLOCK), "a_[l_]"),
        "#pragma omp simd",
        *block_lines(f"for ({kind} l_ = 0; l_ < {BLOCK}; ++l_)", ["o_[k0_ + l_] += a_[l_];"]),
    ]
    body = [
        f"const {kind} kn_ = tdsl_imin({BLOCK}, ne_ - k0_);",
        *block_lines(f"if (kn_ == {BLOCK})", full)[:-1],
        "} else {",
        *indent_lines(over_chunk("kn_", "o_[k0_ + l_]")),
        "}",
    ]
    return block_lines(f"for ({kind} k0_ = 0; k0_ < ne_; k0_ += {BLOCK})", body)
