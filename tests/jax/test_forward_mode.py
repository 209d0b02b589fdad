"""Forward mode: jvp, linearize, jacfwd, hessian and forward-over-reverse products.

A kernel's tangent is its tangent nest (`codegen.passes.jvp`), run like any nest. Checked
against float64 central differences of the corpus's numpy references, against the gradient
nests (`<ct, jvp(t)> == <vjp(ct), t>`), and against jnp twins under jit and vmap.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tests.corpus import CORPUS, CORPUS_BY_NAME, make_inputs
from tests.gpu.test_cuda_backend import EMULATED, REASON
from tests.sampling import EXHAUSTIVE

SMOOTH = [c for c in CORPUS if c.differentiable and not c.ties]
DIFFERENTIABLE = [c for c in CORPUS if c.differentiable]
#: What the brief of forward mode names: each reduction, a shifted access, a scalar input, an
#: input read twice; run through compiled C too.
NAMED = (
    "matmul",
    "row_max",
    "row_min",
    "logsumexp_affine",
    "prod_rows",
    "prod_with_zero",
    "conv1d_valid",
    "scalar_affine",
    "matmul_self",
)


def kernel(case, backend):
    return td.kernel(case.source, reduce=case.reduce, ranges=case.ranges, backend=backend)


def float_inputs(case, seed=0):
    """The case's inputs; the float ones as float64 arrays (scalars 0-d), their names."""
    inputs = make_inputs(case, seed)
    names = [n for n in case.args if not case.args[n].integer]
    values = {n: (np.asarray(v, np.float64) if n in names else v) for n, v in inputs.items()}
    return values, names


def as_function(call, case, values, names):
    """`call` as a function of the float inputs only (integer ones held fixed)."""

    def f(*floats):
        merged = {**values, **dict(zip(names, floats))}
        return call(*(merged[n] for n in case.args))

    return f


def random_like(values, names, seed):
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, np.shape(values[n])) for n in names]


def central_difference(case, values, names, tangents, eps=1e-6):
    def at(step):
        moved = {**values, **{n: values[n] + step * t for n, t in zip(names, tangents)}}
        return case.expected(**{n: moved[n] for n in case.args})

    return (at(eps) - at(-eps)) / (2 * eps)


@pytest.mark.parametrize("case", SMOOTH, ids=lambda c: c.name)
def test_jvp_matches_central_differences_reference(case):
    """Every differentiable corpus kernel: jvp against float64 numpy finite differences."""
    values, names = float_inputs(case)
    tangents = random_like(values, names, seed=1)
    f = as_function(kernel(case, "reference"), case, values, names)
    output, slope = jax.jvp(f, [values[n] for n in names], tangents)
    np.testing.assert_allclose(np.asarray(output), case.expected(**values), rtol=1e-10, atol=1e-12)
    expected = central_difference(case, values, names, tangents)
    np.testing.assert_allclose(np.asarray(slope), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=lambda c: c.name)
