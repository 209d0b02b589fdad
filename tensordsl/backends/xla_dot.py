"""The ``"xla"`` strategy: a nest run as XLA's dots and fused elementwise work, no kernel.

`codegen.ir.contraction.xla_plan` decides which nests qualify (pure contractions, a contraction
plus a bias, a where() over a summed contraction, elementwise terms of nested contractions);
the schedules pick the strategy; the CPU and GPU runners call `run_xla` for it. A pure
contraction term is one einsum; any other term is evaluated over the output's indices
by the reference back end's evaluator, with each nested contraction an einsum placed on the
grid and each plain access a transposed view, so XLA fuses the elementwise work around its
dots. Nothing larger than the output is materialised. A two-operand einsum is emitted as the
`lax.dot_general` that `jnp.einsum` would emit (`tensordsl.backends.einsum_dot`), without
its path search and inner trace.

On the CPU (`minor_contraction=True`), a dot whose operands both contract an axis that is not
their last (`dK[h,j,d] = sum_i dS[h,i,j]*Q[h,i,d]`, a transposed matrix times a matrix) is
given to XLA with one operand transposed into a copy first (`cpu_dot_form`): XLA's CPU dot
runs its fast library kernel only where the left operand contracts its minor axes and the
result needs no transposition, and folds any transposition it sees into the dot, so the copy is
made behind an optimisation barrier. jnp's own einsum runs such a dot in the slow form.
Before that, free axes that stay together (a projection's `b,t` and `s,h,e`) are merged into
one by reshapes (`tensordsl.backends.cpu_dots.merged_dot`), where XLA would otherwise copy an
operand to merge them.

The dots run at the kernel's `precision=`: by default jnp's (`precision=None`, so
`jax.default_matmul_precision` applies: TF32 on an NVIDIA GPU, exact float32 on the CPU), as
the same einsum written in jnp would. Sums that are not contractions stay exact.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import sympy

from codegen.ir.contraction import Contraction, XlaPlan, fits, xla_plan
from codegen.ir.extents import evaluate_int, extent_values, output_shape
from codegen.ir.nest import LoopNest, Reduce
from tensordsl.backends.cpu_dots import cpu_dot_form, merged_dot
from tensordsl.backends.einsum_dot import einsum_dot
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
    dot runs fast (axes that stay together merged, `merged_dot`; `cpu_dot_form`);
    half-precision products accumulate in float32. A sum over no points is 0 whatever the
    scalar factors (as in the kernels: an infinite scale times an empty sum is not NaN)."""
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

    def einsum(subscripts: str, tensors: list[jax.Array]) -> jax.Array:
        if minor and len(tensors) == 2:
            shapes = zip(subscripts.split("->")[0].split(","), map(jnp.shape, tensors))
            sizes = {letter: n for letters, shape in shapes for letter, n in zip(letters, shape)}
            subscripts, tensors = _cpu_arranged(subscripts, tensors, sizes, len(plan.tensors))
        return einsum_dot(subscripts, tensors, precision=precision, preferred_element_type=wide)

    merged = merged_dot(plan.subscripts, tensors, einsum) if minor else None
    result = (einsum(plan.subscripts, tensors) if merged is None else merged).astype(work)
    for p in plan.scalars:
        result = result * jnp.asarray(operands[p], work)
    if plan.constant != 1.0:
        result = result * plan.constant
    return result


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
