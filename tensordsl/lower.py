"""Lower a parsed statement to a loop nest, inferring index ranges from the accesses.

`lower` builds the nest: operands in order of first appearance, free indices from the left,
reduced indices in order of first appearance, the body as sympy, and every index's range as
an expression of the operands' extents. `check_shapes` checks concrete shapes against it at
call time (ranks, agreeing extents, non-empty ranges, reads in bounds).

>>> low = lower(parse("Y[i] := X[i+k] * W[k]"))
>>> low.nest.free[0].stop
-W.shape[0] + X.shape[0] + 1
>>> check_shapes(low, {"X": (5,), "W": (2,)})
{X.shape[0]: 5, W.shape[0]: 2}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import sympy

from codegen.functions import FUNCTIONS, CeilDiv, FloorDiv, indicator
from codegen.ir import (
    LoopNest,
    Operand,
    Range,
    Term,
    extent_symbol,
    index_symbol,
    scalar_symbol,
    tensor_base,
)
from codegen.reductions import USER_REDUCTIONS
from tensordsl.errors import (
    ExpressionError,
    IndexExpressionError,
    RangeError,
    ReductionError,
    ShapeError,
    UnknownNameError,
    close_match,
)
from tensordsl.parse import (
    Access,
    Binary,
    Call,
    Compare,
    Expr,
    Name,
    Number,
    Statement,
    Unary,
    parse,
)

__all__ = ["USER_REDUCTIONS", "AccessUse", "Affine", "Lowered", "check_shapes", "lower"]

Span = tuple[int, int]

_DIVISION = ("/",)


@dataclass(frozen=True)
class Affine:
    """An index expression `sum(c * index) + constant` with integer coefficients."""

    coefficients: tuple[tuple[str, int], ...]
    constant: int

    @property
    def bare_index(self) -> str | None:
        """The index name when the expression is that index alone (an unshifted use)."""
        if self.constant == 0 and len(self.coefficients) == 1 and self.coefficients[0][1] == 1:
            return self.coefficients[0][0]
        return None

    def expr(self) -> sympy.Expr:
        terms = [c * index_symbol(n) for n, c in self.coefficients]
        return sympy.Add(*terms, sympy.Integer(self.constant))


@dataclass(frozen=True)
class AccessUse:
    """One tensor access: its affine axes and where it is in the source."""

    tensor: str
    axes: tuple[Affine, ...]
    span: Span
    axis_spans: tuple[Span, ...]


def _walk(node: Expr) -> Iterator[Expr]:
    """`node` and every node below it, in source order."""
    yield node
    if isinstance(node, Access):
        children: tuple[Expr, ...] = node.indices
    elif isinstance(node, Call):
        children = node.args
    elif isinstance(node, Unary):
        children = (node.operand,)
    elif isinstance(node, Binary | Compare):
        children = (node.left, node.right)
    else:
        children = ()
    for child in children:
        yield from _walk(child)


def _text(source: str, span: Span) -> str:
    return source[span[0] : span[1]]


_RELATIONS = {
    "<": sympy.Lt,
    "<=": sympy.Le,
    ">": sympy.Gt,
    ">=": sympy.Ge,
    "==": sympy.Eq,
    "!=": sympy.Ne,
}
_NOT_FINITE = (sympy.zoo, sympy.oo, -sympy.oo, sympy.nan, sympy.I)
_AFFINE_EXAMPLE = "an affine expression of indices with integer coefficients, such as 'i+k', '2i+1'"


@dataclass
class _Body:
    """What walking the right-hand side found."""

    body: sympy.Expr
    free: list[str]
    reduced: list[str]
    operands: list[tuple[str, int]]
    accesses: tuple[AccessUse, ...]
    index_spans: tuple[tuple[str, Span], ...]
    body_spans: dict[str, Span]
    operand_spans: dict[str, Span]


class _BodyBuilder:
    """Turns the syntax tree of the right-hand side into sympy, recording names and accesses."""

    def __init__(self, statement: Statement) -> None:
        self.st = statement
        self.src = statement.source
        self.ranks: dict[str, int] = {}
        self.spans: dict[str, Span] = {}
        self.accesses: list[AccessUse] = []

    def build(self) -> _Body:
        free = self.free_indices()
        bracketed = [
            n
            for a in _walk(self.st.body)
            if isinstance(a, Access)
            for i in a.indices
            for n in _walk(i)
            if isinstance(n, Name)
        ]
        self.indices = set(free) | {n.name for n in bracketed}
        body_spans: dict[str, Span] = {}
        for node in _walk(self.st.body):
            if isinstance(node, Name) and node.name in self.indices:
                body_spans.setdefault(node.name, node.span)
        if self.st.output in self.indices:
            raise UnknownNameError(
                f"'{self.st.output}' is both the output and an index",
                self.src,
                self.st.output_span,
                expected="different names for the output and its indices",
            )
        body = self.value(self.st.body)
        spans = dict(zip(free, (n.span for n in self.st.indices or ()), strict=True))
        for name, span in body_spans.items():
            spans.setdefault(name, span)
        reduced = [n for n in body_spans if n not in free]
        return _Body(
            body,
            free,
            reduced,
            list(self.ranks.items()),
            tuple(self.accesses),
            tuple(spans.items()),
            body_spans,
            self.spans,
        )

    def free_indices(self) -> list[str]:
        names: list[str] = []
        for node in self.st.indices or ():
            if not isinstance(node, Name):
                raise IndexExpressionError(
                    f"'{_text(self.src, node.span)}' on the left-hand side is not an index name",
                    self.src,
                    node.span,
                    expected="plain, distinct index names, as in 'Y[i, j]'",
                )
            if node.name in names:
                raise IndexExpressionError(
                    f"index '{node.name}' appears twice on the left-hand side",
                    self.src,
                    node.span,
                    expected="distinct names (a diagonal is read as 'Y[i] := A[i, i]')",
                )
            names.append(node.name)
        return names

    def register(self, name: str, rank: int, span: Span) -> None:
        if name == self.st.output:
            raise UnknownNameError(
                f"the output '{name}' is used on the right-hand side",
                self.src,
                span,
                expected="only inputs on the right-hand side",
            )
        if rank and name in self.indices:
            raise UnknownNameError(
                f"'{name}' is an index and cannot be read as a tensor",
                self.src,
                span,
                expected="different names for tensors and indices",
            )
        self.spans.setdefault(name, span)
        before = self.ranks.setdefault(name, rank)
        if before == rank:
            return
        if 0 in (before, rank):
            raise UnknownNameError(
                f"'{name}' is used both as a scalar and as a tensor",
                self.src,
                span,
                expected="one role per name",
            )
        raise ShapeError(
            f"'{name}' is read with {rank} indices here but with {before} before",
            self.src,
            span,
            expected=f"the same number of indices on every read of '{name}'",
        )

    def fail(self, what: str, node: Expr, expected: str) -> ExpressionError:
        return ExpressionError(what, self.src, node.span, expected=expected)

    def checked(self, node: Expr, build: Callable[[], sympy.Basic]) -> Any:
        """`build()`, turning sympy's complaints and non-finite values into user errors."""
        text = _text(self.src, node.span)
        try:
            result = build()
        except (TypeError, ValueError, ArithmeticError, RecursionError) as err:
            raise self.fail(
                f"cannot evaluate '{text}': {err}", node, "an expression with a finite real value"
            ) from None
        floats = result.atoms(sympy.Float) if isinstance(result, sympy.Basic) else ()
        if any(result.has(v) for v in _NOT_FINITE) or any(not math.isfinite(f) for f in floats):
            raise self.fail(
                f"'{text}' is not a finite real number",
                node,
                "an expression with a finite real value",
            )
        return result

    def value(self, node: Expr) -> Any:
        if isinstance(node, Number):
            return self.checked(node, lambda: _number(node.text))
        if isinstance(node, Name):
            if node.name in self.indices:
                return index_symbol(node.name)
            self.register(node.name, 0, node.span)
            return scalar_symbol(node.name)
        if isinstance(node, Access):
            return self.access(node)
        if isinstance(node, Call):
            return self.call(node)
        if isinstance(node, Compare):
            return indicator(self.relation(node))
        if isinstance(node, Unary):
            operand = self.value(node.operand)
            return -operand if node.op == "-" else operand
        return self.binary(node)

    def binary(self, node: Binary) -> Any:
        left, right = self.value(node.left), self.value(node.right)
        huge = left.is_Number and right.is_Number and abs(right) > 256
        if node.op == "**" and huge and left not in (0, 1, -1):
            raise self.fail(
                f"'{_text(self.src, node.span)}' is too large",
                node,
                "a constant power with an exponent of at most 256",
            )
        ops: dict[str, Callable[[], Any]] = {
            "+": lambda: left + right,
            "-": lambda: left - right,
            "*": lambda: left * right,
            "/": lambda: left / right,
            "**": lambda: left**right,
        }
        return self.checked(node, ops[node.op])

    def relation(self, node: Compare) -> Any:
        left, right = self.value(node.left), self.value(node.right)
        return self.checked(node, lambda: _RELATIONS[node.op](left, right))

    def call(self, node: Call) -> Any:
        spec = FUNCTIONS.get(node.name)
        if spec is None:
            raise UnknownNameError(
                f"unknown function '{node.name}'",
                self.src,
                node.name_span,
                expected="one of " + ", ".join(sorted(FUNCTIONS)),
                hint=close_match(node.name, FUNCTIONS),
            )
        if len(node.args) != spec.arity:
            params = ", ".join("xyz"[: spec.arity])
            raise ShapeError(
                f"'{node.name}' takes {spec.arity} argument(s), got {len(node.args)}",
                self.src,
                node.span,
                expected=f"{node.name}({params})",
            )
        args = [
            self.relation(a)
            if isinstance(a, Compare) and (node.name, n) == ("where", 0)
            else self.value(a)
            for n, a in enumerate(node.args)
        ]
        return self.checked(node, lambda: spec.build(*args))

    def access(self, node: Access) -> Any:
        if not node.indices:
            raise IndexExpressionError(
                f"'{node.name}[]' has no indices",
                self.src,
                node.span,
                expected=f"a scalar written without brackets: '{node.name}'",
            )
        self.register(node.name, len(node.indices), node.name_span)
        axes = tuple(self.affine(index) for index in node.indices)
        self.accesses.append(
            AccessUse(node.name, axes, node.span, tuple(i.span for i in node.indices))
        )
        return tensor_base(node.name)[tuple(a.expr() for a in axes)]

    def affine(self, node: Expr) -> Affine:
        parts = self.affine_parts(node, node)
        text = _text(self.src, node.span)
        if any(c.denominator != 1 for c in parts.values()):
            raise IndexExpressionError(
                f"index expression '{text}' has a non-integer coefficient",
                self.src,
                node.span,
                expected=_AFFINE_EXAMPLE,
            )
        coefficients = tuple((n, int(c)) for n, c in parts.items() if n is not None and c != 0)
        return Affine(coefficients, int(parts.get(None, 0)))

    def affine_parts(self, node: Expr, whole: Expr) -> dict[str | None, Fraction]:
        """Coefficient of each index name (None: the constant) in an index expression."""

        def bad(why: str) -> IndexExpressionError:
            return IndexExpressionError(
                f"index expression '{_text(self.src, whole.span)}' is not affine: {why}",
                self.src,
                whole.span,
                expected=_AFFINE_EXAMPLE,
            )

        if isinstance(node, Number):
            if not node.text.isdigit():
                raise bad(f"'{node.text}' is not an integer")
            return {None: Fraction(int(node.text))}
        if isinstance(node, Name):
            return {node.name: Fraction(1)}
        if isinstance(node, Unary):
            sign = -1 if node.op == "-" else 1
            return {n: sign * c for n, c in self.affine_parts(node.operand, whole).items()}
        if not isinstance(node, Binary):
            kind = {Access: "a tensor read", Call: "a function call"}.get(
                type(node), "a comparison"
            )
            raise bad(f"it contains {kind}")
        left, right = self.affine_parts(node.left, whole), self.affine_parts(node.right, whole)
        if node.op in "+-":
            sign = 1 if node.op == "+" else -1
            zero = Fraction(0)
            return {n: left.get(n, zero) + sign * right.get(n, zero) for n in {**left, **right}}
        constant = {None}
        if node.op == "*" and (set(left) <= constant or set(right) <= constant):
            scale, other = (left, right) if set(left) <= constant else (right, left)
            return {n: c * scale.get(None, 0) for n, c in other.items()}
        if node.op == "/" and set(right) <= constant and right.get(None, 0) != 0:
            return {n: c / right[None] for n, c in left.items()}
        if node.op == "**" and set(left) | set(right) <= constant:
            base, exponent = left.get(None, Fraction(0)), right.get(None, Fraction(0))
            if exponent.denominator == 1 and 0 <= exponent <= 64:
                return {None: base ** int(exponent)}
        why = {"*": "a product of indices", "/": "a division by an index or zero"}
        raise bad(why.get(node.op, "a power of indices"))


