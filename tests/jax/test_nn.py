"""tensordsl.nn: every layer's values and gradients against a plain jax.numpy version written
here, float64 and float32, on the reference and C back ends (one layer under the CUDA
emulator); jit and vmap; the errors of bad options."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl import nn
from tensordsl.explain.timing import nest_equations
from tests.backends import BACKENDS as ALL_BACKENDS
from tests.backends import generated_kernels  # noqa: F401 (a fixture)
from tests.sampling import product

BACKENDS = ("reference", "c")
DTYPES = ("float64", "float32")
TOLERANCE = {"float64": 1e-9, "float32": 3e-4}


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _normal(rng: np.random.Generator, *shape: int, dtype: str = "float64") -> jax.Array:
    return jnp.asarray(rng.normal(size=shape), dtype=dtype)


def _close(got, want, dtype: str) -> None:
    tol = TOLERANCE[dtype]
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    scale = max(float(np.max(np.abs(want))), 1.0) if want.size else 1.0
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def check(layer, reference, args: tuple, dtype: str, wrt: tuple[int, ...]) -> None:
    """Values, and the gradients of `sum(out * cotangent)` w.r.t. the arguments `wrt`.

    The layer is called as a user calls it, eagerly; the jnp reference is jitted, each
    evaluation compiled as one program: eagerly each of its operations and of their
    transposes would be compiled alone, many times the time (docs/testing.md)."""
    got, want = layer(*args), jax.jit(reference)(*args)
    assert got.dtype == want.dtype == jnp.dtype(dtype)
    _close(got, want, dtype)
    cotangent = _normal(_rng(99), *want.shape, dtype=dtype)

    def loss(fn):
        return lambda *a: jnp.sum(fn(*a) * cotangent)

    grads = jax.grad(loss(layer), wrt)(*args)
    expected = jax.jit(jax.grad(loss(reference), wrt))(*args)
    for g, e in zip(grads, expected):
        assert g.dtype == e.dtype
        _close(g, e, dtype)


# --------------------------------------------------------------------------- jnp references


def dense_jnp(x, w, b=None):
    return x @ w + (0 if b is None else b)


def layer_norm_jnp(x, g=None, beta=None, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    y = (x - mean) / jnp.sqrt(var + eps)
    return y * (1 if g is None else g) + (0 if beta is None else beta)


def rms_norm_jnp(x, g, eps=1e-6):
    return x / jnp.sqrt((x**2).mean(-1, keepdims=True) + eps) * g


def cross_entropy_jnp(logits, labels, smoothing=0.0):
    classes = logits.shape[-1]
    target = jax.nn.one_hot(labels, classes, dtype=logits.dtype)
    target = target * (1 - smoothing) + smoothing / classes
    return -jnp.sum(target * jax.nn.log_softmax(logits, axis=-1), axis=-1)


def conv_jnp(x, kernel, b, stride, padding, dilation, spatial):
    numbers = ("NWC", "WIO", "NWC") if spatial == 1 else ("NHWC", "HWIO", "NHWC")
    if isinstance(padding, str):
        padding = padding.upper()
    y = jax.lax.conv_general_dilated(
        x,
        kernel,
        (stride,) * spatial if isinstance(stride, int) else stride,
        padding,
        rhs_dilation=(dilation,) * spatial if isinstance(dilation, int) else dilation,
        dimension_numbers=numbers,
        precision="highest",
    )
    return y if b is None else y + b


def attention_jnp(q, k, v, *, mask=None, bias=None, mod=None, scale=None):
    """q (B, T, H, E): scores (B, H, T, S), materialised, as a jnp user writes them."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = jnp.einsum("bihd,bjhd->bhij", q, k, precision="highest") * scale
    if bias is not None:
        s = s + bias
    if mod is not None:
        s = mod(s)
    if mask is not None:
        s = jnp.where(mask, s, -jnp.inf)
    p = jax.nn.softmax(s, axis=-1)
    return jnp.einsum("bhij,bjhe->bihe", p, v, precision="highest")


