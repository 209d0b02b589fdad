"""Hoisting by index dependence: where each sub-expression of a term is computed.

A term's loops form a chain of *levels*: level 0 is outside all of the term's loops (host
parameters, scalar inputs and the free indices the strategy binds there), and each further
level is one loop of the strategy (a reduced loop, a row or vector lane of a register tile).
`plan` places every sub-expression of the body at the outermost level where all the indices
it reads are bound, computes each distinct sub-expression once (shared by every use, within
the term), and gives each test (a constraint `c >= 0` or a guard) the level of its indices.
A nested reduction (`Reduce`) becomes a loop of its own at the level of the indices it
depends on, and the parts of its body that do not depend on its index are hoisted out of it.

So `O[i, e] = sum_j exp(S[i, j] - L[i]) * V[j, e]` under levels `[], [j], [i], [e]` computes
`exp(S[i, j] - L[i])` once per `(j, i)` at level 2, and only the product with `V[j, e]` per
lane at level 3:

>>> from codegen.ir.nest import index_symbol, tensor_base
>>> i, j, e = (index_symbol(n) for n in "ije")
>>> S, L, V = tensor_base("S"), tensor_base("L"), tensor_base("V")
>>> p = plan(sympy.exp(S[i, j] - L[i]) * V[j, e], [[], [j], [i], [e]])
>>> [[str(s) for s in level] for level in p.statements]
[[], [], ['t0_ = exp(-L[i] + S[i, j])'], []]
>>> p.value  # temporaries are sympy Dummies, which sympy prints with a leading _
_t0_*V[j, e]

Statements at a level are computed unconditionally once that level's tests hold: every
access of a body is in bounds over the term's iteration space (the call-time checks), so a
hoisted load or a branch of a `where` computed outside its condition is always safe; a test
wraps everything at its level and deeper.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TypeAlias

import sympy

from codegen.ir.nest import Reduce

Node: TypeAlias = sympy.Basic  # a subexpression: any sympy node of a body


@dataclass(frozen=True)
class Assign:
    """`symbol = expr`, computed once; `expr` refers to earlier statements' symbols."""

    symbol: sympy.Symbol
    expr: sympy.Expr

    def __str__(self) -> str:
        return f"{self.symbol.name} = {self.expr}"


@dataclass(frozen=True)
class Loop:
    """A nested reduction: `symbol = reduce_{index in [start, stop)} value`, where the
    statements `inner` are computed inside the loop before `value`."""

    symbol: sympy.Symbol
    reduction: str
    index: sympy.Symbol
    start: sympy.Expr
    stop: sympy.Expr
    inner: tuple[Assign | Loop, ...]
    value: sympy.Expr

    def __str__(self) -> str:
        return f"{self.symbol.name} = {self.reduction}_{self.index}({self.value})"


Statement = Assign | Loop


@dataclass
class Plan:
    """What to compute at each level: statements, then tests wrapping deeper levels."""

    statements: list[list[Statement]]
    tests: list[list[sympy.Basic]]
    value: sympy.Expr  # the body, in terms of the statements' symbols; at the last level
    next_temporary: int  # the number of the next temporary to name

    def with_level(self, level: int, statements: list[Statement]) -> Plan:
        """This plan with the statements of `level` replaced."""
        by_level = list(self.statements)
        by_level[level] = statements
        return replace(self, statements=by_level)


