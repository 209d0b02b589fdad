"""Tullio.jl's test/einsum.jl (Einsum.jl's tests run through Tullio), translated (see
harness.py for the conventions)."""

from __future__ import annotations

import numpy as np

from tests.tullio.harness import Skip, randn, shape, value

X52, Y62, Z72 = randn(5, 2), randn(6, 2), randn(7, 2)
X10, Y10 = randn(10), randn(10)
A55 = np.arange(1.0, 26.0).reshape(5, 5).T  # Julia's column-major reshape(1:25, 5, 5)
A102 = randn(10, 2)
X23, C5 = randn(2, 3), randn(5)
CP = np.einsum("ir,jr,kr->ijk", X52, Y62, Z72)

CASES = [
    value(
        "not_overwritten",
        "x[i] := y[i]; the caller's i is unchanged",
        "x[i] := y[i]",
        {"y": Y10},
        Y10,
    ),
    shape(
        "replaced",
        "B[i, j] := A[i, j]; size(B) == size(A)",
        "B[i,j] := A[i,j]",
        {"A": randn(5, 10)},
        (5, 10),
    ),
    value(
        "cp_decomposition",
        "A2[i, j, k] := X[i, r] * Y[j, r] * Z[k, r]",
        "A2[i,j,k] := X[i,r] * Y[j,r] * Z[k,r]",
        {"X": X52, "Y": Y62, "Z": Z72},
        CP,
    ),
    value("issue_21", "z := x[i] * y[i]", "z := x[i] * y[i]", {"x": X10, "y": Y10}, X10 @ Y10),
    value("issue_20", "y[i] := x[i, s]", "y[i] := x[i,s]", {"x": X23}, X23.sum(1)),
    value(
        "no_lhs_indices", "k := x[i] * y[i]", "k := x[i] * y[i]", {"x": X10, "y": Y10}, X10 @ Y10
    ),
    value(
        "elementwise", "k[i] := x[i] * y[i]", "k[i] := x[i] * y[i]", {"x": X10, "y": Y10}, X10 * Y10
    ),
    value("mapping", "B[i, j] := exp(A[i, j])", "B[i,j] := exp(A[i,j])", {"A": A102}, np.exp(A102)),
    value(
        "numpy_diagonal",
        "B[i] := A[i, i]; [1, 7, 13, 19, 25]",
        "B[i] := A[i,i]",
        {"A": A55},
        np.array([1.0, 7, 13, 19, 25]),
    ),
    value(
        "offset",
        "A[i] := X[i + 5]; size (5,) (test_broken in Tullio)",
        "A[i] := X[i + 5]",
        {"X": X10},
        X10,
    ),
    value(
        "symbolic_offset",
        "A[i] := X[i + $offset]  (offset = 5)",
        "A[i] := X[i + 5]",
        {"X": X10},
        X10,
    ),
    value("add_scalar", "A[i] := X[i] + k", "A[i] := X[i] + k", {"X": X10, "k": 5.0}, X10 + 5),
    value("sub_scalar", "B[i] := X[i] - k", "B[i] := X[i] - k", {"X": X10, "k": 5.0}, X10 - 5),
    value("mul_scalar", "A[i] := X[i] * k", "A[i] := X[i] * k", {"X": X10, "k": 5.0}, X10 * 5),
    value("div_scalar", "B[i] := X[i] / k", "B[i] := X[i] / k", {"X": X10, "k": 5.0}, X10 / 5),
    value(
        "constant_interpolated",
        "B[i] := A[i, $j]  (j = 2)",
        "B[i] := A[i, 1]",
        {"A": A102},
        A102[:, 1],
    ),
    value("constant", "C[i] := A[i, 1]", "C[i] := A[i, 0]", {"A": A102}, A102[:, 0]),
    value(
        "integer_input",
        "A1[i, j] := B1[i] * C[j]  (B1 Int); eltype Float64",
        "A1[i,j] := B1[i] * C[j]",
        {"B1": np.ones(5, np.int32), "C": C5},
        np.outer(np.ones(5), C5),
    ),
    value(
        "float32_input",
        "A2[i, j] := B2[i] * C[j]  (B2 Float32)",
        "A2[i,j] := B2[i] * C[j]",
        {"B2": np.ones(5, np.float32), "C": C5},
        np.outer(np.ones(5), C5),
    ),
    value("scalar_trace", "b := a[i,i]; b == 2", "b := a[i,i]", {"a": np.eye(2)}, 2.0),
    value("scalar_trace_0d", "c[] := a[i,i]; c[] == 2", "c := a[i,i]", {"a": np.eye(2)}, 2.0),
    shape("issue_6_shift", "A2[j] := X[j+3]; axes -2:7", "A2[j] := X[j+3]", {"X": X10}, (10,)),
    shape(
        "issue_6_interpolated",
        "A3[j] := X[j+$offset]; axes -2:7",
        "A3[j] := X[j+3]",
        {"X": X10},
        (10,),
    ),
    value("issue_6_negative", "A5[i] := X[i-5]; size (10,)", "A5[i] := X[i-5]", {"X": X10}, X10),
    value(
        "issue_6_both",
        "A6[i] := X[i+3]*X[i-3]",
        "A6[i] := X[i+3]*X[i-3]",
        {"X": X10},
        X10[6:] * X10[:4],
    ),
]

IN_PLACE = "in-place update (`=`, `+=`, `*=` into an existing array): a kernel returns a new array"
SKIPS = [
    Skip("cp_in_place", "A[i, j, k] = X[i, r] * Y[j, r] * Z[k, r]", IN_PLACE),
    Skip("twice_declared", "if true; A[i,j,k] = ... else A[i,j,k] = ... end", IN_PLACE),
    Skip("block_transpose", "t[i, j] := transpose(z[j, i])", "Julia-specific: arrays of arrays"),
    Skip("add_in_place", "A[i, j] = A[i,j] + 50", IN_PLACE),
    Skip("plus_equals", "A[i, j, k] += X[i, r] * Y[j, r] * Z[k, r]", IN_PLACE),
    Skip("offset_in_place", "B[i] = X[i + 5]", IN_PLACE),
    Skip("symbolic_offset_in_place", "B[i] = X[i + $offset]", IN_PLACE),
    Skip("add_sub_in_place", "C[i] = X[i] + k; D[i] = X[i] - k", IN_PLACE),
    Skip("mul_div_in_place", "C[i] = X[i] * k; D[i] = X[i] / k", IN_PLACE),
    Skip("constant_in_place", "D[i, 1] = A[i, $j]", IN_PLACE),
    Skip("constant_both_in_place", "D[i, $j] = A[i, $j]", IN_PLACE),
    Skip("scalar_is_int", "b isa Int; c isa Array{Int,0}", "results are floats"),
    Skip("issue_6_in_place", "A[j] = X[j]*Y[j+3]", IN_PLACE),
    Skip("issue_12_plus", "A[i] = B[i+5]; A[1] == 6", IN_PLACE),
    Skip("issue_12_minus", "A[i] = B[i-5]; all(A .== 0)", IN_PLACE),
    Skip("issue_12_legal_plus", "A[i] = B[i+5] (A of 10)", IN_PLACE),
    Skip("issue_12_legal_minus", "A[i] = B[i-5] (A of 10)", IN_PLACE),
]
