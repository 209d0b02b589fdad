"""The fusion cost model's decisions (what it chose, not how fast it ran), the `fuse=` option,
and `explain`. Values of the programs whose decisions changed: tests/cpu/test_fusion_cost_c.py."""

from __future__ import annotations

import pytest

import tensordsl as td
from benchmarks.natural import ATTENTION, ATTENTION_LAYER, CROSS_ATTENTION, TRIPLET
from codegen.ir.program import live_statements
from codegen.passes.fusion import fuse
from codegen.passes.online import pair_stored
from tensordsl.binding.programs import fuse_program
from tests.programs import PROGRAMS_BY_NAME

MLP = "H[b,u] := X[b,f] * W1[f,u]\nY[b,o] := tanh(H[b,u]) * W2[u,o]"
MOE = "H[b,e,o] := X[b,f] * W[e,f,o]\nY[b,o] := G[b,e] * tanh(H[b,e,o])"


def fused(k: td.ProgramKernel, shapes: dict, order: int = 1):
    concrete = k.program.concrete_shapes(shapes)
    return fuse_program(
        live_statements(k.program), k.program.outputs, concrete, k.fuse, order=order
    )


def decisions(k: td.ProgramKernel, shapes: dict, order: int = 1) -> dict:
    return {d.name: d for d in fused(k, shapes, order).decisions}


def test_the_mlp_hidden_layer_is_stored_not_recomputed_per_output_feature(monkeypatch):
    k = td.program(MLP, backend="reference")
    for outputs in (128, 8):
        # XLA evaluates tanh(H) once per (b, u) before its dot (a prologue): no sum repeated
        # forward, but the gradient of W2 would redo H's sum per element.
        found = decisions(k, {"X": (512, 128), "W1": (128, 512), "W2": (512, outputs)})["H"]
        assert found.choice == "store"
        assert found.reason == "the gradients of Y would recompute its sum per element"
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    for outputs in (128, 8):  # as a kernel, even a few output features would repeat H's sum
        found = decisions(k, {"X": (512, 128), "W1": (128, 512), "W2": (512, outputs)})["H"]
        assert found.choice == "store"
        assert (
            found.reason == f"recomputing it would repeat its sum {outputs}x inside Y's loop over o"
        )
        assert found.inline_cost > found.store_cost


def test_a_mixture_of_experts_hidden_layer_is_stored_though_larger_than_every_input():
    k = td.program(MOE, backend="reference")
    shapes = {"X": (256, 64), "W": (8, 64, 64), "G": (256, 8)}
    found = decisions(k, shapes)["H"]
    assert (found.choice, found.reason) == (
        "store",
        "the gradients of Y would recompute its sum per element",
    )
    assert [n.output for n in fused(k, shapes).stored] == ["H", "Y"]


def test_the_triplet_distance_matrix_is_stored_once_for_the_max_and_the_min():
    k = td.program(TRIPLET, backend="reference")
    found = decisions(k, {"X": (128, 32), "same": (128, 128), "margin": ()})
    assert found["D"].choice == "store"
    assert found["P"].reason == "a max: recomputing it where read is not derived"


def test_a_logsumexp_read_linearly_is_stored_for_its_gradient():
    """Cross-entropy: `loss[n] := L[n] - P[n]` reads the logsumexp L linearly, but L's own
    gradient `exp(X - L)` reads L: recomputed, it would redo the logsumexp per class."""
    from tensordsl.nn.layers import CROSS_ENTROPY

    k = td.program(CROSS_ENTROPY, backend="reference")
    text = k.explain({"X": (512, 1024), "y": (512,)})
    assert (
        "L: stored (the gradient of its logsumexp reads its value: recomputed, it would be "
        "repeated for every element of its input)" in text
    ), text


