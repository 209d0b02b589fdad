"""Programs of several statements: the front end, the program IR, and the corpus on the
reference back end (values against float64 numpy, gradients against central differences)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest
import sympy

import tensordsl as td
from codegen.ir.nest import extent_symbol
from codegen.ir.program import live_statements
from tensordsl.errors import UnsupportedError
from tensordsl.frontend.statements import (
    check_program_shapes,
    lower_program,
    parse_program,
    statement_spans,
)
from tests.corpus import make_inputs
from tests.program_checks import check_gradients, check_values
from tests.programs import PROGRAMS, PROGRAMS_BY_NAME

pytestmark = pytest.mark.usefixtures("poisoned_outputs")


def reference(source: str, **options):
    return td.kernel(source, backend="reference", **options)


RNG = np.random.default_rng(11)


# -- the language ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "texts"),
    [
        ("A[i] := X[i]", ["A[i] := X[i]"]),
        ("A[i] := X[i]; B[i] := A[i]*2", ["A[i] := X[i]", "B[i] := A[i]*2"]),
        (
            "\n  A[i] := X[i]   # copy; not a statement\n\n  B := A[i] ;\n",
            ["A[i] := X[i]", "B := A[i]"],
        ),
        ("# only a comment\n;;\n", []),
    ],
)
def test_statements_are_split_by_newlines_and_semicolons(source, texts):
    assert [source[a:b] for a, b in statement_spans(source)] == texts


def test_spans_are_offsets_into_the_program():
    source = "A[i] := X[i] + 1\n  (max) B := A[i] * W[i]  # the peak"
    first, second = parse_program(source)
    assert source[slice(*second.output_span)] == "B"
    assert second.reduction_span is not None
    assert source[slice(*second.reduction_span)] == "max"
    assert source[slice(*second.body.span)] == "A[i] * W[i]"
    assert (first.source, second.source) == (source, source)


def test_inputs_are_the_undefined_names_in_order_of_first_appearance():
    k = reference("H[b,j] := X[b,k] * W[k,j] * alpha\nY[b,j] := H[b,j] + c[j] * alpha + beta")
    assert k.inputs == ("X", "W", "alpha", "c", "beta")
    assert k.outputs == ("Y",)


def test_default_output_is_the_last_statement_alone_as_one_array():
    X = RNG.normal(size=(3, 4))
    k = reference("A[i] := X[i,j]\nB[i] := A[i] * 2")
    np.testing.assert_allclose(np.asarray(k(X)), 2 * X.sum(1), rtol=1e-12)


def test_outputs_are_returned_as_a_tuple_in_the_order_asked():
    X = RNG.normal(size=(3, 4))
    k = reference("A[i] := X[i,j]\nB[i] := A[i] * 2", outputs=("B", "A"))
    B, A = k(X=X)
    np.testing.assert_allclose(np.asarray(A), X.sum(1), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(B), 2 * X.sum(1), rtol=1e-12)
    (only,) = reference("A[i] := X[i,j]", outputs="A")(X)  # a str is one name
    np.testing.assert_allclose(np.asarray(only), X.sum(1), rtol=1e-12)


def test_a_one_statement_source_is_the_kernel_of_today():
    assert type(td.kernel("Y[i] := X[i,j]")) is td.Kernel
    assert type(td.kernel("\n    Y[i] := X[i,j]\n")) is td.Kernel
    commented = td.kernel("Y[i] := X[i,j]  # row sums", backend="reference")
    assert type(commented) is td.ProgramKernel
    X = RNG.normal(size=(2, 3))
    np.testing.assert_allclose(np.asarray(commented(X)), X.sum(1), rtol=1e-12)


def test_reduce_is_the_default_of_statements_without_a_prefix():
    X = RNG.normal(size=(3, 5))
    k = reference("(max) M[i] := X[i,j]; m[i] := X[i,j]", reduce="min", outputs=("M", "m"))
    M, m = k(X)
    np.testing.assert_array_equal(np.asarray(M), X.max(1))
    np.testing.assert_array_equal(np.asarray(m), X.min(1))


def test_ranges_apply_to_every_statement_with_the_index():
    x = RNG.normal(size=6)
    k = reference("C[t] := X[t] * 2\nD[i] := C[i+1] - C[i]", ranges={"i": 3})
    np.testing.assert_allclose(np.asarray(k(x)), 2 * (x[1:4] - x[:3]), rtol=1e-12)
    both = reference("C[i] := X[i] * 2\nD[i] := C[i+1] - C[i]", ranges={"i": 3})
    with pytest.raises(td.RangeError, match="'C\\[i\\+1\\]' reads axis 0 of 'C' at 1..3"):
        both(x)  # C has 3 elements too


def test_statements_the_outputs_do_not_need_are_not_run():
    low = lower_program("A[i] := X[i] * 2\nB[i] := X[i] + W[i]\nC[i] := A[i] * 3")
    assert [n.output for n in live_statements(low.program)] == ["A", "C"]
    k = reference("A[i] := X[i] * 2\nB[i] := X[i] + W[i]\nC[i] := A[i] * 3")
    assert k.inputs == ("X", "W")
    np.testing.assert_allclose(np.asarray(k(np.arange(3.0), np.ones(3))), [0.0, 6.0, 12.0])


def test_options_that_name_one_statement_are_refused():
    with pytest.raises(UnsupportedError, match="schedule= and loop_order="):
        td.kernel("A[i] := X[i]; B[i] := A[i]", loop_order=("i",))
    with pytest.raises(td.UnknownNameError, match="nograd names 'A'"):
        td.kernel("A[i] := X[i]; B[i] := A[i]", nograd=("A",))
    with pytest.raises(td.UnknownNameError, match="unknown backend"):
        td.kernel("A[i] := X[i]; B[i] := A[i]", backend="gpu")


def test_calls_bind_inputs_by_position_or_by_name():
    k = reference("A[i] := X[i] * s; B[i] := A[i] + X[i]")
    with pytest.raises(td.ShapeError, match="takes 2 inputs, got 1"):
        k(np.ones(2))
    with pytest.raises(td.UnknownNameError, match="did you mean 's'"):
        k(X=np.ones(2), ss=1.0)
    with pytest.raises(td.ShapeError, match="missing input 's'"):
        k(X=np.ones(2))
    with pytest.raises(td.ShapeError, match="all by position or all by name"):
        k(np.ones(2), s=1.0)


# -- the program IR ----------------------------------------------------------------------------


def test_the_ir_is_frozen_and_hashable_with_shapes_in_input_extents():
    low = lower_program(PROGRAMS_BY_NAME["causal_attention"].source, outputs=("O", "L"))
    program = low.program
    assert hash(program) == hash(lower_program(low.source, outputs=("O", "L")).program)
    assert program.defined == ("S", "L", "O") and program.intermediates == ("S",)
    assert program.shape("L") == tuple(extent_symbol("Q", a) for a in range(3))
    assert program.shape("O")[3] == extent_symbol("V", 3)
    assert [n.output for n in program.consumers("S")] == ["L", "O"]
    assert program.in_input_extents(extent_symbol("S", 3)) == extent_symbol("K", 2)
    with pytest.raises(AttributeError):
        program.outputs = ("S",)  # type: ignore[misc]


def test_intermediate_extents_follow_shifts():
    low = lower_program(PROGRAMS_BY_NAME["conv_difference"].source)
    X, W = extent_symbol("X", 1), extent_symbol("W", 2)
    assert sympy.simplify(low.program.shape("D")[1] - (X - W)) == 0
    shapes = check_program_shapes(low, {"X": (3, 9), "W": (2, 3, 3)})
    assert (shapes["C"], shapes["D"]) == ((2, 7), (2, 6))


def test_explain_has_one_section_per_statement_with_its_gradients():
    k = td.kernel(PROGRAMS_BY_NAME["causal_attention"].source, outputs=("O", "L"))
    text = k.explain({"Q": (1, 2, 5, 3), "K": (1, 2, 5, 3), "scale": (), "V": (1, 2, 5, 4)})
    assert "  S: shape (Q.shape[0], Q.shape[1], Q.shape[2], K.shape[2])   intermediate" in text
    for n, line in enumerate((2, 3, 4), start=1):
        assert f"statement {n} (line {line}): " in text
    for name in ("Q", "K", "scale", "S", "L", "V"):
        assert f"  gradient of {name}\n" in text
    # The mask reads no summed index: it is added once, outside the sum over d.
    assert (
        "    S[b, h, i, j] = (sum_d Q[b, h, i, d]*K[b, h, j, d]*scale)\n"
        "                  + where(i >= j, 0, -inf)\n" in text
    )


def test_source_gives_every_nest_of_every_statement():
    k = td.kernel("A[i] := X[i,j]\nB[i] := A[i] * W[i]")
    assert list(k.source("c")) == ["A.forward", "A.grad_X", "B.forward", "B.grad_A", "B.grad_W"]
    assert all("tdsl_" in text for text in k.source("c").values())


# -- the corpus on the reference back end -------------------------------------------------------


@pytest.mark.parametrize("case", PROGRAMS, ids=lambda c: c.name)
def test_reference_values(case):
    check_values(case, "reference")


@pytest.mark.parametrize("case", PROGRAMS, ids=lambda c: c.name)
def test_reference_gradients_against_central_differences(case):
    check_gradients(case, "reference")


def test_vmap_over_a_program():
    case = PROGRAMS_BY_NAME["layernorm"]
    k = td.kernel(case.source, backend="reference")
    X = RNG.normal(size=(4, 3, 7))
    g, beta = RNG.normal(size=7), RNG.normal(size=7)
    got = jax.vmap(lambda x: k(x, 7.0, 0.2, g, beta))(X)
    want = np.stack([case.expected(X=x, F=7.0, eps=0.2, g=g, beta=beta)[0] for x in X])
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10)


def test_second_order_gradients():
    case = PROGRAMS_BY_NAME["rmsnorm"]
    inputs = make_inputs(case)
    k = td.kernel(case.source, backend="reference")
    jax.test_util.check_grads(
        jax.jit(k), list(inputs.values()), order=2, modes=["rev"], atol=1e-5, rtol=1e-5
    )


def test_a_fully_masked_row_stays_in_its_row():
    """Row 0 of a strictly causal mask has no key: the mask bounds the loops, so row 0 sums
    over nothing (L = -inf, O = 0), and nothing else is touched, gradients included."""
    k = reference(
        """
        S[i,j] := Q[i,d] * K[j,d] + where(j < i, 0, -inf)
        (logsumexp) L[i] := S[i,j]
        O[i,e] := exp(S[i,j] - L[i]) * V[j,e]
        """,
        outputs=("O", "L"),
    )
    Q, K, V = (RNG.normal(size=(5, 3)) for _ in range(3))
    O, L = (np.asarray(a) for a in k(Q, K, V))
    assert L[0] == -np.inf and (O[0] == 0).all()
    scores = np.where(np.tril(np.ones((5, 5)), -1) > 0, Q @ K.T, -np.inf)[1:]
    P = np.exp(scores - scores.max(1, keepdims=True))
    np.testing.assert_allclose(O[1:], (P / P.sum(1, keepdims=True)) @ V, rtol=1e-12)
    assert np.isfinite(L[1:]).all()
    dQ, dK = jax.grad(lambda q, k_: jnp.sum(k(q, k_, V)[1][1:]), (0, 1))(Q, K)
    assert np.isfinite(np.asarray(dQ)).all() and np.isfinite(np.asarray(dK)).all()


def test_nograd_inputs_of_a_program_get_zero_gradients():
    k = reference("H[b,j] := X[b,k] * W[k,j]; Y[b,j] := tanh(H[b,j] + c[j])", nograd=("W",))
    X, W, c = RNG.normal(size=(2, 3)), RNG.normal(size=(3, 4)), RNG.normal(size=4)
    gX, gW = jax.grad(lambda x, w: k(x, w, c).sum(), (0, 1))(X, W)
    np.testing.assert_allclose(np.asarray(gX), (1 - np.tanh(X @ W + c) ** 2) @ W.T, rtol=1e-10)
    assert not np.asarray(gW).any()


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"reduce": 3}, td.ReductionError, "unknown reduction '3'"),
        ({"ranges": [("i", 3)]}, td.RangeError, "ranges= must be a dict .* got list"),
        ({"outputs": 3}, td.UnknownNameError, "outputs= is 3"),
        ({"outputs": ()}, td.UnknownNameError, r"outputs= is \(\)"),
        ({"outputs": ("B", 2)}, td.UnknownNameError, "outputs= names 2"),
    ],
)
def test_malformed_options_are_errors(options, error, match):
    with pytest.raises(error, match=match):
        td.kernel("A[i] := X[i]; B[i] := A[i]", **options)


def test_float32_reference_attention_past_256_rows():
    # jaxlib 0.10.2's YNNPACK fusion on the CPU miscomputes `s * sum_d Q*K` in the rows past
    # 255 when the sum is a reduce of a broadcast product; the reference back end sums as dot
    # products with ones instead (tensordsl/backends/reference.py `_sum`). Against float64 numpy.
    rng = np.random.default_rng(3)
    Q, K, V = (rng.normal(size=(1, 1, 300, 12)) for _ in range(3))
    k = reference(PROGRAMS_BY_NAME["causal_attention"].source, outputs=("O", "L"))
    O, L = jax.jit(k)(*(np.float32(a) for a in (Q, K)), np.float32(0.3), np.float32(V))
    S = np.einsum("bhid,bhjd->bhij", Q, K) * np.float64(np.float32(0.3))
    S = np.where(np.tril(np.ones((300, 300), bool)), S, -np.inf)
    want_L = np.log(np.exp(S - S.max(-1, keepdims=True)).sum(-1)) + S.max(-1)
    want_O = np.einsum("bhij,bhje->bhie", np.exp(S - want_L[..., None]), V)
    np.testing.assert_allclose(np.asarray(L, np.float64), want_L, atol=1e-4)
    np.testing.assert_allclose(np.asarray(O, np.float64), want_O, atol=1e-4)
