"""Small nests built by hand, for the doctests of the stages after the IR.

>>> print(matmul())
C[i, j] := A[i, k]*B[k, j]
"""

from __future__ import annotations

from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol, tensor_base


def matmul() -> LoopNest:
    """`C[i,j] := A[i,k] * B[k,j]`, every range from its tensor's extent."""
    i, j, k = (index_symbol(n) for n in "ijk")
    a, b = tensor_base("A"), tensor_base("B")
    return LoopNest(
        "C",
        (Range(i, 0, extent_symbol("A", 0)), Range(j, 0, extent_symbol("B", 1))),
        (Term(a[i, k] * b[k, j], (Range(k, 0, extent_symbol("A", 1)),)),),
        (Operand("A", 2), Operand("B", 2)),
    )
