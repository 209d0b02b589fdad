"""The state of one emission: names, host parameters, reduction state, term bodies.

`Emitter` emits C; everything that differs for another C dialect is a class attribute (the
printer, the index and position types, the storage types, the half-precision conversions),
so `codegen.cuda.dialect.CudaEmitter` only states what differs. The strategies
(`codegen.c.reductions.simple`, `codegen.c.tiles`, `codegen.cuda.reductions.simple`,
`codegen.cuda.staged.tiles`) write loops through an emitter; `codegen.c.emit` and
`codegen.cuda.emit` assemble the function.
"""

from __future__ import annotations

import copy
import dataclasses
import string
from collections.abc import Mapping, Sequence
from typing import Generic, TypeVar

import sympy

from codegen.emit import lane_sums, staging
from codegen.emit.loop_order import LoopOrder, term_order
from codegen.emit.printer import CPrinter, TensorView, c_name
from codegen.emit.signature import STORAGE, accumulation_type
from codegen.emit.staging import Assign, Loop, Plan, Statement
from codegen.ir.bounds import LoopBounds, hoist_parameters, loop_bounds
from codegen.ir.nest import LoopNest, Term, extent_of, extent_symbol
from codegen.ir.reductions import REDUCTIONS, Reduction

Lines = list[str]
S = TypeVar("S", bound=LoopOrder)


def indent_lines(lines: Sequence[str], levels: int = 1) -> Lines:
    return ["    " * levels + line if line else line for line in lines]


def block_lines(head: str, body: Sequence[str]) -> Lines:
    return [head + " {", *indent_lines(body), "}"]


