"""Emit a loop nest as a C function under a `Schedule`.

Calling convention of the generated entry point::

    void tdsl_<output>_<role>_<hash8>(void *out, const void *const *operands,
                                      const int64_t *params);

* `out`: the C-contiguous output buffer, fully written (element type from `dtypes`);
* `operands`: one data pointer per operand of the nest, in `nest.operands` order
  (C-contiguous; a scalar operand points at its one element); never written;
* `params`: int64 values computed on the host from the extents, in the order of
  `CSource.parameters` (hoisted extent expressions, strides, the amount of work).

Element offsets are int64 throughout. The body of every term is printed after `sympy.cse`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.bounds import LoopBounds, affine_parts, hoist_parameters, loop_bounds
from codegen.ir import LoopNest, Term, extent_of, extent_symbol
from codegen.printer import CPrinter, TensorView
from codegen.schedule import Schedule, choose_cpu_schedule, term_order, validate

STORAGE = {
    "float32": "float",
    "float64": "double",
    "float16": "uint16_t",
    "bfloat16": "uint16_t",
    "int32": "int32_t",
    "int64": "int64_t",
}
PARALLEL_WORK = 1 << 16  # below this many body evaluations a kernel runs on one thread

Lines = list[str]


@dataclass(frozen=True)
class CSource:
    """Generated C for one nest: text, entry point and the host parameters it expects."""

    text: str
    entry: str
    parameters: tuple[tuple[str, sympy.Expr], ...]  # (C name, expression of extents)
    signature: str = "void(void *out, const void *const *operands, const int64_t *params)"


@dataclass(frozen=True)
class Reducer:
    """C templates of one reduction: `{a}`/`{b}` are its state, `{v}` a value, `{pos}`."""

    init: tuple[str, ...]
    update: str
    combine: str  # fold another state `{oa}`/`{ob}` into this one
    result: str
    int_state: bool = False  # the second state variable is an int64 position


# argmax/argmin, as jnp.argmax/argmin: NaN wins over every number (the first NaN), ties go to
# the smaller position. The state only depends on the set of values seen, not their order,
# so every schedule (lanes, chunks, threads) agrees. Branch-free, so lane loops vectorise.
_ARG_TAKE = (
    "({b} < 0 || {v} {op} {a} || ({v} != {v} && {a} == {a}) "
    "|| (({v} == {a} || ({v} != {v} && {a} != {a})) && {pos} < {b}))"
)
_ARG = "{{ const int t_ = " + _ARG_TAKE + "; {a} = t_ ? {v} : {a}; {b} = t_ ? {pos} : {b}; }}"
_ARG_COMBINE = (
    "{{ const int t_ = {ob} >= 0 && "
    + _ARG_TAKE.replace("{v}", "{oa}").replace("{pos}", "{ob}")
    + "; {a} = t_ ? {oa} : {a}; {b} = t_ ? {ob} : {b}; }}"
)
REDUCERS = {
    "sum": Reducer(("0",), "{a} += {v};", "{a} += {oa};", "{a}"),
    "prod": Reducer(("1",), "{a} *= {v};", "{a} *= {oa};", "{a}"),
    "max": Reducer(
        ("-INFINITY",), "{a} = {v} > {a} ? {v} : {a};", "{a} = {oa} > {a} ? {oa} : {a};", "{a}"
    ),
    "min": Reducer(
        ("INFINITY",), "{a} = {v} < {a} ? {v} : {a};", "{a} = {oa} < {a} ? {oa} : {a};", "{a}"
    ),
    "logsumexp": Reducer(
        ("-INFINITY", "0"),
        "if ({v} > {a}) {{ {b} = {b}*{exp}({a} - {v}) + 1; {a} = {v}; }} "
        "else if ({v} > -INFINITY) {{ {b} += {exp}({v} - {a}); }}",
        "if ({oa} > {a}) {{ {b} = {b}*{exp}({a} - {oa}) + {ob}; {a} = {oa}; }} "
        "else if ({oa} > -INFINITY) {{ {b} += {ob}*{exp}({oa} - {a}); }}",
        "({a} == -INFINITY ? -INFINITY : {a} + {log}({b}))",
    ),
    "argmax": Reducer(
        ("-INFINITY", "-1"),
        _ARG.replace("{op}", ">"),
        _ARG_COMBINE.replace("{op}", ">"),
        "{b}",
        int_state=True,
    ),
    "argmin": Reducer(
        ("INFINITY", "-1"),
        _ARG.replace("{op}", "<"),
        _ARG_COMBINE.replace("{op}", "<"),
        "{b}",
        int_state=True,
    ),
}

_HALF = """\
#include <string.h>
static inline float tdsl_h2f(uint16_t h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t tdsl_f2h(float f) {
    _Float16 x = (_Float16)f; /* rounds to nearest even */
    uint16_t h; memcpy(&h, &x, 2); return h;
}
static inline float tdsl_bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t tdsl_f2bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* round to nearest even */
}"""


def accumulation_type(dtypes: Mapping[str, str]) -> str:
    """`double` when any operand or the output is float64, else `float`."""
    return "double" if "float64" in dtypes.values() else "float"


def _cname(name: str) -> str:
    return re.sub(r"\W", "_", name)


def _indent(lines: Sequence[str], levels: int = 1) -> Lines:
    return ["    " * levels + line if line else line for line in lines]


def _block(head: str, body: Sequence[str]) -> Lines:
    return [head + " {", *_indent(body), "}"]


class _Emitter:
    """State of one emission: the printer, hoisted parameters and the C names."""

    #: Conversions of 16-bit storage types to and from float (the CUDA emitter overrides them).
    HALF_TO_FLOAT = {"float16": "tdsl_h2f", "bfloat16": "tdsl_bf2f"}
    FLOAT_TO_HALF = {"float16": "tdsl_f2h", "bfloat16": "tdsl_f2bf"}
    STORAGE_TYPES = STORAGE

    def __init__(self, nest: LoopNest, dtypes: Mapping[str, str], schedule: Schedule):
        self.nest, self.dtypes, self.schedule = nest, dtypes, schedule
        self.f = accumulation_type(dtypes)
        self.params: dict[sympy.Basic, sympy.Symbol] = {}
        self.named: list[tuple[str, sympy.Expr]] = []  # strides and work, after the P's
        self.reducer = REDUCERS[nest.reduction]
        tensors, scalars = {}, {}
        for op in nest.operands:
            if op.is_scalar:
                scalars[op.name] = f"in_{_cname(op.name)}"
                continue
            extents = [extent_symbol(op.name, d) for d in range(op.rank)]
            strides = self.stride(op.name, extents)
            integer = dtypes[op.name].startswith("int")
            tensors[op.name] = TensorView(
                f"in_{_cname(op.name)}", strides, self.load(op.name), integer=integer
            )
        lengths = [r.stop - r.start for r in nest.free]
        self.out_strides = self.stride("OUT", lengths)
        self.printer = CPrinter(self.f, tensors=tensors, scalars=scalars)
        self.exp = "expf" if self.f == "float" else "exp"
        self.log = "logf" if self.f == "float" else "log"
        self.bounds = [
            loop_bounds(t, term_order(nest, schedule, n)) for n, t in enumerate(nest.terms)
        ]

    def variant(
        self, terms: Sequence[Term] | None = None, schedule: Schedule | None = None
    ) -> _Emitter:
        """This emitter with other terms or schedule (same parameters, printer and names)."""
        other = copy.copy(self)
        if terms is not None:
            other.nest = dataclasses.replace(self.nest, terms=tuple(terms))
        other.schedule = schedule or self.schedule
        other.bounds = [
            loop_bounds(t, term_order(other.nest, other.schedule, n))
            for n, t in enumerate(other.nest.terms)
        ]
        return other

    # -- parameters and names ------------------------------------------------------------

    def hoist(self, expr: sympy.Basic) -> sympy.Basic:
        """Replace extent expressions by host parameters (bare extents included)."""
        expr = hoist_parameters(expr, self.params)
        bare = {s: s for s in expr.free_symbols if extent_of(s) is not None}
        for symbol in sorted(bare, key=str):
            bare[symbol] = self.params.setdefault(
                symbol, sympy.Symbol(f"P{len(self.params)}", integer=True)
            )
        self.printer.parameters.update(sym.name for sym in self.params.values())
        return expr.xreplace(bare)

    def stride(self, name: str, extents: Sequence[sympy.Expr]) -> tuple[str | None, ...]:
        """Register the row-major strides of a tensor; the last axis is contiguous."""
        names: list[str | None] = []
        for d in range(len(extents)):
            if d == len(extents) - 1:
                names.append(None)
                continue
            cname = f"s_{_cname(name)}_{d}"
            self.named.append((cname, sympy.Mul(*extents[d + 1 :])))
            names.append(cname)
        return tuple(names)

    def load(self, name: str) -> str:
        dtype = self.dtypes[name]
        if dtype in self.HALF_TO_FLOAT:
            return f"(({self.f}){self.HALF_TO_FLOAT[dtype]}({{}}))"
        return "{}" if self.STORAGE_TYPES[dtype] == self.f else f"(({self.f}){{}})"

    def store(self, value: str) -> str:
        dtype = self.dtypes[self.nest.output]
        if dtype in self.FLOAT_TO_HALF:
            return f"{self.FLOAT_TO_HALF[dtype]}((float)({value}))"
        storage = self.STORAGE_TYPES[dtype]
        if dtype.startswith("int") and not self.reducer.int_state:
            return f"({storage})llrint({value})"
        return value if storage == self.f else f"({storage})({value})"

    def idx(self, expr: sympy.Basic) -> str:
        return self.printer.index(self.hoist(expr))

    # -- reduction state -----------------------------------------------------------------

    def names(self, base: str = "acc_", sub: str = "") -> tuple[str, str]:
        """The C lvalues of the reduction state (value, second value or position)."""
        return f"{base}{sub}", f"{base}b_{sub}"

    def declare(self, base: str = "acc_", dims: str = "") -> Lines:
        """Declare the state; scalars (no `dims`) are initialised."""
        kinds = [self.f, "int64_t" if self.reducer.int_state else self.f]
        lines = []
        for kind, name, init in zip(kinds, self.names(base), self.reducer.init, strict=False):
            lines.append(f"{kind} {name}{dims};" if dims else f"{kind} {name} = {init};")
        return lines

    def init(self, sub: str, base: str = "acc_") -> Lines:
        names = self.names(base, sub)
        return [f"{s} = {v};" for s, v in zip(names, self.reducer.init, strict=False)]

    def fmt(self, template: str, state: tuple[str, str], other: tuple[str, str] = ("", "")) -> str:
        a, b = state
        return template.format(
            a=a, b=b, oa=other[0], ob=other[1], v="val_", pos="pos_", exp=self.exp, log=self.log
        )

    # -- terms ---------------------------------------------------------------------------

    def term_body(self, n: int, sub: str, tests: Sequence[sympy.Expr] = ()) -> Lines:
        """Evaluate term `n`'s body into `v` and fold it into the state `acc<sub>`.

        `tests` are expressions that must be >= 0 for this element: the body (and its loads)
        is evaluated only where they hold.
        """
        if tests:
            conditions = [f"{self.idx(t)} >= 0" for t in tests]
            if self.nest.terms[n].guard != sympy.true:
                conditions.append(f"({self.printer.doprint(self.hoist(self.nest.terms[n].guard))})")
            unguarded = self.variant(
                [
                    dataclasses.replace(t, guard=sympy.true) if m == n else t
                    for m, t in enumerate(self.nest.terms)
                ]
            )
            return _block(f"if ({' && '.join(conditions)})", unguarded.term_body(n, sub))
        term = self.nest.terms[n]
        body = self.hoist(term.body)
        replacements, (reduced,) = sympy.cse(body, symbols=sympy.numbered_symbols("cse"))
        lines: Lines = []
        renames: dict[sympy.Basic, sympy.Basic] = {}
        for symbol, expr in replacements:
            expr = expr.xreplace(renames)
            if expr.is_integer and not expr.atoms(sympy.Indexed):
                renames[symbol] = sympy.Symbol(symbol.name, integer=True)
                lines.append(f"const int64_t {symbol.name} = {self.printer.index(expr)};")
            else:
                lines.append(f"const {self.f} {symbol.name} = {self.printer.doprint(expr)};")
        value = self.printer.doprint(reduced.xreplace(renames))
        lines.append(f"const {self.f} val_ = {value};")
        if self.reducer.int_state:
            lines.append(f"const int64_t pos_ = {self.position(term)};")
        update = [self.fmt(self.reducer.update, self.names("acc_", sub))]
        if term.guard != sympy.true:
            update = _block(f"if ({self.printer.doprint(self.hoist(term.guard))})", update)
        return lines + update

    def position(self, term: Term) -> str:
        """The flat row-major position over the term's reduced ranges (argmax/argmin)."""
        parts, stride = [], sympy.Integer(1)
        for r in reversed(term.reduced):
            parts.append(self.hoist((r.index - r.start) * stride))
            stride = stride * sympy.Max(r.stop - r.start, 0)
        return self.printer.index(sympy.Add(*parts)) if parts else "0"

    def loops(
        self,
        n: int,
        inner: Lines,
        skip: int = 0,
        first: tuple[str, str] | None = None,
        stop_at: int | None = None,
    ) -> Lines:
        """Term `n`'s reduced loops around `inner`, from loop `skip` to `stop_at`."""
        order = term_order(self.nest, self.schedule, n)
        bounds: LoopBounds = self.bounds[n]
        lines = inner
        end = len(order) if stop_at is None else stop_at
        for depth in reversed(range(skip, end)):
            r = order[depth]
            lo, hi = self.idx(bounds.starts[r]), self.idx(bounds.stops[r])
            if depth == skip and first is not None:
                lo, hi = first
            name = self.printer.index(r)
            lines = _block(f"for (int64_t {name} = {lo}; {name} < {hi}; ++{name})", lines)
        return lines

    def guarded(self, n: int, lines: Lines) -> Lines:
        tests = self.bounds[n].free_tests
        if not tests:
            return lines
        cond = " && ".join(f"{self.idx(t)} >= 0" for t in tests)
        return _block(f"if ({cond})", lines)

    def out_offset(self) -> str:
        parts = []
        for r, stride in zip(self.nest.free, self.out_strides, strict=True):
            index = self.printer.index(r.index)
            start = self.hoist(r.start)
            term = index if start == 0 else f"({index} - {self.printer.index(start)})"
            parts.append(term if stride is None else f"{term}*{stride}")
        return " + ".join(parts) or "0"

    def store_line(self, sub: str = "", base: str = "acc_") -> str:
        value = self.fmt(self.reducer.result, self.names(base, sub))
        return f"out_[{self.out_offset()}] = {self.store(value)};"

    def free_loop(self, r: sympy.Symbol) -> str:
        rng = next(x for x in self.nest.free if x.index == r)
        name = self.printer.index(r)
        return (
            f"for (int64_t {name} = {self.idx(rng.start)}; {name} < {self.idx(rng.stop)}; ++{name})"
        )

    def parallel(self, collapse: int) -> Lines:
        if not self.schedule.parallel or collapse == 0:
            return []
        clause = f" collapse({collapse})" if collapse > 1 else ""
        return [f"#pragma omp parallel for{clause} schedule(static) if(work_ >= {PARALLEL_WORK})"]

    def free_symbols(self) -> list[sympy.Symbol]:
        by_name = {s.name: s for s in self.nest.free_indices}
        return [by_name[name] for name in self.schedule.free_order]


