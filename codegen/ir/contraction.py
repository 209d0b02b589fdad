"""Pure contractions: nests that XLA's `dot_general` computes as they are.

A nest is a pure contraction when it sums one product of plain tensor accesses (every axis
indexed by a bare index, no index twice in one access), scalar operands and constants over
ranges that start at 0, with no guard and no constraint on a reduced index. (A gradient nest
may keep a constraint on its free indices that restates an extent the call-time checks
already made equal, such as `k < A.shape[1]` in `dB[k, j]`; `fits` checks it holds
everywhere.) Such a nest is an einsum; on the CPU
and GPU, XLA's dot (Eigen, cuBLAS) beats a generated loop nest for it, so the schedules may
pick the ``"xla"`` strategy and the runner calls `jnp.einsum` instead of a kernel.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import scalar_symbol, tensor_base
>>> i, j, k = (index_symbol(n) for n in "ijk")
>>> A, B = tensor_base("A"), tensor_base("B")
>>> nest = LoopNest("C", (Range(i, 0, extent_symbol("A", 0)), Range(j, 0, extent_symbol("B", 1))),
...     (Term(2 * scalar_symbol("s") * A[i, k] * B[k, j], (Range(k, 0, extent_symbol("A", 1)),)),),
...     (Operand("s", 0), Operand("A", 2), Operand("B", 2)))
>>> contraction(nest)
Contraction(subscripts='ac,cb->ab', tensors=(1, 2), scalars=(0,), constant=2.0, prologues=())

A contraction whose factors include elementwise functions of the inputs (GELU, tanh, a mask, a
scale: `0.5*H[b,u]*(1 + erf(H[b,u]/sqrt(2)))*W[u,o]`) is one too once those factors are
evaluated apart (`prologue_contraction`): each group of them that reads fewer indices than the
term's loops is a `Prologue`, computed once per point of its own indices (once per `(b, u)`,
not per `(b, u, o)`) and given to the einsum as one more input, as `gelu(H) @ W` is in jnp.
"""

from __future__ import annotations

import dataclasses
import functools
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen import config
from codegen.ir import summands
from codegen.ir.bounds import loop_bounds
from codegen.ir.nest import LoopNest, Range, Reduce, Term, extent_of, extent_symbol
from codegen.ir.xla_elementwise import xla_elementwise

_LETTERS = string.ascii_lowercase + string.ascii_uppercase


@dataclass(frozen=True)
class Prologue:
    """Elementwise factors of a contraction's term, evaluated once per point of their own
    indices (`indices`, in the term's loop order: free, then reduced) into one einsum input."""

    body: sympy.Expr
    indices: tuple[sympy.Symbol, ...]


@dataclass(frozen=True)
class Contraction:
    """`constant * prod(scalars) * einsum(subscripts, *tensors, *prologues)`; operands by
    position, each prologue evaluated over its indices first (`Prologue`)."""

    subscripts: str
    tensors: tuple[int, ...]  # operand positions, one per einsum input (repeats allowed)
    scalars: tuple[int, ...]  # operand positions of scalar factors
    constant: float
    prologues: tuple[Prologue, ...] = ()  # einsum inputs after the tensors'


def contraction(nest: LoopNest) -> Contraction | None:
    """The nest as an einsum, or None when it is not a pure contraction with a reduced index
    and at least two tensor factors (a dot product, not a mere sum or scaling)."""
    if nest.reduction != "sum" or len(nest.terms) != 1:
        return None
    return term_contraction(nest, nest.terms[0])


def term_contraction(nest: LoopNest, term: Term, *, prologues: bool = False) -> Contraction | None:
    """One term of a summed nest as an einsum over the nest's free indices (`contraction`'s
    rules; with `prologues`, `prologue_contraction`'s), or None."""
    if term.guard != sympy.true or not term.reduced:
        return None
    reduced = set(term.reduced_indices)
    if any(c.free_symbols & reduced for c in term.constraints):
        return None
    ranges = (*nest.free, *term.reduced)
    if any(r.start != 0 for r in ranges):
        return None
    indices = [r.index for r in ranges]
    return _einsum(nest, term.body, indices, [r.index for r in nest.free], prologues=prologues)


