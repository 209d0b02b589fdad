"""Lane masks for shifted reads: the edge tiles of a tile strategy without per-lane tests.

A gradient nest of a shifted access (a convolution's input gradient, `dX[c, t] = sum_{o, q}
dY[o, t - q] * W[o, c, q]` with `0 <= t - q < dY.shape[1]`) keeps the eliminated index's
range as constraints on the vector lanes. An edge tile used to test them per lane: a masked
load and 64-bit comparisons in the innermost loop, several times an interior tile's work,
and for a 34-wide output with 32-wide tiles every tile is an edge tile. Here each such
operand is read from a copy padded with zeros along its last axis (every read of the tile
box in bounds, so the lanes load unconditionally), and the constraints, which are functions
of the padded axis' position alone, become a mask row over that axis: all bits set where
they hold, none where they fail. A lane's value is ANDed with its mask bits (one load and
one AND, no branch), so a failing lane adds exactly +0, as the tested lane did, even where
the rest of the body is infinite or NaN (a multiplication by a padded zero would give NaN).

The copies are made once per call, before the tile loops (`malloc`; where it fails, the nest
runs the scalar strategy instead). Only sums qualify (the mask gives 0, a sum's identity),
with every access that reads the vector index reading it in its last axis only, through one
affine expression per term, and each lane constraint an integer multiple of that expression
plus extents.

A full tile whose rows are inside (only its lanes cross an edge) reads the same copies
through the same masks, with no row test (`inside_masks`, a third path of `tiles.tiled`).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import sympy

from codegen.emit.emitter import Emitter, Lines, block_lines
from codegen.emit.printer import TensorView, c_name
from codegen.ir.affine import affine_parts
from codegen.ir.nest import Reduce, Term, extent_symbol, tensor_base

#: The function that ANDs a value's bits with a mask (printed `tdsl_lane_maskf` in float).
LANE_MASK = sympy.Function("tdsl_lane_mask")

LANE_MASK_HELPERS = """\
#include <stdlib.h>
/* x where m has every bit set, +0 where m is 0 (a lane of a shifted read outside its
 * operand: exactly the tested lane's zero, even for an infinite or NaN x). */