def test_attention_scores_stay_recomputed_and_paired_in_one_pass():
    case = PROGRAMS_BY_NAME["causal_attention"]
    k = td.kernel(case.source, outputs=case.outputs, backend="reference")
    shapes = {name: arg.shape for name, arg in case.args.items()}
    result = fused(k, shapes)
    assert result.inlined == ("S",)
    assert "read by a logsumexp and the weighted sum O" in decisions(k, shapes)["S"].reason
    assert [(n.output, n.online) for n in pair_stored(result.stored)] == [("O", "L")]


def test_attention_scores_differentiated_twice_are_stored_where_they_fit(monkeypatch):
    """An HVP (`jax.jvp` of `jax.grad`) runs every nest again as a tangent nest, which would
    recompute the scores and their tangent: stored, unless they pass the memory cap."""
    from codegen.passes import cost

    case = PROGRAMS_BY_NAME["causal_attention"]
    k = td.kernel(case.source, outputs=case.outputs, backend="reference")
    shapes = {"Q": (1, 2, 256, 64), "K": (1, 2, 256, 64), "scale": (), "V": (1, 2, 256, 64)}
    first, second = decisions(k, shapes)["S"], decisions(k, shapes, order=2)["S"]
    assert first.choice == "inline"
    assert (second.choice, second.reason) == (
        "store",
        "larger than every input and output, but differentiated twice: every tangent nest "
        "would recompute it and its tangent",
    )
    assert second.inline_cost > first.inline_cost
    assert [n.output for n in fused(k, shapes, order=2).stored] == ["S", "L", "O"]
    monkeypatch.setattr(cost, "HIGHER_ORDER_STORE_BYTES", 2 * 256 * 256 * 4 - 1)
    live, concrete = live_statements(k.program), k.program.concrete_shapes(shapes)
    capped = fuse(live, outputs=k.program.outputs, shapes=concrete, order=2)  # not cached
    assert capped.inlined == ("S",)  # past the cap: one pass, as at first order


CROSS_SHAPES = {"Q": (4, 128, 32), "K": (4, 384, 32), "scale": (), "V": (4, 384, 32)}


def test_unmasked_scores_are_stored_where_stored_scores_run_as_xla_dots():
    """Zoo 3: with no mask to skip work, the one-pass kernel ran cross-attention 2x slower than
    the scores stored and XLA's dots (forward and forward+backward, 2 cores). On the back
    ends that run stored scores as XLA's dots (`beside`), unmasked scores are stored up to
    BESIDE_STORE_BYTES; masked ones, and every back end else, keep the one pass."""
    k = td.program(CROSS_ATTENTION, backend="c")
    live, concrete = live_statements(k.program), k.program.concrete_shapes(CROSS_SHAPES)
    stored = fuse(live, outputs=k.program.outputs, shapes=concrete, beside=True)
    (decision,) = [d for d in stored.decisions if d.name == "S"]
    assert (decision.choice, stored.inlined) == ("store", ())
    assert decision.reason == (
        "larger than every input and output, but no mask spares any of its elements: "
        "stored, its sums run as XLA's dots"
    )
    assert fuse(live, outputs=k.program.outputs, shapes=concrete).inlined == ("S",)
    causal = td.program(ATTENTION, backend="c")
    live = live_statements(causal.program)
    shapes = causal.program.concrete_shapes({**CROSS_SHAPES, "K": (4, 128, 32), "V": (4, 128, 32)})
    assert fuse(live, outputs=causal.program.outputs, shapes=shapes, beside=True).inlined == ("S",)


def test_unmasked_scores_past_the_store_cap_keep_the_one_pass(monkeypatch):
    from codegen.passes import cost

    monkeypatch.setattr(cost, "BESIDE_STORE_BYTES", 4 * 128 * 384 * 4 - 1)
    k = td.program(CROSS_ATTENTION, backend="c")
    live, concrete = live_statements(k.program), k.program.concrete_shapes(CROSS_SHAPES)
    assert fuse(live, outputs=k.program.outputs, shapes=concrete, beside=True).inlined == ("S",)


