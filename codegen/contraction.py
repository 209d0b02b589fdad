"""Pure contractions: nests that XLA's `dot_general` computes as they are.

A nest is a pure contraction when it sums one product of plain tensor accesses (every axis
indexed by a bare index, no index twice in one access), scalar operands and constants over
ranges that start at 0, with no guard and no constraint on a reduced index. (A gradient nest
may keep a constraint on its free indices that restates an extent the call-time checks
already made equal, such as `k < A.shape[1]` in `dB[k, j]`; `fits` checks it holds
everywhere.) Such a nest is an einsum; on the CPU
and GPU, XLA's dot (Eigen, cuBLAS) beats a generated loop nest for it, so the schedules may
pick the ``"xla"`` strategy and the runner calls `jnp.einsum` instead of a kernel.

>>> from codegen.ir import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir import scalar_symbol, tensor_base
>>> i, j, k = (index_symbol(n) for n in "ijk")
>>> A, B = tensor_base("A"), tensor_base("B")
>>> nest = LoopNest("C", (Range(i, 0, extent_symbol("A", 0)), Range(j, 0, extent_symbol("B", 1))),
...     (Term(2 * scalar_symbol("s") * A[i, k] * B[k, j], (Range(k, 0, extent_symbol("A", 1)),)),),
...     (Operand("s", 0), Operand("A", 2), Operand("B", 2)))
>>> contraction(nest)
Contraction(subscripts='ac,cb->ab', tensors=(1, 2), scalars=(0,), constant=2.0)
"""

from __future__ import annotations

import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.ir import LoopNest, extent_symbol

_LETTERS = string.ascii_lowercase + string.ascii_uppercase


@dataclass(frozen=True)
class Contraction:
    """`constant * prod(scalars) * einsum(subscripts, *tensors)`; operands by position."""

    subscripts: str
    tensors: tuple[int, ...]  # operand positions, one per einsum input (repeats allowed)
    scalars: tuple[int, ...]  # operand positions of scalar factors
    constant: float


def contraction(nest: LoopNest) -> Contraction | None:
    """The nest as an einsum, or None when it is not a pure contraction with a reduced index
    and at least two tensor factors (a dot product, not a mere sum or scaling)."""
    if nest.reduction != "sum" or len(nest.terms) != 1:
        return None
    (term,) = nest.terms
    reduced = set(term.reduced_indices)
    if term.guard != sympy.true or not term.reduced:
        return None
    if any(c.free_symbols & reduced for c in term.constraints):
        return None
    ranges = (*nest.free, *term.reduced)
    if any(r.start != 0 for r in ranges):
        return None
    letters = {r.index: _LETTERS[n] for n, r in enumerate(ranges) if n < len(_LETTERS)}
    if len(letters) != len(ranges):
        return None
    position = {op.name: n for n, op in enumerate(nest.operands)}
    reads: list[tuple[int, str]] = []  # (operand position, einsum subscripts)
    scalars: list[int] = []
    constant = 1.0
    for factor in sympy.Mul.make_args(term.body):
        if factor.is_Number:
            constant *= float(factor)
        elif isinstance(factor, sympy.Symbol) and factor.name in position:
            if not nest.operand(factor.name).is_scalar:
                return None
            scalars.append(position[factor.name])
        elif isinstance(factor, sympy.Indexed) and factor.base.name in position:
            axes = factor.indices
            if not all(a in letters for a in axes) or len(set(axes)) != len(axes):
                return None
            reads.append((position[factor.base.name], "".join(letters[a] for a in axes)))
        else:
            return None
    reads.sort()
    tensors, inputs = [p for p, _ in reads], [s for _, s in reads]
    used = set("".join(inputs))
    if len(tensors) < 2 or any(letters[r.index] not in used for r in ranges):
        return None
    output = "".join(letters[r.index] for r in nest.free)
    return Contraction(f"{','.join(inputs)}->{output}", tuple(tensors), tuple(scalars), constant)


def fits(nest: LoopNest, shapes: Mapping[str, Sequence[int]]) -> bool:
    """Whether, for these shapes, every index runs over exactly the extent of every axis it
    indexes, so that the einsum computes the nest (checked once per trace)."""
    values = {
        extent_symbol(name, axis): n
        for name, shape in shapes.items()
        for axis, n in enumerate(shape)
    }
    (term,) = nest.terms
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