@dataclass
class _Planner:
    levels: dict[sympy.Symbol, int]  # loop index -> its level
    count: int
    integer_tensors: frozenset[str]  # tensors of integers (they compare as integers)
    last: int  # the innermost level
    hoist_conditions: bool = False  # `selection`: a `where` rewritten for the vectoriser
    uses: dict[Node, int] = field(default_factory=dict)
    homes: dict[Node, tuple] = field(default_factory=dict)  # node -> (level, nested indices)
    names: dict[Node, sympy.Symbol] = field(default_factory=dict)
    containers: dict[tuple, list[Statement]] = field(default_factory=dict)
    owned: dict[tuple, list[Node]] = field(default_factory=dict)  # named nodes per container
    nested_at: dict[sympy.Symbol, tuple] = field(default_factory=dict)  # a nested loop's home

    def home(self, node: Node) -> tuple:
        """`(level, (r1, r2, ...))`: the main level, and the nested loops (outermost first)
        whose index the node depends on; a node lives in the innermost of them."""
        found = self.homes.get(node)
        if found is not None:
            return found
        if isinstance(node, sympy.Symbol):
            result: tuple = self.nested_at.get(node) or (self.levels.get(node, 0), ())
        elif isinstance(node, Reduce):
            # The loop sits where everything it reads but its own index is bound; what
            # depends on its index lives inside it.
            outer = [self.home(s) for s in node.free_symbols]
            result = (max((h[0] for h in outer), default=0), _merge(h[1] for h in outer))
            self.nested_at[node.index] = (result[0], (*result[1], node.index))
        elif isinstance(node, sympy.Indexed):
            parts = [self.home(i) for i in node.indices]
            result = (max((h[0] for h in parts), default=0), _merge(h[1] for h in parts))
        elif not node.args:
            result = (0, ())
        else:
            parts = [self.home(a) for a in node.args]
            result = (max(h[0] for h in parts), _merge(h[1] for h in parts))
        self.homes[node] = result
        return result

    def count_uses(self, node: Node) -> None:
        self.uses[node] = self.uses.get(node, 0) + 1
        if self.uses[node] > 1 or isinstance(node, sympy.Indexed) or not node.args:
            return
        for child in _children(node):
            self.count_uses(child)

    def needs_name(self, node: Node, parent_home: tuple) -> bool:
        """Named: nested reductions; values computed at another level than their user (a
        hoisted load or expression); expressions used more than once."""
        if isinstance(node, Reduce):
            return True
        if not isinstance(node, sympy.Expr) or not node.args or self.integral(node):
            return False
        hoisted = self.home(node) != parent_home
        if isinstance(node, sympy.Indexed):
            return hoisted
        return hoisted or self.uses.get(node, 0) > 1

    def rewrite(self, node: Node, parent_home: tuple) -> sympy.Basic:
        """`node` with named sub-expressions replaced by their symbols; names it if needed."""
        if node in self.names:
            return self.names[node]
        if not node.args or self.integral(node):
            return node
        home = self.home(node)
        if isinstance(node, Reduce):
            return self.nested(node, home)
        if isinstance(node, sympy.Indexed):
            rewritten = node
        elif isinstance(node, sympy.Piecewise):
            rewritten = self.selection(node, home)
        else:
            rewritten = node.func(*(self.rewrite(a, home) for a in node.args))
        if not self.needs_name(node, parent_home):
            return rewritten
        return self.name(node, Assign(self.fresh(), rewritten), home)

    def selection(self, node: sympy.Piecewise, home: tuple) -> sympy.Piecewise:
        """A `where` the compiler can vectorise. At the innermost level a branch that is a
        load is loaded before the choice: under the choice it is a masked load, which the
        vectoriser cannot make of an address that is the same in every lane (a nested sum
        inside the lanes, `sum_r where(e == A[t, r], dY[t, r], 0)`: a top-k's gradient).
        With `hoist_conditions`, also: a condition bound at an outer level is computed there
        (the loop is then unswitched on it); a branch that calls a function, under a
        condition that changes from one iteration of the innermost loop to the next, is
        computed before the choice (a call under a branch is not vectorised: the vector math
        functions are declared `notinbranch`). All are safe: every access is in bounds and
        the functions have no side effects (`-fno-math-errno`)."""
        innermost = home[0] == self.last and not home[1]
        pairs = []
        for expr, cond in node.args:
            value = self.rewrite(expr, home)
            test = self.rewrite(cond, home)
            if home[0] == self.last and isinstance(expr, sympy.Indexed) and not value.is_Symbol:
                value = self.name(expr, Assign(self.fresh(), value), home)
            varies = cond not in (sympy.true, sympy.false) and not self.integral_test(cond)
            if self.hoist_conditions and varies:
                if self.home(cond) != home:
                    test = self.names.get(cond) or self.name(
                        cond, Assign(self.fresh(), test), self.home(cond)
                    )
                elif innermost and calls(expr) and not value.is_Symbol:
                    value = self.name(expr, Assign(self.fresh(), value), self.home(expr))
            pairs.append((value, test))
        return sympy.Piecewise(*pairs)

    def integral_test(self, cond: sympy.Basic) -> bool:
        """A comparison of integer arithmetic only (indices, parameters, integer tensors):
        printed inline, where the compiler folds it into loop bounds."""
        return all(self.integral(side) for rel in cond.atoms(sympy.Rel) for side in rel.args)

    def nested(self, node: Reduce, home: tuple) -> sympy.Symbol:
        inner_home = (home[0], (*home[1], node.index))
        self.containers.setdefault(inner_home, [])
        value = self.rewrite(node.body, inner_home)
        start, stop = (self.rewrite(x, home) for x in (node.start, node.stop))
        inner = tuple(self.containers.pop(inner_home))
        for owned in self.owned.pop(inner_home, []):  # names local to the loop's body
            del self.names[owned]
        symbol = self.fresh()
        loop = Loop(symbol, node.reduction, node.index, start, stop, inner, value)
        return self.name(node, loop, home)

    def name(self, node: Node, statement: Statement, home: tuple) -> sympy.Symbol:
        self.containers.setdefault(home, []).append(statement)
        self.owned.setdefault(home, []).append(node)
        self.names[node] = statement.symbol
        return statement.symbol

    def integral(self, node: Node) -> bool:
        """Integer arithmetic on indices, parameters and integer tensors: printed inline in
        integer arithmetic (never as a float temporary), so comparisons stay exact."""
        if not isinstance(node, sympy.Expr) or node.atoms(Reduce):
            return False
        reads = node.atoms(sympy.Indexed)
        if any(a.base.name not in self.integer_tensors for a in reads):
            return False
        stand_in = {a: sympy.Symbol(f"int{n}_", integer=True) for n, a in enumerate(reads)}
        return bool(node.xreplace(stand_in).is_integer)

    def fresh(self) -> sympy.Symbol:
        symbol = sympy.Dummy(f"t{self.count}_", real=True)  # generated: no user name meets it
        self.count += 1
        return symbol