# --------------------------------------------------------------------------- layers


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_dense(backend, dtype):
    rng = _rng(1)
    x, w = _normal(rng, 2, 3, 5, dtype=dtype), _normal(rng, 5, 4, dtype=dtype)
    b = _normal(rng, 4, dtype=dtype)
    check(
        lambda x, w, b: nn.dense(x, w, b, backend=backend), dense_jnp, (x, w, b), dtype, (0, 1, 2)
    )
    check(lambda x, w: nn.dense(x, w, backend=backend), dense_jnp, (x, w), dtype, (0, 1))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm(backend, dtype):
    rng = _rng(2)
    x = _normal(rng, 2, 3, 6, dtype=dtype) * 2 + 0.5
    g, beta = 1 + 0.3 * _normal(rng, 6, dtype=dtype), _normal(rng, 6, dtype=dtype)
    check(
        lambda x, g, beta: nn.layer_norm(x, g, beta, eps=1e-3, backend=backend),
        lambda x, g, beta: layer_norm_jnp(x, g, beta, 1e-3),
        (x, g, beta),
        dtype,
        (0, 1, 2),
    )
    check(lambda x: nn.layer_norm(x, backend=backend), layer_norm_jnp, (x,), dtype, (0,))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm(backend, dtype):
    rng = _rng(3)
    x, g = _normal(rng, 4, 7, dtype=dtype), 1 + 0.3 * _normal(rng, 7, dtype=dtype)
    check(
        lambda x, g: nn.rms_norm(x, g, eps=1e-4, backend=backend),
        lambda x, g: rms_norm_jnp(x, g, 1e-4),
        (x, g),
        dtype,
        (0, 1),
    )


