"""Gradient nests that read a value a program already stores instead of recomputing it.

A program's backward derives each statement's gradient nests on their own, so they
recompute what the statement's body computes. Softmax as a program::

    (max) M[i] := X[i,j]
    Z[i] := exp(X[i,j] - M[i])
    P[i,j] := exp(X[i,j] - M[i]) / Z[i]

gives `dX = dP*exp(X - M)/Z + dZ*exp(X - M)` and `dZ = sum_j -dP*exp(X - M)/Z**2`: the
exponential once per element in each of two nests, where the stored `P` already holds it,
up to the factor `Z`. `read_stored` rewrites a gradient nest with the stored statements:
for each *elementwise* stored statement `S[f] := B` (a sum with no reduced index, one term,
no bounds or guard) and each costly factor `e` of `B = e * rest` (a function call, a
fractional power, a nested reduction), an occurrence of `e` at other indices `f'` becomes
`S[f'] / rest(f')`, where `1/rest` divides by nothing but constants (`exp(X - M) =
P * Z`; never `e = S / W`, NaN at `W = 0`). sympy then cancels what it can: the nests above
become `dX = dP*P + dZ*P*Z` and `dZ = sum_j -dP*P/Z`, memory reads and no exponential,
which is how XLA differentiates jnp's softmax (`P * (dP - rowsum(dP * P))`).

An occurrence is replaced only where `S` is stored: each free index of `S` is read bare by
an access of `e` on an axis whose whole extent is the index's range (`X[i, j]` with `i` over
`[0, X.shape[0])`), so wherever the gradient nest reads `e`, in bounds, `S` holds it.

>>> import sympy
>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, j, p, q = (index_symbol(n) for n in "ijpq")
>>> X, M, Z, dZ = (tensor_base(n) for n in ("X", "M", "Z", "dZ"))
>>> rows, cols = Range(i, 0, extent_symbol("X", 0)), Range(j, 0, extent_symbol("X", 1))
>>> probs = LoopNest("P", (rows, cols), (Term(sympy.exp(X[i, j] - M[i]) / Z[i]),),
...     (Operand("X", 2), Operand("M", 1), Operand("Z", 1)))
>>> d_x = LoopNest("dX", (Range(p, 0, 4), Range(q, 0, 6)),
...     (Term(dZ[p] * sympy.exp(X[p, q] - M[p])),), (Operand("dZ", 1), Operand("X", 2),
...     Operand("M", 1)))
>>> print(read_stored(d_x, (probs,), foreign=frozenset({"dZ", "dX"})))
dX[p, q] := dZ[p]*P[p, q]*Z[p]
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterator, Sequence

import sympy

from codegen.ir.nest import LoopNest, Operand, Reduce, Term, extent_symbol, tensor_base
from codegen.passes.grad import divides_by_a_value

#: At most this many index maps tried per occurrence (a tensor read many times in a factor).
MAX_MAPS = 64


@dataclasses.dataclass(frozen=True)
class _Held:
    """A costly factor `e` of a stored statement's body, held as `e = S[f] * inverse`."""

    statement: LoopNest
    factor: sympy.Expr
    inverse: sympy.Expr  # 1 / (the body's other factors): no division by a value
    anchors: tuple[tuple[sympy.Symbol, str, int], ...]  # (free index, tensor, axis) per index


def _costly(expr: sympy.Expr) -> bool:
    """A function call, a fractional power or a nested reduction: worth a memory read."""
    if expr.atoms(sympy.Function, Reduce):
        return True
    return any(not p.exp.is_integer for p in expr.atoms(sympy.Pow))


def _anchors(statement: LoopNest, factor: sympy.Expr) -> tuple | None:
    """For each free index of `statement`, an access of `factor` that reads it bare on an
    axis whose whole extent is the index's range; None where one has none."""
    found = []
    reads = sorted(factor.atoms(sympy.Indexed), key=sympy.default_sort_key)
    for r in statement.free:
        anchor = next(
            (
                (r.index, a.base.name, axis)
                for a in reads
                for axis, index in enumerate(a.indices)
                if index == r.index
                and r.start == 0
                and r.stop == extent_symbol(a.base.name, axis)
                and a.base.name != statement.output
            ),
            None,
        )
        if anchor is None:
            return None
        found.append(anchor)
    return tuple(found)