def _number(text: str) -> sympy.Expr:
    if text.isdigit():
        return sympy.Integer(int(text))
    return sympy.Float(float(text))


@dataclass(frozen=True)
class Lowered:
    """A lowered statement plus what call-time checks need."""

    nest: LoopNest
    statement: Statement
    accesses: tuple[AccessUse, ...]  # every tensor access, in source order
    index_spans: tuple[tuple[str, Span], ...]  # first occurrence of every index
    explicit: frozenset[str]  # indices whose range came from `ranges=`
    operand_spans: tuple[tuple[str, Span], ...] = ()  # first use of every operand

    def index_span(self, name: str) -> Span | None:
        return dict(self.index_spans).get(name)

    def unshifted_uses(self, name: str) -> tuple[tuple[AccessUse, int], ...]:
        """`(access, axis)` for every axis indexed by `name` alone."""
        return tuple(
            (access, axis)
            for access in self.accesses
            for axis, affine in enumerate(access.axes)
            if affine.bare_index == name
        )


def _reduction(statement: Statement, reduce: str | None) -> str:
    prefix = statement.reduction
    src, span = statement.source, statement.reduction_span
    if prefix is not None and reduce is not None and prefix != reduce:
        raise ReductionError(
            f"the statement asks for reduction '{prefix}' but reduce='{reduce}' was given",
            src,
            span,
            expected="one reduction: the prefix or reduce=, or both the same",
        )
    name = prefix if prefix is not None else (reduce if reduce is not None else "sum")
    if name not in USER_REDUCTIONS:
        raise ReductionError(
            f"unknown reduction '{name}'",
            src,
            span if prefix is not None else None,
            expected="one of " + ", ".join(USER_REDUCTIONS),
            hint=close_match(name, USER_REDUCTIONS),
        )
    return name


