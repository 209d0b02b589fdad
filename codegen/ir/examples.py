"""Small nests built by hand, for the doctests of the stages after the IR.

>>> print(matmul())
C[i, j] := A[i, k]*B[k, j]
"""

from __future__ import annotations

from sympy import exp

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


def gaussian() -> LoopNest:
    """`Y[i] := exp(-((X[i,0]-Z[j,0])^2 + (X[i,1]-Z[j,1])^2)) * B[j]`: a Gaussian kernel in
    two dimensions, its coordinates spelled out."""
    i, j = index_symbol("i"), index_symbol("j")
    x, z, b = tensor_base("X"), tensor_base("Z"), tensor_base("B")
    distance = (x[i, 0] - z[j, 0]) ** 2 + (x[i, 1] - z[j, 1]) ** 2
    return LoopNest(
        "Y",
        (Range(i, 0, extent_symbol("X", 0)),),
        (Term(exp(-distance) * b[j], (Range(j, 0, extent_symbol("Z", 0)),)),),
        (Operand("X", 2), Operand("Z", 2), Operand("B", 1)),
    )


def softmax_program() -> tuple[LoopNest, ...]:
    """Softmax over the rows of `X` as a program's stored nests: `(max) M[i] := X[i,j]`,
    `Z[i] := exp(X[i,j] - M[i])`, `P[i,j] := exp(X[i,j] - M[i]) / Z[i]`."""
    i, j = index_symbol("i"), index_symbol("j")
    x, m, z = tensor_base("X"), tensor_base("M"), tensor_base("Z")
    rows, cols = Range(i, 0, extent_symbol("X", 0)), Range(j, 0, extent_symbol("X", 1))
    e = exp(x[i, j] - m[i])
    return (
        LoopNest("M", (rows,), (Term(x[i, j], (cols,)),), (Operand("X", 2),), "max"),
        LoopNest("Z", (rows,), (Term(e, (cols,)),), (Operand("X", 2), Operand("M", 1))),
        LoopNest(
            "P",
            (rows, cols),
            (Term(e / z[i]),),
            (Operand("X", 2), Operand("M", 1), Operand("Z", 1)),
        ),
    )
