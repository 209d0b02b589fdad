"""The state of one C emission: names, host parameters, reduction templates, term bodies.

`codegen.c` (scalar and split strategies, assembly), `codegen.c_tiles` (tile and dot
strategies) and `codegen.cuda` emit through an `Emitter`.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.bounds import LoopBounds, hoist_parameters, loop_bounds
from codegen.ir import LoopNest, Term, extent_of, extent_symbol
from codegen.printer import CPrinter, TensorView
from codegen.schedule import Schedule, term_order

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


def check_dtypes(nest: LoopNest, dtypes: Mapping[str, str], storage: Mapping[str, str]) -> None:
    """Raise ValueError unless every tensor of `nest` has a dtype with a `storage` type."""
    missing = [n for n in (*nest.operand_names, nest.output) if dtypes.get(n) not in storage]
    if missing:
        raise ValueError(f"dtypes of {missing} missing or not one of {sorted(storage)}")


def entry_name(nest: LoopNest, dtypes: Mapping[str, str], schedule: object, role: str) -> str:
    """`tdsl_<output>_<role>_<hash8>`: the hash covers the nest, dtypes and schedule."""
    digest = hashlib.sha256(
        repr((str(nest), sorted(dtypes.items()), schedule, role)).encode()
    ).hexdigest()[:8]
    return f"tdsl_{c_name(nest.output)}_{c_name(role)}_{digest}"


def accumulation_type(dtypes: Mapping[str, str]) -> str:
    """`double` when any operand or the output is float64, else `float`."""
    return "double" if "float64" in dtypes.values() else "float"


def c_name(name: str) -> str:
    return re.sub(r"\W", "_", name)


def indent_lines(lines: Sequence[str], levels: int = 1) -> Lines:
    return ["    " * levels + line if line else line for line in lines]


def block_lines(head: str, body: Sequence[str]) -> Lines:
    return [head + " {", *indent_lines(body), "}"]


class Emitter:
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
                scalars[op.name] = f"in_{c_name(op.name)}"
                continue
            extents = [extent_symbol(op.name, d) for d in range(op.rank)]
            strides = self.stride(op.name, extents)
            integer = dtypes[op.name].startswith("int")
            tensors[op.name] = TensorView(
                f"in_{c_name(op.name)}", strides, self.load(op.name), integer=integer
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
    ) -> Emitter:
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
            cname = f"s_{c_name(name)}_{d}"
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
            return block_lines(f"if ({' && '.join(conditions)})", unguarded.term_body(n, sub))
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
            update = block_lines(f"if ({self.printer.doprint(self.hoist(term.guard))})", update)
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
            lines = block_lines(f"for (int64_t {name} = {lo}; {name} < {hi}; ++{name})", lines)
        return lines

    def guarded(self, n: int, lines: Lines) -> Lines:
        tests = self.bounds[n].free_tests
        if not tests:
            return lines
        cond = " && ".join(f"{self.idx(t)} >= 0" for t in tests)
        return block_lines(f"if ({cond})", lines)

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
