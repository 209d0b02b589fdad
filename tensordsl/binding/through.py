"""An input's gradient as a stored intermediate's cotangent summed onto its elements
(`codegen.passes.mirror.summed_through`).

A relative-bias table read beside the stored scores in every statement that reads them
(`s_[b,h,i,j] + R[h, i - j + T - 1]` in the logsumexp and in the weighted sum) has as
gradient the scores' cotangent `dS`, summed onto the table's elements: `dR[h, p] = sum_b,j
dS[b, h, j + p - T + 1, j]`. The backward computes `dS` anyway (one nest for all the
scores' readers, `tensordsl.binding.program_grad`), so the table's gradient is a pass over
it, not a gradient nest that recomputes every score, weight and `dO . v` once more. Every
element of the table's gradient is written once, by the thread of its element (no atomics).
ALiBi's learnt slopes (`s_[b,h,i,j] + A[h] * (j - i)`) likewise: `dA[h] = sum dS * (j - i)`,
as per-row partial sums summed by XLA (`codegen.passes.partials`).

With `TENSORDSL_CENTRED_ROWS=1`, where the scores feed only a softmax and the factor is
not a constant (ALiBi's `j - i`), the cotangent read is `dS - P * rho`, `rho` the rows' sums
of `dS` less the logsumexp's own cotangent, exactly 0 but for float32's rounding of the
logsumexp, which the factor would multiply by up to T (`codegen.passes.centring`): the
weights `P` are recomputed in the same pass, within the mask's bounds, and `rho` is one more
pass over `dS`. Not the default: measured slower on the backward (benchmarks/RESULTS.md,
"alibi").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from typing import Any

import jax.numpy as jnp
import numpy as np
import sympy

from codegen import config
from codegen.ir.nest import (
    LoopNest,
    Operand,
    Range,
    Term,
    extent_symbol,
    index_symbol,
    tensor_base,
)
from codegen.passes import grad, gradient_rules
from codegen.passes.centring import SoftmaxRows, softmax_rows
from codegen.passes.mirror import Through, summed_through, through_nest
from codegen.passes.partials import row_partials
from tensordsl.binding.primitive import is_differentiable


def find(
    nest: LoopNest,
    wrt: str,
    stored: Sequence[LoopNest],
    values: Mapping[str, Any],
    wanted: Set[str],
) -> tuple[str, Through] | None:
    """(a stored intermediate that `nest` reads and several stored statements read, each
    only beside `wrt` as `summed_through` says, how), or None. Both differentiable and
    `wanted` (their gradients needed), `wrt` an input; then every reader's part of `wrt`'s
    gradient is in the intermediate's cotangent, and none is run on its own."""
    outputs = {each.output for each in stored}
    if wrt in outputs or not _wanted(wrt, values, wanted):
        return None
    for name in sorted(nest.operand_names):
        readers = [each for each in stored if name in each.operand_names]
        if name not in outputs or len(readers) < 2 or not _wanted(name, values, wanted):
            continue
        through = summed_through(readers, wrt, name)
        if through is not None:
            return name, through
    return None


def _wanted(name: str, values: Mapping[str, Any], wanted: Set[str]) -> bool:
    return name in wanted and is_differentiable(jnp.result_type(values[name]))


def softmax(
    partner: str,
    stored: Sequence[LoopNest],
    outputs: Sequence[str],
    given: Mapping[str, Any],
    ways: Iterable[Through],
) -> tuple[SoftmaxRows, Any] | None:
    """(how the stored intermediate `partner` feeds a softmax, the logsumexp's cotangent
    given from outside, None where it is an output given none), or None
    (`codegen.passes.centring`); None too where no input read beside it (`ways`) has a
    factor that varies (nothing to centre, nothing to prove), and unless
    `TENSORDSL_CENTRED_ROWS` asks for it (`codegen.config.centred_rows`: a slower
    backward)."""
    if not config.centred_rows() or not any(_varies(way) for way in ways):
        return None
    readers = [each for each in stored if partner in each.operand_names]
    rows = softmax_rows(readers, partner, stored=stored, outputs=outputs)
    return None if rows is None else (rows, given.get(rows.lse))


