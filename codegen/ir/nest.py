"""The loop-nest IR.

A `LoopNest` computes one output array. Its free indices run over rectangular ranges (the
output's axes, in order); its body is a sum of `Term`s, each with its own reduced indices,
reduced with the nest's reduction and written once per output element::

    OUT[f...] = reduce over terms t, over t.reduced (within t.constraints, where t.guard)
                of t.body

Symbols used inside the IR:

* index symbols (`index_symbol`): integer loop indices, free or reduced;
* extent symbols (`extent_symbol`): the run-time length of one axis of a named tensor; all
  ranges are expressions of extents, so one nest serves every shape;
* scalar operands (`scalar_symbol`) and tensor accesses (`tensor_base(name)[i, k]`).

Ranges are half-open `[start, stop)`. A term's `constraints` are affine expressions `c` of
loop indices (integer coefficients) and extents that must satisfy `c >= 0`: gradient nests
use them for the bounds that a change of variables produces. `guard` is any further
condition on indices (a divisibility test, a repeated index).

>>> i, k = index_symbol("i"), index_symbol("k")
>>> A = tensor_base("A")
>>> nest = LoopNest(
...     output="Y",
...     free=(Range(i, 0, extent_symbol("A", 0)),),
...     terms=(Term(A[i, k], (Range(k, 0, extent_symbol("A", 1)),)),),
...     operands=(Operand("A", 2),),
... )
>>> nest.free_indices, nest.terms[0].reduced_indices
((i,), (k,))
>>> sorted(nest.extent_tensors())
['A']
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace

import sympy
from sympy.core.symbol import Str

from codegen.ir.reductions import POSITION_DTYPE, REDUCTIONS
from codegen.ir.source import as_one_term, constraint_source, expr_source

_EXTENT_NAME = re.compile(r"^(?P<tensor>.+)\.shape\[(?P<axis>\d+)\]$")


def index_symbol(name: str) -> sympy.Symbol:
    """The symbol of a loop index."""
    return sympy.Symbol(name, integer=True)


def scalar_symbol(name: str) -> sympy.Symbol:
    """The symbol of a scalar operand."""
    return sympy.Symbol(name, real=True)


def tensor_base(name: str) -> sympy.IndexedBase:
    """The indexed base of a tensor operand: `tensor_base("A")[i, k]` is an access."""
    return sympy.IndexedBase(name, real=True)


def extent_symbol(tensor: str, axis: int) -> sympy.Symbol:
    """The run-time extent of `tensor`'s axis `axis`."""
    return sympy.Symbol(f"{tensor}.shape[{axis}]", integer=True, nonnegative=True)


def extent_of(symbol: sympy.Basic) -> tuple[str, int] | None:
    """`(tensor, axis)` for an extent symbol, else None."""
    if not isinstance(symbol, sympy.Symbol):
        return None
    match = _EXTENT_NAME.match(symbol.name)
    if match is None:
        return None
    return match["tensor"], int(match["axis"])


class Reduce(sympy.Expr):
    """A nested reduction inside a body: `reduction` over `index` in `[start, stop)` of `body`.

    Programs inline an intermediate that has its own reduction this way
    (`S[i, j] = sum_d Q[i, d]*K[j, d]` inside `exp(S[i, j] - L[i])`). `index` is bound: it is
    not among the free symbols, and the emitters compute the reduction in a loop of its own.

    >>> i, d = index_symbol("i"), index_symbol("d")
    >>> r = Reduce("sum", tensor_base("Q")[i, d], d, 0, extent_symbol("Q", 1))
    >>> r, sorted(map(str, r.free_symbols))
    (sum_d(Q[i, d]), ['Q', 'Q.shape[1]', 'i'])
    """

    is_real = True

    def __new__(
        cls, reduction: str | Str, body: object, index: object, start: object, stop: object
    ) -> Reduce:
        name = reduction if isinstance(reduction, Str) else Str(reduction)
        args = (name, *(sympy.sympify(a) for a in (body, index, start, stop)))
        return sympy.Expr.__new__(cls, *args)

    @property
    def reduction(self) -> str:
        return str(self.args[0].name)

    @property
    def body(self) -> sympy.Expr:
        return self.args[1]

    @property
    def index(self) -> sympy.Symbol:
        return self.args[2]

    @property
    def start(self) -> sympy.Expr:
        return self.args[3]

    @property
    def stop(self) -> sympy.Expr:
        return self.args[4]

    @property
    def free_symbols(self) -> set[sympy.Basic]:
        # sympy counts an access among its free symbols: drop those that read the bound index.
        inner = {s for s in self.body.free_symbols if self.index not in s.free_symbols}
        return inner | self.start.free_symbols | self.stop.free_symbols

    def _eval_derivative(self, symbol: sympy.Symbol) -> sympy.Expr:
        if symbol not in self.free_symbols:
            return sympy.Integer(0)
        raise NotImplementedError("gradients through a nested reduction are derived by grad.py")

    def _sympystr(self, printer: sympy.printing.StrPrinter) -> str:
        return f"{self.reduction}_{self.index}({printer._print(self.body)})"