@pytest.mark.usefixtures("generated_kernels")
@pytest.mark.parametrize("backend", ALL_BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_embedding_is_the_languages_gather(backend, dtype):
    rng = _rng(4)
    table, ids = _normal(rng, 9, 4, dtype=dtype), jnp.asarray(rng.integers(0, 9, (2, 5)))
    layer = jax.jit(lambda t, i: nn.embedding(i, t, backend=backend))
    check(lambda t: layer(t, ids), lambda t: t[ids], (table,), dtype, (0,))
    check(lambda t: nn.embedding(ids, t, backend=backend), lambda t: t[ids], (table,), dtype, (0,))
    assert nn.embedding(ids, table).shape == (2, 5, 4)
    assert nn.embedding(ids[0, 0], table).shape == (4,)  # one id: one row
    assert nn.embedding(jnp.zeros((0, 3), int), table).shape == (0, 3, 4)
    with pytest.raises(td.RangeError, match=r"'ids' points to 9 on axis 0 of 'table'"):
        nn.embedding(np.array([[3, 9]]), table, backend=backend)
    # under jit (ids not known when traced) an id outside the table reads NaN, no gradient
    outside = jnp.array([3, -1, 9, 3])
    got = layer(table, outside)
    assert np.isnan(np.asarray(got[1:3])).all()
    _close(got[::3], table[jnp.array([3, 3])], dtype)
    grad = jax.grad(lambda t: jnp.sum(jnp.nan_to_num(layer(t, outside))))(table)
    _close(grad, jnp.zeros_like(table).at[3].set(2), dtype)
    explained = td.kernel(nn.layers.EMBEDDING).explain()
    assert "gather" in explained and "sum_" not in explained


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy(backend, dtype, smoothing):
    rng = _rng(5)
    logits = _normal(rng, 2, 3, 5, dtype=dtype) * 3
    labels = jnp.asarray(rng.integers(0, 5, (2, 3)))
    check(
        lambda z: nn.cross_entropy(z, labels, smoothing, backend=backend),
        lambda z: cross_entropy_jnp(z, labels, smoothing),
        (logits,),
        dtype,
        (0,),
    )


CONV1D = [  # stride, padding, dilation
    (1, "same", 1),
    (2, "valid", 1),
    (2, "same", 2),
    (1, ((2, 1),), 3),
    (3, 1, 1),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("stride", "padding", "dilation"), CONV1D)
def test_conv1d(backend, dtype, stride, padding, dilation):
    rng = _rng(6)
    x, kernel = _normal(rng, 2, 11, 3, dtype=dtype), _normal(rng, 3, 3, 4, dtype=dtype)
    b = _normal(rng, 4, dtype=dtype)
    options = {"stride": stride, "padding": padding, "dilation": dilation}
    lax_padding = ((padding, padding),) if isinstance(padding, int) else padding
    check(
        lambda x, k, b: nn.conv1d(x, k, b, backend=backend, **options),
        lambda x, k, b: conv_jnp(x, k, b, stride, lax_padding, dilation, 1),
        (x, kernel, b),
        dtype,
        (0, 1, 2),
    )


CONV2D = [((2, 1), "same", (1, 2)), (1, "valid", 1), (2, ((1, 0), (0, 2)), 1)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("stride", "padding", "dilation"), CONV2D)
def test_conv2d(backend, dtype, stride, padding, dilation):
    rng = _rng(7)
    x, kernel = _normal(rng, 2, 7, 6, 2, dtype=dtype), _normal(rng, 3, 2, 2, 3, dtype=dtype)
    options = {"stride": stride, "padding": padding, "dilation": dilation}
    check(
        lambda x, k: nn.conv2d(x, k, backend=backend, **options),
        lambda x, k: conv_jnp(x, k, None, stride, padding, dilation, 2),
        (x, kernel),
        dtype,
        (0, 1),
    )


def test_conv_without_batch_axes_and_with_two():
    rng = _rng(8)
    x, kernel = _normal(rng, 9, 2), _normal(rng, 3, 2, 3)
    want = conv_jnp(x[None], kernel, None, 1, "same", 1, 1)[0]
    _close(nn.conv1d(x, kernel, backend="reference"), want, "float64")
    xs = _normal(rng, 2, 3, 9, 2)
    want = jax.vmap(lambda x: conv_jnp(x, kernel, None, 1, "same", 1, 1))(xs)
    _close(nn.conv1d(xs, kernel, backend="reference"), want, "float64")


def _causal(T, S):
    return np.tril(np.ones((T, S), bool))


ATTENTION = {  # name: (options of nn.attention, jnp reference options); T = 6, S = 6
    "plain": ({}, {}),
    "causal": ({"causal": True}, {"mask": _causal(6, 6)}),
    "band": (
        {"mask_mod": "abs(i - j) <= 1"},
        {"mask": np.abs(np.arange(6)[:, None] - np.arange(6)) <= 1},
    ),
    "softcap": (
        {"score_mod": "cap * tanh(S / cap)", "mod_args": {"cap": 2.0}, "scale": 0.7},
        {"mod": lambda s: 2.0 * jnp.tanh(s / 2.0), "scale": 0.7},
    ),
}


@pytest.mark.parametrize(
    ("case", "dtype", "backend"), product(sorted(ATTENTION), DTYPES, BACKENDS, every=3)
)
def test_attention(backend, dtype, case):
    ours, theirs = ATTENTION[case]
    rng = _rng(9)
    q, k, v = (_normal(rng, 2, 6, 2, 3, dtype=dtype) for _ in range(3))
    check(
        lambda q, k, v: nn.attention(q, k, v, backend=backend, **ours),
        lambda q, k, v: attention_jnp(q, k, v, **theirs),
        (q, k, v),
        dtype,
        (0, 1, 2),
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_relative_bias_and_padding_mask(backend):
    """A learnt table read by score_mod, a data mask read by mask_mod, a broadcast bias, two
    leading axes, T != S; gradients of q, k, v, the table and the bias."""
    rng = _rng(10)
    q, k, v = _normal(rng, 2, 1, 4, 2, 3), _normal(rng, 2, 1, 5, 2, 3), _normal(rng, 2, 1, 5, 2, 2)
    table, bias = _normal(rng, 2, 9), _normal(rng, 2, 1, 1, 4, 5)  # per batch, query, key
    keep = jnp.asarray(np.array([[[1, 1, 1, 0, 1]], [[1, 0, 1, 1, 1]]]))  # (2, 1, S)
    offset = np.arange(4)[:, None] - np.arange(5)[None, :] + 4

    def ours(q, k, v, table, bias):
        return nn.attention(
            q,
            k,
            v,
            causal=True,
            bias=bias,
            backend=backend,
            score_mod="S + R[h, i - j + 4]",
            mask_mod="M[b, j] > 0",
            mod_args={"R": table, "M": keep.reshape(2, 5)},
        )

    def theirs(q, k, v, table, bias):
        mask = _causal(4, 5) & (keep[:, :, None, None, :] > 0)  # (2, 1, 1, T, S)
        flat = [x.reshape(2, *x.shape[2:]) for x in (q, k, v)]
        out = attention_jnp(
            *flat,
            bias=bias.reshape(2, 1, 4, 5),
            mod=lambda s: s + table[:, offset],
            mask=mask.reshape(2, 1, 4, 5),
        )
        return out.reshape(q.shape[:-1] + (2,))

    check(ours, theirs, (q, k, v, table, bias), "float64", (0, 1, 2, 3, 4))


def test_attention_stores_no_scores():
    """The (B, H, T, S) scores are recomputed where they are read, forwards and backwards."""
    src = nn.attention.__globals__["attention_source"]("s_[b,h,i,j]", "(j <= i)")
    program = td.kernel(src, backend="c")
    shapes = {"q_": (1, 64, 2, 8), "k_": (1, 64, 2, 8), "scale_": (), "v_": (1, 64, 2, 8)}
    text = program.explain(shapes)
    assert "s_ recomputed where read, never stored" in text
    assert "j in [0, min(64, i + 1))" in text  # the causal mask bounds the loop


@pytest.mark.parametrize(
    ("options", "want"),
    [
        ({"causal": True}, [("out_", "lse_")]),
        ({"mask_mod": "abs(i - j) <= 4"}, [("out_", "lse_")]),
        ({}, [("s_", ""), ("lse_", ""), ("out_", "")]),
    ],
)
def test_attention_forward_is_one_pass_on_c_where_a_mask_spares_scores(options, want):
    """Masked, the logsumexp and the weighted sum run as one nest (online softmax): the
    scores are computed once in the forward, not once per nest. Unmasked, the one pass
    would compute every pair XLA's dots compute, slower: the scores are stored, and the
    scores, the logsumexp and the weighted sum are three nests."""
    rng = _rng(13)
    q, k, v = (_normal(rng, 2, 32, 2, 8, dtype="float32") for _ in range(3))
    jaxpr = jax.make_jaxpr(lambda q, k, v: nn.attention(q, k, v, backend="c", **options))(q, k, v)
    nests = [e.params["nest"] for e in nest_equations(jaxpr.jaxpr)]
    assert [(n.output, n.online) for n in nests] == want


def test_cuda_emulated(monkeypatch):
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    rng = _rng(11)
    x, g = _normal(rng, 3, 5, dtype="float32"), 1 + 0.3 * _normal(rng, 5, dtype="float32")
    try:
        check(
            lambda x, g: nn.rms_norm(x, g, backend="cuda"), rms_norm_jnp, (x, g), "float32", (0, 1)
        )
    except td.UnsupportedError as error:  # no C++ compiler for the emulator
        pytest.skip(f"CUDA emulator unavailable: {str(error).splitlines()[0]}")


# --------------------------------------------------------------------------- JAX transforms


def test_jit_and_vmap():
    rng = _rng(12)
    x, w, b = _normal(rng, 5, 4, 3), _normal(rng, 3, 2), _normal(rng, 2)
    layer = jax.jit(lambda x, w, b: nn.layer_norm(nn.dense(x, w, b, backend="c"), backend="c"))
    _close(layer(x, w, b), layer_norm_jnp(dense_jnp(x, w, b)), "float64")
    per_row = jax.vmap(lambda x: nn.dense(x, w, b, backend="c"))(x)
    _close(per_row, dense_jnp(x, w, b), "float64")
    q = _normal(rng, 3, 4, 2, 2)
    vmapped = jax.jit(jax.vmap(lambda q: nn.attention(q, q, q, causal=True, backend="c")))(q)
    want = attention_jnp(q, q, q, mask=_causal(4, 4))
    _close(vmapped, want, "float64")
    labels = jnp.asarray(rng.integers(0, 2, (5, 4)))
    grad = jax.jit(jax.grad(lambda z: nn.cross_entropy(z, labels, backend="c").mean()))(x[..., :2])
    _close(grad, jax.grad(lambda z: cross_entropy_jnp(z, labels).mean())(x[..., :2]), "float64")


def test_kernels_are_built_once():
    from tensordsl.nn._common import build

    rng = _rng(13)
    x, w = _normal(rng, 2, 3), _normal(rng, 3, 4)
    nn.dense(x, w, backend="reference")
    before = build.cache_info()
    for _ in range(3):
        nn.dense(x, w, backend="reference")
    after = build.cache_info()
    assert after.misses == before.misses and after.hits == before.hits + 3


# --------------------------------------------------------------------------- errors


def test_bad_options_raise_typed_errors():
    x, w = np.ones((2, 3)), np.ones((4, 5))
    with pytest.raises(td.ShapeError, match=r"dense: the input width .* of 'x' is 3 but 4"):
        nn.dense(x, w)
    with pytest.raises(td.OptionError, match=r"unknown padding 'sam'(.|\n)*did you mean 'same'"):
        nn.conv1d(np.ones((1, 5, 2)), np.ones((3, 2, 1)), padding="sam")
    with pytest.raises(td.OptionError, match=r"stride=0 is not 1 positive integer"):
        nn.conv1d(np.ones((1, 5, 2)), np.ones((3, 2, 1)), stride=0)
    with pytest.raises(td.OptionError, match=r"padding=\(1, 2\) is not 2 pair"):
        nn.conv2d(np.ones((1, 5, 5, 2)), np.ones((3, 3, 2, 1)), padding=(1, 2))
    with pytest.raises(td.OptionError, match=r"label_smoothing=1.5 is outside \[0.0, 1.0\]"):
        nn.cross_entropy(np.ones((2, 3)), np.array([0, 1]), 1.5)
    with pytest.raises(td.InputError, match="'labels' has dtype float"):
        nn.cross_entropy(np.ones((2, 3)), np.array([0.0, 1.0]))
    with pytest.raises(td.ShapeError, match=r"'labels' has shape \(3,\)"):
        nn.cross_entropy(np.ones((2, 3)), np.array([0, 1, 2]))
    with pytest.raises(td.OptionError, match="eps=-1"):
        nn.layer_norm(np.ones((2, 3)), eps=-1)
    with pytest.raises(td.InputError, match="'ids' has dtype float"):
        nn.embedding(np.ones(3), np.ones((4, 2)))
    assert issubclass(td.OptionError, ValueError)


def test_bad_modifiers_point_into_them():
    q = np.ones((1, 3, 1, 2))
    with pytest.raises(td.UnknownNameError) as info:
        nn.attention(q, q, q, score_mod="S + R[h, i - k]", mod_args={"R": np.ones((1, 5))})
    assert str(info.value) == (
        "score_mod: 'k' in an index list is not one of the indices b, h, i, j\n"
        "  S + R[h, i - k]\n"
        "               ^\n"
        "expected index expressions over b, h, i, j (another index would be summed over)"
    )
    with pytest.raises(td.UnknownNameError, match=r"reads 'scael'(.|\n)*did you mean 'scale'"):
        nn.attention(q, q, q, score_mod="S * scael", mod_args={"scale": 2.0})
    with pytest.raises(td.UnknownNameError, match="array 'T', which is not given in mod_args"):
        nn.attention(q, q, q, score_mod="S + T[h]")
    with pytest.raises(td.UnknownNameError, match="mask_mod reads the score 'S'"):
        nn.attention(q, q, q, mask_mod="S > 0")
    with pytest.raises(td.ParseError, match=r"score_mod: (.|\n)*  S \+\* 2"):
        nn.attention(q, q, q, score_mod="S +* 2")
    with pytest.raises(td.OptionError, match="score_mod is 3, not an expression"):
        nn.attention(q, q, q, score_mod=3)
    with pytest.raises(td.ShapeError, match="does not broadcast"):
        nn.attention(q, q, q, bias=np.ones((2, 3, 3)))
    with pytest.raises(td.ShapeError, match="the head count of 'v' is 1 but 2 in 'k'"):
        nn.attention(q, np.ones((1, 3, 2, 2)), q)
    with pytest.raises(td.ShapeError, match="'k' and 'v' have 2 heads and 'q' has 1"):
        nn.attention(q, np.ones((1, 3, 2, 2)), np.ones((1, 3, 2, 2)))


@pytest.mark.parametrize("shape", [(6, 5), (2, 1, 5), (3, 1, 6, 1), (1,)])
def test_attention_bias_broadcasts(shape):
    """A bias of any shape broadcastable to (..., H, T, S): its gradient has its shape."""
    rng = _rng(14)
    q, k, v = _normal(rng, 3, 6, 2, 4), _normal(rng, 3, 5, 2, 4), _normal(rng, 3, 5, 2, 4)
    bias = _normal(rng, *shape)

    def theirs(q, k, v, bias):
        return attention_jnp(q, k, v, bias=jnp.broadcast_to(bias, (3, 2, 6, 5)).reshape(3, 2, 6, 5))

    check(
        lambda q, k, v, bias: nn.attention(q, k, v, bias=bias, backend="reference"),
        theirs,
        (q, k, v, bias),
        "float64",
        (0, 1, 2, 3),
    )


def test_cross_entropy_label_outside_the_classes_picks_nothing():
    logits = _normal(_rng(15), 2, 4)
    loss = nn.cross_entropy(logits, jnp.array([7, 1]), backend="reference")
    _close(loss[0], jax.nn.logsumexp(logits[0]), "float64")


# --------------------------------------------------------------------------- grouped heads, lse


def _grouped_jnp(q, k, v, **options):
    """The jnp user's grouped-query attention: K and V repeated to q's heads."""
    group = q.shape[-2] // k.shape[-2]
    return attention_jnp(q, jnp.repeat(k, group, axis=-2), jnp.repeat(v, group, axis=-2), **options)


GROUPED = {  # name: (nn.attention options, attention_jnp options built from the head count H)
    "causal": (lambda R: {"causal": True}, lambda R: {"mask": _causal(5, 5)}),
    "head slopes": (  # ALiBi-like: the score modification reads the query head h
        lambda R: {"score_mod": "S - (h + 1) * 0.25 * abs(i - j)"},
        lambda R: {
            "mod": lambda s: (
                s
                - (jnp.arange(4.0)[:, None, None] + 1)
                * 0.25
                * jnp.abs(jnp.arange(5.0)[:, None] - jnp.arange(5.0))
            )
        },
    ),
    "head table and mask": (
        lambda R: {
            "score_mod": "S + R[h, i - j + 4]",
            "mask_mod": "(h < 2) + (j <= i) > 0",
            "mod_args": {"R": R},
        },
        lambda R: {
            "mod": lambda s: s + R[:, np.arange(5)[:, None] - np.arange(5)[None, :] + 4][None],
            "mask": (np.arange(4)[:, None, None] < 2) | _causal(5, 5)[None],
        },
    ),
}


@pytest.mark.parametrize(
    ("kv_heads", "case", "backend"), product([1, 2], sorted(GROUPED), BACKENDS, every=3)
)
def test_attention_grouped_query_heads(backend, case, kv_heads):
    """K and V with fewer heads than q (grouped-query; multi-query with one head), the query
    head read by the modifiers; gradients of q, k, v and a per-head table."""
    ours, theirs = GROUPED[case]
    rng = _rng(21)
    q, k, v = (
        _normal(rng, 2, 5, 4, 3),
        _normal(rng, 2, 5, kv_heads, 3),
        _normal(rng, 2, 5, kv_heads, 2),
    )
    table = _normal(rng, 4, 9)
    check(
        lambda q, k, v, R: nn.attention(q, k, v, backend=backend, **ours(R)),
        lambda q, k, v, R: _grouped_jnp(q, k, v, **theirs(R)),
        (q, k, v, table),
        "float64",
        (0, 1, 2, 3) if "table" in case else (0, 1, 2),
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_grouped_heads_with_a_per_head_bias_and_float32(backend):
    rng = _rng(22)
    q, k, v = (_normal(rng, 3, 6, h, 4, dtype="float32") for h in (6, 2, 2))
    bias = _normal(rng, 6, 1, 6, dtype="float32")  # per query head and key
    check(
        lambda q, k, v, bias: nn.attention(q, k, v, bias=bias, causal=True, backend=backend),
        lambda q, k, v, bias: _grouped_jnp(q, k, v, bias=bias, mask=_causal(6, 6)),
        (q, k, v, bias),
        "float32",
        (0, 1, 2, 3),
    )


def test_attention_grouped_heads_copy_nothing():
    """The kernels read k and v with their own head count: no repeated K or V is built."""
    rng = _rng(23)
    q, k, v = _normal(rng, 1, 5, 4, 3), _normal(rng, 1, 7, 2, 3), _normal(rng, 1, 7, 2, 3)
    jaxpr = jax.make_jaxpr(lambda q, k, v: nn.attention(q, k, v, backend="c"))(q, k, v)
    shapes = [x.aval.shape for e in jaxpr.jaxpr.eqns for x in e.outvars]
    assert (1, 7, 4, 3) not in shapes  # K or V repeated to q's heads
    for equation in nest_equations(jaxpr.jaxpr):
        assert (1, 7, 2, 3) in [x.aval.shape for x in equation.invars]


@pytest.mark.parametrize(
    ("kv_heads", "options", "message"),
    [
        (3, {}, r"'k' and 'v' have 3 heads and 'q' has 4"),
        (2, {"enable_gqa": False}, r"have 2 heads and 'q' has 4 with enable_gqa=False"),
    ],
)
def test_attention_head_counts_that_do_not_group(kv_heads, options, message):
    rng = _rng(24)
    q, k = _normal(rng, 1, 3, 4, 2), _normal(rng, 1, 3, kv_heads, 2)
    with pytest.raises(td.ShapeError, match=message):
        nn.attention(q, k, k, backend="reference", **options)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_returns_its_logsumexp(backend, causal):
    """`return_lse`: the log-sum-exp of each query's modified, masked scores, (..., H, T),
    and gradients through both outputs."""
    rng = _rng(25)
    q, k, v = _normal(rng, 2, 5, 2, 3), _normal(rng, 2, 6, 2, 3), _normal(rng, 2, 6, 2, 2)
    options = {"causal": causal, "score_mod": "S * 0.5 + 0.1 * (i - j)"}

    def theirs(q, k, v):
        s = jnp.einsum("bihd,bjhd->bhij", q, k, precision="highest") / math.sqrt(3)
        s = s * 0.5 + 0.1 * (jnp.arange(5.0)[:, None] - jnp.arange(6.0))
        if causal:
            s = jnp.where(_causal(5, 6), s, -jnp.inf)
        lse = jax.nn.logsumexp(s, axis=-1)
        out = jnp.einsum("bhij,bjhe->bihe", jnp.exp(s - lse[..., None]), v, precision="highest")
        return out, lse

    def ours(q, k, v):
        return nn.attention(q, k, v, backend=backend, return_lse=True, **options)

    got, want = ours(q, k, v), jax.jit(theirs)(q, k, v)
    assert got[1].shape == (2, 2, 5)
    for g, w in zip(got, want):
        _close(g, w, "float64")
    ct = _normal(_rng(26), 2, 5, 2, 2), _normal(_rng(27), 2, 2, 5)

    def loss(fn):
        return lambda *a: sum(jnp.sum(o * c) for o, c in zip(fn(*a), ct))

    for g, w in zip(
        jax.grad(loss(ours), (0, 1, 2))(q, k, v),
        jax.jit(jax.grad(loss(theirs), (0, 1, 2)))(q, k, v),
    ):
        _close(g, w, "float64")


@pytest.mark.parametrize("backend", BACKENDS)
def test_attention_joined_masks(backend):
    """`and_masks` / `or_masks` (FlexAttention's helpers) join mask_mod texts."""
    rng = _rng(28)
    q, k, v = (_normal(rng, 2, 6, 2, 3) for _ in range(3))
    keep = jnp.asarray(np.array([[1, 1, 0, 1, 1, 1], [1, 0, 1, 1, 0, 1]]))
    near = np.abs(np.arange(6)[:, None] - np.arange(6)) <= 1
    for joined, mask in [
        (nn.and_masks("j <= i", "M[b, j] > 0"), _causal(6, 6) & (keep[:, None, None, :] > 0)),
        (nn.or_masks("abs(i - j) <= 1", "j == 0"), near | (np.arange(6) == 0)),
    ]:
        check(
            lambda q, k, v, m=joined: nn.attention(
                q, k, v, mask_mod=m, mod_args={"M": keep}, backend=backend
            ),
            lambda q, k, v, m=mask: attention_jnp(q, k, v, mask=m),
            (q, k, v),
            "float64",
            (0, 1, 2),
        )
    with pytest.raises(td.OptionError, match="and_masks takes mask_mod texts"):
        nn.and_masks()