def _scalar(e: _Emitter) -> Lines:
    body = [*e.declare()]
    for n in range(len(e.nest.terms)):
        body += e.guarded(n, e.loops(n, e.term_body(n, "")))
    lines = [*body, e.store_line("")]
    free = e.free_symbols()
    for r in reversed(free):
        lines = _block(e.free_loop(r), lines)
    return e.parallel(len(free)) + lines


def _lanes(e: _Emitter, rn: str, wn: str, inner: Lines, simd: bool = True) -> Lines:
    """Loops over the register tile: rows (if any) outside, simd lanes inside."""
    s = e.schedule
    vec = e.printer.index(sympy.Symbol(s.vector or "", integer=True))
    lines = _block(
        f"for (int64_t w_ = 0; w_ < {wn}; ++w_)", [f"const int64_t {vec} = {vec}0_ + w_;", *inner]
    )
    # Fully unrolled tile loops keep the accumulators in registers.
    lines = (["#pragma omp simd"] if simd else [f"#pragma GCC unroll {s.width}"]) + lines
    if s.row is None:
        return lines
    row = e.printer.index(sympy.Symbol(s.row, integer=True))
    return [f"#pragma GCC unroll {s.rows}"] + _block(
        f"for (int64_t r_ = 0; r_ < {rn}; ++r_)", [f"const int64_t {row} = {row}0_ + r_;", *lines]
    )


