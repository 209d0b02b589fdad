"""Index arrays (gathers): `W[tok[b,t], d]`, `A[inds[i] + j]`, `Z[b,t,y[b,t]]`.

Values against float64 numpy on random inputs whose index arrays repeat some rows and never
read others; the table's gradient against `np.add.at` (and central differences), each
element written once by a deterministic segmented sum: bitwise equal across calls, exactly 0
for rows never read. Errors (float/bool index arrays, out-of-range indices eagerly), NaN under
jit, jit/vmap/grad/jvp, every back end (reference, c, cuda emulated) and a partitioned call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl.errors import InputError, RangeError, UnsupportedError
from tests.gpu.test_cuda_backend import EMULATED, REASON

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

BACKENDS = ["reference", "c", "cuda"]


def _backend(name, monkeypatch):
    if name == "cuda":
        if REASON is not None:
            pytest.skip(REASON)
        if EMULATED:
            monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    return name


def _indices(rng, n, shape):
    """Random indices into [0, n) that repeat values and leave some rows unread."""
    values = rng.integers(0, max(n - 2, 1), size=shape)
    values.flat[0] = values.flat[-1]  # at least one repeat
    return values.astype(np.int32)


def _cases(rng):
    """(source, options, inputs, float64 numpy reference) per form of the brief."""
    W = rng.normal(size=(9, 4))
    tok = _indices(rng, 9, (3, 5))
    A = rng.normal(size=(12,))
    inds = _indices(rng, 9, (5,))
    B = rng.normal(size=(4, 5))
    Z = rng.normal(size=(2, 3, 7))
    L = rng.normal(size=(2, 3))
    y = _indices(rng, 7, (2, 3))
    odd = _indices(rng, 6, (5,)) + 1
    return {
        "embedding": (
            "E[b,t,d] := W[tok[b,t], d]",
            {},
            {"W": W, "tok": tok},
            lambda W, tok: W[tok],
        ),
        "shifted": (
            "Y[i,j] := A[inds[i] + j]",
            {"ranges": {"j": 3}},
            {"A": A, "inds": inds},
            lambda A, inds: A[inds[:, None] + np.arange(3)],
        ),
        "summed": (
            "Y[i] := A[inds[j]] * B[i,j]",
            {},
            {"A": A, "inds": inds, "B": B},
            lambda A, inds, B: B @ A[inds],
        ),
        "pick": (
            "P[b,t] := L[b,t] - Z[b,t,y[b,t]]",
            {},
            {"L": L, "Z": Z, "y": y},
            lambda L, Z, y: L - np.take_along_axis(Z, y[..., None], -1)[..., 0],
        ),
        "scaled": (
            "Y[i] := A[2*inds[i+1] - 1] * A[i]",
            {},
            {"A": A, "inds": odd},
            lambda A, inds: A[2 * inds[1:] - 1] * A[: len(inds) - 1],
        ),
        "offset": ("Y[i] := A[inds[i+1]]", {}, {"A": A, "inds": inds}, lambda A, inds: A[inds]),
    }


CASES = _cases(np.random.default_rng(0))


def _kernel(name, backend, **extra):
    source, options, _, _ = CASES[name]
    return td.kernel(source, backend=backend, **options, **extra)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CASES))
def test_values_and_gradients(name, backend, monkeypatch):
    """Forward values and every float input's gradient against float64 numpy."""
    backend = _backend(backend, monkeypatch)
    _, _, inputs, reference = CASES[name]
    k = _kernel(name, backend)
    assert k.inputs == tuple(inputs)
    got = k(**inputs)
    np.testing.assert_allclose(np.asarray(got), reference(**inputs), rtol=1e-12, atol=1e-12)
    floats = [n for n, v in inputs.items() if v.dtype.kind == "f"]
    cotangent = np.random.default_rng(1).normal(size=np.shape(got))

    def loss(*values):
        return jnp.sum(k(**{**inputs, **dict(zip(floats, values))}) * cotangent)

    grads = jax.grad(loss, argnums=tuple(range(len(floats))))(*(inputs[n] for n in floats))
    for name_, grad in zip(floats, grads):
        want = _numeric_gradient(reference, inputs, name_, cotangent)
        np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-7, atol=1e-9, err_msg=name_)


