"""How the gradient of each reduction is formed: the nests the forward also computes, and
the factor multiplying `df/dA` in every gradient term (one rule per row of
`codegen.ir.reductions.REDUCTIONS`), with the names and roles of the tensors they read.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> nest = lower(parse("Y[i] := X[i,k]"), reduce="max").nest
>>> for role, aux in auxiliary_nests(nest).items():
...     print(role, aux)
argument (argmax) Y_argument[i] := X[i, k]
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import sympy

from codegen.errors import Unsupported
from codegen.ir.functions import indicator
from codegen.ir.nest import LoopNest, Reduce, Term, scalar_symbol, tensor_base
from codegen.ir.reductions import REDUCTIONS

#: Roles of a gradient nest's operands.
COTANGENT, OUTPUT = "cotangent", "output"
ARGUMENT, FINITE_PROD, ZERO_COUNT, INF_COUNT = "argument", "finite_prod", "zero_count", "inf_count"


def _unique(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


@dataclass(frozen=True)
class GradientNames:
    """Names of the tensors a gradient nest of `nest` refers to."""

    cotangent: str
    gradient: str
    argument: str
    finite_prod: str
    zero_count: str
    inf_count: str


def gradient_names(nest: LoopNest, wrt: str) -> GradientNames:
    taken = set(nest.operand_names) | {nest.output} | nest.extent_tensors()
    return GradientNames(
        cotangent=_unique("d" + nest.output, taken),
        gradient=_unique("d" + wrt, taken),
        argument=_unique(nest.output + "_argument", taken),
        finite_prod=_unique(nest.output + "_finite_prod", taken),
        zero_count=_unique(nest.output + "_zero_count", taken),
        inf_count=_unique(nest.output + "_inf_count", taken),
    )


def _no_auxiliary(nest: LoopNest, names: GradientNames) -> dict[str, LoopNest]:
    return {}


def _extreme_auxiliary(nest: LoopNest, names: GradientNames) -> dict[str, LoopNest]:
    """max/min: the position of the winning iteration (an argmax/argmin nest)."""
    return {
        ARGUMENT: LoopNest(
            names.argument, nest.free, nest.terms, nest.operands, "arg" + nest.reduction
        )
    }


def _selection_auxiliary(nest: LoopNest, names: GradientNames) -> dict[str, LoopNest]:
    """topk: the positions of the selected values (an argtopk nest, the same rank index)."""
    return {ARGUMENT: LoopNest(names.argument, nest.free, nest.terms, nest.operands, "argtopk")}


def _prod_auxiliary(nest: LoopNest, names: GradientNames) -> dict[str, LoopNest]:
    """prod: the product of the finite nonzero factors (an infinite one counts as its sign),
    the number of zero factors and the number of infinite ones."""
    (term,) = nest.terms
    body = term.body
    saved = {
        FINITE_PROD: (names.finite_prod, _regular(body), "prod"),
        ZERO_COUNT: (names.zero_count, indicator(sympy.Eq(body, 0)), "sum"),
        INF_COUNT: (names.inf_count, indicator(_is_infinite(body)), "sum"),
    }
    return {
        role: LoopNest(
            name,
            nest.free,
            (Term(value, term.reduced, term.constraints, term.guard),),
            nest.operands,
            reduction,
        )
        for role, (name, value, reduction) in saved.items()
    }


def _is_infinite(x: sympy.Expr) -> sympy.Basic:
    """`x` is +-inf: the only nonzero values equal to their double (sympy keeps the test)."""
    return sympy.And(sympy.Ne(x, 0), sympy.Eq(x, 2 * x))


def _regular(x: sympy.Expr) -> sympy.Expr:
    """The factor as the finite product counts it: 1 for 0, the sign for +-inf, else x."""
    return sympy.Piecewise(
        (sympy.Integer(1), sympy.Eq(x, 0)), (sympy.sign(x), _is_infinite(x)), (x, True)
    )


def _sum_scale(nest: LoopNest, names: GradientNames) -> sympy.Expr:
    return saved(names.cotangent, nest)


def _logsumexp_scale(nest: LoopNest, names: GradientNames) -> sympy.Expr:
    """`dY * exp(f - Y)` (the row's `weight`), with the saved output Y; 0 where Y is -inf
    (every f -inf: a softmax row that a mask leaves empty), where `exp(-inf - -inf)` would be
    NaN: such a row gives no gradient, as in FlexAttention. The test wraps the weight, not its
    argument, so that it stays the `exp(S - L)` that attention's gradient nests compute once
    for both of their terms."""
    (term,) = nest.terms
    weight = REDUCTIONS["logsumexp"].weight
    assert weight is not None
    y = saved(nest.output, nest)
    empty = sympy.And(sympy.Lt(y, 0), sympy.Eq(y, 2 * y))  # y is -inf (see _is_infinite)
    scale = sympy.Piecewise((sympy.Integer(0), empty), (weight(term.body, y), True))
    return saved(names.cotangent, nest) * scale


def _extreme_scale(nest: LoopNest, names: GradientNames) -> sympy.Expr:
    """`dY` at the saved winning position, 0 elsewhere (topk: `dY[..., r]` at the position of
    rank r; the gradient nest sums over the ranks, which no input reads)."""
    (term,) = nest.terms
    argument = saved(names.argument, nest)
    # `position - argument == 0`, not `position == argument`: once a gradient solves the
    # position for its own indices (`X[c, 2t + k]`: k = p - 2t), sympy's Piecewise makes
    # `Eq(p - 2t, argument)` canonical by turns for ever (sympy 1.14); the difference
    # against 0 it leaves alone.
    return sympy.Piecewise(
        (saved(names.cotangent, nest), sympy.Eq(flat_position(term) - argument, 0)),
        (sympy.Integer(0), True),
    )


def _prod_scale(nest: LoopNest, names: GradientNames) -> sympy.Expr:
    """`dY` times the product of the other factors as IEEE arithmetic gives it: the finite
    ones divided by this factor's regular part, times inf if another factor is infinite,
    times 0 if another is zero (so 0 * inf is NaN, as in jnp); never dividing by 0 or inf."""
    (term,) = nest.terms
    x = term.body
    finite = saved(names.finite_prod, nest) / _regular(x)
    other_zeros = saved(names.zero_count, nest) - indicator(sympy.Eq(x, 0))
    other_infinities = saved(names.inf_count, nest) - indicator(_is_infinite(x))
    infinite = sympy.Piecewise((sympy.oo, other_infinities > 0), (sympy.Integer(1), True))
    others = finite * infinite * indicator(sympy.Eq(other_zeros, 0))
    return saved(names.cotangent, nest) * others


def _no_scale(nest: LoopNest, names: GradientNames) -> sympy.Expr:
    raise Unsupported(f"no gradient for the reduction '{nest.reduction}'")


@dataclass(frozen=True)
class GradientRule:
    """How the gradient of a reduction is formed.

    `auxiliary` gives the nests the forward pass must also compute (by role); `scale` the
    factor multiplying `df/dA` in every gradient term (the cotangent, adjusted).
    """

    auxiliary: Callable[[LoopNest, GradientNames], dict[str, LoopNest]]
    scale: Callable[[LoopNest, GradientNames], sympy.Expr]


#: One rule per row of `codegen.ir.reductions.REDUCTIONS`.
GRADIENT_RULES: dict[str, GradientRule] = {
    "sum": GradientRule(_no_auxiliary, _sum_scale),
    "max": GradientRule(_extreme_auxiliary, _extreme_scale),
    "min": GradientRule(_extreme_auxiliary, _extreme_scale),
    "prod": GradientRule(_prod_auxiliary, _prod_scale),
    "logsumexp": GradientRule(_no_auxiliary, _logsumexp_scale),
    "argmax": GradientRule(_no_auxiliary, _no_scale),
    "argmin": GradientRule(_no_auxiliary, _no_scale),
    "topk": GradientRule(_selection_auxiliary, _extreme_scale),
    "argtopk": GradientRule(_no_auxiliary, _no_scale),
}


def nested_weight(nested: Reduce, derivative: str) -> sympy.Expr:
    """d nested / d its body: the weight of the body's derivative in the derivative of a
    nested reduction, from the reduction's row (`Reduction.weight`); the gradient and the
    tangent (`jvp.py`) both read it.

    Args:
        nested: the nested reduction.
        derivative: what is formed ("gradient", "forward-mode derivative"), for the error.

    Raises:
        Unsupported: the reduction has no weight of its value and result alone.

    >>> from codegen.ir.nest import index_symbol, tensor_base
    >>> i, d = index_symbol("i"), index_symbol("d")
    >>> nested_weight(Reduce("logsumexp", tensor_base("X")[i, d], d, 0, 4), "gradient")
    exp(X[i, d] - logsumexp_d(X[i, d]))
    """
    weight = REDUCTIONS[nested.reduction].weight
    if weight is None:
        weighted = " and ".join(name for name, row in REDUCTIONS.items() if row.weight)
        raise Unsupported(
            f"no {derivative} through a nested '{nested.reduction}' reduction (only "
            f"{weighted}): store that intermediate instead of recomputing it"
        )
    return weight(nested.body, nested)


def auxiliary_nests(nest: LoopNest) -> dict[str, LoopNest]:
    """The nests the forward pass must also compute for the gradients of `nest`.

    Keys are roles ("argument", "finite_prod", "zero_count", "inf_count"); each nest's output
    has the name the gradient nests use for it.
    """
    return GRADIENT_RULES[nest.reduction].auxiliary(nest, gradient_names(nest, "_"))


def saved(name: str, nest: LoopNest) -> sympy.Expr:
    """The element of an output-shaped tensor at the current output position."""
    if not nest.free:
        return scalar_symbol(name)
    return tensor_base(name)[tuple(r.index - r.start for r in nest.free)]


def flat_position(term: Term) -> sympy.Expr:
    """Row-major position of the current iteration over the term's reduced ranges."""
    position, stride = sympy.Integer(0), sympy.Integer(1)
    for r in reversed(term.reduced):
        position += (r.index - r.start) * stride
        stride *= r.stop - r.start
    return position


def outermost_reductions(expr: sympy.Basic) -> list[Reduce]:
    """The nested reductions of `expr` read outside every other one, each once, in the order
    they are met. One may also be read inside another (LayerNorm's mean inlined both in the
    normalisation and inside the variance's sum): it is outermost all the same, where it is
    read outside (the gradient and the tangent hold it fixed there)."""
    found: list[Reduce] = []

    def walk(node: sympy.Basic) -> None:
        if isinstance(node, Reduce):
            if node not in found:
                found.append(node)
            return
        for arg in node.args:
            walk(arg)

    walk(expr)
    return found


@functools.lru_cache(maxsize=4096)
def reads_output(nest: LoopNest) -> bool:
    """Whether the derivatives of `nest` read its saved output: its rule's scale does
    (logsumexp's `exp(f - Y)`). The gradient nests (`grad.py`) and the tangent nest (`jvp.py`)
    multiply every derivative of the body by this scale, so they read the output exactly
    when it does and some perturbed input's derivative is not zero; this structural answer
    needs neither derived.

    Raises:
        Unsupported: the reduction has no gradient (argmax).

    >>> from tensordsl.frontend.lower import lower
    >>> from tensordsl.frontend.parse import parse
    >>> [reads_output(lower(parse("Y[i] := X[i,k]"), reduce=r).nest) for r in ("sum", "logsumexp")]
    [False, True]
    """
    scale = GRADIENT_RULES[nest.reduction].scale(nest, gradient_names(nest, "_"))
    return scale.has(saved(nest.output, nest))
