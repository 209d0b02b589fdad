"""The "xla" strategy: contractions (alone, or with a bias, a mask or elementwise weights) run
as XLA's dot, everything else as kernels."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.ir.contraction import contraction, xla_plan
from codegen.ir.nest import Reduce
from codegen.passes import grad
from tensordsl.backends.cpu_dots import CpuDotForm, cpu_dot_form, merged_runs
from tensordsl.backends.reference import evaluate
from tensordsl.backends.xla_dot import run_xla
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse


def _nest(source, **options):
    return lower(parse(source), **options).nest


@pytest.mark.parametrize(
    ("source", "subscripts"),
    [
        ("C[i,j] := A[i,k] * B[k,j]", "ac,cb->ab"),
        ("S[h,i,j] := Q[h,i,d] * K[h,j,d] * scale", "abd,acd->abc"),
        ("Y[b,o] := 0.5 * X[b,c] * W[o,c]", "ac,bc->ab"),
        ("G[i,j] := A[i,k] * A[j,k]", "ac,bc->ab"),
        ("Y[i] := X[i,k] * W[k]", "ab,b->a"),  # W is reused for every i
    ],
)
def test_pure_contractions_are_recognised(source, subscripts):
    found = contraction(_nest(source))
    assert found is not None and found.subscripts == subscripts


@pytest.mark.parametrize(
    "source",
    [
        "Y[i] := X[i,k]",  # one tensor: a sum, not a dot
        "C[i,j] := A[i,k] * B[k,j] + 1",  # not a product
        "Y[i] := X[i+k] * W[k]",  # shifted access
        "C[i,j] := exp(A[i,k]) * B[k,j]",  # a function of an access
        "D[i] := A[i,i,k] * B[k]",  # an index twice in one access
        "C[i,j] := A[i,j] * B[i,j]",  # nothing reduced
        "D[i] := A[i,k] * B[i,k]",  # row dot products: nothing reused, a kernel's pass
    ],
)
def test_other_nests_are_not_contractions(source):
    assert contraction(_nest(source)) is None


def test_row_dot_products_run_as_kernels_even_with_a_factor_per_row():
    # Softmax's `dZ[i] = sum_j -dP[i,j]*P[i,j]/Z[i]`: as a prologue contraction it ran as
    # one small XLA dot per row; a matrix-vector product keeps XLA's dot.
    assert xla_plan(_nest("D[i] := A[i,k] * B[i,k] / c[i]")) is None
    assert xla_plan(_nest("D[i] := A[i,k] * exp(B[k])")) is not None


def _hlo(f, *args):
    return jax.jit(f).lower(*args).as_text()


def test_matmul_and_its_gradients_run_as_xla_dots(monkeypatch):
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(5, 7)), rng.normal(size=(7, 3))
    k = td.kernel("C[i,j] := A[i,k] * B[k,j] * s", backend="c")

    def loss(A, B):
        return jnp.sum(k(A, B, 0.5) * jnp.arange(15.0).reshape(5, 3))

    np.testing.assert_allclose(k(A, B, 0.5), 0.5 * A @ B, rtol=1e-12)
    got = jax.grad(loss, argnums=(0, 1))(A, B)
    want = jax.grad(lambda A, B: jnp.sum(0.5 * A @ B * jnp.arange(15.0).reshape(5, 3)), (0, 1))(
        A, B
    )
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    text = _hlo(jax.grad(loss, argnums=(0, 1)), A, B)
    assert "dot" in text and "custom_call" not in text
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    assert "custom_call" in _hlo(jax.grad(loss, argnums=(0, 1)), A, B)
    np.testing.assert_allclose(jax.grad(loss, argnums=(0, 1))(A, B)[0], want[0], rtol=1e-12)


def test_a_narrowed_range_falls_back_to_the_kernel():
    rng = np.random.default_rng(1)
    A, B = rng.normal(size=(4, 6)), rng.normal(size=(6, 3))
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", ranges={"k": range(1, 5)}, backend="c")
    np.testing.assert_allclose(k(A, B), A[:, 1:5] @ B[1:5], rtol=1e-12)
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", ranges={"k": 4}, backend="c")
    np.testing.assert_allclose(k(A, B), A[:, :4] @ B[:4], rtol=1e-12)


def test_a_loop_order_asks_for_the_generated_kernel():
    rng = np.random.default_rng(2)
    A, B = rng.normal(size=(4, 6)), rng.normal(size=(6, 3))
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", loop_order=("j", "i"), backend="c")
    assert "custom_call" in _hlo(k, A, B)
    np.testing.assert_allclose(k(A, B), A @ B, rtol=1e-12)


def test_vmapped_and_half_precision_contractions():
    rng = np.random.default_rng(3)
    A, B = rng.normal(size=(3, 4, 6)), rng.normal(size=(6, 5))
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", backend="c")
    np.testing.assert_allclose(jax.vmap(k, (0, None))(A, B), A @ B, rtol=1e-12)
    half = k(A[0].astype(jnp.bfloat16), B.astype(jnp.bfloat16))
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(half, np.float64), A[0] @ B, rtol=3e-2, atol=3e-2)


def test_explain_shows_the_strategy():
    text = td.kernel("C[i,j] := A[i,k] * B[k,j]").explain()
    assert "gradient of A" in text  # the nests themselves do not depend on the strategy
    from tensordsl.explain.nests import schedule_lines

    lines = schedule_lines(_nest("C[i,j] := A[i,k] * B[k,j]"))
    assert any("XLA's dot" in line for line in lines)


# ------------------------------------------------------------ contractions with companions


@pytest.mark.parametrize(
    ("source", "dots"),
    [
        ("Y[b,o] := X[b,f] * W[f,o] + c[o]", [True, False]),  # bias, added once
        ("S[i,j] := Q[i,d] * K[j,d] + B[i,j]", [True, False]),  # scores plus a bias
        ("Y[b,o] := X[b,f] * W[f,o] + c[o] * (f == 0)", [True, False]),  # bias at f = 0
        ("S[i,j] := where(j <= i, Q[i,e] * K[j,e] * s, -1e9)", [False]),  # masked scores
        ("S[h,i,j] := where(i - j <= 2, Q[h,i,e] * K[h,j,e], -inf)", [False]),
    ],
)
def test_contractions_with_elementwise_companions_have_a_plan(source, dots):
    plan = xla_plan(_nest(source))
    assert plan is not None and [d is not None for d in plan.dots] == dots


@pytest.mark.parametrize(
    "source",
    [
        "Y[i] := exp(X[i,k]) * W[k]",  # a function of an access inside the sum
        "S[i,j] := where(j <= e, Q[i,e] * K[j,e], 0)",  # the condition reads the summed index
        "Y[b,o] := X[b,f] * W[f,o] + c[o] * (f <= 5)",  # six reduced points: a loop
        "(max) Y[i] := A[i,k] * B[k]",  # not a sum
        "Y[i] := X[i] + c[i]",  # no dot at all
    ],
)
def test_nests_that_need_a_loop_have_no_plan(source):
    assert xla_plan(_nest(source)) is None


def test_tangent_nests_of_contractions_run_as_dots():
    """A tangent nest adds one product per perturbed factor (`Q*tK + K*tQ`); grouped by the
    tensors they contract, the rest factored out, each group is one einsum
    (`codegen.ir.summands`), as in jnp's own forward mode: no kernel runs."""
    from codegen.passes import jvp

    scores = jvp.tangent(_nest("S[h,i,j] := Q[h,i,d] * K[h,j,d] * s"), ("Q", "K")).nest
    plan = xla_plan(scores)
    assert plan is not None and len(plan.dots) == 2 and all(plan.dots)
    source = "O[i,e] := exp(S[i,j] - L[i]) * V[j,e]"
    weighted = jvp.tangent(_nest(source), ("S", "L", "V")).nest
    plan = xla_plan(weighted)  # tV * exp(S - L), and V * exp(S - L) * (tS - tL)
    assert plan is not None and plan.origins == (0, 0)
    assert [len(d.tensors) for d in plan.dots] == [1, 1]
    rng = np.random.default_rng(12)
    args = (_random(rng, 6, 5), _random(rng, 6), _random(rng, 5, 4))
    slopes = (_random(rng, 6, 5), _random(rng, 6), _random(rng, 5, 4))
    k = td.kernel(source, backend="c")

    def twin(S, L, V):
        return jnp.exp(S - L[:, None]) @ V

    got = jax.jvp(k, args, slopes)
    want = jax.jvp(twin, args, slopes)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12)
    assert "custom_call" not in _hlo(lambda *a: jax.jvp(k, a, slopes)[1], *args)