def test_jvp_is_the_transpose_of_the_gradient_nests(case):
    """<ct, J t> == <J^T ct, t>: the tangent nest and the gradient nests agree, ties included
    (both pick the first winning position of a max/min)."""
    values, names = float_inputs(case, seed=2)
    tangents = random_like(values, names, seed=3)
    f = as_function(kernel(case, "reference"), case, values, names)
    output, slope = jax.jvp(f, [values[n] for n in names], tangents)
    cotangent = np.random.default_rng(4).uniform(-1, 1, np.shape(output))
    gradients = jax.vjp(f, *[values[n] for n in names])[1](jnp.asarray(cotangent))
    forward = float(np.sum(cotangent * np.asarray(slope)))
    reverse = sum(float(np.sum(np.asarray(g) * t)) for g, t in zip(gradients, tangents))
    np.testing.assert_allclose(forward, reverse, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", NAMED)
@pytest.mark.parametrize("backend", ["reference", "c"])
def test_jvp_jit_and_linearize(name, backend):
    """jvp under jit and linearize's linear function, against the reference back end's jvp."""
    case = CORPUS_BY_NAME[name]
    values, names = float_inputs(case, seed=5)
    tangents = random_like(values, names, seed=6)
    primals = [values[n] for n in names]
    f = as_function(kernel(case, backend), case, values, names)
    truth = as_function(kernel(case, "reference"), case, values, names)
    expected = central_difference(case, values, names, tangents)
    want_out, want = jax.jvp(truth, primals, tangents)
    np.testing.assert_allclose(np.asarray(want), expected, rtol=1e-5, atol=1e-6)
    out, got = jax.jit(lambda p, t: jax.jvp(f, p, t))(primals, tangents)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want_out), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)
    out, linear = jax.linearize(f, *primals)
    np.testing.assert_allclose(np.asarray(linear(*tangents)), np.asarray(want), rtol=1e-10)
    doubled = [2 * t for t in tangents]
    np.testing.assert_allclose(
        np.asarray(linear(*doubled)), 2 * np.asarray(want), rtol=1e-10, atol=1e-12
    )


@pytest.mark.parametrize("name", NAMED)
@pytest.mark.parametrize("backend", ["reference", "c"])
def test_jacfwd_equals_jacrev(name, backend):
    """jacfwd (vmap of the tangent nest over the tangents) equals jacrev (gradient nests)."""
    case = CORPUS_BY_NAME[name]
    values, names = float_inputs(case, seed=7)
    f = as_function(kernel(case, backend), case, values, names)
    argnums = tuple(range(len(names)))
    primals = [values[n] for n in names]
    forward = jax.jit(jax.jacfwd(f, argnums))(*primals)
    reverse = jax.jacrev(f, argnums)(*primals)
    for a, b in zip(forward, reverse):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_vmap_of_jvp_batched_primals_and_tangents():
    """vmap over primals and tangents (and tangents only) of the C kernel's jvp."""
    k = td.kernel("Y[i] := X[i+k] * W[k]", backend="c")
    rng = np.random.default_rng(8)
    X, tX = rng.uniform(-1, 1, (4, 9)), rng.uniform(-1, 1, (4, 9))
    W, tW = rng.uniform(-1, 1, 3), rng.uniform(-1, 1, (4, 3))

    def truth(x, w):
        return jnp.stack([x[i : i + 3] @ w for i in range(7)])

    def jvp(f):
        return jax.vmap(lambda x, w, tx, tw: jax.jvp(f, (x, w), (tx, tw))[1], (0, None, 0, 0))

    np.testing.assert_allclose(
        np.asarray(jvp(k)(X, W, tX, tW)), np.asarray(jvp(truth)(X, W, tX, tW)), rtol=1e-12
    )
    tangent_only = jax.vmap(lambda tw: jax.jvp(k, (X[0], W), (tX[0], tw))[1])(tW)
    expected = jax.vmap(lambda tw: jax.jvp(truth, (X[0], W), (tX[0], tw))[1])(tW)
    np.testing.assert_allclose(np.asarray(tangent_only), np.asarray(expected), rtol=1e-12)


VMAPPED_JVP_CASES = {
    "S[i,j] := Q[i,d] * K[j,d]": lambda q, k: q @ k.T,
    # a fused program (two statements read Q): its tangent primitive under vmap
    "S[i,j] := Q[i,d] * K[j,d]; O[i,e] := tanh(S[i,j]) * Q[j,e]": lambda q, k: (
        jnp.tanh(q @ k.T) @ q
    ),
    # float64 attention with its scores stored (T*S under the size of q): fused, centred
    "S[i,j] := Q[i,d] * K[j,d]; (logsumexp) L[i] := S[i,j]; O[i,e] := exp(S[i,j] - L[i]) * "
    "K[j,e]": lambda q, k: jax.nn.softmax(q @ k.T, -1) @ k,
}