class Emitter(Generic[S]):
    """State of one emission: the printer, hoisted parameters and the C names.

    Generic in its schedule type (`Schedule` for C, `GpuSchedule` for CUDA).
    """

    printer_class: type[CPrinter] = CPrinter
    index_type = "int64_t"  # loop indices, offsets and integer sub-expressions
    position_type = "int64_t"  # the position state of argmax/argmin
    #: The pragma over a nested sum's loop, "{state}" its accumulator; empty: none.
    simd_sum_pragma = "#pragma omp simd reduction(+:{state})"
    storage = STORAGE  # numpy dtype name -> element type in memory
    #: Conversions of 16-bit storage types to and from float.
    half_to_float = {"float16": "tdsl_h2f", "bfloat16": "tdsl_bf2f"}
    float_to_half = {"float16": "tdsl_f2h", "bfloat16": "tdsl_f2bf"}

    #: Write a `TDSL_COUNT_FMA(n)` hook at each body evaluation (`fma_hook`): the CUDA
    #: emulator's counters (codegen/cuda/emulator/counting.h); never in text for a compiler.
    count_fmas = False

    def __init__(self, nest: LoopNest, dtypes: Mapping[str, str], schedule: S):
        self.nest, self.dtypes, self.schedule = nest, dtypes, schedule
        self.f = accumulation_type(dtypes)
        self.params: dict[sympy.Basic, sympy.Symbol] = {}
        self.named: list[tuple[str, sympy.Expr]] = []  # strides and work, after the P's
        self.reducer = REDUCTIONS[nest.reduction]
        self.temporaries = 0  # temporaries t0_, t1_, ... named so far (see `plan`)
        self.tile_symbols: dict[tuple[str, str], sympy.Dummy] = {}
        self.outlined: list[tuple[str, tuple, tuple[str, ...]]] = []  # C: outline.py
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
        self.out_strides = self.stride("OUT", [r.stop - r.start for r in nest.free])
        self.printer = self.printer_class(self.f, tensors=tensors, scalars=scalars)
        self._exp = self.printer.call_name(sympy.exp)  # float32 C: tdsl_exp (codegen.c.vecmath)
        self._log = "logf" if self.f == "float" else "log"
        self.bounds = [
            loop_bounds(t, term_order(nest, schedule, n)) for n, t in enumerate(nest.terms)
        ]

    @property
    def exp(self) -> str:
        """The name of exp in the accumulation type, for code written around the printer (a
        reduction's template, the online strategy); noted as called (`CPrinter.functions`)."""
        self.printer.functions.add("exp")
        return self._exp

    @property
    def log(self) -> str:
        """The name of log in the accumulation type; noted as called, as `exp`."""
        self.printer.functions.add("log")
        return self._log

    def variant(self, terms: Sequence[Term] | None = None, schedule: S | None = None) -> Emitter[S]:
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
                symbol, sympy.Dummy(f"P{len(self.params)}", integer=True)
            )
        return expr.xreplace(bare)

    def tile_symbol(self, role: str, index: sympy.Symbol) -> sympy.Dummy:
        """A generated integer variable about a tiled `index` (`o` its tile's origin, ...),
        one per role and index: `<role>_<index>`, outside the users' `v_` namespace."""
        key = (role, index.name)
        if key not in self.tile_symbols:
            self.tile_symbols[key] = sympy.Dummy(f"{role}_{c_name(index.name)}", integer=True)
        return self.tile_symbols[key]

    def tile_name(self, role: str, index: sympy.Symbol) -> str:
        """The C name of `tile_symbol(role, index)`."""
        return self.tile_symbol(role, index).name

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
        if dtype in self.half_to_float:
            return f"(({self.f}){self.half_to_float[dtype]}({{}}))"
        return "{}" if self.storage[dtype] == self.f else f"(({self.f}){{}})"

    def store(self, value: str) -> str:
        dtype = self.dtypes[self.nest.output]
        if dtype in self.float_to_half:
            return f"{self.float_to_half[dtype]}((float)({value}))"
        storage = self.storage[dtype]
        if dtype.startswith("int") and not self.reducer.positional:
            return f"({storage})llrint({value})"
        return value if storage == self.f else f"({storage})({value})"

    def idx(self, expr: sympy.Basic) -> str:
        return self.printer.index(self.hoist(expr))

    def fma_hook(self, count: int | str = 1) -> Lines:
        """The counting hook of `count` body evaluations, where `count_fmas` asks for it."""
        return [f"TDSL_COUNT_FMA({count});"] if self.count_fmas else []

    # -- reduction state -----------------------------------------------------------------

    def names(self, base: str = "acc_", sub: str = "") -> tuple[str, str]:
        """The C lvalues of the reduction state (value, second value or position)."""
        return f"{base}{sub}", f"{base}b_{sub}"

    def state_types(self, reducer: Reduction | None = None) -> tuple[str, str]:
        """The C types of the two state variables (of the nest's reduction by default)."""
        row = reducer or self.reducer
        positional = row.positional or row.selects  # a selection keeps positions too
        value = self.f if reducer is not None else self.nest_state_type()
        return value, self.position_type if positional else self.f

    #: Strategies whose nest state is one sequential chain of additions (no vector lanes):
    #: a float sum accumulates in double there (`nest_state_type`).
    double_sum_strategies: tuple[str, ...] = ("scalar", "split")

    def nest_state_type(self) -> str:
        """The type of the nest's reduction state: the accumulation type, but double for a
        float sum in a strategy that adds one value after another. Its error then stays
        below float's rounding for any length (a float chain's grows like n: 2e8 ones
        summed to 199999840), and it costs nothing: such a chain waits on each addition's
        latency, which a conversion to double does not lengthen."""
        strategy = getattr(self.schedule, "strategy", None)
        wide = self.reducer.name == "sum" and strategy in self.double_sum_strategies
        return "double" if wide and self.f == "float" else self.f

    def declare(self, base: str = "acc_", dims: str = "") -> Lines:
        """Declare the state; scalars (no `dims`) are initialised."""
        kinds = self.state_types()
        lines = []
        for kind, name, init in zip(kinds, self.names(base), self.reducer.init, strict=False):
            lines.append(f"{kind} {name}{dims};" if dims else f"{kind} {name} = {init};")
        return lines

    def init(self, sub: str, base: str = "acc_") -> Lines:
        names = self.names(base, sub)
        return [f"{s} = {v};" for s, v in zip(names, self.reducer.init, strict=False)]

    def fmt(
        self,
        template: str,
        state: tuple[str, str],
        other: tuple[str, str] = ("", ""),
        *,
        value: str = "val_",
    ) -> str:
        """A reduction template with its state variables, the other state it combines with,
        and the C name of the value it takes (`value`)."""
        a, b = state
        fields = {field for _, field, _, _ in string.Formatter().parse(template) if field}
        functions = {name: getattr(self, name) for name in ("exp", "log") if name in fields}
        return template.format(a=a, b=b, oa=other[0], ob=other[1], v=value, pos="pos_", **functions)

    # -- terms ---------------------------------------------------------------------------

    def plan(
        self,
        n: int,
        levels: Sequence[Sequence[sympy.Symbol]],
        tests: Sequence[sympy.Expr] = (),
        *,
        hoist_conditions: bool = False,
    ) -> Plan:
        """Where term `n`'s sub-expressions are computed when its loops bind `levels`
        (see `codegen.emit.staging`). `tests` are constraints `c >= 0` tested per element (the
        edge tiles of a tile strategy); the term's guard and the tests its loop bounds leave
        on free indices are added."""
        term = self.nest.terms[n]
        exprs = (*self.bounds[n].free_tests, *tests)
        conditions = [sympy.Ge(self.hoist(c), 0) for c in exprs]
        if term.guard != sympy.true:
            conditions.append(self.hoist(term.guard))
        integer = frozenset(name for name, v in self.printer.tensors.items() if v.integer)
        body = self.hoist(term.body)
        found = staging.plan(
            body,
            levels,
            conditions,
            first=self.temporaries,
            integer_tensors=integer,
            hoist_conditions=hoist_conditions,
        )
        self.temporaries = found.next_temporary
        return found

    def level_lines(
        self, plan: Plan | Sequence[Plan], level: int, inner: Lines, *, simd: bool = False
    ) -> Lines:
        """The statements of `level`, then `inner`, under the level's tests. `simd`: the level
        is inside a `#pragma omp simd` loop (nested loops get no simd pragma of their own).
        Several plans of one term that share this level (the same indices bound, so the same
        tests) put their statements side by side under one test."""
        plans = [plan] if isinstance(plan, Plan) else list(plan)
        lines = [s for p in plans for s in self.statement_lines(p.statements[level], simd)]
        lines += inner
        tests = plans[0].tests[level]
        if not tests:
            return lines
        return block_lines(f"if ({' && '.join(self.printer.doprint(t) for t in tests)})", lines)

    def statement_lines(self, statements: Sequence[Statement], simd: bool) -> Lines:
        lines: Lines = []
        for statement in statements:
            if isinstance(statement, Assign):
                value = self.printer.doprint(statement.expr)
                lines.append(f"const {self.f} {statement.symbol.name} = {value};")
            else:
                lines += self.nested_lines(statement, simd)
        return lines

    def nested_lines(self, loop: Loop, simd: bool) -> Lines:
        """A nested reduction: its state, its loop (`#pragma omp simd` for sums outside a
        simd loop), its result; a nested sum inside it in lane arrays where that applies."""
        if not simd and self.simd_sum_pragma and (lanes := lane_sums.lane_sum_lines(self, loop)):
            return lanes
        reducer = REDUCTIONS[loop.reduction]
        state = (f"{loop.symbol.name}a", f"{loop.symbol.name}b")
        kinds = self.state_types(reducer)
        lines = [f"{kind} {name} = {init};" for kind, name, init in zip(kinds, state, reducer.init)]
        name = self.printer.index(loop.index)
        lo, hi = self.printer.index(loop.start), self.printer.index(loop.stop)
        body = [
            *self.statement_lines(loop.inner, True),
            f"const {self.f} nv_ = {self.printer.doprint(loop.value)};",
            self.fmt(reducer.update, state, value="nv_"),
            *self.fma_hook(),
        ]
        if not simd and loop.reduction == "sum" and self.simd_sum_pragma:
            lines.append(self.simd_sum_pragma.format(state=state[0]))
        head = f"for ({self.index_type} {name} = {lo}; {name} < {hi}; ++{name})"
        lines += block_lines(head, body)
        result = self.fmt(reducer.result, state)
        return [*lines, f"const {self.f} {loop.symbol.name} = {result};"]

    def term_lines(
        self,
        n: int,
        *,
        first: tuple[str, str] | None = None,
        step: tuple[str, str] | None = None,
        first_step: tuple[str, str] | None = None,
    ) -> Lines:
        """Term `n` folded into the scalar state `acc_`: its reduced loops (see `loops` for
        `first`, `step` and `first_step`), each sub-expression at the outermost loop where
        its indices are bound (level 0 is outside the term's loops), in a block of its own."""
        plan = self.plan(n, [[], *self.reduced_levels(n)])
        fold = self.fold_lines(n, plan, "")
        loops = self.loops(n, fold, first=first, step=step, first_step=first_step, plan=plan)
        return ["{", *indent_lines(self.level_lines(plan, 0, loops)), "}"]

    def fold_lines(self, n: int, plan: Plan, sub: str, update: str | None = None) -> Lines:
        """At the innermost level: the body's value, folded into the state `acc<sub>` (by
        `update` instead of the reduction's own where given)."""
        lines = [f"const {self.f} val_ = {self.printer.doprint(plan.value)};"]
        if self.reducer.positional or self.reducer.selects:
            lines.append(f"const {self.index_type} pos_ = {self.position(self.nest.terms[n])};")
        update = self.fmt(update or self.reducer.update, self.names("acc_", sub))
        return [*lines, update, *self.fma_hook()]

    def selected_fold_lines(self, plan: Plan, level: int, sub: str) -> Lines | None:
        """A sum's fold at `level` (a tile's lanes): a value, zero where a test fails, added
        unconditionally, so the accumulators stay in registers (an update under the test is a
        masked store). None where this is not a sum or the level has no tests."""
        tests = plan.tests[level]
        if not tests or self.nest.reduction != "sum" or self.reducer.positional:
            return None
        test = " && ".join(self.printer.doprint(t) for t in tests)
        value = self.printer.doprint(plan.value)
        guarded = [*self.statement_lines(plan.statements[level], True), f"val_ = {value};"]
        guarded += self.fma_hook()
        update = self.fmt(self.reducer.update, self.names("acc_", sub))
        return [f"{self.f} val_ = 0;", *block_lines(f"if ({test})", guarded), update]

    def position(self, term: Term) -> str:
        """The flat row-major position over the term's reduced ranges (argmax/argmin)."""
        parts, stride = [], sympy.Integer(1)
        for r in reversed(term.reduced):
            parts.append(self.hoist((r.index - r.start) * stride))
            stride = stride * sympy.Max(r.stop - r.start, 0)
        return self.printer.index(sympy.Add(*parts)) if parts else "0"

    def term_order(self, n: int) -> tuple[sympy.Symbol, ...]:
        """Term `n`'s reduced indices in loop order (outermost first)."""
        return term_order(self.nest, self.schedule, n)

    def loops(
        self,
        n: int,
        inner: Lines,
        *,
        first: tuple[str, str] | None = None,
        stop_at: int | None = None,
        step: tuple[str, str] | None = None,
        plan: Plan | Sequence[Plan] | None = None,
        level: int = 1,
        first_step: tuple[str, str] | None = None,
    ) -> Lines:
        """Term `n`'s reduced loops around `inner`, outermost first, down to `stop_at`.

        `first` replaces the outermost loop's bounds; with `step = (offset, stride)` the
        innermost loop starts `offset` after its lower bound and advances by `stride`, and
        `first_step` does the same for the outermost loop where it is not the innermost. With
        a `plan`, the body of the loop at depth d starts with the plan's level `level + d`.
        """
        order = self.term_order(n)
        bounds: LoopBounds = self.bounds[n]
        lines = inner
        end = len(order) if stop_at is None else stop_at
        for depth in reversed(range(end)):
            r = order[depth]
            lo, hi = self.idx(bounds.starts[r]), self.idx(bounds.stops[r])
            if depth == 0 and first is not None:
                lo, hi = first
            name, kind = self.printer.index(r), self.index_type
            strided = step if depth == len(order) - 1 else first_step if depth == 0 else None
            if strided is not None:
                offset, stride = strided
                head = f"for ({kind} {name} = {lo} + {offset}; {name} < {hi}; {name} += {stride})"
            else:
                head = f"for ({kind} {name} = {lo}; {name} < {hi}; ++{name})"
            if plan is not None:
                lines = self.level_lines(plan, level + depth, lines)
            lines = block_lines(head, lines)
        return lines

    def reduced_levels(self, n: int, stop_at: int | None = None) -> list[list[sympy.Symbol]]:
        """One level per reduced loop of term `n` (down to `stop_at`), in loop order."""
        return [[r] for r in self.term_order(n)[:stop_at]]

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
        name, kind = self.printer.index(r), self.index_type
        return (
            f"for ({kind} {name} = {self.idx(rng.start)}; {name} < {self.idx(rng.stop)}; ++{name})"
        )

    def header(self) -> Lines:
        """The comment that opens every generated source: the nest, dtypes and schedule."""
        source = str(self.nest).replace("*/", "* /")
        dtypes = ", ".join(f"{k}: {v}" for k, v in sorted(self.dtypes.items()))
        return [
            "/* Generated by tensordsl. Do not edit.",
            *(f" *   {line}" for line in source.splitlines()),
            f" * reduction: {self.nest.reduction}; dtypes: {dtypes}; "
            f"accumulate in {self.nest_state_type()}",
            f" * schedule: {self.schedule.describe()}",
            " */",
        ]

    def free_symbols(self) -> list[sympy.Symbol]:
        by_name = {s.name: s for s in self.nest.free_indices}
        return [by_name[name] for name in self.schedule.free_order]
