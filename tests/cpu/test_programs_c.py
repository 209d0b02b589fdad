"""The program corpus on the C back end: values, gradients, jit, vmap and second order."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest

import tensordsl as td
from tensordsl.binding import programs as program_module
from tensordsl.cli import main
from tensordsl.errors import UnsupportedError
from tests.backends import NEEDS_C_COMPILER
from tests.corpus import make_inputs
from tests.program_checks import check_gradients, check_values, program_kernel
from tests.programs import PROGRAMS, PROGRAMS_BY_NAME, directional_derivative

pytestmark = [
    NEEDS_C_COMPILER,
    pytest.mark.usefixtures("poisoned_outputs"),
    pytest.mark.optimised,
]


@pytest.mark.parametrize("case", PROGRAMS, ids=lambda c: c.name)
def test_values(case):
    check_values(case, "c", "float64")


#: float32 builds other nests; a few programs keep the tier fast.
FLOAT32 = ("softmax", "layernorm", "causal_attention")


@pytest.mark.parametrize("name", FLOAT32)
def test_values_in_float32(name):
    check_values(PROGRAMS_BY_NAME[name], "c", "float32")


@pytest.mark.parametrize("case", PROGRAMS, ids=lambda c: c.name)
def test_gradients_against_central_differences(case):
    check_gradients(case, "c")


def test_gradients_of_a_vmapped_program_under_jit():
    """vmap over a batch axis of every input, then grad, all jitted: the per-example
    gradients against central differences of each example."""
    case = PROGRAMS_BY_NAME["rmsnorm"]
    batch = [make_inputs(case, seed) for seed in range(3)]
    stacked = {n: np.stack([np.asarray(b[n]) for b in batch]) for n in case.args}

    def per_example(stacked_inputs):
        return jax.vmap(lambda inputs: program_kernel(case, "c")(**inputs))(stacked_inputs)

    rng = np.random.default_rng(5)
    cotangent = rng.normal(size=np.shape(per_example(stacked)))
    gradients = jax.jit(jax.grad(lambda inputs: jnp.sum(per_example(inputs) * cotangent)))(stacked)
    for n, inputs in enumerate(batch):
        for name in case.args:
            direction = rng.normal(size=np.shape(inputs[name]))
            want = directional_derivative(case, inputs, (cotangent[n],), name, direction)
            got = float(np.sum(np.asarray(gradients[name][n]) * direction))
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{name}, example {n}")


def test_second_order_gradients():
    """A small nonlinear program (few nests to compile); the corpus's rmsnorm is checked to
    second order on the reference back end."""
    k = td.kernel("A[b,j] := tanh(X[b,j]) * c[j]; s := A[b,j] * A[b,j]", backend="c")
    rng = np.random.default_rng(4)
    X, c = rng.normal(size=(3, 4)), rng.normal(size=4)
    jax.test_util.check_grads(jax.jit(k), [X, c], order=2, modes=["rev"], atol=1e-5, rtol=1e-5)


def _attention_float64(Q, K, V, scale):
    """Causal attention in float64 jax.numpy: the scores stored, softmax by logsumexp."""
    S = jnp.einsum("bhid,bhjd->bhij", Q, K) * scale
    S = jnp.where(jnp.tril(jnp.ones(S.shape[-2:], bool)), S, -jnp.inf)
    L = jax.nn.logsumexp(S, axis=-1)
    return jnp.einsum("bhij,bhje->bhie", jnp.exp(S - L[..., None]), V), L


@pytest.mark.parametrize("dtype, width", [("float32", 64), ("float64", 64), ("float32", 12)])
def test_attention_fills_the_register_tiles(dtype, width):
    # Head width 64 fills the 8x64 register tiles of the O, dQ, dK and dV nests (narrower
    # heads only ever take the partial-tile code); T = 70 leaves a partial tile of rows and
    # tiles across the diagonal. In float32 the rows' scores are vector dot products, with a
    # tail for a width of 12. Outputs and all input gradients against float64 XLA.
    k = td.kernel(PROGRAMS_BY_NAME["causal_attention"].source, outputs=("O", "L"), backend="c")
    rng = np.random.default_rng(7)
    shape = (1, 2, 70, width)
    Q, K, V, dO = (rng.normal(size=shape) for _ in range(4))
    dL = rng.normal(size=shape[:3])
    want, vjp = jax.vjp(lambda q, k_, v: _attention_float64(q, k_, v, 0.125), Q, K, V)
    want_grads = vjp((dO, dL))
    cast = [np.asarray(a, dtype) for a in (Q, K, V, dO, dL)]
    scale = np.asarray(0.125, dtype)
    got, vjp = jax.vjp(lambda q, k_, v: k(q, k_, scale, v), *cast[:3])
    got_grads = vjp(tuple(cast[3:]))
    tolerance = 1e-5 if dtype == "float32" else 1e-11
    for name, g, w in zip(("O", "L", "dQ", "dK", "dV"), (*got, *got_grads), (*want, *want_grads)):
        w = np.asarray(w)
        np.testing.assert_allclose(
            np.asarray(g, np.float64), w, rtol=0, atol=tolerance * np.abs(w).max(), err_msg=name
        )


MASKED_ROW = """
    S[i,j] := Q[i,d] * K[j,d] + where(j < i, 0, -inf)
    (logsumexp) L[i] := S[i,j]
    O[i,e] := exp(S[i,j] - L[i]) * V[j,e]