@dataclass(frozen=True)
class Range:
    """`index` runs over `[start, stop)`; start and stop are expressions of extents."""

    index: sympy.Symbol
    start: sympy.Expr
    stop: sympy.Expr

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", sympy.sympify(self.start))
        object.__setattr__(self, "stop", sympy.sympify(self.stop))


@dataclass(frozen=True)
class Operand:
    """An input of a nest: a tensor of `rank` axes, or a scalar when rank is 0."""

    name: str
    rank: int

    @property
    def is_scalar(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class Term:
    """One summand of a nest's body with its own reduced indices."""

    body: sympy.Expr
    reduced: tuple[Range, ...] = ()
    constraints: tuple[sympy.Expr, ...] = ()
    guard: sympy.Basic = field(default=sympy.true)

    @property
    def reduced_indices(self) -> tuple[sympy.Symbol, ...]:
        return tuple(r.index for r in self.reduced)

    def expressions(self) -> Iterator[sympy.Basic]:
        """Every sympy expression of the term (body, bounds, constraints, guard)."""
        yield self.body
        for r in self.reduced:
            yield r.start
            yield r.stop
        yield from self.constraints
        yield self.guard


@dataclass(frozen=True)
class LoopNest:
    """One output array computed by a loop nest (see the module docstring)."""

    output: str
    free: tuple[Range, ...]
    terms: tuple[Term, ...]
    operands: tuple[Operand, ...]
    #: A key of `codegen.ir.reductions.REDUCTIONS`. argmax/argmin give the position of the
    #: extreme value as a flat index over the reduced ranges (row-major in `Term.reduced`).
    reduction: str = "sum"
    #: Not empty: a one-pass softmax-weighted sum (`codegen.passes.online`) that also computes the
    #: logsumexp named here, packed into the output's last axis. Only the C back end emits
    #: it; the others run it as the two nests it stands for.
    online: str = ""

    def __post_init__(self) -> None:
        assert self.reduction in REDUCTIONS, self.reduction
        assert self.terms, "a nest has at least one term"
        several = self.reduction == "sum" or self.online
        assert several or len(self.terms) == 1, "only sums have several terms"

    @property
    def free_indices(self) -> tuple[sympy.Symbol, ...]:
        return tuple(r.index for r in self.free)

    @property
    def label(self) -> str:
        """What the nest computes, for people: its output (a one-pass nest: `O+L`)."""
        return f"{self.output}+{self.online}" if self.online else self.output

    @property
    def operand_names(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.operands)

    def operand(self, name: str) -> Operand:
        for op in self.operands:
            if op.name == name:
                return op
        raise KeyError(name)

    def expressions(self) -> Iterator[sympy.Basic]:
        """Every sympy expression of the nest."""
        for r in self.free:
            yield r.start
            yield r.stop
        for term in self.terms:
            yield from term.expressions()

    def extent_tensors(self) -> frozenset[str]:
        """Names of the tensors whose extents the nest refers to (operands or not).

        Computed once per nest (every call through JAX asks for it)."""
        known = self.__dict__.get("_extent_tensors")
        if known is not None:
            return known
        names = set()
        for expr in self.expressions():
            for sym in expr.free_symbols:
                found = extent_of(sym)
                if found is not None:
                    names.add(found[0])
        # Not a field: equality, hashing and `replace` ignore it; frozen, so set directly.
        object.__setattr__(self, "_extent_tensors", frozenset(names))
        return self.__dict__["_extent_tensors"]

    @property
    def declares_output_shape(self) -> bool:
        """True when the caller gives the output's shape (gradient nests do)."""
        return self.output in self.extent_tensors()

    def __str__(self) -> str:
        return nest_source(self)


def accesses(expr: sympy.Basic) -> tuple[sympy.Indexed, ...]:
    """The tensor accesses in `expr`, in a stable order."""
    found = expr.atoms(sympy.Indexed)
    return tuple(sorted(found, key=sympy.default_sort_key))


def rename(nest: LoopNest, /, *, tensors: dict[str, str], indices: dict[str, str]) -> LoopNest:
    """Rename tensors/scalars (and their extents) and indices throughout a nest."""
    mapping: dict[sympy.Basic, sympy.Basic] = {}
    # Loop indices too: a free index need not appear in any expression (`dX[b, f] = dM[b]`).
    loops = (*nest.free_indices, *(s for t in nest.terms for s in t.reduced_indices))
    for expr in (*nest.expressions(), *loops):
        for sym in expr.free_symbols:
            ext = extent_of(sym)
            if ext is not None and ext[0] in tensors:
                mapping[sym] = extent_symbol(tensors[ext[0]], ext[1])
            elif isinstance(sym, sympy.Symbol) and sym.name in indices and sym.is_integer:
                mapping[sym] = index_symbol(indices[sym.name])
            elif isinstance(sym, sympy.Symbol) and sym.name in tensors and ext is None:
                mapping[sym] = scalar_symbol(tensors[sym.name])
        for base in expr.atoms(sympy.IndexedBase):
            if base.name in tensors:
                mapping[base] = tensor_base(tensors[base.name])

    renamed = map_expressions(nest, lambda e: e.xreplace(mapping))
    return replace(
        renamed,
        output=tensors.get(nest.output, nest.output),
        operands=tuple(Operand(tensors.get(op.name, op.name), op.rank) for op in nest.operands),
        online=tensors.get(nest.online, nest.online),
    )


def map_expressions(nest: LoopNest, function: Callable[[sympy.Basic], sympy.Basic]) -> LoopNest:
    """The nest with `function` applied to every expression: ranges (their index symbols
    too), bodies, constraints and guards."""

    def map_range(r: Range) -> Range:
        return Range(function(r.index), function(r.start), function(r.stop))

    terms = tuple(
        Term(
            function(t.body),
            tuple(map_range(r) for r in t.reduced),
            tuple(function(c) for c in t.constraints),
            function(t.guard),
        )
        for t in nest.terms
    )
    return replace(nest, free=tuple(map_range(r) for r in nest.free), terms=terms)


def canonical(nest: LoopNest) -> LoopNest:
    """The nest with tensors and indices renamed by position: the cache key.

    Operands become T0, T1, ... (in order), the output OUT, free indices i0, i1, ... and
    each term's reduced indices r0, r1, ... (shared names across terms are fine: every term
    binds its own).

    >>> i, j = index_symbol("i"), index_symbol("j")
    >>> P = tensor_base("P")
    >>> n = LoopNest("Z", (Range(i, 0, extent_symbol("P", 0)),),
    ...              (Term(P[i, j], (Range(j, 0, extent_symbol("P", 1)),)),), (Operand("P", 2),))
    >>> str(canonical(n))
    'OUT[i0] := T0[i0, r0]'
    """
    tensors, indices = canonical_names(nest)
    return rename(nest, tensors=tensors, indices=indices)


def canonical_names(nest: LoopNest) -> tuple[dict[str, str], dict[str, str]]:
    """The renaming `canonical` applies: `{tensor: new name}`, `{index: new name}`."""
    tensors = {op.name: f"T{n}" for n, op in enumerate(nest.operands)}
    tensors[nest.output] = "OUT"
    if nest.online:
        tensors[nest.online] = "LSE"
    for name in sorted(nest.extent_tensors() - set(tensors)):
        tensors[name] = f"X{len(tensors)}"
    indices = {sym.name: f"i{n}" for n, sym in enumerate(nest.free_indices)}
    reduced_names: dict[str, str] = {}
    for term in nest.terms:
        for sym in term.reduced_indices:
            reduced_names.setdefault(sym.name, f"r{len(reduced_names)}")
    # Any other integer symbol (a stray index) keeps its name; rename() leaves it alone.
    indices.update(reduced_names)
    return tensors, indices


# --------------------------------------------------------------------------- as source
def output_source(nest: LoopNest) -> str:
    """The left-hand side: `Y[i, j]`, or `s` for a 0-d output."""
    if not nest.free:
        return nest.output
    return f"{nest.output}[{', '.join(r.index.name for r in nest.free)}]"


def nest_source(nest: LoopNest) -> str:
    """The nest as source: one statement per term (a one-pass nest, `codegen.passes.online`: the
    logsumexp and the weighted sum it stands for)."""
    if nest.online:
        return _one_pass_source(nest)
    name = nest.reduction
    if REDUCTIONS[name].selects and nest.free:  # `(topk 5)`: k, the rank's extent
        name += f" {nest.free[-1].stop - nest.free[-1].start}"
    prefix = "" if name == "sum" else f"({name}) "
    lhs = output_source(nest)
    lines = []
    for n, term in enumerate(nest.terms):
        op = ":=" if n == 0 else "+="
        lines.append(f"{prefix}{lhs} {op} {_term_source(term, nest.operand_names)}")
    return "\n".join(lines)


def _term_source(term: Term, operands: tuple[str, ...]) -> str:
    """A term's body as a statement reads it back: a sum whose terms read different reduced
    indices is printed as one call (`source.as_one_term`, the parser's rule for a term free
    of its reduced indices would add it once); guards multiply the whole body.

    >>> i, k = index_symbol("i"), index_symbol("k")
    >>> x = tensor_base("X")[i + k]
    >>> _term_source(Term(2*x + 4, reduced=(Range(k, 0, 3),)), ("X",))
    'pow(2*X[i + k] + 4, 1)'
    >>> _term_source(Term(2*x + 4, reduced=()), ("X",))
    '2*X[i + k] + 4'
    """
    body = as_one_term(term.body, term.reduced_indices)
    text = expr_source(body, operands)
    guards = _guards(term, operands)
    if guards and isinstance(body, sympy.Add):
        text = f"({text})"
    return text + guards


def _guards(term: Term, operands: tuple[str, ...] = ()) -> str:
    """Constraints read back as guards: `(j <= i)` factors; then the guard, a factor too
    (`(doc[b, i] == doc[b, j])`)."""
    text = "".join(f"*({constraint_source(c)})" for c in term.constraints)
    if term.guard != sympy.true:
        text += f"*({expr_source(term.guard, operands)})"
    return text


def _one_pass_source(nest: LoopNest) -> str:
    scores, weight = nest.terms
    rows = ", ".join(r.index.name for r in nest.free[:-1])
    lse = f"{nest.online}[{rows}]" if rows else nest.online
    last = nest.free[-1].index.name
    x = expr_source(scores.body, nest.operand_names)
    w = expr_source(weight.body, nest.operand_names)
    names = nest.operand_names
    return "\n".join(
        [
            f"(one pass, packed along {last}) (logsumexp) {lse} := {x}{_guards(scores, names)}",
            f"{nest.output}[{rows}, {last}] := exp({x} - {lse})*{w}{_guards(weight, names)}",
        ]
    )


def default_dtypes(nest: LoopNest, dtype: str = "float32") -> dict[str, str]:
    """`dtype` for every operand and the output; a positional output is `POSITION_DTYPE`."""
    dtypes = dict.fromkeys(nest.operand_names, dtype)
    dtypes[nest.output] = POSITION_DTYPE if REDUCTIONS[nest.reduction].positional else dtype
    return dtypes