TileBody = Callable[[_Emitter, str, str, Sequence[Sequence[sympy.Expr]]], Lines]


@dataclass(frozen=True)
class _TilePaths:
    """Interior tiles run `interior` unmasked; other tiles run `edge` with per-lane tests."""

    condition: tuple[str, ...]  # C conditions (>= 0 tests) of an interior tile
    interior: _Emitter
    edge: _Emitter
    tests: tuple[tuple[sympy.Expr, ...], ...]  # per term, per-lane tests of the edge path
    #: Per tiled index: the interior conditions on that index's tile start alone (with a
    #: tile width of one), whose other symbols are extents.
    alone: dict[sympy.Symbol, tuple[sympy.Expr, ...]]


def _tile_paths(e: _Emitter) -> _TilePaths:
    """Split each term's constraints on the tiled indices into a tile test and lane tests.

    A constraint `c >= 0` that mentions a tiled index holds for a whole tile (and every
    value of the reduced indices in their ranges) when it holds at the box's worst corner
    (it is affine), so interior tiles drop it. Other tiles loop over the bounds of the
    constraint at its best corner (a superset) and test the constraint per lane. Corners
    use the tile's actual width (`rn_`, `wn_`), so a narrow tile can be interior too.
    """
    s = e.schedule
    sizes = {s.vector: s.width, **({s.row: s.rows} if s.row else {})}
    tiled = {x: sizes[x.name] for x in e.nest.free_indices if x.name in sizes}
    starts, widths = {}, {}
    for x in tiled:
        start = e.printer.index(x) + "0_"
        width = "rn_" if x.name == s.row else "wn_"
        e.printer.parameters.update((start, width))
        starts[x] = sympy.Symbol(start, integer=True)
        widths[x] = sympy.Symbol(width, integer=True, positive=True)
    condition: list[str] = []
    alone: dict[sympy.Symbol, list[sympy.Expr]] = {x: [] for x in tiled}
    inner, edge, tests = [], [], []
    for term in e.nest.terms:
        kept, relaxed, lane = [], [], []
        for c in term.constraints:
            coefficients = affine_parts(c, tuple(tiled))
            if not coefficients:
                kept.append(c)
                continue
            worst = {
                x: starts[x] + (0 if a > 0 else widths[x] - 1) for x, a in coefficients.items()
            }
            best = {x: starts[x] + (tiled[x] - 1 if a > 0 else 0) for x, a in coefficients.items()}
            for r in term.reduced:
                a = affine_parts(c, (r.index,)).get(r.index, 0)
                if a:
                    worst[r.index] = r.start if a > 0 else r.stop - 1
            test = sympy.expand(c.xreplace(worst))
            condition.append(f"{e.idx(test)} >= 0")
            x = next(iter(coefficients)) if len(coefficients) == 1 else None
            if x is not None and all(
                extent_of(y) is not None for y in test.free_symbols - {starts[x], widths[x]}
            ):
                alone[x].append(test.xreplace({widths[x]: 1}))
            relaxed.append(sympy.expand(c.xreplace(best)))
            lane.append(c)
        inner.append(dataclasses.replace(term, constraints=tuple(kept)))
        edge.append(dataclasses.replace(term, constraints=(*kept, *relaxed)))
        tests.append(tuple(lane))
    found = {x: tuple(found) for x, found in alone.items()}
    if not condition:
        return _TilePaths((), e, e, tuple(() for _ in e.nest.terms), found)
    return _TilePaths(tuple(condition), e.variant(inner), e.variant(edge), tuple(tests), found)