"""


def test_a_fully_masked_row_agrees_with_the_reference():
    rng = np.random.default_rng(2)
    Q, K, V = (rng.normal(size=(5, 3)) for _ in range(3))
    ours = td.kernel(MASKED_ROW, outputs=("O", "L"), backend="c")(Q, K, V)
    truth = td.kernel(MASKED_ROW, outputs=("O", "L"), backend="reference")(Q, K, V)
    for got, want in zip(ours, truth):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)
    # The mask bounds the loops: row 0 sums over nothing (O = 0, L = -inf), and no other row
    # sees a NaN; its gradients are finite too.
    assert np.asarray(ours[1])[0] == -np.inf and (np.asarray(ours[0])[0] == 0).all()
    assert np.isfinite(np.asarray(ours[0])).all()
    k = td.kernel(MASKED_ROW, outputs=("O", "L"), backend="c")
    grads = jax.grad(lambda *a: jnp.sum(k(*a)[0] * 1.5), argnums=(0, 1, 2))(Q, K, V)
    assert all(np.isfinite(np.asarray(g)).all() for g in grads)


def test_unfused_programs_keep_the_nan_of_a_fully_masked_row(monkeypatch):
    # Statements run as separate kernels: exp(-inf - (-inf)) is NaN in the masked row only.
    monkeypatch.setenv("TENSORDSL_FUSE", "0")
    rng = np.random.default_rng(2)
    Q, K, V = (rng.normal(size=(5, 3)) for _ in range(3))
    O, L = td.kernel(MASKED_ROW, outputs=("O", "L"), backend="c")(Q, K, V)
    assert np.isnan(np.asarray(O)[0]).all() and np.isfinite(np.asarray(O)[1:]).all()


def test_profile_times_the_nests_a_call_runs(capsys, monkeypatch):
    # Fused: the scores are recomputed inside the one-pass nest of O and L and inside the
    # gradient nests (one per input); the profile times those, not the statements as written.
    k = td.kernel(PROGRAMS_BY_NAME["causal_attention"].source, outputs=("O", "L"), backend="c")
    shapes = {"Q": (1, 2, 24, 4), "K": (1, 2, 24, 4), "scale": (), "V": (1, 2, 24, 4)}
    report = k.profile(shapes, reps=1, wrt=("Q", "K", "scale", "V"))
    assert [t.name for t in report.timings] == ["O+L", "dL", "dQ", "dK", "dscale", "dV"]
    # by default the scalar `scale` (a Python number in most models) is not differentiated
    assert [t.name for t in k.profile(shapes, reps=1).timings] == ["O+L", "dL", "dQ", "dK", "dV"]
    assert all(t.seconds > 0 for t in report.timings)
    assert "dS" not in {t.nest.output for t in report.timings}
    assert [
        t.name
        for t in td.kernel(k.source_text, nograd=("scale", "V")).profile(shapes, reps=1).timings
    ] == ["O+L", "dL", "dQ", "dK"]
    monkeypatch.setenv("TENSORDSL_FUSE", "0")  # as written: the scores stored, dS per reader
    names = [t.name for t in k.profile(shapes, reps=1).timings]
    assert names[:3] == ["S", "L", "O"] and names.count("dS") == 2
    monkeypatch.delenv("TENSORDSL_FUSE")
    source = "C[i] := X[i+k] * W[k]; D[i] := C[i+1] - C[i]"
    assert main(["explain", source, "--shapes", "X=40", "W=3", "--time", "--reps", "1"]) == 0
    out = capsys.readouterr().out
    assert out.index("schedules of statement 2") < out.index("timings (c, float32")


def test_source_with_shapes_shows_the_nests_a_call_runs(capsys, monkeypatch):
    source = PROGRAMS_BY_NAME["causal_attention"].source
    k = td.kernel(source, outputs=("O", "L"), backend="c")
    shapes = {"Q": (1, 2, 24, 4), "K": (1, 2, 24, 4), "scale": (), "V": (1, 2, 24, 4)}
    fused = k.source("c", shapes)
    assert list(fused) == ["O+L", "dL", "dQ", "dK", "dscale", "dV"]
    # O recomputes the scores from Q and K: it reads no stored S.
    assert "in_Q[" in fused["O+L"] and "in_S[" not in fused["O+L"]
    # CUDA runs the one-pass nest as one kernel too (codegen.cuda.attention.online).
    cuda = k.source("cuda", shapes)
    assert list(cuda) == list(fused) and "strategy=online" in cuda["O+L"]
    assert list(k.source("c"))[0] == "S.forward"  # without shapes: the statements as written
    monkeypatch.setenv("TENSORDSL_FUSE", "0")
    unfused = k.source("c", shapes)
    assert list(unfused)[:3] == ["S", "L", "O"] and {"dS", "dS.2"} <= set(unfused)
    monkeypatch.delenv("TENSORDSL_FUSE")
    dims = "1x2x24x4"
    argv = ["explain", source, "--shapes", f"Q={dims}", f"K={dims}", "scale=()", f"V={dims}"]
    assert main([*argv, "--source", "c"]) == 0
    out = capsys.readouterr().out
    assert "--- dQ (c) ---" in out and "--- S.forward (c) ---" not in out


def test_attention_never_materialises_the_scores():
    # Forward and backward under jit: no buffer of the (B, H, T, T) scores anywhere, neither
    # XLA's nor an intermediate of ours; the scores are recomputed inside L's and O's nests
    # and inside every gradient nest.
    from tensordsl.binding.programs import compiled_statements

    case = PROGRAMS_BY_NAME["causal_attention"]
    k = td.kernel(case.source, outputs=("O", "L"), backend="c")
    b, h, t, d = 1, 2, 40, 4
    rng = np.random.default_rng(5)
    Q, K, V = (jnp.asarray(rng.normal(size=(b, h, t, d))) for _ in range(3))
    ct = jnp.asarray(rng.normal(size=(b, h, t, d)))

    def loss(Q, K, V):
        O, L = k(Q, K, 0.5, V)
        return jnp.sum(O * ct) + jnp.sum(L)

    values = {"Q": Q, "K": K, "scale": jnp.asarray(0.5), "V": V}
    assert [n.output for n in compiled_statements(k.program, values, "c")] == ["L", "O"]
    hlo = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))).lower(Q, K, V).compile().as_text()
    assert f"[{b},{h},{t},{t}]" not in hlo
    assert "custom-call" in hlo


@pytest.mark.parametrize("backend", ["reference", "c", "cuda"])
def test_a_stored_intermediate_beyond_memory_is_refused(backend: str, monkeypatch) -> None:
    """Issue 27: a prod intermediate is stored, not recomputed; 200000 x 200000 of them asked
    the allocator for 160 GB (float32). Refused before anything is allocated."""
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    monkeypatch.setattr(program_module, "_memory_bytes", lambda: 16 * 2**30)  # any machine
    rng = np.random.default_rng(27)
    A, B = rng.uniform(0.5, 1.5, (200_000, 2)), rng.uniform(0.5, 1.5, (200_000, 2))
    k = td.kernel("(prod) S[i,j] := A[i,k] * B[j,k]\nY[i] := S[i,j]", backend=backend)
    with pytest.raises(UnsupportedError, match="stores its intermediate 'S' \\(prod\\)"):
        k(A, B)
    small = k(A[:5], B[:4])  # the same program where it fits
    want = np.prod(A[:5, None, :] * B[None, :4, :], axis=2).sum(axis=1)
    np.testing.assert_allclose(np.asarray(small), want, rtol=1e-5)


def test_an_input_read_by_two_stored_statements_gets_one_gradient_nest():
    # Issue 26: RMSNorm reads X in both statements and stores ms (nothing recomputed). The
    # gradient of X is one nest (dY * g * r + 2 * dms * X / F), not one nest per statement
    # and XLA's sum of the two (two more passes over X's size).
    source = "ms[b] := X[b,f]^2 / F; Y[b,f] := X[b,f] * rsqrt(ms[b] + eps) * g[f]"
    k = td.program(source, backend="c")
    rng = np.random.default_rng(26)
    X, g, ct = rng.normal(size=(7, 5)), rng.normal(size=5), rng.normal(size=(7, 5))
    F, eps = 5.0, 1e-5

    def loss(X, g):
        return jnp.sum(k(X, F, eps, g) * ct)

    jaxpr = str(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(X, g))
    assert jaxpr.count("nest=dX[") == 1, jaxpr
    assert "add_any" not in jaxpr
    dX, dg = jax.jit(jax.grad(loss, argnums=(0, 1)))(X, g)
    r = 1 / np.sqrt((X**2).sum(1, keepdims=True) / F + eps)  # float64 reference
    dms = -0.5 * r**3 * (ct * X * g).sum(1, keepdims=True)
    np.testing.assert_allclose(np.asarray(dX), ct * g * r + 2 * dms * X / F, rtol=1e-9)
    np.testing.assert_allclose(np.asarray(dg), (ct * X * r).sum(0), rtol=1e-9)