def test_a_sum_of_products_that_are_no_contractions_keeps_its_kernel():
    assert xla_plan(_nest("Y[i] := A[i,k] * B[k] + exp(A[i,k]) * C[k]")) is None
    assert xla_plan(_nest("Y[i] := A[i,k] * (B[k] + exp(A[i,k]) * C[k])")) is None


def _random(rng, *shape):
    return rng.normal(size=shape)


@pytest.mark.parametrize("bias", ["c[u]", "c[u] * (f == 0)"])
def test_contraction_plus_bias_runs_as_a_dot_with_its_gradients(bias):
    rng = np.random.default_rng(4)
    N, W, c = _random(rng, 2, 5, 6), _random(rng, 6, 7), _random(rng, 7)
    k = td.kernel(f"H[b,t,u] := N[b,t,f] * W[f,u] + {bias}", backend="c")
    np.testing.assert_allclose(k(N, W, c), N @ W + c, rtol=1e-12)
    assert "custom_call" not in _hlo(k, N, W, c)
    weights = _random(rng, 2, 5, 7)

    def loss(N, W, c):
        return jnp.sum(k(N, W, c) * weights)

    got = jax.grad(loss, argnums=(0, 1, 2))(N, W, c)
    want = (weights @ W.T, np.einsum("btf,btu->fu", N, weights), weights.sum((0, 1)))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12)
    batched = jax.vmap(k, (None, 0, None))(N, np.stack([W, 2 * W]), c)
    np.testing.assert_allclose(batched, np.stack([N @ W + c, N @ (2 * W) + c]), rtol=1e-12)
    half = k(*(jnp.asarray(x, jnp.bfloat16) for x in (N, W, c)))
    assert half.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(half, np.float64), N @ W + c, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("masked", ["-1e9", "-inf"])
