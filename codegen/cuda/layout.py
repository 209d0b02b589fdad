"""The shape of a nest's body and memory reads, from which `codegen.cuda.schedule` picks a
strategy: a product of two factors split by their indices (`split_contraction`: the smem
tile; `split_weighted`: the online kernel's weighted sum), a body whose accesses each read
one of two free indices (`split_pairwise`: the pairwise tile), and which way a reduction reads
memory (`reduction_layout`): along its reduced index ("rows": a group of lanes per output
element strides the row) or along its last free index ("columns": a thread per output
element, the reduced loops cut across blocks)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import sympy

from codegen.emit.loop_order import LoopOrder
from codegen.ir.bounds import loop_bounds
from codegen.ir.nest import LoopNest, Reduce, accesses, extent_of


@dataclass(frozen=True)
class Sides:
    """The accesses of a pairwise body (`split_pairwise`), each staged on its own."""

    rows: tuple[sympy.Indexed, ...]  # read the row index, not the column
    columns: tuple[sympy.Indexed, ...]  # read the column index, not the row
    common: tuple[sympy.Indexed, ...]  # read neither (`w[k]`, a batch index)


def split_pairwise(nest: LoopNest, row: str, column: str) -> Sides | None:
    """The accesses of a one-term body split by which of `row` and `column` they read (every
    row against every column: pairwise distances' `(X[i,k] - Y[j,k])^2`), else None: an
    access that reads both, or reads through another access; a body that reads `row` or
    `column` outside its accesses, holds a nested reduction or no access on a side; a
    guard, more terms than one, or no reduced index.

    >>> from tensordsl.frontend.lower import lower
    >>> from tensordsl.frontend.parse import parse
    >>> split_pairwise(lower(parse("D[i,j] := (X[i,k] - Y[j,k])^2 * w[k]")).nest, "i", "j")
    Sides(rows=(X[i, k],), columns=(Y[j, k],), common=(w[k],))
    """
    if nest.online or len(nest.terms) != 1:
        return None
    (term,) = nest.terms
    if not term.reduced or term.guard != sympy.true or term.body.atoms(Reduce):
        return None
    found: dict[str, list[sympy.Indexed]] = {"rows": [], "columns": [], "common": []}
    for access in accesses(term.body):
        if any(x.atoms(sympy.Indexed) for x in access.indices):
            return None
        reads = {s.name for x in access.indices for s in x.free_symbols}
        if row in reads and column in reads:
            return None
        side = "rows" if row in reads else "columns" if column in reads else "common"
        found[side].append(access)
    rest = term.body.xreplace({a: sympy.Dummy() for a in accesses(term.body)})
    if uses(rest, row) or uses(rest, column) or not found["rows"] or not found["columns"]:
        return None
    return Sides(tuple(found["rows"]), tuple(found["columns"]), tuple(found["common"]))


def split_contraction(
    nest: LoopNest, row: str, vector: str
) -> tuple[sympy.Expr, sympy.Expr] | None:
    """`(a, b)` with body `a*b`, `a` free of `vector` and `b` free of `row`, else None.

    A body with a nested reduction (an inlined intermediate, attention's scores) is None:
    the smem strategy loads each element of a tile as one expression, with no loop of its
    own for a nested reduction (issue 27: attention whose K and V lack the batch index)."""
    if nest.reduction != "sum" or len(nest.terms) != 1:
        return None
    (term,) = nest.terms
    if not term.reduced or term.guard != sympy.true or term.body.atoms(Reduce):
        return None
    a_factors: list[sympy.Expr] = []
    b_factors: list[sympy.Expr] = []
    for factor in sympy.Mul.make_args(term.body):
        names = {s.name for s in factor.free_symbols if isinstance(s, sympy.Symbol)}
        names |= {s.name for access in factor.atoms(sympy.Indexed) for s in access.free_symbols}
        if row in names and vector in names:
            return None
        (b_factors if vector in names else a_factors).append(factor)
    a, b = sympy.Mul(*a_factors), sympy.Mul(*b_factors)
    if not a.atoms(sympy.Indexed) or not b.atoms(sympy.Indexed):
        return None
    return a, b


def uses(expr: sympy.Basic, name: str) -> bool:
    """Whether `expr` reads the index `name` (in an access or elsewhere)."""
    return any(s.name == name for s in expr.free_symbols if isinstance(s, sympy.Symbol))


def split_weighted(nest: LoopNest) -> tuple[sympy.Expr, sympy.Expr] | None:
    """`(a, b)` with the body of a sum of one reduced index `a*b` (every added term has the
    same factors `b`), where `b`, the factors that read the last free index (the column),
    reads no other free index but the outer ones, holds an access and no nested reduction,
    and `a`, holding a nested reduction, does not read the column; else None."""
    if nest.reduction != "sum" or nest.online or len(nest.terms) != 1 or len(nest.free) < 2:
        return None
    (term,) = nest.terms
    if len(term.reduced) != 1 or term.guard != sympy.true or not term.body.atoms(Reduce):
        return None
    row, col = nest.free[-2].index.name, nest.free[-1].index.name
    products = [sympy.Mul.make_args(t) for t in sympy.Add.make_args(term.body)]
    columns = [frozenset(f for f in p if uses(f, col)) for p in products]
    if not columns[0] or any(c != columns[0] for c in columns):
        return None
    b = sympy.Mul(*sorted(columns[0], key=str))
    if uses(b, row) or b.atoms(Reduce) or not b.atoms(sympy.Indexed):
        return None
    a = sympy.Add(*(sympy.Mul(*(f for f in p if f not in columns[0])) for p in products))
    return None if uses(a, col) else (a, b)


@dataclass(frozen=True)
class Paired:
    """A packed nest's parts (`split_paired`): each member's weight `a` and weighted value
    `b` (the second's `b` reading the packed column shifted back), and `C1`."""

    weights: tuple[sympy.Expr, sympy.Expr]
    values: tuple[sympy.Expr, sympy.Expr]
    split: sympy.Expr


def split_paired(nest: LoopNest) -> Paired | None:
    """The parts of two weighted sums packed along their columns (`codegen.cuda.attention.paired`:
    `sum_k where(c < C1, a1*b1, a2*b2)`, each product as `split_weighted` takes it), else
    None."""
    if nest.reduction != "sum" or nest.online or len(nest.terms) != 1 or len(nest.free) < 2:
        return None
    (term,) = nest.terms
    body, column = term.body, nest.free[-1].index
    if not isinstance(body, sympy.Piecewise) or len(body.args) != 2:
        return None
    (first, test), (second, otherwise) = body.args
    if otherwise != sympy.true or not isinstance(test, sympy.StrictLessThan):
        return None
    if test.lhs != column or column in test.rhs.free_symbols or nest.free[-1].start != 0:
        return None
    parts = []
    for value in (first, second):
        alone = dataclasses.replace(nest, terms=(dataclasses.replace(term, body=value),))
        split = split_weighted(alone)
        if split is None:
            return None
        parts.append(split)
    (a1, b1), (a2, b2) = parts
    return Paired((a1, a2), (b1, b2), test.rhs)


def weighted_form(nest: LoopNest) -> bool:
    """Whether the weighted strategy takes `nest`: one weighted sum or a packed pair."""
    return split_weighted(nest) is not None or split_paired(nest) is not None


def _row_indices(nest: LoopNest, order: LoopOrder) -> set[str]:
    """The indices a group of lanes may stride: each term's innermost reduced loop, or, in a
    term without reduced loops, the index of a nested reduction of its body."""
    found: set[str] = set()
    for n, term in enumerate(nest.terms):
        if order.reduced_order[n]:
            found.add(order.reduced_order[n][-1])
        else:
            found.update(r.index.name for r in term.body.atoms(Reduce))
    return found


def rectangular(nest: LoopNest, order: LoopOrder) -> bool:
    """Whether every reduced loop's bounds are expressions of extents alone (the columns
    strategy flattens them and counts their iterations on the host)."""
    for n, term in enumerate(nest.terms):
        names = order.reduced_order[n]
        by_name = {s.name: s for s in term.reduced_indices}
        bounds = loop_bounds(term, tuple(by_name[name] for name in names))
        for expr in (*bounds.starts.values(), *bounds.stops.values()):
            if any(extent_of(s) is None for s in expr.free_symbols):
                return False
    return True


def reduction_layout(nest: LoopNest, order: LoopOrder) -> str | None:
    """ "rows" when the largest access reads a reduced index contiguously (its last axis),
    "columns" when it reads the last free index there and a term has reduced loops, else
    None. The largest access is the one of highest rank; ties go to columns. An access
    whose last axis reads both (a convolution's `X[i + k]`) is neither, and the widest such
    access rules both out: a thread per output element already coalesces there.

    >>> from codegen.ir.examples import matmul as example
    >>> from codegen.emit.loop_order import default_loop_order
    >>> reduction_layout(example(), default_loop_order(example()))  # B[k,j]: j
    'columns'
    """
    if not nest.free or not any(t.reduced or t.body.atoms(Reduce) for t in nest.terms):
        return None
    rows, last = _row_indices(nest, order), order.free_order[-1]
    rank = {"rows": -1, "columns": -1, "both": -1}
    for term in nest.terms:
        for access in accesses(term.body):
            names = {s.name for s in access.indices[-1].free_symbols}
            kind = "both" if names & rows and last in names else "rows" if names & rows else None
            kind = kind or ("columns" if last in names else None)
            if kind is not None:
                rank[kind] = max(rank[kind], len(access.indices))
    if rank["rows"] > max(rank["columns"], rank["both"]):
        return "rows"
    if rank["columns"] >= max(rank["rows"], rank["both"], 0) and any(t.reduced for t in nest.terms):
        return "columns" if rectangular(nest, order) else None
    return None