@pytest.mark.parametrize("backend", ["reference", "c"])
@pytest.mark.parametrize("source", sorted(VMAPPED_JVP_CASES))
def test_jvp_of_vmap_and_vmap_of_jvp_with_only_some_inputs_perturbed(source, backend):
    """The tangent nest of a batched `tangent_p` is made from one batch element's shapes: made
    from the batched arguments, Q's tangent against a batched K gave a (B, B, T) output, and
    programs under `vmap` of `jvp` or `jvp` of `vmap` gave wrong tangents (float64 attention
    with stored scores off by units)."""
    k = td.kernel(source, backend=backend)
    truth = VMAPPED_JVP_CASES[source]
    rng = np.random.default_rng(21)
    Q, K, tQ = (rng.normal(size=(3, 4, 16)) for _ in range(3))
    want = jax.jit(jax.vmap(lambda q, k, t: jax.jvp(lambda q: truth(q, k), (q,), (t,))[1]))(
        Q, K, tQ
    )
    got = jax.vmap(lambda q, kk, t: jax.jvp(lambda q: k(q, kk), (q,), (t,))[1])(Q, K, tQ)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)
    got = jax.jvp(lambda q: jax.vmap(k)(q, K), (Q,), (tQ,))[1]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)
    unbatched = jax.jvp(lambda q: jax.vmap(k, (0, None))(q, K[0]), (Q,), (tQ,))[1]
    expected = jax.jvp(lambda q: jax.vmap(truth, (0, None))(q, K[0]), (Q,), (tQ,))[1]
    np.testing.assert_allclose(np.asarray(unbatched), np.asarray(expected), rtol=1e-10, atol=1e-12)


HESSIAN_CASES = [
    # (source, reduce, jnp twin of the kernel, shapes)
    ("C[i,j] := A[i,k] * A[k,j]", "sum", lambda A: A @ A, ((4, 4),)),
    ("Y[i] := X[i,k]", "max", lambda X: jnp.max(X, 1), ((3, 5),)),
    ("Y[i] := X[i,k]", "min", lambda X: jnp.min(X, 1), ((3, 5),)),
    ("L[i] := A[i,k] + B[k]", "logsumexp", lambda A, B: jax.nn.logsumexp(A + B, 1), ((3, 5), (5,))),
    ("P[i] := X[i,k]", "prod", lambda X: jnp.prod(X, 1), ((3, 4),)),
    ("Y[i] := tanh(X[i+k] * W[k])", "sum", None, ((8,), (3,))),
    ("Y[i] := alpha * sin(X[i])", "sum", lambda a, X: a * jnp.sin(X), ((), (5,))),
]


def _twin(source, reduce, twin):
    if twin is not None:
        return twin

    def conv(X, W):
        n = X.shape[0] - W.shape[0] + 1
        return jnp.stack([jnp.sum(jnp.tanh(X[i : i + W.shape[0]] * W)) for i in range(n)])

    return conv


@pytest.mark.parametrize(
    "source, reduce, twin, shapes, backend",
    # Every case on C; on the reference back end every other one (`-m exhaustive`: all).
    [
        pytest.param(
            *case,
            backend,
            id=f"{case[1]}:{case[0]}-{backend}",
            marks=(EXHAUSTIVE,) if backend == "reference" and position % 2 else (),
        )
        for position, case in enumerate(HESSIAN_CASES)
        for backend in ("reference", "c")
    ],
)
def test_hessian_and_forward_over_reverse(source, reduce, twin, shapes, backend):
    """hessian (jacfwd of jacrev) and jvp of grad (Hessian-vector products) of a scalar loss
    through the kernel, against the same loss through jnp."""
    k = td.kernel(source, reduce=reduce, backend=backend)
    rng = np.random.default_rng(9)
    args = [rng.uniform(0.5, 1.5, s) * rng.choice([-1, 1], s) for s in shapes]
    vectors = [rng.uniform(-1, 1, s) for s in shapes]
    twin = _twin(source, reduce, twin)

    def loss(f):
        def value(*a):
            y = f(*a)
            return jnp.sum(jnp.sin(y) * jnp.arange(1.0, 1.0 + y.size).reshape(y.shape))

        return value

    argnums = tuple(range(len(args)))
    got = jax.jit(jax.hessian(loss(k), argnums))(*args)
    want = jax.jit(jax.hessian(loss(twin), argnums))(*args)  # eagerly, each op compiles alone
    for row_got, row_want in zip(got, want):
        for a, b in zip(row_got, row_want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)
    hvp_got = jax.jvp(jax.grad(loss(k), argnums), args, vectors)[1]
    hvp_want = jax.jit(lambda a, v: jax.jvp(jax.grad(loss(twin), argnums), a, v)[1])(args, vectors)
    for a, b in zip(hvp_got, hvp_want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)


