"""A fused program as one differentiable function: each input's gradient is one nest.

Differentiated statement by statement (JAX's chaining of the statements' primitives), an
input read by several statements gets one gradient nest per statement, each recomputing what
they share: attention's Q is read by the logsumexp L and by the weighted sum O, and both of
its gradient nests recompute the scores and the weights `exp(S - L)`. Here the fused
program's statements run under one `jax.custom_jvp` whose tangent is a linear primitive
(`tensordsl.binding.program_jvp`), evaluated forwards as the nests' tangent nests and
transposed into this backward:

* forward: the stored statements in order (`codegen.passes.fusion`), every value kept;
* backward: the stored statements in reverse; the cotangent of a stored intermediate is the
  sum of what its readers give it (attention's `dL` plus `-rowsum(dO * O)` from O; one
  nest for all the readers where it is an array several statements read, `_folded`); the
  gradient nests of each program input, one per statement that reads it, are added into ONE
  nest (`merge_gradients`: their terms over the same loops merge into one term, so the
  scores and weights are computed once, `dS = P * (dP + dL)` in FlashAttention's words) and
  run once;
* an input a statement reads only as `x[i] - A[i]` (or `x[i] + A[i]`) with a stored
  intermediate `A` that statement alone reads (Sinkhorn's marginals) takes `A`'s gradient
  from it, negated (or as is), instead of a gradient nest of its own (`codegen.passes.mirror`);
* an input read beside a stored intermediate in every statement that reads it, only in
  `s_ + c * R` (a relative-bias table `s_[b,h,i,j] + R[h, i - j + T - 1]`, ALiBi's slopes
  with c = j - i) gets that intermediate's cotangent times c summed onto its elements
  (`tensordsl.binding.through`);
* a stored intermediate read with some of the indices of an input, only in a fixed
  combination with it (`-A[i] - C[i,j]/eps`), gets its gradient as the input's part summed
  (`codegen.passes.spread`): the statement's weights are computed in one gradient nest;
* a statistic no output depends on (a max subtracted for stability, `exp(X - M)` divided by
  its sum: `codegen.passes.invariance`) gets no cotangent: none of its gradient nests run.

Every nest still runs through the primitive (`jax_bind.call_nest`), so the backward is itself
differentiable (second order), batchable and jittable.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import sympy
from jax.custom_derivatives import SymbolicZero

from codegen import config
from codegen.ir.affine import holds_everywhere
from codegen.ir.extents import extent_values
from codegen.ir.nest import LoopNest, Operand, rename
from codegen.ir.reductions import POSITION_DTYPE, REDUCTIONS
from codegen.passes import grad, gradient_rules
from codegen.passes.factor import factor_sums
from codegen.passes.guards import bound_guards
from codegen.passes.invariance import shift_invariant
from codegen.passes.mirror import mirror_sign
from codegen.passes.online import centred, pair_stored
from codegen.passes.packing import folded_extents
from codegen.passes.partials import row_partials
from codegen.passes.reuse import read_stored
from codegen.passes.row_passes import row_passes
from codegen.recursion import deeply
from tensordsl.backends.table import BACKENDS
from tensordsl.binding import grouped, program_jvp, summed, through
from tensordsl.binding import one_pass as online
from tensordsl.binding.cotangents import StoredNames, Sums, with_cotangents
from tensordsl.binding.primitive import call_nest, is_differentiable, output_dtype
from tensordsl.errors import user_facing


def _dtype(operands: Sequence[Any]) -> Any:
    dtype = jnp.result_type(*operands) if operands else jnp.result_type(float)
    return dtype if jnp.issubdtype(dtype, jnp.inexact) else jnp.result_type(float)


def _shapes(values: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(np.shape(v)) for name, v in values.items()}


@dataclasses.dataclass(frozen=True)
class _Part:
    """One statement's gradient nest of an input, with its operands' values by name."""

    nest: LoopNest
    values: dict[str, Any]
    shapes: dict[str, tuple[int, ...]]  # of every tensor the nest's extents may name


def merge_gradients(nests: Sequence[LoopNest]) -> LoopNest:
    """The gradient nests of one input (one per statement that reads it) as one nest: the
    free indices renamed alike, the operands united by name, terms over the same loops and
    bounds merged (`grad.merge_terms`), then the usual passes."""
    first = nests[0]
    taken = {s for n in nests for s in grad._names_in(n)}  # noqa: SLF001 - one owner of names
    free = [f"{index.name}_" for index in first.free_indices]
    while set(free) & taken:
        free = [f"{name}_" for name in free]
    renamed = [
        rename(n, tensors={}, indices={i.name: f for i, f in zip(n.free_indices, free)})
        for n in nests
    ]
    operands: dict[str, Operand] = {}
    for nest in renamed:
        for op in nest.operands:
            operands.setdefault(op.name, op)
    terms = grad.merge_terms(tuple(t for nest in renamed for t in nest.terms))
    merged = dataclasses.replace(renamed[0], terms=terms, operands=tuple(operands.values()))
    return factor_sums(bound_guards(merged))


def _tangent(output: Any, tangent: Any, perturbed: bool) -> Any:
    """An output's tangent: float0 zeros for a position (argmax, argtopk: JAX's tangent type
    of an integer), zeros where no input is perturbed."""
    if not is_differentiable(jnp.result_type(output)):
        return np.zeros(np.shape(output), jax.dtypes.float0)
    return tangent if perturbed else jnp.zeros_like(output)


def _folded(parts: list[_Part]) -> list[_Part]:
    """The parts with their max and min of extents evaluated for the call's shapes, and the
    constraints that then hold on the whole of their free ranges dropped: two readers'
    bounds that differ as written (`Min(v_.shape[1], ...)` against `ds_.shape[3]`) and agree
    for these shapes then merge into one term (`merge_gradients`)."""
    found = []
    for part in parts:
        extents = {s: sympy.Integer(v) for s, v in extent_values(part.nest, part.shapes).items()}
        nest = folded_extents(part.nest, extents)
        box = {}
        for r in nest.free:
            lo, hi = (sympy.sympify(x).xreplace(extents) for x in (r.start, r.stop))
            if lo.is_Integer and hi.is_Integer:
                box[r.index] = (int(lo), int(hi) - 1)
        terms = tuple(
            dataclasses.replace(
                t,
                constraints=tuple(
                    c for c in t.constraints if not holds_everywhere(c.xreplace(extents), box)
                ),
            )
            for t in nest.terms
        )
        found.append(dataclasses.replace(part, nest=dataclasses.replace(nest, terms=terms)))
    return found


class FusedProgram:
    """The stored statements of a fused program, callable and differentiable as one."""

    def __init__(
        self,
        stored: tuple[LoopNest, ...],
        inputs: tuple[str, ...],
        outputs: tuple[str, ...],
        backend: str,
        nograd: frozenset[str],
        precision: Any = None,
        shapes: Mapping[str, Sequence[int]] | None = None,
    ) -> None:
        self.stored, self.inputs, self.outputs = stored, inputs, outputs
        self.stored_names = StoredNames.of(stored)
        # forward: a logsumexp and its weighted sum in one pass, where their loops are the
        # same for these shapes (the tensors' shapes of the call it was fused for)
        self.runs = pair_stored(stored, shapes)
        # forward alone (not differentiated): row statistics as passes over their reader's
        # rows, one kernel, where the back end has a strategy for them
        self.forward, self.row_passes = self.runs, tuple[str, ...]()
        record = BACKENDS.get(backend)
        if shapes is not None and config.fuse_programs() and getattr(record, "row_passes", 0):
            self.forward, self.row_passes = row_passes(self.runs, outputs=outputs, shapes=shapes)
        # A max subtracted for stability and divided out again: its gradient is exactly zero.
        self.zero_gradient = shift_invariant(stored, outputs=outputs)
        self.backend, self.nograd, self.precision = backend, nograd, precision
        self.call = jax.custom_jvp(deeply(self.run))
        # Symbolic zeros: the rule knows which inputs are differentiated, and the backward
        # runs nothing for the others (nor for outputs whose cotangents are zero).
        self.call.defjvp(deeply(self._jvp), symbolic_zeros=True)

    # -- forward -------------------------------------------------------------------------

    def _values(self, args: Sequence[Any], runs: Sequence[LoopNest] = ()) -> dict[str, Any]:
        values = dict(zip(self.inputs, args))
        for nest in runs or self.runs:
            operands = [values[name] for name in nest.operand_names]
            found = call_nest(
                nest,
                operands,
                backend=self.backend,
                precision=self.precision,
                shapes={},
                out_dtype=output_dtype(nest, operands),
                nograd=self.nograd & set(nest.operand_names),
            )
            if nest.online:
                values[nest.output], values[nest.online] = online.unpack(found)
            else:
                values[nest.output] = found
        return values

    def run(self, *args: Any) -> tuple[Any, ...]:
        """The forward (`self.forward`: its row statistics computed inside their readers)."""
        values = self._values(args, self.forward)
        return tuple(values[name] for name in self.outputs)

    def _jvp(self, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple:
        """The outputs, and their tangents as one linear primitive whose transpose is the
        fused backward (`tensordsl.binding.program_jvp`)."""
        values = self._values(primals)
        outputs = tuple(values[name] for name in self.outputs)
        slopes = {
            name: t
            for name, value, t in zip(self.inputs, primals, tangents)
            if not isinstance(t, SymbolicZero)
            and name not in self.nograd
            and is_differentiable(jnp.result_type(value))
        }
        found = program_jvp.bind(self, values, slopes) if slopes else outputs
        return outputs, tuple(_tangent(out, t, bool(slopes)) for out, t in zip(outputs, found))

    def tangents(self, values: Mapping[str, Any], slopes: Mapping[str, Any]) -> tuple:
        """The outputs' tangents for the tangents `slopes` of some inputs: the forward's
        nests differentiated forwards one by one (each its tangent nest)."""

        def forward(*moved: Any) -> tuple[Any, ...]:
            args = {name: values[name] for name in self.inputs}
            args.update(zip(slopes, moved))
            found = self._values([args[name] for name in self.inputs])  # nest by nest
            return tuple(found[name] for name in self.outputs)

        outputs, found = jax.jvp(forward, [values[n] for n in slopes], list(slopes.values()))
        # a position's tangent (float0) as zeros of its own type, as program_tangent_p's
        # abstract evaluation gives it (`_jvp` hands JAX float0 for it)
        return tuple(
            t if is_differentiable(o.dtype) else jnp.zeros(o.shape, o.dtype)
            for o, t in zip(outputs, found)
        )

    # -- backward ------------------------------------------------------------------------

    def gradients(
        self, values: Mapping[str, Any], perturbed: Sequence[str], cotangents: Sequence[Any]
    ) -> list[Any]:
        """The gradients of the `perturbed` inputs, in that order, for the outputs'
        `cotangents` (None for a zero one): the stored statements in reverse, each input's
        gradient nests merged into one nest and run once."""
        stored_names, readers = self.stored_names.outputs, self.stored_names.readers
        given = {n: ct for n, ct in zip(self.outputs, cotangents) if ct is not None}
        cotangent = Sums(given.items())
        needed = with_cotangents(self.stored, frozenset(perturbed))
        parts: dict[str, list[_Part]] = {}
        # A stored intermediate several statements read (attention's stored scores, read by
        # the logsumexp and the weighted sum) gets its gradient nests merged into one, run
        # once its last reader is done: each pair's weight is computed once, not per reader.
        pending: dict[str, list[_Part]] = {}
        # An input that mirrors a stored intermediate of the same statement (`la[i] - A[i]`)
        # gets that intermediate's gradient, negated where a difference, not a nest of its own;
        # an input's part that gives an intermediate's gradient summed is added here too.
        mirrored = Sums()
        # An input read beside a stored intermediate in all its readers: the intermediate's
        # cotangent summed onto the input's elements (`tensordsl.binding.through`).
        onto: dict[str, dict[str, Any]] = {}
        wanted = needed.difference(self.nograd, self.zero_gradient)
        for nest in reversed(self.stored):
            if nest.output in pending:
                name = nest.output
                found = self._call(*self._merged(_folded(pending.pop(name)), values[name]))
                cotangent.add(name, found)
                if name in onto:  # `R[h, i - j + 7]` beside it, rows centred in a softmax
                    ways = onto.pop(name)
                    rows = through.softmax(name, self.stored, self.outputs, given, ways.values())
                    for wrt, how in ways.items():
                        part = through.gradient(wrt, name, how, found, values, self._call, rows)
                        mirrored.add(wrt, part)
            dy = cotangent.get(nest.output)
            if dy is None:
                continue
            by_role = self._roles(nest, values, dy)
            here: dict[str, tuple] = {}  # the stored intermediates' gradients of this nest
            partners: dict[str, list[tuple[str, int]]] = {}  # intermediate: (input, sign)
            lse, differentiated = self._centred(nest, values)
            if lse:  # the centred sum's own value: 0, NaN where O is not finite
                by_role = {**by_role, gradient_rules.OUTPUT: values[nest.output] * 0}
            # an intermediate's gradient as an input's part summed (`-A[i] - C[i,j]/eps`)
            sums = None if lse else summed.find(nest, values, stored_names, readers, wanted)
            direct: dict[str, Any] = {}
            for op in nest.operands:
                value = values[op.name]
                if op.name not in needed or op.name in self.nograd or op.name == lse:
                    continue
                if op.name in self.zero_gradient:
                    continue
                if not is_differentiable(jnp.result_type(value)):
                    continue
                if sums is not None and op.name == sums[1]:
                    continue  # from the input's part, below
                if (beside := through.find(nest, op.name, self.stored, values, wanted)) is not None:
                    onto.setdefault(beside[0], {})[op.name] = beside[1]
                    continue  # from the intermediate's cotangent, above
                mirror = self._mirror(nest, op.name, values, needed)
                if mirror is not None and (sums is None or op.name != sums[0]):
                    partners.setdefault(mirror[0], []).append((op.name, mirror[1]))
                    continue
                part = self._part(differentiated, op.name, values, by_role)
                if sums is not None and op.name == sums[0]:
                    found = self._call(*self._merged(_folded([part]), value))
                    direct[sums[1]] = summed.partner_gradient(found, sums, values, self._call)
                    mirrored.add(op.name, found)
                elif op.name in stored_names and readers[op.name] > 1:
                    pending.setdefault(op.name, []).append(part)
                elif op.name in stored_names:
                    here[op.name] = self._merged([part], value)
                else:
                    parts.setdefault(op.name, []).append(part)
            together = grouped.run_together(here, self.backend, self.precision, call_nest)
            for name, item in here.items():
                direct[name] = together[name] if name in together else self._call(*item)
            for name, found in direct.items():
                cotangent.add(name, found)
                for wrt, sign in partners.get(name, ()):
                    mine = (found if sign > 0 else -found).astype(jnp.result_type(values[wrt]))
                    mirrored.add(wrt, mine)
        merged = {name: self._merged(parts[name], values[name]) for name in parts}
        together = grouped.run_together(merged, self.backend, self.precision, call_nest)
        for name in merged:  # a gradient alone: by rows where that splits it
            if name not in together and (found := self._by_rows(*merged[name])) is not None:
                together[name] = found
        found = Sums(  # in the order of `perturbed`, as the nests run
            (name, together[name] if name in together else self._call(*merged[name]))
            for name in perturbed
            if name in merged
        )
        for name, value in mirrored.items():
            found.add(name, value)
        return [
            found[name] if name in found else jnp.zeros_like(values[name]) for name in perturbed
        ]

    def _mirror(
        self,
        nest: LoopNest,
        wrt: str,
        values: Mapping[str, Any],
        needed: set[str],
    ) -> tuple[str, int] | None:
        """(a stored intermediate of `nest` that `wrt`, a program input, mirrors, the sign of
        its gradient in `wrt`'s: `codegen.passes.mirror`), or None: the intermediate must get
        its gradient from `nest` alone, run here (this statement its one reader), of `wrt`'s
        shape."""
        if wrt in self.stored_names.outputs:
            return None
        for op in nest.operands:
            name = op.name
            if (
                name in self.stored_names.outputs
                and self.stored_names.readers[name] == 1
                and name in needed
                and name not in self.nograd
                and name not in self.zero_gradient
                and np.shape(values[name]) == np.shape(values[wrt])
                and is_differentiable(jnp.result_type(values[name]))
                and (sign := mirror_sign(nest, wrt, name)) is not None
            ):
                return name, sign
        return None

    def _centred(self, nest: LoopNest, values: Mapping[str, Any]) -> tuple[str, LoopNest]:
        """In float64, a softmax-weighted sum of a stored logsumexp as the nest to
        differentiate, `sum_j exp(X - L) * (W - O)` (`codegen.passes.online.centred`), and
        the logsumexp's name (it then gets no cotangent from the sum): exact where one key
        takes a row's whole weight (docs/nn.md, "Scores beyond float precision"). Float32 and
        narrower keep FlashAttention's `dP - D`, one subtraction per score and head element
        fewer; else ("", nest)."""
        if jnp.result_type(values[nest.output]) != jnp.float64:
            return "", nest
        shapes = _shapes(values)
        for lse in self.stored:
            if lse.reduction == "logsumexp" and lse.output in nest.operand_names:
                found = centred(lse, nest, shapes)
                if found is not None:
                    return lse.output, found
        return "", nest

    def _roles(self, nest: LoopNest, values: Mapping[str, Any], dy: Any) -> dict[str, Any]:
        """The values a gradient nest of `nest` reads by role: cotangent, output, saved
        auxiliary results (the argmax of a max, ...), computed again here."""
        operands = [values[name] for name in nest.operand_names]
        by_role = {gradient_rules.COTANGENT: dy, gradient_rules.OUTPUT: values[nest.output]}
        for role, aux in gradient_rules.auxiliary_nests(nest).items():
            positional = REDUCTIONS[aux.reduction].positional
            by_role[role] = call_nest(
                aux,
                operands,
                backend=self.backend,
                precision=self.precision,
                shapes={},
                out_dtype=POSITION_DTYPE if positional else _dtype(operands),
            )
        return by_role

    def _part(
        self, nest: LoopNest, wrt: str, values: Mapping[str, Any], by_role: Mapping[str, Any]
    ) -> _Part:
        with user_facing():
            gradient = grad.gradient(nest, wrt)
        named = {
            name: values[name] if role == "input" else by_role[role]
            for name, role in gradient.roles
        }
        # What the program stores is read, not recomputed (softmax's exp(X - M) as P * Z).
        foreign = frozenset(
            n for n, role in gradient.roles if role not in ("input", gradient_rules.OUTPUT)
        )
        found = read_stored(gradient.nest, self.stored, foreign=foreign | {gradient.nest.output})
        named.update({name: values[name] for name in found.operand_names if name not in named})
        shapes = {**_shapes(values), **_shapes(named)}
        shapes[found.output] = tuple(np.shape(values[wrt]))
        return _Part(found, named, shapes)

    def _merged(self, parts: Sequence[_Part], like: Any) -> tuple:
        """The parts merged into one nest, with its operands' values and the shapes of the
        tensors it names, and `like` (an array of the gradient's shape and dtype)."""
        nest = parts[0].nest if len(parts) == 1 else merge_gradients([p.nest for p in parts])
        values: dict[str, Any] = {}
        shapes: dict[str, tuple[int, ...]] = {}
        for part in parts:
            values.update(part.values)
            shapes.update(part.shapes)
        shapes[nest.output] = tuple(np.shape(like))
        return nest, values, shapes, like

    def _by_rows(self, nest: LoopNest, values: dict, shapes: dict, like: Any) -> Any:
        """A gradient of few elements, each a sum over many rows of pairs (a score
        modifier's slopes), as per-row partial sums summed here in a fixed order
        (`codegen.passes.partials`); None where it does not split."""
        rows = row_partials(nest, shapes)
        if rows is None:
            return None
        partial = self._call(rows.nest, values, shapes, like)
        return jnp.sum(partial, axis=rows.summed, dtype=jnp.result_type(like))

    def _call(self, nest: LoopNest, values: dict, shapes: dict, like: Any) -> Any:
        operands = [values[name] for name in nest.operand_names]
        integer = frozenset(
            name for name, v in values.items() if not is_differentiable(jnp.result_type(v))
        )
        return call_nest(
            nest,
            operands,
            backend=self.backend,
            precision=self.precision,
            shapes=shapes,
            out_dtype=jnp.result_type(like),
            nograd=integer & set(nest.operand_names),
        )