@pytest.mark.parametrize(
    "mask", ["doc[b, i] == doc[b, j]", "M[b, j] > 0", "(doc[b, i] == doc[b, j]) * (j <= i)"]
)
def test_a_mask_that_reads_arrays_keeps_the_scores_recomputed_in_one_pass(mask):
    """Issue 38: a mask that is not a loop bound is the one-pass nest's guard, tested per
    pair; the scores stay recomputed (before, they were stored, (B, H, T, T))."""
    from tensordsl.nn.attention import attention_source

    k = td.program(attention_source("s_[b,h,i,j]", mask), backend="reference")
    shapes = {"q_": (2, 64, 2, 8), "k_": (2, 64, 2, 8), "v_": (2, 64, 2, 8), "scale_": ()}
    shapes.update({"doc": (2, 64), "M": (2, 64)})
    shapes = {name: shape for name, shape in shapes.items() if name in k.inputs}
    result = fused(k, shapes)
    assert result.inlined == ("s_",)
    (one_pass,) = [n for n in pair_stored(result.stored) if n.online]
    assert one_pass.terms[0].guard == one_pass.terms[1].guard != True  # noqa: E712
    shown = str(one_pass)  # the mask is shown in the one-pass nest's source, each statement
    assert shown.count("doc[b, i] == doc[b, j]") + shown.count("M[b, j] > 0") >= 2


def test_the_attention_sublayer_as_one_program():
    k = td.program(ATTENTION_LAYER, backend="reference")
    shapes = {
        "X": (256, 128),
        "C": (),
        "g": (128,),
        "beta": (128,),
        "Wq": (128, 2, 32),
        "Wk": (128, 2, 32),
        "Wv": (128, 2, 32),
        "Wo": (2, 32, 128),
    }
    found = decisions(k, shapes)
    # Statistics, projections and the logsumexp would be recomputed inside loops that do not
    # index them: stored. The (2, 256, 256) scores, larger than everything else: one pass.
    assert {n for n, d in found.items() if d.choice == "store"} == {
        "mu",
        "var",
        "N",
        "Q",
        "K",
        "V",
        "L",
        "O",
    }
    assert found["S"].choice == "inline"
    assert [n.online for n in pair_stored(fused(k, shapes).stored)].count("L") == 1


@pytest.mark.parametrize(
    ("name", "inlined"),
    [
        ("softmax", ()),  # Z's sum would repeat for every j of P
        ("layernorm", ("N",)),  # elementwise, read once: recomputed
        ("rmsnorm", ()),
        ("relative_bias_attention", ("S",)),
    ],
)
def test_corpus_decisions(name, inlined):
    case = PROGRAMS_BY_NAME[name]
    k = td.kernel(case.source, backend="reference")
    assert fused(k, {n: a.shape for n, a in case.args.items()}).inlined == inlined


# -- fuse= -------------------------------------------------------------------------------------


def test_fuse_forces_a_decision():
    shapes = {"X": (512, 128), "W1": (128, 512), "W2": (512, 128)}
    k = td.program(MLP, backend="reference", fuse={"H": "inline"})
    assert k.fuse == (("H", "inline"),)
    assert fused(k, shapes).inlined == ("H",)
    assert decisions(k, shapes)["H"].reason == "forced by fuse="
    attention = PROGRAMS_BY_NAME["causal_attention"]
    k = td.kernel(attention.source, outputs=("O", "L"), backend="reference", fuse=False)
    assert fused(k, {n: a.shape for n, a in attention.args.items()}).inlined == ()
    assert k != td.kernel(attention.source, outputs=("O", "L"), backend="reference")


@pytest.mark.parametrize(
    ("option", "error", "match"),
    [
        ({"Z": "store"}, td.UnknownNameError, "fuse= names 'Z', which is not a statement"),
        ({"X": "store"}, td.UnknownNameError, "fuse= names 'X', which is an input"),
        ({"Y": "store"}, td.UnknownNameError, r"'Y', which is an output \(always stored\)"),
        ({"H": "stored"}, td.InputError, "fuse= says 'stored' for 'H'"),
        ("store", td.InputError, "fuse= must be True, False or a dict, got str"),
    ],
)
def test_malformed_fuse_options_are_errors(option, error, match):
    with pytest.raises(error, match=match) as raised:
        td.program(MLP, fuse=option)
    if option == {"H": "stored"}:
        assert raised.value.hint == "did you mean 'store'?"
        assert "H[b,u] := X[b,f] * W1[f,u]\n  ~~~~" in str(raised.value)