def test_forward_over_forward():
    """The second directional derivative: jvp of jvp (the tangent nest's own tangent nest)."""
    k = td.kernel("Y[i] := exp(X[i,k] * W[k])", backend="c")
    rng = np.random.default_rng(10)
    X, W = rng.uniform(-1, 1, (3, 4)), rng.uniform(-1, 1, 4)
    tX, tW = rng.uniform(-1, 1, (3, 4)), rng.uniform(-1, 1, 4)

    def twin(X, W):
        return jnp.sum(jnp.exp(X * W), 1)

    def second(f):
        def first(x, w):
            return jax.jvp(f, (x, w), (tX, tW))[1]

        return jax.jvp(first, (X, W), (tX, tW))[1]

    np.testing.assert_allclose(np.asarray(second(k)), np.asarray(second(twin)), rtol=1e-10)


def test_integer_input_and_unperturbed_inputs():
    """An integer input gets a float0 tangent; a zero tangent skips the input's terms."""
    case = CORPUS_BY_NAME["integer_mask"]
    k = kernel(case, "c")
    values, _ = float_inputs(case, seed=11)
    X, M = values["X"], values["M"]
    tX = np.random.default_rng(12).uniform(-1, 1, X.shape)
    _, slope = jax.jvp(lambda x: k(x, M), (X,), (tX,))
    np.testing.assert_allclose(np.asarray(slope), np.sum(tX * M, 1), rtol=1e-12)
    k2 = td.kernel("Y[i] := X[i,j] * W[j]", backend="c")
    W = np.random.default_rng(13).uniform(-1, 1, X.shape[1])
    _, slope = jax.jvp(k2, (X, W), (tX, np.zeros_like(W)))
    np.testing.assert_allclose(np.asarray(slope), tX @ W, rtol=1e-12)


ATTENTION = """
S[h,i,j] := Q[h,i,d] * K[h,j,d] * scale + where(j <= i, 0, -inf)
(logsumexp) L[h,i] := S[h,i,j]
O[h,i,e] := exp(S[h,i,j] - L[h,i]) * V[h,j,e]
"""


def attention_twin(Q, K, scale, V):
    T = Q.shape[1]
    S = jnp.einsum("hid,hjd->hij", Q, K) * scale + jnp.where(jnp.tri(T, dtype=bool), 0, -jnp.inf)
    L = jax.nn.logsumexp(S, -1)
    return jnp.einsum("hij,hje->hie", jnp.exp(S - L[..., None]), V), L