static inline float tdsl_lane_maskf(float x, int32_t m) {
    union { float f; int32_t i; } u = {.f = x};
    u.i &= m;
    return u.f;
}
static inline double tdsl_lane_mask(double x, int64_t m) {
    union { double f; int64_t i; } u = {.f = x};
    u.i &= m;
    return u.f;
}"""


@dataclass(frozen=True)
class _Term:
    """One term's padded reads: its index `k`, the shifted expression, its range over the
    tile box `[low, high]`, the operands read through it, and its lane constraints."""

    k: int
    shift: sympy.Expr
    low: sympy.Expr
    high: sympy.Expr
    operands: tuple[str, ...]
    constraints: tuple[sympy.Expr, ...]
    #: Each constraint as `(ratio, rest)`: `ratio * shift + rest`, `rest` free of indices.
    parts: tuple[tuple[sympy.Rational, sympy.Expr], ...]


@dataclass(frozen=True)
class LaneMasks:
    """The edge emitter with masked terms, the tests left per term, and what to prepare."""

    emitter: Emitter
    tests: tuple[tuple[sympy.Expr, ...], ...]
    terms: tuple[_Term, ...]


def lane_masks(
    e: Emitter, tests: Sequence[Sequence[sympy.Expr]], vector: sympy.Symbol
) -> LaneMasks | None:
    """The edge emitter `e` (with per-term lane tests `tests`) with every term whose tests
    on the `vector` index can become a lane mask rewritten; None when none can."""
    if e.nest.reduction != "sum" or e.nest.online:
        return None
    found, terms, left = [], list(e.nest.terms), [tuple(t) for t in tests]
    for k, term in enumerate(e.nest.terms):
        lane = [c for c in tests[k] if vector in c.free_symbols]
        padded = _padded(e, term, lane, vector, k) if lane else None
        if padded is None:
            continue
        found.append(padded)
        terms[k] = _masked_term(term, padded, e.f)
        left[k] = tuple(c for c in tests[k] if vector not in c.free_symbols)
    if not found:
        return None
    masked = e.variant(terms)
    masked.printer = copy.copy(e.printer)
    masked.printer.tensors = dict(e.printer.tensors)
    masked.printer.known_functions = {
        **e.printer.known_functions,
        "tdsl_lane_mask": "tdsl_lane_maskf" if e.f == "float" else "tdsl_lane_mask",
    }
    for p in found:
        for name in p.operands:
            view = e.printer.tensors[name]
            rank = len(view.strides)
            strides = tuple(f"sp{p.k}_{c_name(name)}_{d}" for d in range(rank - 1))
            masked.printer.tensors[_label(name, p.k)] = dataclasses.replace(
                view, cname=f"pb{p.k}_{c_name(name)}", strides=(*strides, None)
            )
        masked.printer.tensors[_label("", p.k)] = TensorView(f"mb{p.k}_", (None,), "{}", True)
    return LaneMasks(masked, tuple(left), tuple(found))


def inside_masks(
    e: Emitter | None,
    tests: Sequence[Sequence[sympy.Expr]],
    masks: LaneMasks | None,
    vector: sympy.Symbol,
) -> LaneMasks | None:
    """The masked terms of a full tile whose rows are inside: `e`, the tile emitter whose terms
    keep only the constraints on the `vector` index (every other constraint holds for the
    whole tile), with per-term lane tests `tests`; None unless every lane test becomes a mask
    over the same padded copies as the edge tiles' `masks`. Such a tile tests no row (a
    convolution's input gradient 34 wide: every tile crosses a column edge, and a test per
    row inside the reduced loops cost more than the masks and the loads together)."""
    if e is None or masks is None:
        return None
    inside = lane_masks(e, tests, vector)
    if inside is None or inside.terms != masks.terms or any(inside.tests):
        return None
    return inside


def _label(operand: str, k: int) -> str:
    """The name of term `k`'s padded copy of `operand` ("" : its mask row) in a rewritten
    body; `#` keeps it apart from every tensor name a user can write."""
    return f"{operand}#pad{k}" if operand else f"#mask{k}"


def _padded(
    e: Emitter, term: Term, lane: list[sympy.Expr], vector: sympy.Symbol, k: int
) -> _Term | None:
    """Term `k`'s padded reads, or None where its lane tests are not a shifted read's bounds."""
    if term.body.atoms(Reduce):
        return None
    reads = [a for a in term.body.atoms(sympy.Indexed) if vector in a.free_symbols]
    if not reads or any(vector in x.free_symbols for a in reads for x in a.indices[:-1]):
        return None
    shifts = {sympy.expand(a.indices[-1]) for a in reads}
    if len(shifts) != 1:
        return None
    (shift,) = shifts
    loops = {r.index: r for r in (*e.nest.free, *term.reduced)}
    coefficients = affine_parts(shift, tuple(loops))
    if not coefficients or set(coefficients) - set(loops) or vector not in coefficients:
        return None
    parts = []
    for c in lane:
        ratio = sympy.Rational(affine_parts(c, (vector,))[vector], coefficients[vector])
        rest = sympy.expand(c - ratio * shift)
        if not ratio.is_integer or rest.free_symbols & set(loops):
            return None
        parts.append((ratio, rest))
    constant = sympy.expand(shift - sum(a * x for x, a in coefficients.items()))
    low, high = constant, constant
    for x, a in coefficients.items():
        first, last = loops[x].start, loops[x].stop - 1
        low += a * (first if a > 0 else last)
        high += a * (last if a > 0 else first)
    operands = tuple(sorted({str(a.base.label) for a in reads}))
    return _Term(k, shift, low, high, operands, tuple(lane), tuple(parts))


def _masked_term(term: Term, p: _Term, f: str) -> Term:
    """`term` reading its shifted operands from their padded copies, its value masked."""
    position = p.shift - p.low
    renamed = {
        a: tensor_base(_label(str(a.base.label), p.k))[(*a.indices[:-1], position)]
        for a in term.body.atoms(sympy.Indexed)
        if str(a.base.label) in p.operands and sympy.expand(a.indices[-1]) == p.shift
    }
    mask = tensor_base(_label("", p.k))[position]
    body = LANE_MASK(term.body.xreplace(renamed), mask)
    kept = tuple(c for c in term.constraints if c not in p.constraints)
    return dataclasses.replace(term, body=body, constraints=kept)


@dataclass(frozen=True)
class Prepared:
    """The padded copies and mask rows of a tiled nest, made before its loops."""

    lines: Lines  # allocate and fill them
    freed: Lines  # free them
    allocated: str  # the C condition that they were allocated
    #: The variables `lines` declare at their top level, each with its type (an outlined
    #: tile case takes those it reads: `codegen.c.tiles.outline`).
    declared: tuple[tuple[str, str], ...]


def prepare_lines(e: Emitter, masks: LaneMasks) -> Prepared:
    """C lines that allocate and fill the padded copies and mask rows, the lines that free
    them, the C condition that they were allocated, and the variables they declare."""
    lines: Lines = []
    freed: Lines = []
    allocated: list[str] = []
    declared: list[tuple[str, str]] = []
    mask_type = "int32_t" if e.f == "float" else "int64_t"
    x = sympy.Dummy("px_", integer=True)
    for p in masks.terms:
        low, width = f"pl{p.k}_", f"pw{p.k}_"
        lines += [
            f"const int64_t {low} = {e.idx(p.low)};",
            f"const int64_t {width} = tdsl_imax({e.idx(p.high)} - {low} + 1, 0);",
        ]
        declared += [(low, "const int64_t"), (width, "const int64_t")]
        for name in p.operands:
            ctype = e.storage[e.dtypes[name]]
            rank = len(e.printer.tensors[name].strides)
            extents = [extent_symbol(name, d) for d in range(rank)]
            base, size, rows = (f"{role}{p.k}_{c_name(name)}" for role in ("pb", "pn", "pr"))
            lines += [
                f"const int64_t {size} = {e.idx(extents[-1])};",
                f"const int64_t {rows} = {e.idx(sympy.Mul(*extents[:-1]))};",
                f"{ctype} *{base} = ({ctype} *)malloc(sizeof({ctype}) * "
                f"(size_t)tdsl_imax({rows} * {width}, 1));",
            ]
            declared += [(size, "const int64_t"), (rows, "const int64_t"), (base, f"{ctype} *")]
            for d in range(rank - 1):
                inner = e.idx(sympy.Mul(*extents[d + 1 : -1]))
                lines.append(f"const int64_t sp{p.k}_{c_name(name)}_{d} = {inner} * {width};")
                declared.append((f"sp{p.k}_{c_name(name)}_{d}", "const int64_t"))
            source = f"in_{c_name(name)}"
            read = f"x_ >= 0 && x_ < {size} ? {source}[r_ * {size} + x_] : 0"
            fill = [f"const int64_t x_ = j_ + {low};", f"{base}[r_ * {width} + j_] = {read};"]
            copy_rows = block_lines(
                f"for (int64_t r_ = 0; r_ < {rows}; ++r_)",
                block_lines(f"for (int64_t j_ = 0; j_ < {width}; ++j_)", fill),
            )
            lines += block_lines(f"if ({base})", copy_rows)
            allocated.append(base)
            freed.append(f"free({base});")
        mask = f"mb{p.k}_"
        holds = [f"{e.idx(sympy.expand(r * x + rest))} >= 0" for r, rest in p.parts]
        lines += [
            f"{mask_type} *{mask} = ({mask_type} *)malloc(sizeof({mask_type}) * "
            f"(size_t)tdsl_imax({width}, 1));",
            *block_lines(
                f"if ({mask})",
                block_lines(
                    f"for (int64_t j_ = 0; j_ < {width}; ++j_)",
                    [
                        f"const int64_t {x.name} = j_ + {low};",
                        f"{mask}[j_] = {' && '.join(holds)} ? -1 : 0;",
                    ],
                ),
            ),
        ]
        declared.append((mask, f"{mask_type} *"))
        allocated.append(mask)
        freed.append(f"free({mask});")
    return Prepared(lines, freed, " && ".join(allocated), tuple(declared))
