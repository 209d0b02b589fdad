"""The reductions table: one row per reduction a loop nest may use.

Every module that treats reductions differently reads this table (or keys a table of its own
by the same names, which `tests/unit/test_tables.py` checks): the language accepts the
`user` rows; the C and CUDA emitters print the templates; the CPU schedule gives the `simd`
rows vector lanes; the reference back end and the gradient rules have one entry per row; the
sharding plan splits a reduced axis only for rows with a `cross_device` combine; `init=`
starts the rows with an `init_combine`; the gradient and the tangent of a nested reduction
(`codegen.passes.gradient_rules.nested_weight`) read `weight`; the guard pass folds a
nested reduction of a constant by `repeated`.

C templates: `{a}`/`{b}` are the reduction state (a value, and a second value or a position),
`{v}` the value of one iteration, `{pos}` its flat position, `{oa}`/`{ob}` another state to
fold in, `{exp}`/`{log}` the math functions of the accumulation type; for a selection,
`{k}` the number of values kept and `{r}` the rank read out.

>>> REDUCTIONS["logsumexp"].identity, REDUCTIONS["argmax"].positional
(-inf, True)
>>> x, y, n = sympy.symbols("x y n")
>>> REDUCTIONS["logsumexp"].weight(x, y), REDUCTIONS["sum"].repeated(x, n)
(exp(x - y), n*x)
>>> USER_REDUCTIONS
('sum', 'max', 'min', 'prod', 'logsumexp', 'argmax', 'argmin', 'topk', 'argtopk')
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import sympy

from codegen.ir.ieee import shifted

#: The dtype of a saved argmax/argmin position (the JAX binding allocates it).
POSITION_DTYPE = "int32"

#: `weight(value, result)`: d result / d value, where it depends on nothing but the two.
Weight = Callable[[sympy.Expr, sympy.Expr], sympy.Expr]
#: `repeated(value, count)`: the result of `count` (>= 1) equal values.
Repeated = Callable[[sympy.Expr, sympy.Expr], sympy.Expr]

#: The largest k of a topk/argtopk the compiled back ends keep (two k-long arrays per
#: output row, in registers or on the stack).
MAX_SELECTION = 64


@dataclass(frozen=True)
class Pass:
    """One vectorised pass over a reduction's values (`Reduction.passes`)."""

    update: str  # fold `{v}` into the state
    simd: str  # the clauses of the `#pragma omp simd` of the pass's loop
    before: str = ""  # a statement on the state before the pass
    only_if: str = ""  # the pass runs where this condition on the state holds


@dataclass(frozen=True)
class Reduction:
    """One reduction (see the module docstring for the template placeholders)."""

    name: str
    user: bool  # users may ask for it (every row today; an internal one would not be)
    identity: float  # the value that leaves the result unchanged
    init: tuple[str, ...]  # C initial value of each state variable
    update: str  # fold `{v}` (at `{pos}`) into the state
    combine: str  # fold another state `{oa}`/`{ob}` into the state
    result: str  # the output value of a final state
    positional: bool = False  # the result is the position `{b}` (an integer), not a value
    simd: bool = False  # independent lanes combined at the end give the same result
    cross_device: str | None = None  # how results over a split reduced axis combine
    #: The same result from passes over a chunk of values, each a vectorised loop; chunk
    #: results fold in by `combine` (the scalar strategy, `codegen.c.reductions.simple`).
    passes: tuple[Pass, ...] = ()
    #: A selection of the k best values (topk, argtopk): the nest's last free index is the
    #: rank, its extent k; the state is two k-long arrays `{a}[]`, `{b}[]` kept sorted.
    selects: bool = False
    #: The derivative of the result with respect to one value (`Weight`): the gradient and
    #: the tangent through a nested reduction are weighted by it, and so are the gradient
    #: terms of a nest with this reduction. None: a derivative needs values the forward
    #: saves (`codegen.passes.gradient_rules`), or there is none.
    weight: Weight | None = None
    #: The result of a constant value repeated (`Repeated`), for constant folding
    #: (`codegen.passes.guards`). None: not folded.
    repeated: Repeated | None = None
    #: The `jax.numpy` function (its name) joining `init=` and the result: the reduction's
    #: binary form, so the result is the reduction started from `init`. None: no `init=`.
    init_combine: str | None = None
    #: Scalar function calls (`exp`, `log`) folding one value into the state makes beyond
    #: the value's own (logsumexp's `exp`): the threads' cost model counts them
    #: (`codegen.c.threads.update_cost`).
    calls: int = 0


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


def _positional(name: str, op: str, init: str) -> Reduction:
    return Reduction(
        name,
        user=True,
        identity=math.nan,
        init=(init, "-1"),
        update=_ARG.replace("{op}", op),
        combine=_ARG_COMBINE.replace("{op}", op),
        result="{b}",
        positional=True,
        simd=True,
    )


