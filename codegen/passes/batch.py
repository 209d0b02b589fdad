"""vmap as a rewrite of the nest: batched operands and the output gain a leading free index.

`C[i,j] := A[i,k] * B[k,j]` vmapped over A's axis 0 becomes `C[b,i,j] := A[b,i,k] * B[k,j]`:
one kernel over the whole batch. Its gradient nests come from the rewritten nest, so the
gradient of an unbatched input (`dB[k,j] := dC[b,i,j] * A[b,i,k]`) reduces over the batch
inside the nest.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> nest = lower(parse("C[i,j] := A[i,k] * B[k,j]")).nest
>>> print(batch_nest(nest, frozenset({"A"})))
C[b, i, j] := A[b, i, k]*B[k, j]
"""

from __future__ import annotations

from dataclasses import replace

import sympy

from codegen.ir.nest import (
    LoopNest,
    Operand,
    Range,
    extent_of,
    extent_symbol,
    index_symbol,
    map_expressions,
    scalar_symbol,
    tensor_base,
)


def batch_index_name(nest: LoopNest) -> str:
    """A name for the batch index that no symbol of `nest` uses."""
    taken = {nest.output, *nest.operand_names}
    for expr in nest.expressions():
        taken.update(str(s) for s in expr.free_symbols)
        taken.update(str(b) for b in expr.atoms(sympy.IndexedBase))
    for term in nest.terms:
        taken.update(str(i) for i in term.reduced_indices)
    taken.update(str(i) for i in nest.free_indices)
    name, n = "b", 0
    while name in taken:
        n += 1
        name = f"b{n}"
    return name


def batch_nest(nest: LoopNest, batched: frozenset[str]) -> LoopNest:
    """`nest` with a new outermost free index over the leading axis of each `batched` operand.

    The output always gains the index (a batched function returns one result per batch
    element). Extents of batched tensors shift by one axis; when the nest declares its
    output's shape (gradient nests), the caller prepends the batch size to that shape.
    """
    assert batched and batched <= set(nest.operand_names), (batched, nest.operand_names)
    b = index_symbol(batch_index_name(nest))
    shifted = set(batched)
    if nest.declares_output_shape:
        shifted.add(nest.output)
    extents: dict[sympy.Basic, sympy.Basic] = {}
    for expr in nest.expressions():
        for sym in expr.free_symbols:
            found = extent_of(sym)
            if found is not None and found[0] in shifted:
                extents[sym] = extent_symbol(found[0], found[1] + 1)
    scalars = {
        scalar_symbol(op.name): tensor_base(op.name)[b]
        for op in nest.operands
        if op.is_scalar and op.name in batched
    }

    def is_batched_access(expr: sympy.Basic) -> bool:
        return isinstance(expr, sympy.Indexed) and expr.base.name in batched

    def sub(expr: sympy.Basic) -> sympy.Basic:
        expr = expr.xreplace(extents).replace(
            is_batched_access, lambda a: tensor_base(a.base.name)[(b, *a.indices)]
        )
        return expr.xreplace(scalars)

    first = next(op.name for op in nest.operands if op.name in batched)
    mapped = map_expressions(nest, sub)
    return replace(
        mapped,
        free=(Range(b, 0, extent_symbol(first, 0)), *mapped.free),
        operands=tuple(
            Operand(op.name, op.rank + 1) if op.name in batched else op for op in nest.operands
        ),
    )