def _explicit_ranges(
    ranges: Mapping[str, int | range] | None, indices: list[str], source: str
) -> dict[str, tuple[sympy.Expr, sympy.Expr]]:
    found: dict[str, tuple[sympy.Expr, sympy.Expr]] = {}
    for name, value in (ranges or {}).items():
        if name not in indices:
            raise RangeError(
                f"ranges= names {name!r}, which is not an index of the statement",
                source,
                expected="one of " + (", ".join(indices) or "no indices"),
                hint=close_match(str(name), indices),
            )
        if isinstance(value, range) and value.step == 1:
            found[name] = (sympy.Integer(value.start), sympy.Integer(value.stop))
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            found[name] = (sympy.Integer(0), sympy.Integer(value))
        else:
            raise RangeError(
                f"ranges[{name!r}] is {value!r}",
                source,
                expected="an extent (an int >= 0) or a range with step 1",
            )
    return found


def _bounds(
    use: AccessUse, axis: int, name: str, known: Mapping[str, tuple[sympy.Expr, sympy.Expr]]
) -> list[tuple[str, int, sympy.Expr]]:
    """What `0 <= index < extent` on one axis allows `name`: ('start'|'stop', divisor, numerator).

    A start bound is `CeilDiv(numerator, divisor)`, a stop bound `FloorDiv(...) + 1`.
    """
    affine = use.axes[axis]
    c = dict(affine.coefficients)[name]
    low = high = sympy.Integer(affine.constant)
    for other, d in affine.coefficients:
        if other != name:
            start, stop = known[other]
            low += d * (start if d > 0 else stop - 1)
            high += d * (stop - 1 if d > 0 else start)
    last = extent_symbol(use.tensor, axis) - 1
    if c > 0:
        return [("start", c, -low), ("stop", c, last - high)]
    return [("start", -c, high - last), ("stop", -c, low)]