# topk/argtopk: the k largest values in descending order, with argmax's order between two
# values (NaN first, ties to the smaller position), so the state is the same for any visiting
# order. A value that beats the last of the k slots moves the slots it beats down by one.
# Every value the last slot takes is not below it (an empty slot holds -inf, NaN compares
# false), so one comparison skips the rest: the common case of a long reduction.
_SLOT_TAKE = _ARG_TAKE.replace("{op}", ">").replace("{a}", "{a}[{s}]").replace("{b}", "{b}[{s}]")
_SELECT = (
    "if (!({v} < {a}[{k} - 1]) && "  # the common case, below the last slot, in one compare
    + _SLOT_TAKE.replace("{s}", "{k} - 1")
    + ") {{ int s_ = {k} - 1; while (s_ > 0 && "
    + _SLOT_TAKE.replace("{s}", "s_ - 1")
    + ") {{ {a}[s_] = {a}[s_ - 1]; {b}[s_] = {b}[s_ - 1]; --s_; }} "
    "{a}[s_] = {v}; {b}[s_] = {pos}; }}"
)


def _selection(name: str, positional: bool) -> Reduction:
    return Reduction(
        name,
        user=True,
        identity=math.nan if positional else -math.inf,
        init=("-INFINITY", "-1"),
        update=_SELECT,
        combine="",  # a selection is computed by one sequential loop per output row
        result="{b}[{r}]" if positional else "{a}[{r}]",
        positional=positional,
        selects=True,
    )


# max/min, as jnp.max/min: NaN propagates. A NaN value is taken, and a NaN state is kept
# because no comparison with NaN holds. Branch-free selects, so lane loops vectorise.
_EXTREMUM = "{a} = ({v} {op} {a} || {v} != {v}) ? {v} : {a};"


def _extremum(name: str, op: str, identity: float, init: str) -> Reduction:
    return Reduction(
        name,
        user=True,
        identity=identity,
        init=(init,),
        update=_EXTREMUM.replace("{op}", op),
        combine=_EXTREMUM.replace("{op}", op).replace("{v}", "{oa}"),
        result="{a}",
        simd=True,
        cross_device=name,
        repeated=lambda x, n: x,
        init_combine="maximum" if op == ">" else "minimum",
    )


# logsumexp: the state is the largest value `{a}` and the sum `{b}` of exp(value - {a}); `{w}`
# is the weight of the value `{v}` folded in (1, or another state's sum). As
# jax.nn.logsumexp: NaN propagates (it becomes `{a}` and stays, as for max); a result of
# +-inf is `{a}` itself (the sum is then not needed: inf - inf would make it NaN).
_LSE = (
    "if ({v} > {a} || {v} != {v}) {{ {b} = {b}*{exp}({a} - {v}) + {w}; {a} = {v}; }} "
    "else if ({v} > -INFINITY) {{ {b} += {w}*{exp}({v} - {a}); }}"
)


# logsumexp of a chunk of values in two vectorised passes: the largest value (NaNs counted
# in `{b}` meanwhile, since a max reduction skips them), then the sum of exp(value -
# largest) where the largest is finite; chunks combine by `combine`. One libmvec exp per
# value instead of a scalar call and a branch per value.
_LSE_PASSES = (
    Pass("{a} = {v} > {a} ? {v} : {a}; {b} += {v} != {v};", "reduction(max:{a}) reduction(+:{b})"),
    Pass(
        "{b} += {exp}({v} - {a});",
        "reduction(+:{b})",
        before="if ({b} != 0) {{ {a} = NAN; }} {b} = 0;",
        only_if="{a} > -INFINITY && {a} < INFINITY",
    ),
)


def _rows(rows: Iterable[Reduction]) -> dict[str, Reduction]:
    return {row.name: row for row in rows}


REDUCTIONS: Mapping[str, Reduction] = _rows(
    [
        Reduction(
            "sum",
            user=True,
            identity=0.0,
            init=("0",),
            update="{a} += {v};",
            combine="{a} += {oa};",
            result="{a}",
            simd=True,
            cross_device="sum",
            weight=lambda x, y: sympy.Integer(1),
            repeated=lambda x, n: x * n,
            init_combine="add",
        ),
        _extremum("max", ">", -math.inf, "-INFINITY"),
        _extremum("min", "<", math.inf, "INFINITY"),
        Reduction(
            "prod",
            user=True,
            identity=1.0,
            init=("1",),
            update="{a} *= {v};",
            combine="{a} *= {oa};",
            result="{a}",
            simd=True,
            repeated=lambda x, n: x**n,
            init_combine="multiply",
        ),
        Reduction(
            "logsumexp",
            user=True,
            identity=-math.inf,
            init=("-INFINITY", "0"),
            update=_LSE.replace("{w}*", "").replace("{w}", "1"),
            combine=_LSE.replace("{v}", "{oa}").replace("{w}", "{ob}"),
            result="({a} > -INFINITY && {a} < INFINITY ? {a} + {log}({b}) : {a})",
            cross_device="logsumexp",
            passes=_LSE_PASSES,
            weight=shifted,  # the softmax weights exp(x - y), x whole first
            repeated=lambda x, n: x + sympy.log(n),
            init_combine="logaddexp",
            calls=1,
        ),
        _positional("argmax", ">", "-INFINITY"),
        _positional("argmin", "<", "INFINITY"),
        _selection("topk", positional=False),
        _selection("argtopk", positional=True),
    ]
)

#: The reductions users may ask for, in the order error messages list them.
USER_REDUCTIONS = tuple(name for name, row in REDUCTIONS.items() if row.user)
