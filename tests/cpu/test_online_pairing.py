"""Pairing a logsumexp with its weighted sum where the ranges are equal for the call's shapes
only (`codegen.passes.online.pair` with `shapes`): attention with a relative-bias table,
whose weighted sum sums over `Min(k_.shape[1], v_.shape[1])` keys and the logsumexp over
`k_.shape[1]`. Checked against float64 numpy that materialises the scores."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import tensordsl as td
from codegen.passes.online import pair, pair_stored
from tensordsl.binding.programs import compiled_statements
from tensordsl.nn.attention import attention_source
from tests.backends import BACKENDS, NEEDS_C_COMPILER, generated_kernels  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

B, T, H, E = 2, 11, 3, 4
RELATIVE = f"S + R[h, i - j + {T - 1}]"


def _inputs(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    qkv = {n: rng.normal(size=(B, T, H, E)) for n in "qkv"}
    return qkv | {"R": rng.normal(size=(H, 2 * T - 1)), "ct": rng.normal(size=(B, T, H, E))}


def _reference(q, k, v, R, ct) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Causal attention with the bias R[h, i - j + T - 1], and the gradients of
    sum(out * ct), in float64 with the scores materialised."""
    scale = 1.0 / np.sqrt(E)
    i, j = np.arange(T)[:, None], np.arange(T)[None, :]
    S = np.einsum("bihd,bjhd->bhij", q, k) * scale + R[:, i - j + T - 1][None]
    S = np.where(j <= i, S, -np.inf)
    P = np.exp(S - S.max(-1, keepdims=True))
    P /= P.sum(-1, keepdims=True)
    out = np.einsum("bhij,bjhe->bihe", P, v)
    dP = np.einsum("bihe,bjhe->bhij", ct, v)
    dS = P * (dP - (dP * P).sum(-1, keepdims=True))
    dR = np.zeros_like(R)
    for h in range(H):
        np.add.at(dR[h], i - j + T - 1, dS[:, h].sum(0))  # masked scores: dS is 0
    grads = {
        "q": np.einsum("bhij,bjhd->bihd", dS, k) * scale,
        "k": np.einsum("bhij,bihd->bjhd", dS, q) * scale,
        "v": np.einsum("bhij,bihe->bjhe", P, ct),
        "R": dR,
    }
    return out, grads


def test_the_relative_table_program_is_paired():
    values = {n: a for n, a in _inputs(0).items() if n in "qkvR"}
    source = attention_source(f"s_[b,h,i,j] + R[h, i - j + {T - 1}]", "(j <= i)")
    program = td.kernel(source, outputs=("out_", "lse_")).program
    args = {"q_": values["q"], "k_": values["k"], "v_": values["v"], "R": values["R"]}
    args["scale_"] = 0.5
    stored = compiled_statements(program, args, "c")
    shapes = program.concrete_shapes({n: np.shape(a) for n, a in args.items()})
    # As written the key ranges differ (Min(k_.shape[1], v_.shape[1]) and k_.shape[1]) ...
    assert pair_stored(stored) == stored
    # ... but not for these shapes: the two in one nest.
    *before, one = pair_stored(stored, shapes)
    assert len(before) == len(stored) - 2
    assert (one.output, one.online) == ("out_", "lse_")
    text = td.kernel(source, outputs=("out_", "lse_")).explain(
        {n: np.shape(a) for n, a in args.items()}
    )
    assert "  forward out_+lse_  one pass over each row's scores" in text


@pytest.mark.usefixtures("generated_kernels")
@pytest.mark.parametrize("backend", BACKENDS)
def test_relative_table_attention_and_its_gradients(backend):
    values = _inputs(1)
    want_out, want_grads = _reference(**values)

    def loss(q, k, v, R):
        out = td.nn.attention(
            q, k, v, causal=True, score_mod=RELATIVE, mod_args={"R": R}, backend=backend
        )
        return (out * values["ct"]).sum(), out

    names = ("q", "k", "v", "R")
    grads, out = jax.grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(*(values[n] for n in names))
    np.testing.assert_allclose(np.asarray(out), want_out, rtol=1e-10, atol=1e-10)
    for name, got in zip(names, grads):
        np.testing.assert_allclose(np.asarray(got), want_grads[name], rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("backend", ["reference", pytest.param("c", marks=NEEDS_C_COMPILER)])
@pytest.mark.parametrize("values", [5, 6])
def test_keys_the_weights_do_not_reach_are_not_paired(backend, values):
    # The weights read V[j + 1]: the weighted sum runs over min(X's 5, values - 1) keys, the
    # logsumexp over all 5. Paired for 6 values (the same loops), not for 5.
    source = "(logsumexp) L[i] := X[i,j]; O[i,e] := exp(X[i,j] - L[i]) * V[j + 1,e]"
    rng = np.random.default_rng(values)
    args = {"X": rng.normal(size=(3, 5)), "V": rng.normal(size=(values, 2))}
    k = td.kernel(source, outputs=("O", "L"), backend=backend)
    lse, weighted = compiled_statements(k.program, args, backend)
    shapes = k.program.concrete_shapes({n: np.shape(a) for n, a in args.items()})
    assert (pair(lse, weighted, shapes) is not None) == (values == 6)
    assert pair(lse, weighted) is None  # as written, the ranges differ
    O, L = k(**args)
    keys = min(5, values - 1)
    want_L = np.log(np.exp(args["X"]).sum(1))
    want_O = np.exp(args["X"][:, :keys] - want_L[:, None]) @ args["V"][1 : keys + 1]
    np.testing.assert_allclose(np.asarray(L, np.float64), want_L, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(O, np.float64), want_O, rtol=1e-5, atol=1e-6)