_TILE_HELPERS = """\
/* Tiles of S along [s, z) with the interior part [a, e) (s <= a <= e <= z) tiled from a:
 * chunks of at most S in [s, a), in [a, e) and in [e, z). */
static inline int64_t tdsl_tiles(int64_t s, int64_t a, int64_t e, int64_t z, int64_t S) {
    return (a - s + S - 1) / S + (e - a + S - 1) / S + (z - e + S - 1) / S;
}
static inline int64_t tdsl_tile(int64_t t, int64_t s, int64_t a, int64_t e, int64_t z,
                                int64_t S, int64_t *n) {
    const int64_t na = (a - s + S - 1) / S, ni = (e - a + S - 1) / S;
    const int64_t x0 = t < na ? s + t * S : t < na + ni ? a + (t - na) * S : e + (t - na - ni) * S;
    *n = tdsl_imin(S, (t < na ? a : t < na + ni ? e : z) - x0);
    return x0;
}"""


def _interior_range(
    e: _Emitter, x: sympy.Symbol, conditions: Sequence[sympy.Expr]
) -> tuple[str, str]:
    """C expressions of `[a, e)`: the tile starts `x0` of one-wide tiles that satisfy every
    condition (each `c(x0) >= 0`, affine in `x0`)."""
    x0 = sympy.Symbol(e.printer.index(x) + "0_", integer=True)
    lows, highs = [], []
    for c in conditions:
        a = affine_parts(c, (x0,))[x0]
        rest = e.idx(sympy.expand(c - a * x0))
        if a > 0:
            lows.append(f"tdsl_ceildiv(-({rest}), {a})")
        else:
            highs.append(f"tdsl_floordiv({rest}, {-a}) + 1")
    low, high = (lows or [None])[0], (highs or [None])[0]
    for more in lows[1:]:
        low = f"tdsl_imax({low}, {more})"
    for more in highs[1:]:
        high = f"tdsl_imin({high}, {more})"
    return low or "", high or ""