def prologue_contraction(nest: LoopNest, term: Term) -> Contraction | None:
    """A summed term whose factors are plain accesses, scalars, constants and elementwise
    factors that each read fewer of the term's indices than it loops over, as an einsum
    whose extra inputs are those factors evaluated apart (`Prologue`), or None.

    The factors of one prologue read the same indices, or fewer: a factor joins the widest
    prologue whose indices include its own, a plain access too (`H[b,u]` of GELU's
    `0.5*H[b,u]*(1 + erf(...))` is multiplied in once per `(b, u)`). A factor that reads
    every index of the term is evaluated as often either way, and a nested reduction or an
    access that is not plain (`X[i + k]`) would be materialised larger than read: none of
    these has a prologue.

    >>> from tensordsl.frontend.lower import lower
    >>> from tensordsl.frontend.parse import parse
    >>> nest = lower(parse("Y[b,o] := 0.5*H[b,u]*(1 + erf(H[b,u]*0.7))*W[u,o]")).nest
    >>> found = prologue_contraction(nest, nest.terms[0])
    >>> found.subscripts, found.tensors, found.constant
    ('cb,ac->ab', (1,), 0.5)
    >>> found.prologues[0].body, found.prologues[0].indices
    ((erf(0.7*H[b, u]) + 1)*H[b, u], (b, u))
    >>> prologue_contraction(nest, lower(parse("Y[i] := exp(X[i,k]) * W[k]")).nest.terms[0])
    """
    return term_contraction(nest, term, prologues=True)


def nested_contraction(
    nest: LoopNest, node: Reduce, outer: Sequence[sympy.Symbol]
) -> Contraction | None:
    """A nested sum `node` as an einsum whose output axes are the indices of `outer` (in that
    order) that its body reads, or None when it is not a pure contraction of at least two
    tensor factors over indices of `outer` and its own index from 0."""
    if node.reduction != "sum" or node.start != 0 or node.body.atoms(Reduce):
        return None
    reads = node.body.free_symbols
    kept = [s for s in outer if s in reads]
    return _einsum(nest, node.body, [*kept, node.index], kept)


def matrix_product(plan: Contraction) -> bool:
    """Whether two of the einsum's tensors each bring an output index the other lacks (a
    matrix times a matrix, where XLA's dot wins; a matrix times a vector is memory-bound and
    a kernel does as well without the extra pass)."""
    inputs, output = plan.subscripts.split("->")
    reads = [set(letters) & set(output) for letters in inputs.split(",")]
    return any(a - b and b - a for a in reads for b in reads)