def test_masked_scores_run_as_a_dot(masked):
    rng = np.random.default_rng(5)
    Q, K = _random(rng, 3, 6, 4), _random(rng, 3, 8, 4)
    source = f"S[h,i,j] := where(j <= i, Q[h,i,e] * K[h,j,e] * s, {masked})"
    k = td.kernel(source, backend="c")
    got = np.asarray(k(Q, K, 0.25))
    scores = 0.25 * np.einsum("hie,hje->hij", Q, K)
    causal = np.arange(8)[None, None, :] <= np.arange(6)[None, :, None]
    np.testing.assert_allclose(got, np.where(causal, scores, 4 * float(masked)), rtol=1e-12)
    assert "custom_call" not in _hlo(lambda Q, K: k(Q, K, 0.25), Q, K)
    # The same nest as the generated kernel agrees.
    kernel = td.kernel(source, backend="c", loop_order=("h", "i", "j", "e"))
    np.testing.assert_allclose(kernel(Q, K, 0.25), got, rtol=1e-12)


def test_an_empty_summed_range_gives_zeros_not_nan():
    rng = np.random.default_rng(6)
    Q, K = _random(rng, 4, 0), _random(rng, 5, 0)
    k = td.kernel("S[i,j] := where(j <= i, Q[i,e] * K[j,e], -inf)", backend="c")
    np.testing.assert_array_equal(k(Q, K), np.zeros((4, 5)))


def test_attention_weight_gradient_runs_its_nested_contraction_as_a_dot():
    """dS = where(j <= i, exp(S - L) * sum_e dO*V, 0): an elementwise term over a nested sum."""
    source = "O[b,i,e] := where(j <= i, exp(S[b,i,j] - L[b,i]), 0) * V[b,j,e]"
    k = td.kernel(source, backend="c")
    nest = _nest(source)
    gradient = grad.gradient(nest, "S").nest
    plan = xla_plan(gradient)
    assert plan is not None and plan.dots == (None,)
    rng = np.random.default_rng(7)
    S, L, V = _random(rng, 2, 5, 5), _random(rng, 2, 5), _random(rng, 2, 5, 3)
    dO = _random(rng, 2, 5, 3)
    causal = np.arange(5)[None, None, :] <= np.arange(5)[None, :, None]
    weights = np.where(causal, np.exp(S - L[..., None]), 0)
    want = weights * np.einsum("bie,bje->bij", dO, V)
    np.testing.assert_allclose(jax.vjp(lambda S: k(S, L, V), S)[1](dO)[0], want, rtol=1e-12)
    values = {"S": S, "L": L, "V": V, "dO": dO}
    operands = [jnp.asarray(values[op.name]) for op in gradient.operands]
    shapes = {"S": S.shape, "L": L.shape, "V": V.shape, "dO": dO.shape, "O": dO.shape}
    shapes[gradient.output] = S.shape
    got = run_xla(gradient, operands, shapes, jnp.float64)
    np.testing.assert_allclose(got, want, rtol=1e-12)
    np.testing.assert_allclose(
        evaluate(gradient, dict(zip(gradient.operand_names, operands)), shapes), want, rtol=1e-12
    )