def _tiled(e: _Emitter, body: TileBody) -> Lines:
    """Tile loops over the row and vector indices.

    Along each tiled index the tiles start where the interior conditions on that index alone
    begin to hold, so every tile in between is interior and only the tiles at the ends need
    per-lane tests (a convolution's input gradient: its first and last `K - 1` columns).
    Full interior tiles get constant trip counts and no per-lane tests.
    """
    s = e.schedule
    free = e.free_symbols()
    paths = _tile_paths(e)
    grid, tile, full = [], [], []
    for x in (x for x in free if x.name in (s.row, s.vector)):
        size, width = (s.rows, "rn_") if x.name == s.row else (s.width, "wn_")
        name = e.printer.index(x)
        r = next(r for r in e.nest.free if r.index == x)
        lo, hi = e.idx(r.start), e.idx(r.stop)
        low, high = _interior_range(e, x, paths.alone[x])
        a = f"tdsl_imin(tdsl_imax({low}, {lo}), {hi})" if low else lo
        end = f"tdsl_imin(tdsl_imax({high}, {name}a_), {hi})" if high else hi
        grid += [
            f"const int64_t {name}a_ = {a};",
            f"const int64_t {name}e_ = {end};",
            f"const int64_t {name}t_ = tdsl_tiles({lo}, {name}a_, {name}e_, {hi}, {size});",
        ]
        tile += [
            f"int64_t {width};",
            f"const int64_t {name}0_ = "
            f"tdsl_tile({name}i_, {lo}, {name}a_, {name}e_, {hi}, {size}, &{width});",
        ]
        full.append(f"{width} == {size}")
    check = " && ".join(full)
    none = tuple(() for _ in e.nest.terms)
    interior = _either(
        check,
        body(paths.interior, str(s.rows), str(s.width), none),
        body(paths.interior, "rn_", "wn_", none),
    )
    if paths.condition:
        masked = body(paths.edge, str(s.rows), str(s.width), paths.tests)
        edge = _either(check, masked, body(paths.edge, "rn_", "wn_", paths.tests))
        interior = _either(" && ".join(paths.condition), interior, edge)
    lines = [*tile, *interior]
    for x in reversed(free):
        if x.name in (s.row, s.vector):
            name = e.printer.index(x)
            lines = _block(f"for (int64_t {name}i_ = 0; {name}i_ < {name}t_; ++{name}i_)", lines)
        else:
            lines = _block(e.free_loop(x), lines)
    return grid + e.parallel(len(free)) + lines


