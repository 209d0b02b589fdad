"""The ``"xla"`` strategy: a nest run as XLA's dots and fused elementwise work, no kernel.

`codegen.ir.contraction.xla_plan` decides which nests qualify (pure contractions, a contraction
plus a bias, a where() over a summed contraction, elementwise terms of nested contractions);
the schedules pick the strategy; the CPU and GPU runners call `run_xla` for it. A pure
contraction term is one `jnp.einsum`; any other term is evaluated over the output's indices
by the reference back end's evaluator, with each nested contraction an einsum placed on the
grid and each plain access a transposed view, so XLA fuses the elementwise work around its
dots. Nothing larger than the output is materialised.

On the CPU (`minor_contraction=True`), a dot whose operands both contract an axis that is not
their last (`dK[h,j,d] = sum_i dS[h,i,j]*Q[h,i,d]`, a transposed matrix times a matrix) is
given to XLA with one operand transposed into a copy first (`cpu_dot_form`): XLA's CPU dot
runs its fast library kernel only where the left operand contracts its minor axes and the
result needs no transposition, and folds any transposition it sees into the dot, so the copy is
made behind an optimisation barrier. jnp's own einsum runs such a dot in the slow form.

The dots run at the kernel's `precision=`: by default jnp's (`precision=None`, so
`jax.default_matmul_precision` applies: TF32 on an NVIDIA GPU, exact float32 on the CPU), as
the same einsum written in jnp would. Sums that are not contractions stay exact.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import sympy

from codegen.ir.contraction import Contraction, XlaPlan, fits, xla_plan
from codegen.ir.extents import evaluate_int, extent_values, output_shape
from codegen.ir.nest import LoopNest, Reduce
from tensordsl.backends.reference import (
    REDUCE,
    Evaluator,
    Points,
    compute_dtype,
    grid,
    term_values,
)


class _NoFit(Exception):
    """A nested contraction's ranges are not whole axes for these shapes: run the kernel."""


def run_xla(
    nest: LoopNest,
    operands: Sequence[jax.Array],
    shapes: Mapping[str, tuple[int, ...]],
    dtype: Any,
    *,
    precision: Any = None,
    minor_contraction: bool = False,
) -> jax.Array | None:
    """`nest` computed by XLA (`codegen.ir.contraction.xla_plan`), its dots at `precision` (None:
    jnp's default), or None where it has no plan or an einsum's index does not run over the
    whole of every axis it indexes for these shapes (the runner then builds the kernel);
    `minor_contraction`: each dot in the form XLA's CPU dot runs fast (`cpu_dot_form`)."""
    plan = xla_plan(nest)
    if plan is None:
        return None
    all_shapes = dict(shapes)
    all_shapes.update({op.name: tuple(jnp.shape(v)) for op, v in zip(nest.operands, operands)})
    extents = extent_values(nest, all_shapes)
    out_dtype = jnp.dtype(dtype)
    work = compute_dtype(out_dtype)
    values = dict(zip(nest.operand_names, operands))
    result: Any = None
    try:
        for term, dot in zip(plan.terms, plan.dots):
            if dot is not None:
                if not fits(nest, all_shapes, term):
                    return None
                made = _prologues(nest, term, dot, values, extents, work, all_shapes, plan)
                value = _dot(dot, operands, work, precision, made, minor=minor_contraction)
            else:
                value = _elementwise(
                    nest,
                    plan,
                    term,
                    values,
                    extents,
                    work,
                    all_shapes,
                    precision,
                    minor_contraction,
                )
            result = value if result is None else result + value
    except _NoFit:
        return None
    shape = output_shape(nest, all_shapes)
    return jnp.broadcast_to(result, shape).astype(out_dtype)


def _dot(
    plan: Contraction,
    operands: Sequence[Any],
    work: Any,
    precision: Any,
    prologues: Sequence[jax.Array] = (),
    *,
    minor: bool = False,
) -> jax.Array:
    """`plan` on the operands and its evaluated `prologues`, with `minor` in the form XLA's CPU
    dot runs fast (`cpu_dot_form`); half-precision products accumulate in float32. A sum over
    no points is 0 whatever the scalar factors (as in the kernels: an infinite scale times an
    empty sum is not NaN)."""
    inputs, output = plan.subscripts.split("->")
    tensors = [jnp.asarray(operands[p]) for p in plan.tensors] + list(prologues)
    sizes = {
        letter: n
        for tensor, letters in zip(tensors, inputs.split(","))
        for letter, n in zip(letters, jnp.shape(tensor))
    }
    if any(sizes[letter] == 0 for letter in sizes if letter not in output):
        return jnp.zeros(tuple(sizes[letter] for letter in output), work)
    wide = jnp.float32 if min(t.dtype.itemsize for t in tensors) < 4 else None
    subscripts = plan.subscripts
    if minor and len(tensors) == 2:
        subscripts, tensors = _cpu_arranged(subscripts, tensors, sizes, len(plan.tensors))
    result = jnp.einsum(
        subscripts,
        *tensors,
        precision=precision,
        preferred_element_type=wide,
    ).astype(work)
    for p in plan.scalars:
        result = result * jnp.asarray(operands[p], work)
    if plan.constant != 1.0:
        result = result * plan.constant
    return result