def _einsum(
    nest: LoopNest,
    body: sympy.Expr,
    indices: Sequence[sympy.Symbol],
    output: Sequence[sympy.Symbol],
    *,
    prologues: bool = False,
) -> Contraction | None:
    """`body`, summed over `indices` not in `output`, as an einsum (see `contraction`; with
    `prologues`, elementwise factors become `Prologue`s, see `prologue_contraction`)."""
    letters = {s: _LETTERS[n] for n, s in enumerate(indices) if n < len(_LETTERS)}
    if len(letters) != len(indices):
        return None
    position = {op.name: n for n, op in enumerate(nest.operands)}
    plain: list[sympy.Indexed] = []
    others: list[sympy.Expr] = []
    scalars: list[int] = []
    constant = 1.0
    for factor in sympy.Mul.make_args(body):
        if factor.is_Number:
            constant *= float(factor)
        elif isinstance(factor, sympy.Symbol) and factor.name in position:
            if not nest.operand(factor.name).is_scalar:
                return None
            scalars.append(position[factor.name])
        elif _plain(factor, position, letters):
            plain.append(factor)
        elif prologues:
            others.append(factor)
        else:
            return None
    groups = _groups(others, plain, position, letters) if others else []
    if groups is None:
        return None
    grouped = {f for _, factors in groups for f in factors}
    reads = sorted(
        (position[f.base.name], "".join(letters[a] for a in f.indices))
        for f in plain
        if f not in grouped
    )
    tensors, inputs = [p for p, _ in reads], [s for _, s in reads]
    made = tuple(
        Prologue(sympy.Mul(*factors), tuple(i for i in indices if i in group))
        for group, factors in groups
    )
    inputs += ["".join(letters[i] for i in p.indices) for p in made]
    used = set("".join(inputs))
    # Two inputs with indices: a dot, not a sum scaled by a scalar prologue (`X[b,f] / F`).
    if sum(1 for i in inputs if i) < 2 or any(letters[s] not in used for s in indices):
        return None
    out = "".join(letters[s] for s in output)
    # Every input read whole per product or a factor per output element (`sum_j
    # dP[i,j]*P[i,j]/Z[i]`, softmax's gradient): the dot reuses nothing, XLA runs it as one
    # small dot per output element (about 4x a kernel's time at 512x512), a kernel reads each
    # element once. A matrix-vector product reuses the vector and stays XLA's.
    if all(set(i) == used or set(i) <= set(out) for i in inputs):
        return None
    subscripts = f"{','.join(inputs)}->{out}"
    return Contraction(subscripts, tuple(tensors), tuple(scalars), constant, made)


def _plain(factor: sympy.Expr, position: Mapping[str, int], letters: Mapping) -> bool:
    """Whether `factor` is an access of an operand by distinct bare loop indices."""
    if not isinstance(factor, sympy.Indexed) or factor.base.name not in position:
        return False
    axes = factor.indices
    return all(a in letters for a in axes) and len(set(axes)) == len(axes)


def _groups(
    others: Sequence[sympy.Expr],
    plain: Sequence[sympy.Indexed],
    position: Mapping[str, int],
    letters: Mapping,
) -> list[tuple[frozenset, list[sympy.Expr]]] | None:
    """The elementwise factors `others` grouped into prologues (each with the indices it
    reads), the `plain` accesses that read no index outside one of them joined to it; None
    where a factor cannot be evaluated apart (`prologue_contraction`)."""
    loop = frozenset(letters)
    reads = []
    for factor in others:
        within = frozenset(factor.free_symbols) & loop
        if within == loop or factor.atoms(Reduce):
            return None
        if not all(_plain(a, position, letters) for a in factor.atoms(sympy.Indexed)):
            return None
        reads.append((within, factor))
    groups: list[tuple[frozenset, list[sympy.Expr]]] = []
    for within, factor in sorted(reads, key=lambda r: -len(r[0])):
        home = next((g for g in groups if within <= g[0]), None)
        if home is None:
            groups.append((within, [factor]))
        else:
            home[1].append(factor)
    for access in plain:
        home = next((g for g in groups if frozenset(access.indices) <= g[0]), None)
        if home is not None:
            home[1].append(access)
    return groups


def fits(nest: LoopNest, shapes: Mapping[str, Sequence[int]], term: Term | None = None) -> bool:
    """Whether, for these shapes, every index runs over exactly the extent of every axis it
    indexes, so that the einsum computes the nest (or its contraction `term`; checked once per
    trace)."""
    values = {
        extent_symbol(name, axis): n
        for name, shape in shapes.items()
        for axis, n in enumerate(shape)
    }
    term = nest.terms[0] if term is None else term
    stops = {r.index: r.stop.xreplace(values) for r in (*nest.free, *term.reduced)}
    for access in term.body.atoms(sympy.Indexed):
        shape = shapes[access.base.name]
        if any(stops[index] != n for index, n in zip(access.indices, shape, strict=True)):
            return False
    # Constraints on free indices must hold at every point: affine, so at the worst corner.
    for constraint in term.constraints:
        expr = sympy.expand(constraint.xreplace(values))
        worst = {r.index: 0 if expr.coeff(r.index) > 0 else stops[r.index] - 1 for r in nest.free}
        if expr.xreplace(worst) < 0:
            return False
    return True