def _either(check: str, yes: Lines, no: Lines) -> Lines:
    return [f"if ({check}) {{", *_indent(yes), "} else {", *_indent(no), "}"]


def _tile(e: _Emitter) -> Lines:
    dims = f"[{e.schedule.rows}][{e.schedule.width}]" if e.schedule.row else f"[{e.schedule.width}]"
    sub = "[r_][w_]" if e.schedule.row else "[w_]"

    def body(p: _Emitter, rn: str, wn: str, tests: Sequence[Sequence[sympy.Expr]]) -> Lines:
        if not any(t.reduced for t in p.nest.terms):
            # Elementwise: each lane computes and stores its element (no accumulator tile).
            lane = [*p.declare()]
            for n in range(len(p.nest.terms)):
                lane += ["{", *_indent(p.guarded(n, p.term_body(n, "", tests[n]))), "}"]
            return _lanes(p, rn, wn, [*lane, p.store_line()])
        lines = [*p.declare(dims=dims), *_lanes(p, rn, wn, p.init(sub))]
        for n in range(len(p.nest.terms)):
            lane = _lanes(p, rn, wn, p.term_body(n, sub, tests[n]))
            lines += p.guarded(n, p.loops(n, lane))
        return lines + _lanes(p, rn, wn, [p.store_line(sub)])

    return _tiled(e, body)