@pytest.mark.parametrize("backend, fuse", [("reference", "1"), ("c", "1"), ("reference", "0")])
def test_program_forward_mode(backend, fuse, monkeypatch):
    """A fused program (the scores inlined as a nested reduction, O+L in one pass on C) and
    the same program unfused: jvp under jit, jacfwd, and forward-over-reverse products."""
    monkeypatch.setenv("TENSORDSL_FUSE", fuse)
    attention = td.kernel(ATTENTION, outputs=("O", "L"), backend=backend)
    rng = np.random.default_rng(14)
    H, T, D = 2, 12, 3  # T > D: the (H, T, T) scores are recomputed, not stored
    Q, K, V = (rng.uniform(-1, 1, (H, T, D)) for _ in range(3))
    tQ, tK, tV = (rng.uniform(-1, 1, (H, T, D)) for _ in range(3))

    def jvp(f):
        return jax.jit(
            lambda q, k, v: jax.jvp(lambda *a: f(*a[:2], 0.5, a[2]), (q, k, v), (tQ, tK, tV))
        )(Q, K, V)

    (got_out, got_slope), (want_out, want_slope) = jvp(attention), jvp(attention_twin)
    for a, b in zip((*got_out, *got_slope), (*want_out, *want_slope)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)

    def loss(f):
        return lambda q, v: jnp.sum(jnp.sin(f(q, K, 0.5, v)[0]))

    got = jax.jvp(jax.grad(loss(attention), (0, 1)), (Q, V), (tQ, tV))[1]
    # The twin jitted: eagerly, each of its ops compiles alone (docs/testing.md).
    want = jax.jit(lambda p, t: jax.jvp(jax.grad(loss(attention_twin), (0, 1)), p, t)[1])(
        (Q, V), (tQ, tV)
    )
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)
    small = Q[:1, :4], K[:1, :4], V[:1, :4]
    got = jax.jacfwd(lambda k: attention(small[0], k, 0.5, small[2])[0])(small[1])
    want = jax.jit(jax.jacrev(lambda k: attention_twin(small[0], k, 0.5, small[2])[0]))(small[1])
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)