def _numeric_gradient(reference, inputs, name, cotangent, eps=1e-6):
    """Central differences of `<reference(inputs), cotangent>` in float64 (exact for these
    functions, linear or bilinear in each float input, up to rounding)."""
    x = inputs[name]
    found = np.zeros_like(x)
    for position in np.ndindex(x.shape):
        up, down = x.copy(), x.copy()
        up[position] += eps
        down[position] -= eps
        hi = np.sum(reference(**{**inputs, name: up}) * cotangent)
        lo = np.sum(reference(**{**inputs, name: down}) * cotangent)
        found[position] = (hi - lo) / (2 * eps)
    return found


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_table_gradient_is_a_deterministic_sum_and_zero_where_unread(backend):
    """dW: np.add.at over the positions, bitwise equal over 3 jitted calls, unread rows 0."""
    rng = np.random.default_rng(2)
    W = rng.normal(size=(50, 8)).astype(np.float32)
    tok = rng.integers(0, 40, size=(16, 33)).astype(np.int32)  # rows 40..49 never read
    cotangent = rng.normal(size=(16, 33, 8)).astype(np.float32)
    k = td.kernel("E[b,t,d] := W[tok[b,t], d]", backend=backend)
    grad = jax.jit(jax.grad(lambda W, tok: jnp.sum(k(W, tok) * cotangent)))
    calls = [np.asarray(grad(W, tok)) for _ in range(3)]
    for other in calls[1:]:
        assert calls[0].tobytes() == other.tobytes()
    want = np.zeros((50, 8))
    np.add.at(want, tok, cotangent.astype(np.float64))
    np.testing.assert_allclose(calls[0], want, rtol=1e-5, atol=1e-5)
    unread = np.setdiff1d(np.arange(50), tok)
    assert unread.size and (calls[0][unread] == 0).all() and not np.signbit(calls[0][unread]).any()