class CpuDotForm(NamedTuple):
    """A two-tensor einsum as XLA's CPU dot runs it fast: its operands taken in `order`, the
    first transposed by `permutation` (None: as it is), then `subscripts`."""

    subscripts: str
    order: tuple[int, int]
    permutation: tuple[int, ...] | None


#: The fewest points of the other operand's free axes for which copying one operand pays.
MIN_REUSE = 16


def cpu_dot_form(subscripts: str, sizes: Mapping[str, int]) -> CpuDotForm | None:
    """The form of a two-tensor einsum that XLA's CPU dot runs as its fast library kernel, or
    None where the einsum has it already or no form has it.

    XLA's CPU dot over one contracted axis is fast where its left operand holds the batch
    axes, then its free axes, then the contracted axis, and the result is batch, left free,
    right free axes in that order; it folds transpositions into the dot, so a transposed
    copy must be made apart (over several contracted axes XLA makes one itself). The
    operands are swapped where that is enough; else the operand whose free axes lead the
    result is transposed, where the other's free axes reuse each copied element
    `MIN_REUSE` times or more.

    Args:
        subscripts: the einsum, two inputs (no letter twice in one input).
        sizes: the extent of each letter.

    Returns:
        The form, or None.

    >>> cpu_dot_form("hij,hid->hjd", dict(h=2, i=256, j=256, d=64))
    CpuDotForm(subscripts='hji,hid->hjd', order=(0, 1), permutation=(0, 2, 1))
    >>> cpu_dot_form("hjd,hid->hij", dict(h=2, i=256, j=256, d=64))
    CpuDotForm(subscripts='hid,hjd->hij', order=(1, 0), permutation=None)
    >>> cpu_dot_form("hij,hjd->hid", dict(h=2, i=256, j=256, d=64)) is None
    True
    """
    inputs, out = subscripts.split("->")
    parts = inputs.split(",")
    if len(parts) != 2 or any(len(set(p)) != len(p) for p in parts):
        return None
    first, second = parts
    if any(letter not in out + other for p, other in zip(parts, parts[::-1]) for letter in p):
        return None  # a letter summed within one operand
    contracted = {letter for letter in first if letter in second and letter not in out}
    batch = [letter for letter in out if letter in first and letter in second]
    if len(contracted) != 1:  # several: XLA merges them into one axis, transposing as it must
        return None

    def free(lhs: str, rhs: str) -> tuple[list[str], list[str]] | None:
        left = [letter for letter in out if letter in lhs and letter not in rhs]
        right = [letter for letter in out if letter in rhs and letter not in lhs]
        return (left, right) if out == "".join(batch + left + right) else None

    def fast(lhs: str, rhs: str) -> bool:
        found = free(lhs, rhs)
        kept = [letter for letter in lhs if letter not in batch]
        return found is not None and kept[: len(found[0])] == found[0]

    if fast(first, second):
        return None
    if fast(second, first):
        return CpuDotForm(f"{second},{first}->{out}", (1, 0), None)
    for order in ((0, 1), (1, 0)):
        lhs, rhs = parts[order[0]], parts[order[1]]
        found = free(lhs, rhs)
        if found is None or math.prod(sizes[letter] for letter in found[1]) < MIN_REUSE:
            continue
        want = "".join(batch + found[0] + [letter for letter in rhs if letter in contracted])
        permutation = tuple(lhs.index(letter) for letter in want)
        return CpuDotForm(f"{want},{rhs}->{out}", order, permutation)
    return None


def _cpu_arranged(
    subscripts: str, tensors: list[jax.Array], sizes: Mapping[str, int], first_prologue: int
) -> tuple[str, list[jax.Array]]:
    """Two einsum inputs in `cpu_dot_form`. The left one is materialised behind a barrier
    where it is a transposed copy or a prologue (inputs from `first_prologue` on): a
    prologue is evaluated on transposed views of its operands, which XLA would fold into
    the dot as well (attention's `dV[j,e] = sum_i P[i,j]*dO[i,e]` with `P` a prologue).
    Over several contracted axes XLA transposes as it must, best inside the prologue."""
    inputs, output = subscripts.split("->")
    first, second = inputs.split(",")
    if len({letter for letter in first if letter in second and letter not in output}) != 1:
        return subscripts, tensors
    form = cpu_dot_form(subscripts, sizes)
    order = (0, 1) if form is None else form.order
    left, right = tensors[order[0]], tensors[order[1]]
    if form is not None:
        subscripts = form.subscripts
    if form is not None and form.permutation is not None:
        left = jax.lax.optimization_barrier(jnp.transpose(left, form.permutation))
    elif order[0] >= first_prologue:
        left = jax.lax.optimization_barrier(left)
    return subscripts, [left, right]