@pytest.mark.parametrize("part", [range(1, 4), 4])
def test_a_nested_contraction_over_part_of_an_axis_falls_back_to_the_kernel(part):
    rng = np.random.default_rng(8)
    Q, K = _random(rng, 4, 6), _random(rng, 5, 6)
    k = td.kernel("S[i,j] := where(j <= i, Q[i,e] * K[j,e], -1e9)", ranges={"e": part}, backend="c")
    used = slice(1, 4) if isinstance(part, range) else slice(0, part)
    scores = Q[:, used] @ K[:, used].T
    causal = np.arange(5)[None, :] <= np.arange(4)[:, None]
    masked = -1e9 * len(range(6)[used])
    np.testing.assert_allclose(k(Q, K), np.where(causal, scores, masked), rtol=1e-12)
    assert "custom_call" in _hlo(k, Q, K)


def test_a_nested_matrix_vector_product_stays_a_kernel():
    """LayerNorm's mean gradient sums dN[b,t,f] * g[f]: memory-bound, no dot to win."""
    nest = _nest("N[b,t,f] := (X[b,t,f] - M[b,t]) * rsqrt(V[b,t] + eps) * g[f] + beta[f]")
    gradient = grad.gradient(nest, "M").nest
    assert gradient.terms[0].body.atoms(Reduce)
    assert xla_plan(gradient) is None


def _dot_precisions(f, *args):
    """The precision of every dot_general in the lowered `jit(f)`."""
    return set(re.findall(r"dot_general .*precision = \[(\w+), \w+\]", _hlo(f, *args)))


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        (None, "DEFAULT"),  # jnp's default, as the same einsum written in jnp
        ("default", "DEFAULT"),
        ("high", "HIGH"),
        ("HIGHEST", "HIGHEST"),
        (jax.lax.Precision.HIGHEST, "HIGHEST"),
    ],
)
def test_precision_reaches_the_dots_of_the_forward_and_every_gradient(precision, expected):
    rng = np.random.default_rng(3)
    A, B = rng.normal(size=(5, 7)), rng.normal(size=(7, 3))
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", backend="c", precision=precision)

    def loss(A, B):
        return jnp.sum(jnp.sin(k(A, B)))

    f = jax.value_and_grad(loss, (0, 1))
    text = _hlo(f, A, B)
    assert text.count("dot_general") == 3  # forward, dA, dB: all dots, no kernel
    assert _dot_precisions(f, A, B) == {expected}
    value, (dA, dB) = jax.jit(f)(A, B)
    ct = np.cos(A @ B)
    np.testing.assert_allclose(value, np.sum(np.sin(A @ B)), rtol=1e-12)
    np.testing.assert_allclose(dA, ct @ B.T, rtol=1e-12)
    np.testing.assert_allclose(dB, A.T @ ct, rtol=1e-12)


def test_default_precision_follows_jax_default_matmul_precision():
    rng = np.random.default_rng(4)
    A, B = rng.normal(size=(4, 6)), rng.normal(size=(6, 2))
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", backend="c")
    with jax.default_matmul_precision("highest"):
        assert _dot_precisions(k, A, B) == {"HIGHEST"}
    assert _dot_precisions(k, A, B) == {"DEFAULT"}


def test_program_precision_reaches_its_dots_and_gradients():
    rng = np.random.default_rng(5)
    A, B = rng.normal(size=(4, 6)), rng.normal(size=(6, 3))
    k = td.kernel(
        "C[i,j] := A[i,k] * B[k,j]\nD[i,j] := C[i,j] * 2", backend="c", precision="highest"
    )
    f = jax.value_and_grad(lambda A, B: jnp.sum(jnp.sin(k(A, B))), (0, 1))
    assert _dot_precisions(f, A, B) == {"HIGHEST"}
    value, (dA, _) = jax.jit(f)(A, B)
    np.testing.assert_allclose(value, np.sum(np.sin(2 * A @ B)), rtol=1e-12)
    np.testing.assert_allclose(dA, 2 * np.cos(2 * A @ B) @ B.T, rtol=1e-12)