def test_integer_inputs_get_no_gradient():
    """grad with respect to the index array: float0 (allow_int), under jit and vmap too."""
    _, _, inputs, _ = CASES["embedding"]
    k = _kernel("embedding", "reference")

    def f(W, tok):
        return jnp.sum(k(W, tok) ** 2)

    for transform in (lambda g: g, jax.jit):
        dW, dtok = transform(jax.grad(f, argnums=(0, 1), allow_int=True))(
            inputs["W"], inputs["tok"]
        )
        assert dtok.dtype == jax.dtypes.float0 and dW.shape == inputs["W"].shape
    batched = jax.vmap(jax.grad(f, argnums=(0, 1), allow_int=True), in_axes=(None, 0))
    dW, dtok = batched(inputs["W"], np.stack([inputs["tok"], inputs["tok"][::-1]]))
    assert dtok.dtype == jax.dtypes.float0 and dW.shape == (2, *inputs["W"].shape)


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_vmap_over_the_index_array_the_table_or_both(backend):
    rng = np.random.default_rng(3)
    W = rng.normal(size=(3, 9, 4))
    tok = np.stack([_indices(rng, 9, (2, 5)) for _ in range(3)])
    k = td.kernel("E[b,t,d] := W[tok[b,t], d]", backend=backend)
    for axes, args, want in (
        ((None, 0), (W[0], tok), np.stack([W[0][t] for t in tok])),
        ((0, None), (W, tok[0]), np.stack([w[tok[0]] for w in W])),
        ((0, 0), (W, tok), np.stack([w[t] for w, t in zip(W, tok)])),
    ):
        got = jax.jit(jax.vmap(k, in_axes=axes))(*args)
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-12)
    cotangent = rng.normal(size=(3, 2, 5, 4))
    grad = jax.grad(lambda W: jnp.sum(jax.vmap(k)(W, tok) * cotangent))(W)
    want = np.zeros_like(W)
    for e in range(3):
        np.add.at(want[e], tok[e], cotangent[e])
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-12)
    shared = jax.grad(lambda W: jnp.sum(jax.vmap(k, in_axes=(None, 0))(W, tok) * cotangent))(W[0])
    want = np.zeros_like(W[0])
    for e in range(3):
        np.add.at(want, tok[e], cotangent[e])
    np.testing.assert_allclose(np.asarray(shared), want, rtol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_forward_mode(backend):
    """A gather's tangent is the gather of the tangent: jvp, jacfwd, linearize."""
    _, _, inputs, reference = CASES["summed"]
    k = _kernel("summed", backend)
    A, inds, B = inputs["A"], inputs["inds"], inputs["B"]
    tA, tB = (
        np.random.default_rng(4).normal(size=A.shape),
        np.random.default_rng(5).normal(size=B.shape),
    )
    out, tangent = jax.jvp(lambda A, B: k(A, inds, B), (A, B), (tA, tB))
    np.testing.assert_allclose(np.asarray(out), reference(A, inds, B), rtol=1e-12)
    want = reference(tA, inds, B) + reference(A, inds, tB)
    np.testing.assert_allclose(np.asarray(tangent), want, rtol=1e-10)
    jacobian = jax.jit(jax.jacfwd(lambda A: k(A, inds, B)))(A)
    np.testing.assert_allclose(np.asarray(jacobian), B @ np.eye(len(A))[inds], rtol=1e-12)
    _, linear = jax.linearize(lambda A: k(A, inds, B), A)
    np.testing.assert_allclose(np.asarray(linear(tA)), reference(tA, inds, B), rtol=1e-10)


def test_index_array_of_floats_or_bools_is_an_error():
    _, _, inputs, _ = CASES["embedding"]
    k = _kernel("embedding", "reference")
    for bad in (inputs["tok"].astype(np.float32), inputs["tok"] > 3):
        with pytest.raises(InputError, match=r"index array 'tok' has dtype (float32|bool)"):
            k(inputs["W"], bad)
    p = td.program("E[b,t,d] := W[tok[b,t], d]; F[b,t,d] := 2 * E[b,t,d]", backend="reference")
    with pytest.raises(InputError, match=r"index array 'tok' has dtype float64"):
        p(inputs["W"], inputs["tok"].astype(np.float64))


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_out_of_range_index_eagerly_an_error_under_jit_nan(backend):
    W = np.random.default_rng(6).normal(size=(5, 3))
    k = td.kernel("E[b,d] := W[tok[b], d]", backend=backend)
    for value in (5, -1):
        tok = np.array([0, value, 2], np.int32)
        with pytest.raises(RangeError, match=rf"index array 'tok' points to {value} on axis 0 "):
            k(W, tok)
        got = np.asarray(jax.jit(k)(W, tok))
        assert np.isnan(got[1]).all()
        np.testing.assert_allclose(got[[0, 2]], W[[0, 2]], rtol=1e-12)
        grad = jax.jit(jax.grad(lambda W, tok: jnp.sum(jnp.nan_to_num(k(W, tok)))))(W, tok)
        np.testing.assert_allclose(np.asarray(grad), np.eye(5)[[0, 2]].sum(0)[:, None] + 0 * W)


def test_program_with_index_arrays():
    """Cross-entropy's target pick and an embedding, inside programs, on reference and C."""
    rng = np.random.default_rng(7)
    Z = rng.normal(size=(2, 3, 7))
    y = _indices(rng, 7, (2, 3))
    L = np.log(np.exp(Z).sum(-1))
    for backend in ("reference", "c"):
        p = td.program(
            "(logsumexp) L[b,t] := Z[b,t,v]\nloss[b,t] := L[b,t] - Z[b,t,y[b,t]]",
            backend=backend,
        )
        assert p.inputs == ("Z", "y")
        np.testing.assert_allclose(
            np.asarray(p(Z, y)), L - np.take_along_axis(Z, y[..., None], -1)[..., 0], rtol=1e-12
        )
        grad = jax.jit(jax.grad(lambda Z, p=p: jnp.sum(p(Z, y))))(Z)
        np.testing.assert_allclose(
            np.asarray(grad), np.exp(Z - L[..., None]) - np.eye(7)[y], rtol=1e-10, atol=1e-12
        )
    W, P = rng.normal(size=(9, 4)), rng.normal(size=(5, 4))
    tok = _indices(rng, 9, (2, 5))
    embed = td.program("E[b,t,d] := W[tok[b,t], d] + P[t,d]; H[b,t,d] := E[b,t,d] * E[b,t,d]")
    np.testing.assert_allclose(np.asarray(embed(W, tok, P)), (W[tok] + P) ** 2, rtol=1e-12)
    dW = jax.grad(lambda W: jnp.sum(embed(W, tok, P)))(W)
    want = np.zeros_like(W)
    np.add.at(want, tok, 2 * (W[tok] + P))
    np.testing.assert_allclose(np.asarray(dW), want, rtol=1e-12)


def test_refused_forms():
    with pytest.raises(
        UnsupportedError, match="profile.* of a program that gathers from its own outputs"
    ):
        td.program("T[i] := 2 * A[i]; Y[j] := T[inds[j]]").profile({"A": (3,), "inds": (2,)})
    with pytest.raises(UnsupportedError, match="index that reads another array"):
        td.kernel("Y[i] := A[inds[perm[i]]]")
    with pytest.raises(td.errors.RangeError, match="'j'"):
        td.kernel("Y[i,j] := A[inds[i] + j]")
    with pytest.raises(td.errors.IndexExpressionError, match="not affine"):
        td.kernel("Y[i] := A[inds[i] * i]")


@pytest.mark.skipif(jax.device_count() < 4, reason="needs 4 devices (tests/conftest.py)")
@pytest.mark.parametrize("backend", ["reference", "c"])
def test_partitioned(backend):
    """The index array split over 4 devices: shard_map and plain jit of sharded arrays."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    rng = np.random.default_rng(8)
    W = rng.normal(size=(11, 4))
    tok = _indices(rng, 11, (8, 3))
    cotangent = rng.normal(size=(8, 3, 4))
    want = np.zeros_like(W)
    np.add.at(want, tok, cotangent)
    k = td.kernel("E[b,t,d] := W[tok[b,t], d]", backend=backend)
    mesh = jax.make_mesh((4,), ("d",), axis_types=(jax.sharding.AxisType.Auto,))
    mapped = jax.shard_map(k, mesh=mesh, in_specs=(P(), P("d")), out_specs=P("d"))
    np.testing.assert_allclose(np.asarray(jax.jit(mapped)(W, tok)), W[tok], rtol=1e-12)
    grad = jax.jit(jax.grad(lambda W, tok: jnp.sum(mapped(W, tok) * cotangent)))(W, tok)
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-12)
    split = jax.device_put(tok, NamedSharding(mesh, P("d")))
    np.testing.assert_allclose(np.asarray(jax.jit(k)(W, split)), W[tok], rtol=1e-12)
    grad = jax.jit(jax.grad(lambda W, tok: jnp.sum(k(W, tok) * cotangent)))(W, split)
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_more_forms(backend):
    """A scalar gather, `end` inside an index array's index, a table row read shifted (each
    element gathered, not whole rows), the same gather twice, an index array also read as a
    value, and an empty index array."""
    rng = np.random.default_rng(9)
    A, W = rng.normal(size=6), rng.normal(size=(3, 4))
    inds, tok = np.array([4, 1, 5, 1]), np.array([2, 0, 2])
    cases = [
        ("s := A[inds[2]]", (A, inds), A[5]),
        ("Y[i] := A[inds[end]] * A[i]", (A, inds), A[1] * A),
        ("E[b,d] := W[tok[b], d+1]", (W, tok), W[tok]),  # d in [-1, 3)
        ("E[b,d] := W[tok[b], 3-d]", (W, tok), W[tok][:, ::-1]),
        ("Y[i] := A[inds[i]] + A[inds[i]]", (A, inds), 2 * A[inds]),
        ("Y[i] := A[inds[i]] * inds[i]", (A, inds), A[inds] * inds),
        ("Y[i] := A[inds[i]]", (A, inds[:0]), A[:0]),
    ]
    for source, args, want in cases:
        k = td.kernel(source, backend=backend)
        np.testing.assert_allclose(np.asarray(k(*args)), want, rtol=1e-12, err_msg=source)
        np.testing.assert_allclose(np.asarray(jax.jit(k)(*args)), want, rtol=1e-12)
    k = td.kernel("E[b,d] := W[tok[b], 3-d]", backend=backend)
    cotangent = rng.normal(size=(3, 4))
    grad = jax.grad(lambda W: jnp.sum(k(W, tok) * cotangent))(W)
    want = np.zeros_like(W)
    np.add.at(want, tok, cotangent[:, ::-1])
    np.testing.assert_allclose(np.asarray(grad), want, rtol=1e-12)


def test_explain_build_and_profile():
    k = td.kernel("E[b,t,d] := W[tok[b,t], d] * s", backend="c")
    text = k.explain({"W": (7, 5), "tok": (2, 3), "s": ()})
    assert "\ngathered W[tok[b,t], d] before the nest (the gradient of W: a sum in" in text
    assert "gradient of W\n" not in text and "gradient of tok" not in text
    assert "gradient of s" in text
    k.build({"W": (7, 5), "tok": (2, 3), "s": ()})  # tok given by shape: int32
    profile = str(k.profile({"W": (7, 5), "tok": (2, 3), "s": ()}, reps=1))
    assert "grad_W[tok[b, t], d]" in profile


@pytest.mark.parametrize("kind", ["kernel", "program"])
def test_explain_and_profile_show_a_gathered_operand_as_written(kind):
    """Issue 36.12: explain and profile showed the internal name of a gathered operand
    (`W__at8`); they show the access as written and the gradient of its table."""
    shapes = {"W": (10, 4), "tok": (5,), "X": (5, 4)}
    if kind == "kernel":
        k = td.kernel("Y[i] := W[tok[i], d] * X[i,d]", backend="c")
        texts = [k.explain(), k.explain(shapes)]
    else:
        k = td.program("H[i,d] := W[tok[i], d] * 2.0; Y[i] := H[i,d] * X[i,d]", backend="c")
        texts = [k.explain(), k.explain(shapes)]
    profile = str(k.profile(shapes, reps=1))
    for text in [*texts, profile]:
        assert "__at" not in text
    for text in texts:
        assert "gradient of W at W[tok[i], d], each element added to dW" in text
        assert "dW[tok[i], d] += dY[i]*" in text or "dW[tok[i], d] += dH[i, d]*" in text
        assert "gradient of W\n" not in text and "gradient of tok" not in text
        assert "*W[tok[i], d]" in text or "W[tok[i], d]*" in text
    assert "W[tok[i], d]" in profile


@pytest.mark.parametrize("fuse", ["1", "0"])
def test_program_forward_mode_and_unfused(fuse, monkeypatch):
    """jvp and hessian of a program that picks targets; a kernel's forward-over-reverse
    Hessian-vector product; the same program unfused (TENSORDSL_FUSE=0)."""
    monkeypatch.setenv("TENSORDSL_FUSE", fuse)
    rng = np.random.default_rng(10)
    Z, tZ = rng.normal(size=(2, 3, 7)), rng.normal(size=(2, 3, 7))
    y = _indices(rng, 7, (2, 3))
    p = td.program(
        "(logsumexp) L[b,t] := Z[b,t,v]; loss[b,t] := L[b,t] - Z[b,t,y[b,t]]",
        backend="reference",
    )

    def f(Z):
        return jnp.sum(p(Z, y))

    def twin(Z):
        return jnp.sum(jax.nn.logsumexp(Z, -1) - jnp.take_along_axis(Z, y[..., None], -1)[..., 0])

    np.testing.assert_allclose(jax.jvp(f, (Z,), (tZ,))[1], jax.jvp(twin, (Z,), (tZ,))[1])
    np.testing.assert_allclose(np.asarray(jax.hessian(f)(Z)), jax.hessian(twin)(Z), atol=1e-12)
    k = td.kernel("Y[i] := A[inds[j]] * B[i,j]", backend="c")
    A, B, inds = rng.normal(size=6), rng.normal(size=(2, 3)), np.array([1, 1, 4])

    def g(A):
        return jnp.sum(k(A, inds, B) ** 2)

    def g_twin(A):
        return jnp.sum((B @ A[inds]) ** 2)

    hvp = jax.jvp(jax.grad(g), (A,), (A,))[1]
    np.testing.assert_allclose(hvp, jax.jvp(jax.grad(g_twin), (A,), (A,))[1], rtol=1e-12)


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_program_gathers_from_its_own_output(backend):
    """Logits computed by the program, then picked by the labels: the program runs as two
    programs (the second reads the logits as an input), gradients through both."""
    rng = np.random.default_rng(11)
    H, W = rng.normal(size=(2, 3, 4)), rng.normal(size=(7, 4))
    y = _indices(rng, 7, (2, 3))
    p = td.program(
        "Z[b,t,v] := H[b,t,d] * W[v,d]\n(logsumexp) L[b,t] := Z[b,t,v]\n"
        "loss[b,t] := L[b,t] - Z[b,t,y[b,t]]",
        backend=backend,
        outputs=("loss", "Z"),
    )
    assert p.inputs == ("H", "W", "y") and len(p._stages) == 2

    def twin(H, W):
        Z = jnp.einsum("btd,vd->btv", H, W)
        pick = jnp.take_along_axis(Z, y[..., None], -1)[..., 0]
        return jax.nn.logsumexp(Z, -1) - pick, Z

    loss, Z = p(H, W, y)
    want_loss, want_Z = twin(H, W)
    np.testing.assert_allclose(np.asarray(loss), want_loss, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(Z), want_Z, rtol=1e-12)
    grads = jax.jit(jax.grad(lambda H, W: jnp.sum(p(H, W, y)[0]), argnums=(0, 1)))(H, W)
    wants = jax.grad(lambda H, W: jnp.sum(twin(H, W)[0]), argnums=(0, 1))(H, W)
    for got, want in zip(grads, wants):
        np.testing.assert_allclose(np.asarray(got), want, rtol=1e-10, atol=1e-12)
    with pytest.raises(RangeError, match="index array 'y' points to 7"):
        p(H, W, np.full((2, 3), 7))


def test_a_concrete_index_array_closed_over_under_jit():
    """An index array captured by a jitted function is concrete, but what the gather
    computes from it is staged: no eager range check there (it raised a
    TracerArrayConversionError), and values and gradients are right."""
    rng = np.random.default_rng(3)
    X = rng.standard_normal((7, 11))
    y = jnp.asarray(rng.integers(0, 11, 7))
    k = td.kernel("P[n] := X[n, y[n]]", backend="reference")
    value, grad = jax.jit(jax.value_and_grad(lambda X: (k(X=X, y=y) * np.arange(1, 8)).sum()))(X)
    np.testing.assert_allclose(value, (X[np.arange(7), np.asarray(y)] * np.arange(1, 8)).sum())
    want = np.zeros_like(X)
    want[np.arange(7), np.asarray(y)] = np.arange(1, 8)
    np.testing.assert_allclose(grad, want)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_index_outside_the_table_under_grad_reads_nan_as_under_jit(backend, monkeypatch):
    """Issue 36.11: with concrete index arrays, `grad` traced the table but the bounds check
    still ran eagerly and raised; a traced call reads NaN there (docs/language.md)."""
    k = td.kernel("Y[i] := A[tok[i]] * X[i]", backend=_backend(backend, monkeypatch))
    rng = np.random.default_rng(36)
    A, X, ct = rng.normal(size=5), rng.normal(size=3), rng.normal(size=3)
    tok = np.array([1, 9, 3], np.int32)
    y, pullback = jax.vjp(lambda a: k(A=a, tok=tok, X=X), A)
    y = np.asarray(y)
    assert np.isnan(y[1])
    np.testing.assert_allclose(y[[0, 2]], A[[1, 3]] * X[[0, 2]], rtol=1e-12)
    want = np.zeros(5)
    want[1], want[3] = ct[0] * X[0], ct[2] * X[2]
    np.testing.assert_allclose(np.asarray(pullback(ct)[0]), want, rtol=1e-12)
    dX = np.asarray(jax.grad(lambda x: jnp.nansum(k(A=A, tok=tok, X=x) * ct))(X))
    np.testing.assert_allclose(dX[[0, 2]], (ct * A[[1, 1, 3]])[[0, 2]], rtol=1e-12)
    with pytest.raises(RangeError, match="points to 9 on axis 0 of 'A'"):
        k(A=A, tok=tok, X=X)  # eager: every input concrete