def _combine(bounds: list[tuple[str, int, sympy.Expr]]) -> tuple[sympy.Expr, sympy.Expr]:
    """Intersect bounds, keeping only the tightest of those that differ by a constant."""
    tightest: dict[tuple[str, int, sympy.Expr], sympy.Expr] = {}
    for kind, divisor, numerator in bounds:
        numerator = sympy.expand(numerator)
        constant, rest = numerator.as_coeff_Add()
        key = (kind, divisor, rest)
        pick = max if kind == "start" else min
        tightest[key] = pick(tightest.get(key, constant), constant)
    starts = [CeilDiv(r + k, d) for (kind, d, r), k in tightest.items() if kind == "start"]
    stops = [FloorDiv(r + k, d) + 1 for (kind, d, r), k in tightest.items() if kind == "stop"]
    return sympy.Max(*starts), sympy.Min(*stops)


def _infer_ranges(
    free: list[str],
    reduced: list[str],
    accesses: tuple[AccessUse, ...],
    known: dict[str, tuple[sympy.Expr, sympy.Expr]],
) -> dict[str, tuple[sympy.Expr, sympy.Expr]]:
    """Ranges of every index that the accesses constrain (Tullio's rule, resolved in rounds).

    An index used only unshifted takes the extent of its first axis. Then, repeatedly, an
    index whose accesses involve only resolved indices takes the intersection of what every
    use allows. When none is ready (`X[i+k] * W[k]`), the first index with an unshifted use
    (reduced indices first) takes the intersection of the uses that can be evaluated.
    """
    uses: dict[str, list[tuple[AccessUse, int]]] = {name: [] for name in free + reduced}
    for access in accesses:
        for axis, affine in enumerate(access.axes):
            for name, _ in affine.coefficients:
                uses[name].append((access, axis))

    def others(name: str, access: AccessUse, axis: int) -> set[str]:
        return {o for o, _ in access.axes[axis].coefficients} - {name}

    for name, found in uses.items():
        if name not in known and found and all(a.axes[x].bare_index == name for a, x in found):
            first, axis = found[0]
            known[name] = (sympy.Integer(0), extent_symbol(first.tensor, axis))
    while True:
        todo = [n for n in free + reduced if n not in known and uses[n]]
        ready = [n for n in todo if all(others(n, a, x) <= set(known) for a, x in uses[n])]
        fallback = [
            n
            for n in reduced + free
            if n in todo and any(a.axes[x].bare_index == n for a, x in uses[n])
        ]
        if not ready and not fallback:
            return known
        name = ready[0] if ready else fallback[0]
        usable = [(a, x) for a, x in uses[name] if others(name, a, x) <= set(known)]
        known[name] = _combine([b for a, x in usable for b in _bounds(a, x, name, known)])