@functools.lru_cache(maxsize=256)
def held_factors(statement: LoopNest) -> tuple[_Held, ...]:
    """The costly factors a stored statement holds (none unless it is elementwise)."""
    if statement.reduction != "sum" or statement.online or len(statement.terms) != 1:
        return ()
    term = statement.terms[0]
    if term.reduced or term.constraints or term.guard != sympy.true:
        return ()
    found = []
    factors = sympy.Mul.make_args(term.body)
    for n, factor in enumerate(factors):
        if not _costly(factor):
            continue
        inverse = 1 / sympy.Mul(*factors[:n], *factors[n + 1 :])
        if divides_by_a_value(inverse):
            continue
        anchors = _anchors(statement, factor)
        if anchors is not None:
            found.append(_Held(statement, factor, inverse, anchors))
    return tuple(found)


def _maps(held: _Held, candidate: sympy.Expr) -> Iterator[dict]:
    """Index maps `f -> f'` under which `held.factor` could read as `candidate`."""
    choices = []
    for index, tensor, axis in held.anchors:
        reads = [a for a in candidate.atoms(sympy.Indexed) if a.base.name == tensor]
        options = sorted({a.indices[axis] for a in reads}, key=sympy.default_sort_key)
        if not options:
            return
        choices.append([(index, option) for option in options])
    for n, choice in enumerate(itertools.product(*choices)):
        if n == MAX_MAPS:
            return
        yield dict(choice)


def _replacement(held: _Held, candidate: sympy.Expr) -> sympy.Expr | None:
    for mapping in _maps(held, candidate):
        if held.factor.xreplace(mapping) == candidate:
            read = tensor_base(held.statement.output)[
                tuple(mapping[r.index] for r in held.statement.free)
            ]
            return read * held.inverse.xreplace(mapping)
    return None


def _rewrite(expr: sympy.Expr, held: Sequence[_Held]) -> sympy.Expr:
    """`expr` with every occurrence of a held factor replaced, outermost first."""
    for h in held:
        if expr.func == h.factor.func:
            found = _replacement(h, expr)
            if found is not None:
                return found
    if not expr.args or isinstance(expr, sympy.Indexed):
        return expr
    args = tuple(_rewrite(a, held) for a in expr.args)
    return expr if args == expr.args else expr.func(*args)


def read_stored(
    nest: LoopNest, stored: Sequence[LoopNest], /, *, foreign: frozenset[str]
) -> LoopNest:
    """`nest` reading the stored statements' values where it recomputes them (module
    docstring).

    Args:
        nest: a gradient nest of one of the program's statements.
        stored: the statements the program stores, every value computed by the forward.
        foreign: the names `nest` uses for something else than the program's value of that
            name (its output, the cotangent, auxiliary results): a statement that reads or
            defines one of them is not used.

    Returns:
        The nest, its new operands (the statements read, what their factors read) appended.
    """
    ranks = {op.name: op.rank for s in stored for op in s.operands}
    ranks.update({s.output: len(s.free) for s in stored})
    held = [
        h
        for s in stored
        for h in held_factors(s)
        if not ({s.output} | set(s.operand_names)) & (foreign | {nest.output})
    ]
    if not held:
        return nest
    terms = tuple(
        dataclasses.replace(t, body=_rewrite(t.body, held)) if t.body.atoms(sympy.Indexed) else t
        for t in nest.terms
    )
    if terms == nest.terms:
        return nest
    before, after = _reads(nest.terms, ranks), _reads(terms, ranks)
    # An operand only the replaced factors read is dropped (X and M of softmax's gradients).
    operands = [op for op in nest.operands if op.name in after or op.name not in before]
    for name in sorted(after - set(nest.operand_names)):
        operands.append(Operand(name, ranks[name]))
    return dataclasses.replace(nest, terms=terms, operands=tuple(operands))


def _reads(terms: Sequence[Term], ranks: dict[str, int]) -> set[str]:
    """The tensors and scalars the terms read (a scalar: a name of rank 0 in `ranks`)."""
    found = set()
    for t in terms:
        for e in t.expressions():
            found |= {a.base.name for a in e.atoms(sympy.Indexed)}
            found |= {s.name for s in e.free_symbols if ranks.get(getattr(s, "name", "")) == 0}
    return found


__all__ = ["held_factors", "read_stored"]