#: A term that reduces over at most this many points in all (a bias written `c[o] * (i == 0)`
#: loops over one `i`; `+ c[o]` is a term of its own over none) is evaluated elementwise next
#: to the einsums.
SHORT = 4


@dataclass(frozen=True)
class XlaPlan:
    """A summed nest as XLA computes it, term by term: `dots[n]` is the einsum of a pure
    contraction term; any other term is evaluated elementwise over the free indices (and its
    few reduced points) with its nested sums as einsums (`nested`, from
    `nested_contraction`) or, when their body does not read their index, as a multiple of
    it."""

    terms: tuple[Term, ...]
    dots: tuple[Contraction | None, ...]
    nested: Mapping[Reduce, Contraction]
    origins: tuple[int, ...]  # the nest's term each of `terms` comes from (by position)


@functools.lru_cache(maxsize=4096)
def xla_plan(nest: LoopNest) -> XlaPlan | None:
    """The nest as XLA's dots and fused elementwise work, or None when some term needs a
    loop nest (a reduction over more than `SHORT` points that is not a contraction, a nested
    reduction that is not a contraction) or nothing in it is a dot (but an `xla_elementwise` nest).

    Besides pure contractions, this covers a contraction plus a bias, a where() over a summed
    contraction (`S = sum_e where(j <= i, Q*K, -1e9)`: the sum moves into the branches,
    `_sum_into_select`), and an elementwise term of nested contractions (attention's
    `dS = exp(S - L) * sum_e dO*V`, a `matrix_product`), and a contraction of elementwise
    functions of its inputs (`prologue_contraction`: `gelu(H[b,u]) * W[u,o]`, evaluated once
    per `(b, u)`), and an elementwise nest of exp (`codegen.ir.xla_elementwise`: a
    logsumexp's gradient, fused with the weighted sum's and computing their exp once).
    Nothing is materialised beyond the output's size, except each prologue, over its own
    indices.

    >>> from tensordsl.frontend.lower import lower
    >>> from tensordsl.frontend.parse import parse
    >>> plan = xla_plan(lower(parse("Y[b,o] := X[b,f] * W[f,o] + c[o]")).nest)
    >>> [dot is not None for dot in plan.dots]
    [True, False]
    >>> xla_plan(lower(parse("S[i,j] := where(j <= i, Q[i,e] * K[j,e], -1e9)")).nest).terms[0].body
    Piecewise((sum_e(K[j, e]*Q[i, e]), i >= j), (sum_e(-1000000000.0), True))
    >>> xla_plan(lower(parse("Y[i] := exp(X[i,k]) * W[k]")).nest) is None
    True
    """
    if nest.reduction != "sum":
        return None
    free = [r.index for r in nest.free]
    terms: list[Term] = []
    dots: list[Contraction | None] = []
    origins: list[int] = []
    einsums: dict[Reduce, Contraction] = {}
    for origin, written in enumerate(nest.terms):
        term, dot = written, term_contraction(nest, written)
        if dot is None:
            term = _sum_into_select(term)
            nested = [n for n in term.body.atoms(Reduce) if n.index in n.body.free_symbols]
            if term.reduced:
                short = None if nested else _short(term)
                if short is None:
                    # Elementwise factors evaluated apart, then a dot (GELU before a matmul).
                    term, dot, nested = written, prologue_contraction(nest, written), []
                    if dot is None:  # products that each contract (a tangent nest's)
                        split = _contracted_groups(nest, written)
                        if split is None:
                            return None
                        terms += [t for t, _ in split]
                        dots += [d for _, d in split]
                        origins += [origin] * len(split)
                        continue
                else:
                    term = short
            for node in nested:
                found = nested_contraction(nest, node, free)
                if found is None or not matrix_product(found):
                    return None
                einsums[node] = found
        terms.append(term)
        dots.append(dot)
        origins.append(origin)
    if not einsums and all(dot is None for dot in dots) and not xla_elementwise(nest):
        return None
    return XlaPlan(tuple(terms), tuple(dots), einsums, tuple(origins))