@pytest.mark.parametrize(
    ("precision", "message"),
    [
        ("hihgest", r"unknown precision 'hihgest'(.|\n)*did you mean 'highest'\?"),
        (3, r"unknown precision 3(.|\n)*None, 'default', 'high', 'highest' or a jax.lax"),
        (("highest", "highest"), r"unknown precision \('highest', 'highest'\)"),
    ],
)
def test_a_bad_precision_is_named(precision, message):
    for source in ("C[i,j] := A[i,k] * B[k,j]", "C[i,j] := A[i,k] * B[k,j]; D[i] := C[i,j]"):
        with pytest.raises(td.UnknownNameError, match=message):
            td.kernel(source, precision=precision)


SIZES = {"h": 2, "i": 48, "j": 40, "d": 24}


@pytest.mark.parametrize(
    ("subscripts", "form"),
    [
        # both operands contract their middle axis (attention's dK): the left one copied
        ("hij,hid->hjd", ("hji,hid->hjd", (0, 1), (0, 2, 1))),
        ("hid,hij->hjd", ("hji,hid->hjd", (1, 0), (0, 2, 1))),
        # the result's order picks which operand is the left one
        ("hij,hid->hdj", ("hdi,hij->hdj", (1, 0), (0, 2, 1))),
        # swapping the operands is enough: no copy
        ("hjd,hid->hij", ("hid,hjd->hij", (1, 0), None)),
        ("ij,i->j", ("i,ij->j", (1, 0), None)),
        # already in the fast form, or no dot
        ("hij,hjd->hid", None),
        ("hid,hjd->hij", None),
        ("ihd,jhd->hij", None),
        ("ij,ij->ij", None),
        ("ij,jk,kl->il", None),
        # over two axes: XLA merges them into one, transposing as it must (a weight gradient)
        ("hij,hid->jd", None),
        # a copy that each element of the other operand's free axes would not reuse enough
        ("ij,ik->jk", None),
    ],
)
def test_cpu_dot_form(subscripts, form):
    sizes = {**SIZES, "k": 8, "l": 5}
    found = cpu_dot_form(subscripts, sizes)
    assert found == (None if form is None else CpuDotForm(*form)), found


@pytest.mark.parametrize(
    ("source", "reference", "copied"),
    [
        ("dK[h,j,d] := A[h,i,j] * Q[h,i,d]", "hij,hid->hjd", True),
        ("dK[h,j,d] := Q[h,i,d] * A[h,i,j]", "hid,hij->hjd", True),
        ("O[h,i,d] := A[h,i,j] * Q[h,j,d]", "hij,hjd->hid", False),
    ],
)
def test_a_transposed_matrix_product_is_given_to_xla_as_a_copy_on_the_cpu(
    source, reference, copied
):
    """XLA's CPU dot folds transpositions into the dot and runs its fast kernel only where
    the left operand contracts its last axis; a product of two operands that both contract
    their middle axis gets one of them copied behind an optimisation barrier."""
    rng = np.random.default_rng(5)
    k = td.kernel(source, backend="c")
    shapes = {"A": (2, 48, 40), "Q": (2, 48 if copied else 40, 24)}
    values = {name: rng.uniform(-1, 1, shape) for name, shape in shapes.items()}
    args = [values[name] for name in k.inputs]
    want = np.einsum(reference, *args)
    np.testing.assert_allclose(np.asarray(k(*args)), want, rtol=1e-12)
    text = _hlo(k, *args)
    assert "custom_call" not in text
    assert ("optimization_barrier" in text) == copied, text


def test_a_prologue_left_of_a_dot_is_materialised_on_the_cpu():
    """Attention's `dV[j,e] = sum_i exp(S[i,j] - L[i]) * dO[i,e]`: the prologue is evaluated
    on a transposed view of S, which XLA would fold into its dot as well."""
    rng = np.random.default_rng(6)
    k = td.kernel("dV[h,j,e] := exp(S[h,i,j] - L[h,i]) * dO[h,i,e]", backend="c")
    S, L, dO = (rng.uniform(-1, 1, s) for s in ((2, 48, 40), (2, 48), (2, 48, 24)))
    args = [{"S": S, "L": L, "dO": dO}[name] for name in k.inputs]
    want = np.einsum("hij,hie->hje", np.exp(S - L[..., None]), dO)
    np.testing.assert_allclose(np.asarray(k(*args)), want, rtol=1e-12)
    text = _hlo(k, *args)
    assert "custom_call" not in text and "optimization_barrier" in text
    # over two contracted axes XLA transposes as it must, inside the prologue: no barrier
    k = td.kernel("dW[u,o] := tanh(A[b,t,u]) * dY[b,t,o]", backend="c")
    A, dY = rng.uniform(-1, 1, (2, 12, 20)), rng.uniform(-1, 1, (2, 12, 24))
    args = [{"A": A, "dY": dY}[name] for name in k.inputs]
    want = np.einsum("btu,bto->uo", np.tanh(A), dY)
    np.testing.assert_allclose(np.asarray(k(*args)), want, rtol=1e-12)
    text = _hlo(k, *args)
    assert "custom_call" not in text and "optimization_barrier" not in text