def lower(
    statement: Statement,
    *,
    reduce: str | None = None,
    ranges: Mapping[str, int | range] | None = None,
) -> Lowered:
    """Lower a parsed statement to a loop nest with inferred ranges.

    Args:
        statement: from `parse`.
        reduce: the reduction ("sum" by default); must agree with a `(max)` prefix.
        ranges: an extent or a `range` (step 1) per index; these win over inference.

    Returns:
        A `Lowered`: the nest plus the accesses that `check_shapes` needs.

    Raises:
        TensorDSLError: a subclass naming the mistake (unknown name or reduction, non-affine
        index, an index that nothing constrains, ...).

    >>> print(lower(parse("C[i,j] := A[i,k] * B[k,j]")).nest.terms[0].reduced)
    (Range(index=k, start=0, stop=A.shape[1]),)
    """
    src = statement.source
    reduction = _reduction(statement, reduce)
    built = _BodyBuilder(statement).build()
    free, order = built.free, built.free + built.reduced
    known = _explicit_ranges(ranges, order, src)
    explicit = frozenset(known)
    first_span = dict(built.index_spans)
    for name in free:
        if name not in built.body_spans and name not in known:
            raise RangeError(
                f"free index '{name}' does not appear on the right-hand side",
                src,
                first_span[name],
                expected=f"every index on the left to be used on the right, "
                f"or ranges={{'{name}': ...}}",
            )
    known = _infer_ranges(free, built.reduced, built.accesses, known)
    for name in order:
        if name not in known:
            span = built.body_spans.get(name, first_span[name])
            raise RangeError(
                f"cannot infer the range of index '{name}'",
                src,
                span,
                expected=f"an access that uses '{name}' alone on some axis, such as 'A[{name}]', "
                f"or ranges={{'{name}': ...}}",
            )

    def as_range(name: str) -> Range:
        start, stop = known[name]
        return Range(index_symbol(name), sympy.simplify(start), sympy.simplify(stop))

    nest = LoopNest(
        output=statement.output,
        free=tuple(as_range(n) for n in free),
        terms=(Term(built.body, tuple(as_range(n) for n in built.reduced)),),
        operands=tuple(Operand(name, rank) for name, rank in built.operands),
        reduction=reduction,
    )
    return Lowered(
        nest,
        statement,
        built.accesses,
        built.index_spans,
        explicit,
        tuple(built.operand_spans.items()),
    )