def test_program_hessian_and_vmap_of_jvp():
    """hessian of a loss through a fused program, and vmap of its jvp over the tangents."""
    softmax = td.kernel(
        """
        (max) M[i] := X[i,j]
        Z[i] := exp(X[i,j] - M[i])
        P[i,j] := exp(X[i,j] - M[i]) / Z[i]
        """,
        backend="c",
    )
    rng = np.random.default_rng(15)
    X = rng.uniform(-2, 2, (3, 5))
    weights = rng.uniform(-1, 1, (3, 5))

    def loss(f):
        return lambda x: jnp.sum(f(x) ** 2 * weights)

    got = jax.jit(jax.hessian(loss(softmax)))(X)
    want = jax.jit(jax.hessian(loss(lambda x: jax.nn.softmax(x, -1))))(X)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-11)
    tangents = rng.uniform(-1, 1, (4, 3, 5))
    got = jax.vmap(lambda t: jax.jvp(softmax, (X,), (t,))[1])(tangents)
    want = jax.jit(jax.vmap(lambda t: jax.jvp(lambda x: jax.nn.softmax(x, -1), (X,), (t,))[1]))(
        tangents
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_cuda_jvp_jacfwd_and_hvp(monkeypatch):
    """The cuda back end (emulated on the CPU without a GPU): the tangent nests of a sum over
    an input read twice and of a max, against the reference back end."""
    if EMULATED:
        monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    rng = np.random.default_rng(16)
    A, tA = rng.uniform(-1, 1, (4, 4)), rng.uniform(-1, 1, (4, 4))
    for source, reduce in (("C[i,j] := A[i,k] * A[k,j]", "sum"), ("Y[i] := A[i,k]", "max")):
        cuda = td.kernel(source, reduce=reduce, backend="cuda")
        reference = td.kernel(source, reduce=reduce, backend="reference")
        got, want = jax.jvp(cuda, (A,), (tA,)), jax.jvp(reference, (A,), (tA,))
        for a, b in zip(got, want):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(
            np.asarray(jax.jacfwd(cuda)(A)), np.asarray(jax.jacfwd(reference)(A)), rtol=1e-12
        )

        hvp = [
            jax.jvp(jax.grad(lambda x, f=f: jnp.sum(jnp.sin(f(x)))), (A,), (tA,))[1]
            for f in (cuda, reference)
        ]
        np.testing.assert_allclose(np.asarray(hvp[0]), np.asarray(hvp[1]), rtol=1e-12)


def test_program_grad_of_vmap_transposes_the_batched_tangent():
    """grad of a vmapped fused program: the batched tangent primitive is transposed into
    batched gradient nests, an unbatched input's gradient summed over the batch."""
    attention = td.kernel(ATTENTION, outputs=("O", "L"), backend="reference")
    rng = np.random.default_rng(17)
    Qs = rng.uniform(-1, 1, (3, 1, 6, 2))
    K, V = rng.uniform(-1, 1, (1, 6, 2)), rng.uniform(-1, 1, (1, 6, 2))

    def loss(f):
        def value(qs, k, v):
            O, L = jax.vmap(lambda q: f(q, k, 0.5, v))(qs)
            return jnp.sum(jnp.sin(O)) + jnp.sum(L**2)

        return value

    got = jax.jit(jax.grad(loss(attention), (0, 1, 2)))(Qs, K, V)
    want = jax.jit(jax.grad(loss(attention_twin), (0, 1, 2)))(Qs, K, V)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_tangent_that_reads_nothing_batched_and_a_zero_tangent_body():
    """vmap over a primal the tangent nest does not read; a body whose derivative is 0."""
    k = td.kernel("Y[i] := X[i,j] * W[j]", backend="c")
    rng = np.random.default_rng(18)
    Xs, W, tX = rng.uniform(-1, 1, (3, 4, 5)), rng.uniform(-1, 1, 5), rng.uniform(-1, 1, (4, 5))
    got = jax.vmap(lambda x: jax.jvp(lambda x: k(x, W), (x,), (tX,))[1])(Xs)
    np.testing.assert_allclose(np.asarray(got), np.tile(tX @ W, (3, 1)), rtol=1e-12)
    step = td.kernel("Y[i] := (X[i] > 0) + 0*W[i]", backend="c")
    X = rng.uniform(-1, 1, 6)
    _, slope = jax.jvp(step, (X, W[:1].repeat(6)), (np.ones(6), np.ones(6)))
    np.testing.assert_array_equal(np.asarray(slope), np.zeros(6))
    assert not np.any(np.asarray(jax.jacfwd(step)(X, X)))


@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices (conftest.py's XLA_FLAGS)")
def test_program_inside_shard_map():
    """A fused program inside shard_map: grad (the tangent primitive varies over the manual
    axis, so its transpose type-checks) and jvp, against jnp."""
    attention = td.kernel(ATTENTION, outputs=("O", "L"), backend="reference")
    mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    rng = np.random.default_rng(19)
    Q, K, V = (jnp.asarray(rng.uniform(-1, 1, (4, 6, 2))) for _ in range(3))
    specs = jax.sharding.PartitionSpec("d")

    def mapped(f):
        return jax.shard_map(
            lambda q, k, v: f(q, k, 0.5, v),
            mesh=mesh,
            in_specs=(specs,) * 3,
            out_specs=(specs, specs),
        )

    def loss(f):
        return lambda q, k, v: jnp.sum(jnp.sin(mapped(f)(q, k, v)[0]))

    got = jax.jit(jax.grad(loss(attention), (0, 1, 2)))(Q, K, V)
    want = jax.jit(jax.grad(loss(attention_twin), (0, 1, 2)))(Q, K, V)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
    got = jax.jvp(mapped(attention), (Q, K, V), (V, Q, K))[1]
    want = jax.jit(lambda p, t: jax.jvp(mapped(attention_twin), p, t)[1])((Q, K, V), (V, Q, K))
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)


def test_program_nested_vmaps_grad_and_jvp():
    """Two vmap levels batching different inputs (V only by the inner one, K by none): the
    tangent primitive keeps both levels, and grad and jvp agree with jnp."""
    attention = td.kernel(ATTENTION, outputs=("O", "L"), backend="reference")
    rng = np.random.default_rng(20)
    Qs, K = rng.uniform(-1, 1, (2, 3, 1, 5, 2)), rng.uniform(-1, 1, (1, 5, 2))
    Vs = rng.uniform(-1, 1, (3, 1, 5, 2))

    def loss(f):
        def value(qs, k, vs):
            inner = jax.vmap(lambda q, v: f(q, k, 0.5, v))
            O, L = jax.vmap(lambda qq: inner(qq, vs))(qs)
            return jnp.sum(jnp.sin(O)) + jnp.sum(L**2)

        return value

    got = jax.grad(loss(attention), (0, 1, 2))(Qs, K, Vs)
    want = jax.jit(jax.grad(loss(attention_twin), (0, 1, 2)))(Qs, K, Vs)
    for a, b in zip(got, want):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-10, atol=1e-12)
    args = (Qs, K, Vs)
    got = jax.jvp(loss(attention), args, args)[1]
    want = jax.jit(lambda p, t: jax.jvp(loss(attention_twin), p, t)[1])(args, args)
    np.testing.assert_allclose(float(got), float(want), rtol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_jvp_of_a_fused_logsumexp_whose_tangent_nests_a_sum_over_the_same_index(backend):
    """The tangent of `L - G` with L inlined reads `sum_v softmax * dZ`, whose softmax holds
    a second sum over v: two nested loops of one index name, each bound on its own."""
    k = td.program("(logsumexp) L[b,t] := Z[b,t,v]\nloss[b,t] := L[b,t] - G[b,t]", backend=backend)
    rng = np.random.default_rng(5)
    z, g = rng.normal(size=(2, 3, 5)), rng.normal(size=(2, 3))
    dz, dg = rng.normal(size=z.shape), rng.normal(size=g.shape)
    out, tangent = jax.jvp(lambda z, g: k(Z=z, G=g), (z, g), (dz, dg))
    p = np.exp(z - z.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    want = np.log(np.exp(z).sum(-1)) - g
    np.testing.assert_allclose(np.asarray(out, np.float64), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(tangent, np.float64), (p * dz).sum(-1) - dg, rtol=1e-5)


ATTENTION = """
    S[h,i,j] := Q[h,i,d] * K[h,j,d] * scale + where(j <= i, 0, -inf)
    (logsumexp) L[h,i] := S[h,i,j]
    O[h,i,e] := exp(S[h,i,j] - L[h,i]) * V[h,j,e]
"""


@pytest.mark.parametrize("scores", ["stored", "inline"])
def test_attention_program_hessian_vector_product_on_c(scores, monkeypatch):
    """Forward-over-reverse through the causal attention program of docs/language.md on C.
    Differentiated twice, the fusion cost model stores the scores (each tangent nest would
    recompute them and their tangent); forced inline, the second-order nests are the longest
    tiled sources (cases outlined as functions, `codegen.c.tiles.outline`). 40 rows and 35
    columns give interior, edge and partial tiles."""
    from tensordsl.explain.timing import nest_equations, running_equations

    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    k = td.program(
        ATTENTION, backend="c", **({"fuse": {"S": "inline"}} if scores == "inline" else {})
    )

    def twin(Q, K, scale, V):
        s = jnp.einsum("hid,hjd->hij", Q, K) * scale
        s = jnp.where(jnp.tril(jnp.ones(s.shape[1:], bool)), s, -jnp.inf)
        return jnp.einsum("hij,hje->hie", jax.nn.softmax(s, -1), V)

    rng = np.random.default_rng(11)
    shapes = ((2, 40, 16), (2, 40, 16), (2, 40, 35))
    Q, K, V = (rng.uniform(-1, 1, s) for s in shapes)
    vectors = tuple(rng.uniform(-1, 1, s) for s in shapes)
    ct = rng.uniform(-1, 1, (2, 40, 35))

    def loss(f):
        return lambda Q, K, V: jnp.sum(f(Q, K, 0.4, V) * ct)

    hvp = jax.jit(lambda *p: jax.jvp(jax.grad(loss(k), (0, 1, 2)), p, vectors)[1])
    got = hvp(Q, K, V)
    want = jax.jit(lambda *p: jax.jvp(jax.grad(loss(twin), (0, 1, 2)), p, vectors)[1])(Q, K, V)
    ran = {e.params["nest"].output for e in nest_equations(jax.make_jaxpr(hvp)(Q, K, V).jaxpr)}
    assert ("S" in ran) == (scores == "stored"), ran
    once = {
        e.params["nest"].output
        for e in nest_equations(jax.make_jaxpr(jax.grad(loss(k), (0, 1, 2)))(Q, K, V).jaxpr)
    }
    assert "S" not in once, once  # differentiated once: recomputed in one pass
    runs = running_equations(jax.make_jaxpr(hvp)(Q, K, V).jaxpr)
    live = {e.params["nest"].output for e in runs if e.primitive.name == "tensordsl_nest"}
    assert not {"dQ", "dK", "dV"} & live, live  # only their tangents are read
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_a_tangent_term_keeps_its_output_alive_only_where_it_reads_it(backend):
    """`jax.jvp` of `jax.grad` read for its tangents only: the first-order gradient nests are
    dead code once their tangent terms, which do not read them, leave them out; a
    logsumexp's tangent (`sum_j exp(X - L)*tX`) reads its output and keeps it."""
    from tensordsl.binding.private_jax import without_dead_code
    from tensordsl.explain.timing import nest_equations

    def live(function, *args):
        jaxpr = without_dead_code(jax.make_jaxpr(function)(*args).jaxpr)
        found = nest_equations(jaxpr, ("tensordsl_nest", "tensordsl_tangent"))
        return [
            ("t" if e.primitive.name == "tensordsl_tangent" else "") + e.params["nest"].output
            for e in found
        ]

    k = td.kernel("Y[i] := exp(X[i,j]) * W[j]", backend=backend)
    rng = np.random.default_rng(3)
    X, W, tX, tW = (rng.uniform(-1, 1, s) for s in ((3, 4), (4,), (3, 4), (4,)))

    def hvp(f):
        grad = jax.grad(lambda X, W: jnp.sum(jnp.sin(f(X, W))), (0, 1))
        return lambda X, W: jax.jvp(grad, (X, W), (tX, tW))[1]

    found = live(hvp(k), X, W)
    assert found == ["Y", "tY", "tdX", "tdW"], found  # no dX, dW
    got = jax.jit(hvp(k))(X, W)
    want = jax.jit(hvp(lambda X, W: jnp.exp(X) @ W))(X, W)
    for a, b in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-9, atol=1e-11)
    lse = td.kernel("(logsumexp) L[i] := X[i,j]", backend=backend)
    assert live(lambda X: jax.jvp(lse, (X,), (tX,))[1], X) == ["L", "tL"]


def test_derivative_order_counts_the_differentiations_tracing_a_value():
    """What the fusion cost model is told (`tensordsl.binding.programs.run_program`)."""
    from tensordsl.binding.private_jax import derivative_order

    seen = []

    def f(x):
        seen.append(derivative_order([x]))
        return jnp.sum(jnp.sin(x))

    x = jnp.linspace(-1.0, 1.0, 3)
    f(x)
    jax.jit(jax.value_and_grad(f))(x)
    jax.jit(lambda x: jax.jvp(f, (x,), (x,)))(x)
    jax.jit(lambda x: jax.jvp(jax.grad(f), (x,), (x,)))(x)
    jax.jit(jax.hessian(f))(x)
    jax.vmap(jax.grad(jax.grad(lambda s: f(x * s))))(x)
    jax.grad(lambda y: f(x) + y)(1.0)  # x itself is not differentiated
    assert seen == [0, 1, 1, 2, 2, 2, 0]