def calls(expr: sympy.Basic) -> bool:
    """Whether `expr` calls a function (`exp`, `tanh`, ...) outside nested reductions."""
    if isinstance(expr, Reduce) or not expr.args:
        return False
    if isinstance(expr, sympy.Function) and not isinstance(expr, sympy.Piecewise):
        return True
    return any(calls(a) for a in expr.args)


def _merge(nested_lists) -> tuple:
    """The nested loops of several children, outermost first (they lie on one path)."""
    longest: tuple = ()
    for nested in nested_lists:
        if len(nested) > len(longest):
            longest = nested
    return longest


def _children(node: Node) -> tuple:
    if isinstance(node, Reduce):
        return (node.body, node.start, node.stop)
    return node.args


def unique_reduce_indices(body: sympy.Expr, taken: set[sympy.Symbol]) -> sympy.Expr:
    """`body` with the index of every distinct nested reduction renamed apart from the loop
    indices and from each other (`d`, `d_1`, ...), so that each names one loop.

    Outermost first: renaming an outer reduction's index changes the reductions inside it
    (`sum_b(sum_d(K[b, d]))` beside another `sum_b` becomes `sum_b_1(sum_d(K[b_1, d]))`), so
    an inner one is renamed as it is after its parents' renaming; renamed before them, two
    different loops would keep one index `d`, and the planner would hoist what reads one of
    them out of it (issue 38).

    >>> from codegen.ir.nest import index_symbol, tensor_base
    >>> b, d = index_symbol("b"), index_symbol("d")
    >>> K, V = tensor_base("K"), tensor_base("V")
    >>> inner = Reduce("sum", K[b, d], d, 0, 4)
    >>> both = Reduce("sum", inner, b, 0, 2) * Reduce("sum", inner * V[b], b, 0, 2)
    >>> sorted(str(r.index) for r in unique_reduce_indices(both, set()).atoms(Reduce))
    ['b', 'b_1', 'd', 'd_1']
    """
    used = set(taken) | {s for s in body.free_symbols if isinstance(s, sympy.Symbol)}
    done: dict[sympy.Basic, sympy.Basic] = {}

    def rename(node: sympy.Basic) -> sympy.Basic:
        if not node.args or node in done:
            return done.get(node, node)
        if isinstance(node, Reduce):
            index, n = node.index, 0
            while index in used:
                n += 1
                index = sympy.Symbol(f"{node.index.name}_{n}", integer=True)
            used.add(index)
            inner = _rebind(node.body, node.index, index) if index != node.index else node.body
            start, stop = rename(node.start), rename(node.stop)
            new = Reduce(node.reduction, rename(inner), index, start, stop)
        else:
            new = node.func(*(rename(a) for a in node.args))
        done[node] = new
        return new

    return rename(body)


