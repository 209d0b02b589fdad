"""attention-gym's score and mask modifications that went wrong (issue 38): powers with
negative and index-valued exponents (ALiBi's slopes), a table read through a wrapped relative
position, masks of clamped comparisons. Forward and every gradient against float64 jax.numpy
on reference, C and CUDA (emulated without a GPU), float64 and float32."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl import nn
from tensordsl.explain.timing import nest_equations
from tests.backends import BACKENDS
from tests.sampling import product

TOLERANCE = {"float64": 1e-9, "float32": 3e-4}


@pytest.fixture(autouse=True)
def _poisoned_and_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs poisoned; CUDA emulated without a GPU; contractions as a user gets them (the
    ALiBi slopes went wrong in the prologue evaluated beside XLA's dot)."""
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    if jax.default_backend() != "gpu":
        monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")


def _close(got, want, dtype: str) -> None:
    tol = TOLERANCE[dtype]
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    scale = max(float(np.max(np.abs(want))), 1.0)
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * scale)


def _check(ours, theirs, args: tuple, dtype: str) -> None:
    """Values and the gradients of `sum(out * cotangent)` w.r.t. every argument; `theirs` runs
    in float64 on float64 copies of the arguments, jitted (eagerly each of its operations is
    compiled alone)."""
    wide = tuple(jnp.asarray(a, jnp.float64) for a in args)
    got, want = ours(*args), jax.jit(theirs)(*wide)
    assert got.dtype == jnp.dtype(dtype)
    _close(got, want, dtype)
    cotangent = np.random.default_rng(99).normal(size=want.shape)
    grads = jax.vjp(ours, *args)[1](jnp.asarray(cotangent, dtype))
    expected = jax.jit(lambda c, *w: jax.vjp(theirs, *w)[1](c))(jnp.asarray(cotangent), *wide)
    for g, e in zip(grads, expected):
        _close(g, e, dtype)


def _attention_jnp(q, k, v, mod=None, mask=None):
    """(B, T, H, E) attention with materialised scores, as a jax.numpy user writes it."""
    s = jnp.einsum("bihd,bjhd->bhij", q, k, precision="highest") / math.sqrt(q.shape[-1])
    s = s if mod is None else mod(s)
    s = s if mask is None else jnp.where(mask, s, -jnp.inf)
    return jnp.einsum("bhij,bjhe->bihe", jax.nn.softmax(s, axis=-1), v, precision="highest")