def test_a_max_cannot_be_forced_inline():
    with pytest.raises(td.UnsupportedError, match="'M' cannot be recomputed where read"):
        td.program("(max) M[i] := X[i,j]; P[i,j] := exp(X[i,j] - M[i])", fuse={"M": "inline"})


def test_fuse_on_a_one_statement_kernel_is_an_error():
    with pytest.raises(td.UnsupportedError, match="fuse= applies to programs"):
        td.kernel("C[i] := A[i,j]", fuse=False)
    assert td.program("C[i] := A[i,j]", fuse=False).fuse == ()


def test_explain_shows_each_decision_and_its_estimated_cost():
    k = td.program(MLP, backend="c")  # explains without building; the reference has no dots
    text = k.explain({"X": (512, 128), "W1": (128, 512), "W2": (512, 128)})
    assert (
        "  H: stored (the gradients of Y would recompute its sum per element); "
        "estimated cost inline 268M, store 74.4M" in text
    )
    # Y's tanh runs once per (b, u) before XLA's dot, forward and in the gradient of W2.
    fused_y = text[text.index("fused statement Y") :]
    once = "262144 times, not 33554432"
    assert f"prologue 1: tanh(H[b, u]) evaluated once per (b, u): {once} (per (b, o, u))" in fused_y
    assert f"prologue 1: tanh(H[b, u]) evaluated once per (u, b): {once} (per (u, o, b))" in fused_y


# -- shift-invariant statistics ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "outputs", "invariant"),
    [
        (PROGRAMS_BY_NAME["softmax"].source, None, ("M",)),
        (PROGRAMS_BY_NAME["softmax"].source, ("P", "Z"), ()),  # Z itself moves with M
        ("(max) M[i] := X[i,j]; P[i,j] := exp(X[i,j] - M[i])", None, ()),
        ("(max) M[i] := X[i,j]; Z[i] := exp(X[i,j] - M[i]); L[i] := log(Z[i])", None, ()),
        (
            "(max) M[i] := X[i,j]; Z[i] := exp(2*(X[i,j] - M[i])); "
            "P[i,j] := exp(2*(X[i,j] - M[i])) / Z[i]",
            None,
            ("M",),
        ),
    ],
)
def test_a_max_divided_out_again_has_no_gradient(source, outputs, invariant):
    from codegen.passes.invariance import shift_invariant

    options = {} if outputs is None else {"outputs": outputs}
    k = td.program(source, backend="reference", **options)
    stored = fused(k, {"X": (4, 6)}).stored
    assert shift_invariant(stored, outputs=k.program.outputs) == invariant


def test_relu_of_a_stored_intermediate_stays_a_value_and_the_sum_xla_dots():
    """Zoo 3: `relu(S[h,i,j])^2 * V[h,j,e]` made relu's `S > 0` a guard of the stored nest
    (as a mask that reads other arrays is): a guarded sum is no XLA dot with a prologue, so
    O ran as a register-tiled kernel and its S gradient as dot products, 2x jnp's time. A
    condition that reads only what its kept branch reads is a function, not a mask."""
    from benchmarks.natural import RELU2_ATTENTION

    k = td.program(RELU2_ATTENTION, backend="c")
    shapes = {"Q": (4, 256, 32), "K": (4, 256, 32), "scale": (), "V": (4, 256, 32)}
    (out,) = [n for n in fused(k, shapes).stored if n.output == "O"]
    assert all(term.guard == True for term in out.terms)  # noqa: E712
    assert "forward O  XLA's dot" in k.explain(shapes)
