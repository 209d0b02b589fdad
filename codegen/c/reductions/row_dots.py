"""Dot products for 8 rows at once in explicit 8-float vectors (C emitter).

A tile's rows batch their nested sums (`codegen.c.tiles.rows.batch_row_sums`), and a chunked
logsumexp computes 8 consecutive values of its reduced index together
(`codegen.c.reductions.simple._batch_dots`). When such a sum is a dot product of two float32 rows
that are contiguous along the summed index, as attention's scores `sum_e Q[i, e]*K[j, e]`
and `sum_e dO[i, e]*V[j, e]` are, the 8 rows' sums are computed here in 8-float vectors
(GCC/clang vector extensions, no intrinsics): one vector accumulator per row, a row shared
by all (`K[j, :]` in a tile over `i`) loaded once per step, and the 8 accumulators reduced
into one vector of the 8 sums by a shuffle tree (`tdsl_hsum8`: 7 additions instead of 8
horizontal sums of 3 each): GCC does not vectorise a tile's rows of dot products well by
itself (attention's dQ and logsumexp nests are the cases to time, `benchmarks/attention.py`).
"""

from __future__ import annotations

import sympy

from codegen.c.geometry import CpuGeometry
from codegen.emit.emitter import Emitter, Lines, block_lines, indent_lines
from codegen.emit.staging import Assign, Loop

#: Rows of a tile whose dot products `tdsl_hsum8` reduces (one vector of 8 sums).
DOT_ROWS = 8

ROW_DOT_HELPERS = """\
/* 8-float vectors for the rows' dot products of a register tile. */
typedef float tdsl_v8 __attribute__((vector_size(32)));
typedef int tdsl_i8 __attribute__((vector_size(32)));
#ifdef __clang__
#define TDSL_SHUFFLE8(a, b, ...) __builtin_shufflevector(a, b, __VA_ARGS__)
#else
#define TDSL_SHUFFLE8(a, b, ...) __builtin_shuffle(a, b, (tdsl_i8){__VA_ARGS__})
#endif
static inline tdsl_v8 tdsl_load8(const float *p) {
    tdsl_v8 v;
    __builtin_memcpy(&v, p, sizeof v);
    return v;
}
/* Adjacent pairs of a and b, interleaved: (a0+a1, b0+b1, a2+a3, b2+b3, ...). */
static inline tdsl_v8 tdsl_pairs8(tdsl_v8 a, tdsl_v8 b) {
    return TDSL_SHUFFLE8(a, b, 0, 8, 2, 10, 4, 12, 6, 14)
        + TDSL_SHUFFLE8(a, b, 1, 9, 3, 11, 5, 13, 7, 15);
}
/* The sums of the 8 lanes of each of a0..a7, in lanes 0..7. */
static inline tdsl_v8 tdsl_hsum8(tdsl_v8 a0, tdsl_v8 a1, tdsl_v8 a2, tdsl_v8 a3,
                                 tdsl_v8 a4, tdsl_v8 a5, tdsl_v8 a6, tdsl_v8 a7) {
    const tdsl_v8 b0 = tdsl_pairs8(a0, a1), b1 = tdsl_pairs8(a2, a3);
    const tdsl_v8 b2 = tdsl_pairs8(a4, a5), b3 = tdsl_pairs8(a6, a7);
    const tdsl_v8 c0 = TDSL_SHUFFLE8(b0, b1, 0, 1, 8, 9, 4, 5, 12, 13)
        + TDSL_SHUFFLE8(b0, b1, 2, 3, 10, 11, 6, 7, 14, 15);
    const tdsl_v8 c1 = TDSL_SHUFFLE8(b2, b3, 0, 1, 8, 9, 4, 5, 12, 13)
        + TDSL_SHUFFLE8(b2, b3, 2, 3, 10, 11, 6, 7, 14, 15);
    return TDSL_SHUFFLE8(c0, c1, 0, 1, 2, 3, 8, 9, 10, 11)
        + TDSL_SHUFFLE8(c0, c1, 4, 5, 6, 7, 12, 13, 14, 15);
}"""