def _contracted_groups(nest: LoopNest, term: Term) -> list[tuple[Term, Contraction]] | None:
    """A term that adds products, each a (prologue) contraction, as one term per group of
    products that contract the same plain accesses (`codegen.ir.summands`), with its
    einsum; None where some product or group is no matrix product."""

    def contracted(product: sympy.Expr) -> tuple[sympy.Expr, ...] | None:
        found = prologue_contraction(nest, dataclasses.replace(term, body=product))
        if found is None:
            return None
        inside = [p.body for p in found.prologues]
        factors = sympy.Mul.make_args(product)
        plain = [f for f in factors if isinstance(f, sympy.Indexed)]
        return tuple(f for f in plain if not any(b.has(f) for b in inside))

    groups = summands.grouped(term, contracted)
    if groups is None:
        return None
    found = []
    for group in groups:
        dot = prologue_contraction(nest, group)
        # Matrix products only (a column sum of products, LayerNorm's `dg`, stays one pass).
        if dot is None or not matrix_product(dot):
            return None
        found.append((group, dot))
    return found


def _short(term: Term) -> Term | None:
    """The term over windows of at most `SHORT` points in all that hold every point its
    constraints allow (`f in [0, 1)` for `c[o] * (f == 0)`), whatever the shapes; the
    constraints and the original ranges stay, as tests; or None."""
    bounds = loop_bounds(term, term.reduced_indices)
    windows, tests, points = [], [], 1
    for r in term.reduced:
        start = bounds.starts[r.index]
        lengths = [
            sympy.expand(stop - first)
            for stop in _arguments(bounds.stops[r.index], sympy.Min)
            for first in _arguments(start, sympy.Max)
        ]
        lengths = [int(n) for n in lengths if n.is_Integer]
        if any(extent_of(x) is None for x in start.free_symbols) or not lengths:
            return None
        points *= max(min(lengths), 0)
        windows.append(Range(r.index, start, start + max(min(lengths), 0)))
        tests += [r.index - r.start, r.stop - 1 - r.index]
    if points > SHORT:
        return None
    return Term(term.body, tuple(windows), (*term.constraints, *tests), term.guard)


def _arguments(expr: sympy.Expr, kind: type[sympy.Basic]) -> tuple[sympy.Basic, ...]:
    """The arguments of a `kind` (Min, Max), or the expression alone."""
    return tuple(expr.args) if isinstance(expr, kind) else (expr,)


def _sum_into_select(term: Term) -> Term:
    """`sum_k where(c, a, b)` as `where(c, sum_k a, sum_k b)` when nothing but the branches
    reads `k` and `k`'s range is one of extents (a sum of a constant stays a nested sum whose
    body does not read its index); any other term as it is."""
    if len(term.reduced) != 1 or not isinstance(term.body, sympy.Piecewise):
        return term
    (r,) = term.reduced
    outside = [r.start, r.stop, term.guard, *term.constraints]
    outside += [condition for _, condition in term.body.args]
    bounds = sympy.Add(r.start, r.stop).free_symbols
    if any(r.index in e.free_symbols for e in outside) or any(extent_of(s) is None for s in bounds):
        return term
    pieces = [
        (Reduce("sum", value, r.index, r.start, r.stop), condition)
        for value, condition in term.body.args
    ]
    return Term(sympy.Piecewise(*pieces), (), term.constraints, term.guard)


def xla_contraction(nest: LoopNest, dtypes: Mapping[str, str] | None = None) -> bool:
    """Whether the schedules give `nest` the ``"xla"`` strategy: it has an `xla_plan`, every
    dtype (when given) is a float, and XLA contractions are not switched off
    (`TENSORDSL_XLA_CONTRACTIONS=0`)."""
    floats = dtypes is None or all(d.startswith(("float", "bfloat")) for d in dtypes.values())
    return floats and config.xla_contractions() and xla_plan(nest) is not None