@pytest.mark.parametrize(
    ("subscripts", "shapes", "merged"),
    [
        # a projection whose free axes stay together: one matrix product, one transposition
        ("btf,fshe->sbhte", ((4, 6, 8), (8, 3, 2, 5)), ("bf,fs->bs", (24, 8), (8, 30))),
        # contracted axes stay as they are: XLA's own transposed copy of a weight gradient's
        # operand compiles quicker than one made apart behind a barrier
        ("btf,btu->fu", None, None),
        # the free axes of an input gradient's two operands
        ("heo,bto->bhte", ((4, 3, 8), (2, 5, 8)), ("ho,bo->bh", (12, 8), (10, 8))),
        # batch axes stay as they are (XLA's dot takes several)
        ("bhie,bhje->bhij", None, None),
        ("bhtf,bfu->bhtu", ((2, 3, 4, 5), (2, 5, 6)), ("bhf,bfu->bhu", (2, 12, 5), (2, 5, 6))),
        # nothing stays together: left to XLA as written
        ("bhte,heo->bto", None, None),
        ("ik,kj->ij", None, None),
        # not a two-operand product of distinct axes
        ("ii,ij->j", None, None),
        ("ij,jk,kl->il", None, None),
        ("ijk,j->i", None, None),
    ],
)
def test_runs_of_axes_that_stay_together_are_merged(subscripts, shapes, merged):
    parts = subscripts.split("->")[0].split(",")
    shapes = shapes or tuple(tuple(range(2, 2 + len(p))) for p in parts)
    runs = merged_runs(subscripts, shapes)
    if merged is None:
        assert runs is None
        return
    assert (runs.subscripts, *runs.shapes) == merged


@pytest.mark.parametrize(
    ("source", "reference", "shapes"),
    [
        ("P[s,b,t,e] := N[b,t,f] * W[f,s,e]", "btf,fse->sbte", {"N": (3, 5, 8), "W": (8, 2, 6)}),
        ("Y[b,t,o] := X[b,t,f] * W[f,o] * 0.5", "btf,fo->bto", {"X": (3, 5, 8), "W": (8, 6)}),
        ("dA[b,h,t,e] := W[h,e,o] * G[b,t,o]", "heo,bto->bhte", {"W": (2, 3, 6), "G": (3, 5, 6)}),
    ],
)
def test_axes_that_stay_together_reach_xla_as_one_axis_on_the_cpu(source, reference, shapes):
    """XLA's CPU dot copies an operand whose free axes are several (a transposed copy per dot,
    a loop of its own in every call); given as one axis each, by reshapes that move no data,
    the dot takes its operands as they are."""
    rng = np.random.default_rng(7)
    k = td.kernel(source, backend="c")
    values = {name: rng.uniform(-1, 1, shape) for name, shape in shapes.items()}
    args = [values[name] for name in k.inputs]
    want = np.einsum(reference, *args) * (0.5 if "0.5" in source else 1.0)
    np.testing.assert_allclose(np.asarray(k(*args)), want, rtol=1e-12)
    text = _hlo(k, *args)
    assert "custom_call" not in text
    (dot,) = re.findall(r"stablehlo.dot_general .*", text)
    assert re.search(r"contracting_dims = \[\d\] x \[\d\]", dot), dot
    assert re.search(r"\(tensor<\d+x\d+xf64>, tensor<\d+x\d+xf64>\)", dot), dot
    # and its gradients: each a dot, the same values as jnp's
    cotangent = rng.uniform(-1, 1, want.shape)

    def loss(*args):
        return jnp.sum(k(*args) * cotangent)

    def loss_jnp(*args):
        return jnp.sum(jnp.einsum(reference, *args) * (0.5 if "0.5" in source else 1.0) * cotangent)

    argnums = tuple(range(len(args)))
    for got, expected in zip(
        jax.grad(loss, argnums)(*args), jax.grad(loss_jnp, argnums)(*args), strict=True
    ):
        np.testing.assert_allclose(got, expected, rtol=1e-12)