def lower_source(source: str, **options: object) -> Lowered:
    """`lower(parse(source), **options)`, for brevity in tests and doctests."""
    return lower(parse(source), **options)  # type: ignore[arg-type]


def _interval(affine: Affine, values: Mapping[str, tuple[int, int]]) -> tuple[int, int] | None:
    """Smallest and largest value of `affine` over the index ranges; None if one is empty."""
    low = high = affine.constant
    for name, c in affine.coefficients:
        start, stop = values[name]
        if stop <= start:
            return None
        low += c * (start if c > 0 else stop - 1)
        high += c * (stop - 1 if c > 0 else start)
    return low, high


def _check_ranks(
    lowered: Lowered, shapes: Mapping[str, tuple[int, ...]]
) -> dict[sympy.Symbol, int]:
    src = lowered.statement.source
    spans = {a.tensor: a.span for a in reversed(lowered.accesses)}
    spans = {**dict(lowered.operand_spans), **spans}
    extents: dict[sympy.Symbol, int] = {}
    for op in lowered.nest.operands:
        span = spans.get(op.name)
        if op.name not in shapes:
            raise ShapeError(
                f"no array given for '{op.name}'",
                src,
                span,
                expected=f"an argument for every input: {lowered.nest.operand_names}",
            )
        shape = tuple(int(n) for n in shapes[op.name])
        if len(shape) != op.rank:
            role = "a scalar" if op.is_scalar else f"a tensor of rank {op.rank}"
            raise ShapeError(
                f"'{op.name}' is {role} in the statement but got shape {shape}",
                src,
                span,
                expected=f"an array of rank {op.rank} for '{op.name}'",
            )
        extents.update({extent_symbol(op.name, axis): n for axis, n in enumerate(shape)})
    return extents