def _rebind(expr: sympy.Basic, old: sympy.Symbol, new: sympy.Symbol) -> sympy.Basic:
    """`expr` with the free occurrences of `old` replaced by `new`: a nested reduction that
    binds `old` itself keeps it in its body (its own loop, renamed before its parent); its
    bounds are in the enclosing scope."""
    if isinstance(expr, Reduce) and expr.index == old:
        start, stop = (_rebind(x, old, new) for x in (expr.start, expr.stop))
        return Reduce(expr.reduction, expr.body, expr.index, start, stop)
    if expr == old:
        return new
    if not expr.args:
        return expr
    return expr.func(*(_rebind(a, old, new) for a in expr.args))


def plan(
    body: sympy.Expr,
    levels: Sequence[Sequence[sympy.Symbol]],
    tests: Sequence[sympy.Basic] = (),
    *,
    first: int = 0,
    integer_tensors: frozenset[str] = frozenset(),
    hoist_conditions: bool = False,
) -> Plan:
    """Place the sub-expressions of `body` and the `tests` at `levels` (outermost first).

    Args:
        body: the term's body (host parameters already substituted).
        levels: the loop indices each level binds; level 0 binds what is bound outside.
        tests: conditions (sympy booleans) the body is evaluated under.
        first: the number of the first temporary (`t<first>_`), so that several plans of
            one function do not reuse names.
        integer_tensors: names of tensors whose elements are integers.
        hoist_conditions: whether a `where` is rewritten for the vectoriser (`selection`):
            its condition computed at its own level, a branch that calls a function before
            the choice. Measured to help one-term elementwise tiles only (the logsumexp
            gradient: 7.6 -> 0.7 ms); in reduction tiles and several-term tiles gcc then
            unswitches the lane loop and leaves its exp version scalar (Sinkhorn's
            gradient: 15 -> 49 ms), so the emitter asks for it there only.

    Returns:
        The `Plan`.
    """
    where = {s: n for n, symbols in enumerate(levels) for s in symbols}
    body = unique_reduce_indices(body, set(where))
    planner = _Planner(where, first, integer_tensors, len(levels) - 1, hoist_conditions)
    planner.count_uses(body)
    last = (len(levels) - 1, ())
    value = planner.rewrite(body, last)
    statements: list[list[Statement]] = [[] for _ in levels]
    for (level, nested), found in planner.containers.items():
        assert not nested, "nested statements live in their loops"
        statements[level] = found
    placed_tests: list[list[sympy.Basic]] = [[] for _ in levels]
    for test in tests:
        placed_tests[planner.home(test)[0]].append(test)
    return Plan(statements, placed_tests, value, planner.count)