def gradient(
    wrt: str,
    partner: str,
    through: Through,
    cotangent: Any,
    values: Mapping[str, Any],
    call: Callable[..., Any],
    centring: tuple[SoftmaxRows, Any] | None = None,
) -> Any:
    """`wrt`'s gradient from the intermediate `partner`'s `cotangent`: the gradient nest of
    `through_nest` (a sum over the intermediate's axes that `wrt`'s element does not fix),
    run by `call(nest, values, shapes, like)`; the cotangent's rows made to sum to what
    they must (`_centred`) where `centring` (from `softmax`) says how the intermediate
    feeds a softmax and the factor is not a constant."""
    like = values[wrt]
    nest = through_nest(partner, np.ndim(values[partner]), wrt, np.ndim(like), through)
    found = grad.gradient(nest, wrt)
    named = {
        name: cotangent if role == gradient_rules.COTANGENT else values[name]
        for name, role in found.roles
    }
    if centring is not None and _varies(through):
        (read,) = (name for name, role in found.roles if role == gradient_rules.COTANGENT)
        found = dataclasses.replace(found, nest=_centred(found.nest, read, centring[0]))
        named[_ROWS] = _row_sums(cotangent, *centring, call)
        named.update({name: values[name] for name in found.nest.operand_names if name not in named})
    shapes = {name: tuple(np.shape(v)) for name, v in (*values.items(), *named.items())}
    shapes[found.nest.output] = tuple(np.shape(like))
    # A few elements, each a sum over every pair (ALiBi's slopes): per-row partial sums,
    # summed by XLA in a fixed order, in parallel and rounded as jax.numpy's sum.
    rows = row_partials(found.nest, shapes)
    if rows is None:
        return call(found.nest, named, shapes, like)
    partial = call(rows.nest, named, shapes, like)
    return jnp.sum(partial, axis=rows.summed, dtype=jnp.result_type(like))


def _varies(way: Through) -> bool:
    """Whether the factor is not a constant (ALiBi's `j - i`): one that a row's error in
    the cotangent would be multiplied by, up to T."""
    return bool(sympy.sympify(way.factor).free_symbols)


#: The operand of a centred gradient nest holding `rho`, the rows' sums to take out.
_ROWS = "rho_rows_"


def _row_sums(cotangent: Any, rows: SoftmaxRows, given: Any, call: Callable[..., Any]) -> Any:
    """`rho`: the cotangent summed over the axes that are not the rows, within the mask's
    bounds, in the logsumexp's order, less the logsumexp's own cotangent (exactly 0 in exact
    arithmetic). A nest, run by `call`, over the kept scores alone (the mask's bounds);
    XLA's sum of the whole array was no faster (benchmarks/RESULTS.md, "alibi")."""
    read = "ct_"
    axes = tuple(index_symbol(f"x{n}_") for n in range(np.ndim(cotangent)))
    ranges = {n: Range(x, 0, extent_symbol(read, n)) for n, x in enumerate(axes)}
    free = tuple(ranges[n] for n in rows.rows)
    reduced = tuple(ranges[n] for n in range(len(axes)) if n not in rows.rows)
    term = Term(tensor_base(read)[axes], reduced, rows.constraints)
    nest = LoopNest(_ROWS, free, (term,), (Operand(read, len(axes)),))
    shape = tuple(np.shape(cotangent)[n] for n in rows.rows)
    like = jnp.zeros((), jnp.result_type(cotangent))
    found = call(nest, {read: cotangent}, {read: np.shape(cotangent), _ROWS: shape}, like)
    return found if given is None else found - given


def _centred(nest: LoopNest, read: str, rows: SoftmaxRows) -> LoopNest:
    """The gradient nest with its cotangent `read` taken as `read - P * rho` (module
    docstring), each term kept within the mask's bounds (where `read` is 0 anyway: every
    reader of the intermediate keeps the same scores)."""
    rho = tensor_base(_ROWS)
    terms = []
    for term in nest.terms:
        (access,) = (a for a in term.body.atoms(sympy.Indexed) if str(a.base) == read)
        axes = {index_symbol(f"x{n}_"): x for n, x in enumerate(access.indices)}
        weight = rows.weight.xreplace(axes)
        row = rho[tuple(access.indices[n] for n in rows.rows)]
        body = term.body.xreplace({access: access - weight * row})
        bounds = tuple(sympy.sympify(c).xreplace(axes) for c in rows.constraints)
        terms.append(dataclasses.replace(term, body=body, constraints=term.constraints + bounds))
    known = {op.name for op in nest.operands}
    added = tuple(
        op for op in (*rows.operands, Operand(_ROWS, len(rows.rows))) if op.name not in known
    )
    return dataclasses.replace(nest, terms=tuple(terms), operands=nest.operands + added)