def _check_agreement(lowered: Lowered, extents: Mapping[sympy.Symbol, int]) -> None:
    src = lowered.statement.source
    for r in (*lowered.nest.free, *lowered.nest.terms[0].reduced):
        name = r.index.name
        uses = lowered.unshifted_uses(name)
        if name in lowered.explicit or len(uses) != sum(
            1 for a in lowered.accesses for f in a.axes if name in dict(f.coefficients)
        ):
            continue  # shifted or explicit: the range is an intersection, checked by reads
        (first, axis), *rest = uses
        n = extents[extent_symbol(first.tensor, axis)]
        for access, other in rest:
            m = extents[extent_symbol(access.tensor, other)]
            if m != n:
                raise RangeError(
                    f"index '{name}' has extent {n} from axis {axis} of '{first.tensor}' "
                    f"but {m} from axis {other} of '{access.tensor}'",
                    src,
                    access.axis_spans[other],
                    expected=f"the same extent on every axis that '{name}' indexes",
                )


def _evaluate_ranges(
    lowered: Lowered, extents: Mapping[sympy.Symbol, int]
) -> dict[str, tuple[int, int]]:
    src = lowered.statement.source
    values: dict[str, tuple[int, int]] = {}
    for r in (*lowered.nest.free, *lowered.nest.terms[0].reduced):
        start, stop = (int(e.xreplace(extents)) for e in (r.start, r.stop))
        values[r.index.name] = (start, stop)
        plain = r.start == 0 and r.stop.is_Symbol
        if r in lowered.nest.free and (stop < start or (stop == start and not plain)):
            used = sorted(str(s) for s in (r.start.free_symbols | r.stop.free_symbols))
            given = ", ".join(
                f"{s} = {extents[sympy.Symbol(s, integer=True, nonnegative=True)]}" for s in used
            )
            raise RangeError(
                f"index '{r.index}' has an empty range [{start}, {stop}) for these shapes",
                src,
                lowered.index_span(r.index.name),
                expected=f"at least one value: '{r.index}' runs over [{r.start}, {r.stop})"
                + (f" where {given}" if given else ""),
            )
    return values


def _check_reads(
    lowered: Lowered, extents: Mapping[sympy.Symbol, int], values: Mapping[str, tuple[int, int]]
) -> None:
    src = lowered.statement.source
    for access in lowered.accesses:
        for axis, affine in enumerate(access.axes):
            n = extents[extent_symbol(access.tensor, axis)]
            interval = _interval(affine, values)
            if interval is None or (interval[0] >= 0 and interval[1] < n):
                continue
            names = [name for name, _ in affine.coefficients]
            where = ", ".join(f"{k} in [{values[k][0]}, {values[k][1]})" for k in names)
            explicit = [k for k in names if k in lowered.explicit]
            raise RangeError(
                f"'{_text(src, access.span)}' reads axis {axis} of '{access.tensor}' at "
                f"{interval[0]}..{interval[1]}, outside [0, {n})",
                src,
                access.span,
                expected="every read inside the array" + (f" for {where}" if where else ""),
                hint=f"narrow or drop ranges= for {', '.join(explicit)}" if explicit else None,
            )


def check_shapes(
    lowered: Lowered, shapes: Mapping[str, tuple[int, ...]]
) -> dict[sympy.Symbol, int]:
    """Check concrete shapes against a lowered statement.

    Args:
        lowered: from `lower`.
        shapes: the shape of every operand by name (a scalar's shape is `()`).

    Returns:
        Every extent symbol of every operand axis, mapped to its value.

    Raises:
        ShapeError: an operand is missing or has the wrong rank.
        RangeError: extents that disagree, an empty range of a free index, a read out of bounds.

    >>> low = lower(parse("C[i,j] := A[i,k] * B[k,j]"))
    >>> check_shapes(low, {"A": (2, 3), "B": (4, 5)})
    Traceback (most recent call last):
    ...
    tensordsl.errors.RangeError: index 'k' has extent 3 from axis 1 of 'A' but 4 from axis 0 of 'B'
    ...
    """
    extents = _check_ranks(lowered, shapes)
    _check_agreement(lowered, extents)
    values = _evaluate_ranges(lowered, extents)
    _check_reads(lowered, extents, values)
    return extents