def _dot(e: _Emitter) -> Lines:
    s = e.schedule
    lanes = s.lanes
    dims = f"[{s.rows}][{s.width}][{lanes}]" if s.row else f"[{s.width}][{lanes}]"
    sub = "[r_][w_]" if s.row else "[w_]"

    def body(p: _Emitter, rn: str, wn: str, tests: Sequence[Sequence[sympy.Expr]]) -> Lines:
        init = _block(f"for (int64_t l_ = 0; l_ < {lanes}; ++l_)", p.init(sub + "[l_]"))
        lines = [*p.declare(dims=dims), *_lanes(p, rn, wn, init, simd=False)]
        for n in range(len(p.nest.terms)):
            order = term_order(p.nest, s, n)
            u = p.printer.index(order[-1])
            lo, hi = p.idx(p.bounds[n].starts[order[-1]]), p.idx(p.bounds[n].stops[order[-1]])
            vector = [
                "#pragma omp simd",
                *_block(
                    f"for (int64_t l_ = 0; l_ < {lanes}; ++l_)",
                    [f"const int64_t {u} = {u}0_ + l_;", *p.term_body(n, sub + "[l_]", tests[n])],
                ),
            ]
            rest = _block(
                f"for (int64_t {u} = {u}0_; {u} < {hi}; ++{u})",
                _lanes(p, rn, wn, p.term_body(n, sub + "[0]", tests[n]), simd=False),
            )
            inner = [
                f"int64_t {u}0_ = {lo};",
                *_block(
                    f"for (; {u}0_ + {lanes} <= {hi}; {u}0_ += {lanes})",
                    _lanes(p, rn, wn, vector, simd=False),
                ),
                *rest,
            ]
            lines += p.guarded(n, p.loops(n, ["{", *_indent(inner), "}"], stop_at=len(order) - 1))
        combine = p.fmt(p.reducer.combine, p.names("tot_"), p.names("acc_", sub + "[l_]"))
        store = [
            *p.declare("tot_"),
            *_block(f"for (int64_t l_ = 0; l_ < {lanes}; ++l_)", [combine]),
            p.store_line(base="tot_"),
        ]
        return lines + _lanes(p, rn, wn, store, simd=False)

    return _tiled(e, body)


def _split(e: _Emitter) -> Lines:
    chunks = e.schedule.chunks
    dims = f"[{chunks}]"
    lines = [*e.declare("part_", dims)]
    chunk = [*e.declare()]
    for n, term in enumerate(e.nest.terms):
        if not term.reduced:
            chunk += _block("if (c_ == 0)", e.guarded(n, e.term_body(n, "")))
            continue
        first = term_order(e.nest, e.schedule, n)[0]
        lo, hi = e.idx(e.bounds[n].starts[first]), e.idx(e.bounds[n].stops[first])
        split = (f"lo_ + len_*c_/{chunks}", f"lo_ + len_*(c_ + 1)/{chunks}")
        chunk += e.guarded(
            n,
            [
                "{",
                *_indent(
                    [
                        f"const int64_t lo_ = {lo}, len_ = tdsl_imax({hi} - lo_, 0);",
                        *e.loops(n, e.term_body(n, ""), first=split),
                    ]
                ),
                "}",
            ],
        )
    states = len(e.reducer.init)
    pairs = list(zip(e.names("part_", "[c_]"), e.names(), strict=True))[:states]
    chunk += [f"{p} = {a};" for p, a in pairs]
    if e.schedule.parallel:
        lines.append(f"#pragma omp parallel for schedule(static) if(work_ >= {PARALLEL_WORK})")
    lines += _block(f"for (int64_t c_ = 0; c_ < {chunks}; ++c_)", chunk)
    combine = e.fmt(e.reducer.combine, e.names(), e.names("part_", "[c_]"))
    lines += [*e.declare(), *_block(f"for (int64_t c_ = 0; c_ < {chunks}; ++c_)", [combine])]
    return [*lines, e.store_line()]