def row_dot_lines(
    e: Emitter[CpuGeometry], st: Loop, state: str, rn: str, row: str, declare_row: str
) -> Lines | None:
    """The sums `st` of 8 rows into `float <state>[8]` in vectors, or None where `st` is not
    a dot product of two contiguous float32 rows, one of them reading the index `row`.

    `rn` is the row count (a number for a full tile, else a C variable: the rows past the
    last compute the last row's sum again); `declare_row` binds `row` for the row `r_`.
    """
    factors = _contiguous_factors(e, st, row)
    if factors is None:
        return None
    rows = DOT_ROWS
    lo, hi = e.printer.index(st.start), e.printer.index(st.stop)
    body = [f"const int64_t dn_ = {hi} - ({lo});"]
    pointers: list[list[str]] = []
    for k, factor in enumerate(factors):
        first = f"&{e.printer.doprint(factor.subs(st.index, st.start))}"
        if row not in {s.name for s in factor.free_symbols}:
            body.append(f"const float *{state}p{k} = {first};")
            pointers.append([f"{state}p{k}"] * rows)
            continue
        names = [f"{state}p{k}_{r}" for r in range(rows)]
        body.append(f"const float {', '.join('*' + name for name in names)};")
        for r, name in enumerate(names):
            bind = [f"const int64_t r_ = {row_of(r, rn, rows)};", declare_row, f"{name} = {first};"]
            body += ["{", *indent_lines(bind), "}"]
        pointers.append(names)
    acc = [f"{state}v{r}" for r in range(rows)]
    step = [
        f"{a} += tdsl_load8({p} + dk_) * tdsl_load8({q} + dk_);" for a, p, q in zip(acc, *pointers)
    ]
    tail = [f"{state}[{r}] += {p}[dk_] * {q}[dk_];" for r, (p, q) in enumerate(zip(*pointers))]
    body += [
        f"tdsl_v8 {', '.join(f'{a} = {{0}}' for a in acc)};",
        "int64_t dk_ = 0;",
        *block_lines("for (; dk_ + 8 <= dn_; dk_ += 8)", step),
        f"const tdsl_v8 {state}s = tdsl_hsum8({', '.join(acc)});",
        *[f"{state}[{r}] = {state}s[{r}];" for r in range(rows)],
        *block_lines("for (; dk_ < dn_; ++dk_)", tail),
    ]
    e.printer.called.add("hsum8")  # `ROW_DOT_HELPERS` defines it
    return [f"float {state}[{rows}];", "{", *indent_lines(body), "}"]


def _contiguous_factors(
    e: Emitter[CpuGeometry], st: Loop, row: str
) -> tuple[sympy.Indexed, ...] | None:
    """The two accesses of `st`'s value when it is their product, both float32 read as
    float, indexed by the summed index alone in their last (contiguous) axis, at least one
    reading the index `row`; else None."""
    if e.f != "float" or st.reduction != "sum" or st.inner:
        return None
    factors = st.value.args if isinstance(st.value, sympy.Mul) else ()
    if len(factors) != 2 or not all(isinstance(f, sympy.Indexed) for f in factors):
        return None
    for factor in factors:
        view = e.printer.tensors[str(factor.base.name)]
        if view.load != "{}" or view.integer or view.strides[-1] is not None:
            return None
        if factor.indices[-1] != st.index:
            return None
        if any(st.index in index.free_symbols for index in factor.indices[:-1]):
            return None
    if not any(row in {s.name for s in f.free_symbols} for f in factors):
        return None
    return tuple(factors)


def batchable_sum(st: Loop, local: set[sympy.Symbol], tested: bool) -> bool:
    """Whether `st` is a nested sum that can be computed for 8 rows (or values of a reduced
    index) at once, before the level's statements and outside its tests: a sum with no
    nested loop inside, reading nothing else of its level (`local`), and, under the level's
    tests (`tested`), only plain accesses (`plain_reads`), in bounds for every row."""
    if st.reduction != "sum" or any(isinstance(x, Loop) for x in st.inner):
        return False
    exprs = [st.value, *(x.expr for x in st.inner if isinstance(x, Assign))]
    if set().union(*(x.free_symbols for x in exprs)) & local:
        return False
    return not tested or plain_reads(*exprs)


def row_of(r: int, rn: str, rows: int) -> str:
    """The row `r_` that computes row `r` of a block of `rows`: `r` itself, or, in a block of
    `rn` < rows rows, the last row for the rows past it (its reads are in bounds, and
    nothing reads those rows' results)."""
    return str(r) if rn == str(rows) else f"tdsl_imin({r}, {rn} - 1)"


def plain_reads(*exprs: sympy.Expr) -> bool:
    """Whether every access in `exprs` indexes each axis by a bare index: in bounds for any
    value of the indices in their ranges, which a row of a tile or a reduced loop never
    leaves (a shifted read, `dY[p - k]`, may rely on a test instead)."""
    return all(
        isinstance(i, sympy.Symbol)
        for expr in exprs
        for access in expr.atoms(sympy.Indexed)
        for i in access.indices
    )
