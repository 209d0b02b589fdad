"""`explain` reads as a summary first, then the nests in the user's terms (issue 28): how many
nests on which back end and each schedule in words, the user's order of terms, and no test
that the call's shape checks already imply."""

from __future__ import annotations

import tensordsl as td
from tensordsl.cli import main

ATTENTION = """
    S[h,i,j] := Q[h,i,d] * K[h,j,d] * scale + where(j <= i, 0, -inf)
    (logsumexp) L[h,i] := S[h,i,j]
    O[h,i,e] := exp(S[h,i,j] - L[h,i]) * V[h,j,e]
"""


def test_a_kernel_summary_counts_its_nests_and_says_each_schedule_in_words():
    lines = td.kernel("Y[i] := X[i+k] * W[k]", backend="c").explain().splitlines()
    assert lines[0] == "3 nests on the c back end, each scheduled for float32 inputs as:"
    assert lines[1].startswith("  forward Y      register tiles of 32 i outputs (i in vector")
    assert lines[2].startswith("  gradient of X  ") and lines[3].startswith("  gradient of W  ")
    assert lines[4] == "forward"
    reference = td.kernel("Y[i] := X[i+k] * W[k]", backend="reference").explain()
    assert reference.splitlines()[0] == (
        "3 nests on the reference back end (jax.numpy: no generated code, no schedule)"
    )
    pallas = td.kernel("Y[i] := X[i+k] * W[k]", backend="pallas").explain()
    assert pallas.splitlines()[0] == (
        "3 nests on the pallas back end (Pallas tile programs, no loop schedule: "
        "explain(shapes, target='pallas') prints them)"
    )
    cuda = td.kernel("M[i] := X[i,j]", reduce="max", backend="cuda").explain().splitlines()
    assert cuda[0] == "3 nests on the cuda back end, each scheduled for float32 inputs as:"
    assert cuda[1].startswith("  forward M  ")
    assert cuda[1].endswith(
        "  a group of lanes per output element striding j (coalesced), combined by warp shuffles"
    )


def test_schedules_are_words_not_codes(capsys):
    assert main(["explain", "Y[i] := X[i+k] * W[k]"]) == 0
    out = capsys.readouterr().out
    assert "tile=" not in out and "strategy=" not in out
    assert "    c:    register tiles of 32 i outputs (i in vector lanes), reducing k inside" in out
    assert "    cuda: one output element per thread, reducing k in registers" in out


def test_the_users_order_of_terms_is_kept():
    text = td.kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend="reference").explain()
    assert "  D[i, j] = sum_k (W[k, i] - X[k, j])**2\n" in text
    assert "  dX[k, j] = sum_i dD[i, j]*(2*X[k, j] - 2*W[k, i])\n" in text
    text = td.kernel("Y[i] := X[i,j] * W[j] - b[i]", backend="reference").explain()
    assert "  Y[i] = (sum_j X[i, j]*W[j])\n       - b[i]\n" in text
    assert "  db[i] = -dY[i]\n" in text


def test_a_summed_sum_is_parenthesised_after_its_reduction():
    # One term whose parts read different reduced indices (codegen/ir/source.py prints it as
    # `pow(..., 1)`): c is added at every j, so the sum reads `sum_j (X + c)`, not `sum_j X + c`.
    text = td.kernel("Y[i] := pow(X[i,j] + c[i], 1)", backend="c").explain()
    assert "  Y[i] = sum_j (X[i, j] + c[i])\n" in text
    text = td.kernel("Y[i] := X[i,j] + c[i]", backend="c").explain()
    assert "  Y[i] = (sum_j X[i, j])\n       + c[i]\n" in text


def test_tests_the_shapes_imply_are_left_out_and_the_others_kept():
    # k indexes W and X alone: their extents agree, so `W.shape[0] - k - 1 >= 0` always holds
    text = td.kernel("D[i,j] := (W[k,i] - X[k,j])^2", backend="reference").explain()
    assert "only where" not in text
    text = td.kernel("C[i,j] := A[i,k] * A[k,j]", backend="reference").explain()
    assert "only where" not in text
    # a shifted read: the first and the last output elements get one term each
    text = td.kernel("D[i] := C[i+1] - C[i]", backend="reference").explain()
    assert "only where p - 1 >= 0" in text
    # the range came from ranges=: W may be longer than 3, so dW[k] is zero past k = 2
    text = td.kernel("Y[i] := X[i,k] * W[k]", ranges={"k": 3}, backend="reference").explain()
    assert "only where -k + 2 >= 0" in text


def test_a_program_summary_comes_before_the_statements():
    shapes = {"Q": (2, 64, 16), "K": (2, 64, 16), "scale": (), "V": (2, 64, 16)}
    text = td.kernel(ATTENTION, outputs=("O", "L"), backend="c").explain(shapes)
    head = text[: text.index("statement 1 (line 2)")]
    assert "fused for these shapes: L, O computed by 2 nest(s); S recomputed where read" in head
    assert "1 nest on the c back end, each scheduled for float32 inputs as:" in head
    assert "  forward O+L  one pass over each row's scores with a running max" in head
    assert "backward: each fused statement's gradient nests (below)" in head
    assert "only where" not in text
    plain = td.kernel(ATTENTION, outputs=("O", "L"), backend="c").explain()
    assert "explain(shapes) shows the fused nests a call runs" in plain.split("statement 1")[0]


def test_only_back_ends_that_call_xla_s_dot_show_its_prologues():
    """c and cuda run `tanh(H) W` as a prologue and XLA's dot; pallas and the reference do not,
    and their explain must not say they do."""
    source = "Y[b,o] := tanh(H[b,u]) * W[u,o]"
    shapes = {"H": (8, 32), "W": (32, 4)}
    for backend, says in [("c", True), ("cuda", True), ("pallas", False), ("reference", False)]:
        kernel = td.kernel(source, backend=backend)
        for text in (kernel.explain(), kernel.explain(shapes)):
            assert ("then XLA's dot" in text) is says, backend


def test_a_program_says_how_its_own_back_end_runs_a_packed_row():
    shapes = {"Q": (2, 12, 4), "K": (2, 12, 4), "scale": (), "V": (2, 12, 4)}
    pallas = td.kernel(ATTENTION, backend="pallas").explain(shapes)
    assert "(O+L: L and O in one Pallas kernel, FlashAttention's forward" in pallas
    assert "one pass: L and O on the pallas back end in one Pallas kernel" in pallas
    assert "rows are short enough" not in pallas and "then XLA's dot" not in pallas
    c = td.kernel(ATTENTION, backend="c").explain(shapes)
    assert "one pass: L and O on the c back end in one pass over each row" in c