STRATEGY_EMITTERS: dict[str, Callable[[_Emitter], Lines]] = {
    "scalar": _scalar,
    "tile": _tile,
    "dot": _dot,
    "split": _split,
}


def emit_c(
    nest: LoopNest,
    *,
    dtypes: Mapping[str, str],
    schedule: Schedule | None = None,
    role: str = "forward",
) -> CSource:
    """Generate C for `nest` (see the module docstring for the calling convention).

    Args:
        nest: the loop nest.
        dtypes: numpy dtype name of each operand and of `nest.output`.
        schedule: loop order and mapping; `choose_cpu_schedule` when None.
        role: the nest's role in its kernel ("forward", "grad_A", ...), used in the name.

    Returns:
        The `CSource`.

    Raises:
        ValueError: when the schedule does not fit the nest or a dtype is unsupported.
    """
    missing = [n for n in (*nest.operand_names, nest.output) if dtypes.get(n) not in STORAGE]
    if missing:
        raise ValueError(f"dtypes of {missing} missing or not one of {sorted(STORAGE)}")
    schedule = schedule or choose_cpu_schedule(nest, dtypes)
    validate(nest, schedule)
    e = _Emitter(nest, dtypes, schedule)
    work = sympy.Mul(*(sympy.Max(r.stop - r.start, 0) for r in nest.free)) * (
        1
        + sympy.Add(
            *(sympy.Mul(*(sympy.Max(r.stop - r.start, 0) for r in t.reduced)) for t in nest.terms)
        )
    )
    e.named.append(("work_", work))
    body = STRATEGY_EMITTERS[schedule.strategy](e)
    if schedule.small is not None:
        vector = next(r for r in nest.free if r.index.name == schedule.vector)
        small = STRATEGY_EMITTERS[schedule.small.strategy](e.variant(schedule=schedule.small))
        head = f"if ({e.idx(vector.stop - vector.start)} >= {schedule.width})"
        body = [*_block(head, body)[:-1], "} else {", *_indent(small), "}"]
    params = [(sym.name, expr) for expr, sym in e.params.items()] + e.named
    digest = hashlib.sha256(
        repr((str(nest), sorted(dtypes.items()), schedule, role)).encode()
    ).hexdigest()[:8]
    entry = f"tdsl_{_cname(nest.output)}_{_cname(role)}_{digest}"
    return CSource(_assemble(e, entry, params, body), entry, tuple(params))


def _assemble(e: _Emitter, entry: str, params: list[tuple[str, sympy.Expr]], body: Lines) -> str:
    nest = e.nest
    source = str(nest).replace("*/", "* /")
    dtypes = ", ".join(f"{k}: {v}" for k, v in sorted(e.dtypes.items()))
    head = [
        "/* Generated by tensordsl. Do not edit.",
        *(f" *   {line}" for line in source.splitlines()),
        f" * reduction: {nest.reduction}; dtypes: {dtypes}; accumulate in {e.f}",
        f" * schedule: {e.schedule.describe()}",
        " */",
        "#include <math.h>",
        "#include <stdint.h>",
        "",
        e.printer.helpers(),
    ]
    if any(v in ("float16", "bfloat16") for v in e.dtypes.values()):
        head.append(_HALF)
    head.append(_TILE_HELPERS)
    prologue: Lines = []
    for n, op in enumerate(nest.operands):
        ctype = STORAGE[e.dtypes[op.name]]
        pointer = f"((const {ctype} *)operands[{n}])"
        if op.is_scalar:
            value = e.load(op.name).format(f"{pointer}[0]")
            prologue.append(f"const {e.f} in_{_cname(op.name)} = {value};")
        else:
            prologue.append(f"const {ctype} *restrict in_{_cname(op.name)} = {pointer};")
    out_type = STORAGE[e.dtypes[nest.output]]
    prologue.append(f"{out_type} *restrict out_ = ({out_type} *)out;")
    prologue += [f"const int64_t {name} = params[{n}];" for n, (name, _) in enumerate(params)]
    signature = f"void {entry}(void *out, const void *const *operands, const int64_t *params)"
    return "\n".join([*head, "", *_block(signature, [*prologue, *body]), ""])