def _prologues(
    nest: LoopNest,
    term: Any,
    plan: Contraction,
    values: Mapping[str, Any],
    extents: Mapping[sympy.Symbol, int],
    work: Any,
    shapes: Mapping[str, tuple[int, ...]],
    xla: XlaPlan,
) -> list[jax.Array]:
    """Each prologue of `plan` evaluated over its own indices (their ranges in `nest`), an
    array with one axis per index in the prologue's order, for XLA to fuse before its dot."""
    by_index = {r.index: r for r in (*nest.free, *term.reduced)}
    made = []
    for prologue in plan.prologues:
        ranges = tuple(by_index[i] for i in prologue.indices)
        points, shape = grid(ranges, extents)
        evaluate = _XlaEvaluator(
            points, values, extents, work, nest=nest, plan=xla, shapes=shapes, precision=None
        )
        made.append(jnp.broadcast_to(jnp.asarray(evaluate(prologue.body), work), shape))
    return made


def _elementwise(
    nest: LoopNest,
    plan: XlaPlan,
    term: Any,
    values: Mapping[str, Any],
    extents: Mapping[sympy.Symbol, int],
    work: Any,
    shapes: Mapping[str, tuple[int, ...]],
    precision: Any,
    minor: bool,
) -> jax.Array:
    """A term over the output's indices (and its few reduced points), summed; `minor`: its
    nested contractions in `cpu_dot_form`."""
    ranges = (*nest.free, *term.reduced)

    def evaluator(grid: Points, operands: Any, extents: Any, dtype: Any) -> Evaluator:
        return _XlaEvaluator(
            grid,
            operands,
            extents,
            dtype,
            nest=nest,
            plan=plan,
            shapes=shapes,
            precision=precision,
            minor=minor,
        )

    body, mask = term_values(nest, term, values, extents, work, evaluator)
    axes = tuple(range(len(nest.free), len(ranges)))
    return REDUCE["sum"](body, mask, axes)


class _XlaEvaluator(Evaluator):
    """The reference evaluator with plain accesses as views and nested contractions as
    einsums, both placed on the grid's axes (its `spans`)."""

    def __init__(
        self,
        grid: Points,
        operands: Mapping[str, Any],
        extents: Mapping[sympy.Symbol, int],
        dtype: Any,
        *,
        nest: LoopNest,
        plan: XlaPlan,
        shapes: Mapping[str, tuple[int, ...]],
        precision: Any,
        minor: bool = False,
    ):
        super().__init__(grid, operands, extents, dtype)
        self.nest, self.plan, self.spans, self.shapes = nest, plan, grid.spans, shapes
        self.precision, self.minor = precision, minor

    def _whole(self, index: sympy.Basic, length: int) -> bool:
        """Whether `index` is a grid index running over exactly `[0, length)`."""
        span = self.spans.get(index)
        return span is not None and span[1:] == (0, length)

    def _placed(self, array: jax.Array, symbols: Sequence[sympy.Symbol]) -> jax.Array:
        """`array`, whose axes are the grid indices `symbols`, moved onto the grid's axes."""
        order = sorted(range(len(symbols)), key=lambda n: self.spans[symbols[n]][0])
        array = jnp.transpose(array, order)
        taken = {self.spans[symbols[n]][0] for n in order}
        missing = [axis for axis in range(len(self.spans)) if axis not in taken]
        return jnp.expand_dims(array, missing) if missing else array

    def access(self, access: sympy.Indexed) -> jax.Array:
        shape = self.shapes[access.base.name]
        indices = access.indices
        plain = len(set(indices)) == len(indices) and all(
            self._whole(i, n) for i, n in zip(indices, shape)
        )
        if not plain:
            return super().access(access)
        array = jnp.asarray(self.operands[access.base.name])
        if jnp.issubdtype(array.dtype, jnp.floating):
            array = array.astype(self.dtype)
        return self._placed(array, indices)

    def nested(self, node: Reduce) -> Any:
        length = evaluate_int(node.stop - node.start, self.extents)
        if node.index not in node.body.free_symbols:
            # A sum of a value that does not read its index: the value, times the points.
            return self(node.body) * length if length > 0 else jnp.zeros((), self.dtype)
        plan = self.plan.nested[node]  # a sum from 0 (`nested_contraction`)
        for access in node.body.atoms(sympy.Indexed):
            for index, n in zip(access.indices, self.shapes[access.base.name]):
                whole = length == n if index == node.index else self._whole(index, n)
                if not whole:
                    raise _NoFit
        kept = [s for s in self.spans if s in node.body.free_symbols]
        operands = [self.operands[op.name] for op in self.nest.operands]
        found = _dot(plan, operands, self.dtype, self.precision, minor=self.minor)
        return self._placed(found, kept)