def _qkv(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> tuple:
    return tuple(jnp.asarray(rng.normal(size=shape), dtype) for _ in range(3))


# --------------------------------------------------------------------------- powers

H5 = np.arange(5)
POWERS = {  # body over X[h] (h < 5): numpy float64 of X and h
    "X[h] + 2^(-(h + 1))": lambda x: x + 2.0 ** -(H5 + 1.0),
    "X[h] * 2^(-(h + 1) * 8 / 4)": lambda x: x * 2.0 ** (-(H5 + 1.0) * 2),
    "X[h] + 3^(2 - h)": lambda x: x + 3.0 ** (2.0 - H5),
    "X[h] + (-2)^h": lambda x: x + (-2.0) ** H5,
    "X[h] + (h + 1)^(-2)": lambda x: x + (H5 + 1.0) ** -2,
    "X[h] + (h - 2)^3": lambda x: x + (H5 - 2.0) ** 3,
    "X[h]^h": lambda x: x ** H5.astype(float),
    "X[h]^(-h)": lambda x: x ** -H5.astype(float),
    "X[h]^(-2)": lambda x: x**-2.0,
    "X[h] * 2^(-h / 2)": lambda x: x * 2.0 ** (-H5 / 2),
}


@pytest.mark.parametrize(
    ("body", "dtype", "backend"),
    product(sorted(POWERS), ["float64", "float32"], BACKENDS, every=3),
)
def test_powers_follow_ieee_floats(backend, dtype, body):
    """An integer base with a negative or index-valued exponent is a float power (0.5, 0.25,
    ...), never a truncated or wrapped integer one; its gradient too."""
    x = jnp.asarray([1.5, -0.7, 2.2, 0.9, -1.3], dtype)
    kernel = td.kernel(f"Y[h] := {body}", backend=backend)
    _check(kernel, POWERS[body], (x,), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_alibi_written_with_a_power(backend, dtype):
    """ALiBi's slopes `2^(-8 (h + 1) / H)` written as a power of the head index."""
    B, T, H, E = 2, 6, 4, 8
    q, k, v = _qkv(np.random.default_rng(1), (B, T, H, E), dtype)
    offsets = np.arange(T)[None, :] - np.arange(T)[:, None]  # j - i
    slopes = 2.0 ** (-(np.arange(H) + 1.0) * 8 / H)

    def ours(q, k, v):
        mod = f"S + (j - i) * 2^(-(h + 1) * 8 / {H})"
        return nn.attention(q, k, v, score_mod=mod, backend=backend)

    def theirs(q, k, v):
        return _attention_jnp(q, k, v, mod=lambda s: s + slopes[:, None, None] * offsets)

    _check(ours, theirs, (q, k, v), dtype)


# --------------------------------------------------------------------------- wrapped tables


@pytest.mark.parametrize("backend", BACKENDS)
def test_table_read_through_a_wrapped_relative_position(backend):
    """`S * F[mod(i - j)]`: the gradient of F gathers through the wrap. At this size the C
    and CUDA gradient of F computes the two scores it reads in two nested reductions over
    `d`; they were given one loop index, and a load of one was hoisted out of its loop
    (the compiler rejected the code: `v_d_1` undeclared)."""
    B, T, H, E = 2, 70, 4, 32
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, (B, T, H, E), "float64")
    table = jnp.asarray(rng.normal(size=T))
    wrapped = (np.arange(T)[:, None] - np.arange(T)[None, :]) % T

    def ours(q, k, v, table):
        return nn.attention(
            q, k, v, score_mod="S * F[mod(i - j)]", mod_args={"F": table}, backend=backend
        )

    def theirs(q, k, v, table):
        return _attention_jnp(q, k, v, mod=lambda s: s * table[wrapped])

    _check(ours, theirs, (q, k, v, table), "float64")


# --------------------------------------------------------------------------- clamped masks

MASKS = {  # mask_mod: the same mask in numpy, of query and key positions
    "(j >= max(i, 1)) * (j <= max(i, 2) + 3) * (j >= max(2*i, 1)) * (j <= max(2*i, 2) + 5)"
    " * (j <= max(3*i, 2) + 4)": lambda i, j: (
        (j >= np.maximum(i, 1))
        & (j <= np.maximum(i, 2) + 3)
        & (j >= np.maximum(2 * i, 1))
        & (j <= np.maximum(2 * i, 2) + 5)
        & (j <= np.maximum(3 * i, 2) + 4)
    ),
    # a window centred on the query, clamped inside the sequence (NATTEN's 1-D neighbourhood)
    "abs(j - min(max(i, 2), 6)) <= 2": lambda i, j: np.abs(j - np.clip(i, 2, 6)) <= 2,
    "(j >= min(i, 4)) * (j <= max(i, 4))": lambda i, j: (
        (j >= np.minimum(i, 4)) & (j <= np.maximum(i, 4))
    ),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mask", sorted(MASKS))
def test_masks_of_clamped_comparisons(backend, mask):
    """Index comparisons with `max`/`min` of indices: right forwards and backwards (the
    front end once took minutes to build them). Four queries, nine keys: every query keeps
    a key (the first mask keeps none for a query past 3)."""
    rng = np.random.default_rng(3)
    q = jnp.asarray(rng.normal(size=(2, 4, 2, 4)))
    k, v = (jnp.asarray(rng.normal(size=(2, 9, 2, 4))) for _ in range(2))
    kept = MASKS[mask](np.arange(4)[:, None], np.arange(9)[None, :])
    assert kept.any(axis=1).all()

    def ours(q, k, v):
        return nn.attention(q, k, v, mask_mod=mask, backend=backend)

    def theirs(q, k, v):
        return _attention_jnp(q, k, v, mask=kept)

    _check(ours, theirs, (q, k, v), "float64")


# --------------------------------------------------------------------------- x64


def _kernel_operand_dtypes(fn, *args) -> set[str]:
    jaxpr = jax.make_jaxpr(fn)(*args)
    return {str(v.aval.dtype) for e in nest_equations(jaxpr.jaxpr) for v in e.invars}


def test_python_floats_keep_float32_kernels_float32_under_x64():
    """With `jax_enable_x64` (on in this suite) a Python float is a weakly typed float64; the
    kernels of float32 inputs still read it as float32, as JAX's `x * 0.5` does, so they
    compute in float (they computed in double, 3-6x slower); their gradients are float32."""
    assert jax.config.jax_enable_x64
    q = jnp.asarray(np.random.default_rng(4).normal(size=(1, 8, 2, 4)), jnp.float32)

    def loss(q):
        return jnp.sum(nn.attention(q, q, q, causal=True, scale=0.3, backend="c") ** 2)

    assert _kernel_operand_dtypes(jax.grad(loss), q) == {"float32"}
    assert jax.grad(loss)(q).dtype == jnp.float32
    kernel = td.kernel("Y[i] := X[i] * s", backend="c")
    x = jnp.asarray([0.5, 1.5], jnp.float32)
    assert _kernel_operand_dtypes(lambda x: kernel(x, 0.25), x) == {"float32"}
    strong = _kernel_operand_dtypes(lambda x: kernel(x, np.float64(0.25)), x)
    assert strong == {"float32", "float64"}  # a NumPy float64 promotes, as in JAX
    ds = jax.grad(lambda s: jnp.sum(kernel(x, s)))(0.25)  # a Python float's gradient
    assert ds.dtype == jnp.float64 and float(ds) == 2.0
