"""FlashAttention-class attention on the pallas back end (`codegen.tiles.attention`,
`tensordsl/backends/pallas/attention.py`), in Pallas' interpret mode, against an independent
float64 jax.numpy attention: every variant's forward and every gradient (q, k, v and the
modifiers' arrays) for a random cotangent, f32 and bf16; that the fused kernels run (one
Triton kernel forward, D + dK/dV + dQ backward, in the CUDA lowering); and that each lowers
for CUDA on this CPU, forward and value_and_grad.

Pallas allocates every output and each program instance writes its whole block once, so
there is nothing to poison.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl.backends.pallas.api import TRITON_CUSTOM_CALL, lowering_for_gpu
from tensordsl.nn.attention import attention_source
from tests.sampling import sampled


@dataclass(frozen=True)
class Variant:
    """An attention call: its shapes `(B, T, S, H, Hk, E)`, keyword arguments, the arrays of
    `mod_args` (made from the rng), and the float64 score rule `(s, arrays, b, h, i, j)`
    -> (score, keep) of the reference."""

    shape: tuple[int, int, int, int, int, int]
    kwargs: dict = field(default_factory=dict)
    arrays: Any = None
    rule: Any = None
    #: The mod_args arrays whose gradient is zero (a mask's).
    no_gradient: tuple[str, ...] = ()


def _plain(s, a, b, h, i, j):
    return s, jnp.ones(s.shape, bool)


def _causal(s, a, b, h, i, j):
    return s, j <= i


VARIANTS = {
    "plain": Variant((2, 48, 48, 2, 2, 16), {}, None, _plain),
    "causal": Variant((1, 64, 64, 2, 2, 32), {"causal": True}, None, _causal),
    "sliding_window": Variant(
        (1, 72, 72, 2, 2, 16),
        {"causal": True, "mask_mod": "i - j <= 20"},
        None,
        lambda s, a, b, h, i, j: (s, (j <= i) & (i - j <= 20)),
    ),
    "padding_mask": Variant(
        (2, 40, 40, 2, 2, 16),
        {"mask_mod": "M[b, j] > 0"},
        lambda rng, B, T, S, H: {
            "M": np.concatenate([np.ones((B, 1)), (rng.random((B, S - 1)) > 0.4)], axis=1).astype(
                np.float32
            )
        },
        lambda s, a, b, h, i, j: (s, a["M"][b, j] > 0),
        no_gradient=("M",),
    ),
    "relative_bias": Variant(
        (1, 40, 40, 2, 2, 16),
        {"causal": True, "score_mod": "S + R[h, i - j + 39]"},
        lambda rng, B, T, S, H: {"R": rng.normal(size=(H, T + S - 1)).astype(np.float32)},
        lambda s, a, b, h, i, j: (s + a["R"][h, i - j + 39], j <= i),
    ),
    "alibi": Variant(
        (1, 48, 48, 4, 4, 16),
        {"causal": True, "score_mod": "S - 2 ** (-(h + 1)) * abs(i - j)"},
        None,
        lambda s, a, b, h, i, j: (s - 2.0 ** (-(h + 1)) * jnp.abs(i - j), j <= i),
    ),
    "alibi_learned_slopes": Variant(
        (2, 32, 32, 2, 2, 16),
        {"causal": True, "score_mod": "S - sl[h] * abs(i - j)"},
        lambda rng, B, T, S, H: {"sl": rng.uniform(0.05, 0.5, size=H).astype(np.float32)},
        lambda s, a, b, h, i, j: (s - a["sl"][h] * jnp.abs(i - j), j <= i),
    ),
    "soft_cap": Variant(
        (1, 48, 48, 2, 2, 16),
        {"score_mod": "3 * tanh(S / 3)"},
        None,
        lambda s, a, b, h, i, j: (3 * jnp.tanh(s / 3), jnp.ones(s.shape, bool)),
    ),
    "learned_soft_cap": Variant(
        (1, 48, 48, 2, 2, 16),
        {"score_mod": "c * tanh(S / c)"},
        lambda rng, B, T, S, H: {"c": np.float32(rng.uniform(2.0, 4.0))},
        lambda s, a, b, h, i, j: (a["c"] * jnp.tanh(s / a["c"]), jnp.ones(s.shape, bool)),
    ),
    "learned_scale": Variant(
        (2, 40, 40, 2, 2, 16),
        {"causal": True, "score_mod": "S * t"},
        lambda rng, B, T, S, H: {"t": np.float32(rng.uniform(0.5, 1.5))},
        lambda s, a, b, h, i, j: (s * a["t"], j <= i),
    ),
    "grouped_query_relative_bias": Variant(
        (1, 40, 40, 4, 2, 16),
        {"causal": True, "score_mod": "S + R[h, i - j + 39]"},
        lambda rng, B, T, S, H: {"R": rng.normal(size=(H, T + S - 1)).astype(np.float32)},
        lambda s, a, b, h, i, j: (s + a["R"][h, i - j + 39], j <= i),
    ),
    "padding_mask_learned_slopes": Variant(
        (2, 40, 40, 2, 2, 16),
        {"mask_mod": "M[b, j] > 0", "score_mod": "S - sl[h] * abs(i - j)"},
        lambda rng, B, T, S, H: {
            "M": np.concatenate([np.ones((B, 1)), (rng.random((B, S - 1)) > 0.4)], axis=1).astype(
                np.float32
            ),
            "sl": rng.uniform(0.05, 0.5, size=H).astype(np.float32),
        },
        lambda s, a, b, h, i, j: (s - a["sl"][h] * jnp.abs(i - j), a["M"][b, j] > 0),
        no_gradient=("M",),
    ),
    "grouped_query": Variant((1, 40, 40, 4, 2, 16), {"causal": True}, None, _causal),
    "cross": Variant((2, 24, 72, 2, 2, 16), {}, None, _plain),
    "odd_length": Variant((1, 37, 37, 2, 2, 24), {"causal": True}, None, _causal),
    # Array masks (the nests' guard): tested per (query, key) pair on every tile.
    "document_sorted": Variant(
        (2, 72, 72, 2, 2, 16),
        {"mask_mod": "doc[b, i] == doc[b, j]"},
        lambda rng, B, T, S, H: {"doc": _documents(rng, B, T, shuffled=False)},
        lambda s, a, b, h, i, j: (s, a["doc"][b, i] == a["doc"][b, j]),
        no_gradient=("doc",),
    ),
    "document_unsorted": Variant(
        (2, 72, 72, 2, 2, 16),
        {"causal": True, "mask_mod": "doc[b, i] == doc[b, j]"},
        lambda rng, B, T, S, H: {"doc": _documents(rng, B, T, shuffled=True)},
        lambda s, a, b, h, i, j: (s, (a["doc"][b, i] == a["doc"][b, j]) & (j <= i)),
        no_gradient=("doc",),
    ),
}


def _documents(rng, B: int, T: int, shuffled: bool) -> np.ndarray:
    """(B, T) document ids: sorted runs (packed sequences) or the same ids shuffled; the
    first query's document holds the first key (no query of the causal variant keeps none)."""
    ids = np.sort(rng.integers(0, 4, size=(B, T)), axis=1)
    if shuffled:
        ids = rng.permuted(ids, axis=1)
    return ids.astype(np.float32)


def reference(q, k, v, arrays, rule):
    """float64 softmax attention: `(B, T, H, E)` queries, `(B, S, Hk, E)` keys and values."""
    B, T, H, E = q.shape
    S, Hk = k.shape[1], k.shape[2]
    k = jnp.repeat(k, H // Hk, axis=2)
    v = jnp.repeat(v, H // Hk, axis=2)
    s = jnp.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(E)
    b, h, i, j = np.meshgrid(
        np.arange(B), np.arange(H), np.arange(T), np.arange(S), indexing="ij", sparse=True
    )
    s, keep = rule(s, arrays, b, h, i, j)
    s = jnp.where(keep, s, -jnp.inf)
    p = jnp.exp(s - s.max(axis=-1, keepdims=True))
    p = p / p.sum(axis=-1, keepdims=True)
    return jnp.einsum("bhij,bjhe->bihe", p, v)


def reference_vjp(ref, args, cotangent):
    """`ref(*args)` and its vjp of `cotangent`, traced and compiled as one program: run
    eagerly, each jax.numpy operation of `ref` and of its transpose is compiled alone, about
    ten times the time (docs/testing.md)."""

    @jax.jit
    def both(cotangent, *args):
        out, vjp = jax.vjp(ref, *args)
        return out, vjp(cotangent)

    return both(jnp.asarray(cotangent, jnp.float64), *args)


def _inputs(variant: Variant, seed: int = 0) -> tuple[list, dict]:
    B, T, S, H, Hk, E = variant.shape
    rng = np.random.default_rng(seed)
    qkv = [rng.normal(size=(B, n, h, E)) for n, h in ((T, H), (S, Hk), (S, Hk))]
    arrays = variant.arrays(rng, B, T, S, H) if variant.arrays else {}
    return qkv, arrays


def _attention(variant: Variant, backend: str = "pallas"):
    names = []

    def call(q, k, v, *mods):
        args = dict(zip(names, mods))
        return td.nn.attention(q, k, v, backend=backend, mod_args=args or None, **variant.kwargs)

    return call, names


TOLERANCE = {"float32": 2e-5, "bfloat16": 3e-2}
#: Every variant in float32; in bfloat16 every third (`-m exhaustive`: every one).
SAMPLED = [pytest.param(name, "float32", id=f"float32-{name}") for name in sorted(VARIANTS)] + [
    pytest.param(p.values[0], "bfloat16", id=f"bfloat16-{p.id}", marks=p.marks)
    for p in sampled(sorted(VARIANTS), every=3, ids=str)
]


@pytest.mark.parametrize(("name", "dtype"), SAMPLED)
def test_forward_and_every_gradient_match_float64(name, dtype):
    variant = VARIANTS[name]
    (q, k, v), arrays = _inputs(variant)
    call, names = _attention(variant)
    names += sorted(arrays)
    args = [jnp.asarray(x, dtype) for x in (q, k, v)]
    args += [jnp.asarray(arrays[n], dtype) for n in names]
    cotangent = jnp.asarray(
        np.random.default_rng(1).normal(size=args[0].shape[:-1] + (variant.shape[-1],)), dtype
    )

    @jax.jit
    def forward_and_backward(*args):
        out, vjp = jax.vjp(call, *args)
        return out, vjp(cotangent)

    out, found = forward_and_backward(*args)
    wide = [jnp.asarray(a, jnp.float64) for a in args]

    def ref(q, k, v, *mods):
        return reference(q, k, v, dict(zip(names, mods)), variant.rule)

    expected, wanted = reference_vjp(ref, wide, cotangent)
    tolerance = TOLERANCE[dtype]
    scale = float(jnp.abs(expected).max())
    error = float(jnp.abs(out.astype(jnp.float64) - expected).max())
    assert error <= tolerance * scale, f"forward: {error} over {tolerance} * {scale}"
    for what, got, want in zip(["q", "k", "v", *names], found, wanted):
        scale = float(jnp.abs(want).max())
        error = float(jnp.abs(got.astype(jnp.float64) - want).max())
        if what in variant.no_gradient:  # a mask: its gradient is zero
            assert scale == 0 and error == 0, f"d{what}: {error}"
            continue
        assert scale > 0 and error <= 2 * tolerance * scale, f"d{what}: {error} vs {scale}"


def lowered_for_cuda(function, *args) -> str:
    with lowering_for_gpu():
        return jax.jit(function).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


def _loss(call):
    def loss(*args):
        return call(*args).astype(jnp.float32).sum()

    return loss


def _kernels(text: str) -> list[str]:
    """The names of the Triton kernels a lowered module calls, in order."""
    calls = [line for line in text.splitlines() if TRITON_CUSTOM_CALL in line]
    return [re.search(r'name = "([^"]*)"', line).group(1) for line in calls]


@pytest.mark.parametrize(
    "name",
    ["causal", "grouped_query", "cross", "padding_mask", "document_sorted", "document_unsorted"],
)
def test_the_fused_kernels_run(name):
    """One kernel forward; backward the D pass (`dlse_ = -rowsum(dO * O)`), dK and dV in one
    kernel, and dQ: nothing else; array masks (guards) too."""
    variant = VARIANTS[name]
    (q, k, v), arrays = _inputs(variant)
    call, names = _attention(variant)
    names += sorted(arrays)
    args = [jnp.asarray(x, jnp.float32) for x in (q, k, v)]
    args += [jnp.asarray(arrays[n], jnp.float32) for n in names]
    assert _kernels(lowered_for_cuda(call, *args)) == ["tdsl_out__flash"]
    both = lowered_for_cuda(jax.value_and_grad(_loss(call), argnums=(0, 1, 2)), *args)
    assert _kernels(both) == [
        "tdsl_out__flash",
        "tdsl_dlse__tiles",
        "tdsl_dv__dk__flash",
        "tdsl_dq__flash",
    ]


#: The attention variants with a score parameter, and the parameter.
PARAMETERS = {
    "relative_bias": "R",
    "alibi_learned_slopes": "sl",
    "learned_soft_cap": "c",
    "learned_scale": "t",
    "grouped_query_relative_bias": "R",
    "padding_mask_learned_slopes": "sl",
}


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_score_parameter_gradients_are_partial_sums_of_the_dk_dv_kernel(name):
    """The gradient of a score parameter (a relative-bias table, ALiBi slopes, a soft-cap, a
    scale; with a padding mask too) runs inside the dK+dV kernel as per-tile partial sums:
    no kernel of its own; a relative-bias table's forward and dQ, dK+dV kernels are the
    fused ones too. (A mask's array is not differentiated: its gradient is zero.)"""
    variant = VARIANTS[name]
    (q, k, v), arrays = _inputs(variant)
    call, names = _attention(variant)
    names += sorted(arrays)
    args = [jnp.asarray(x, jnp.float32) for x in (q, k, v)]
    args += [jnp.asarray(arrays[n], jnp.float32) for n in names]
    assert _kernels(lowered_for_cuda(call, *args)) == ["tdsl_out__flash"]
    argnums = (0, 1, 2, *(3 + n for n, a in enumerate(names) if a not in variant.no_gradient))
    both = lowered_for_cuda(jax.value_and_grad(_loss(call), argnums=argnums), *args)
    assert _kernels(both) == [
        "tdsl_out__flash",
        "tdsl_dlse__tiles",
        "tdsl_dv__dk__flash",
        "tdsl_dq__flash",
    ]
    # The parameter alone differentiated: no dK+dV pair to carry it, its own tile program
    # (of few elements: per-row partial sums, `codegen/passes/partials.py`).
    alone = lowered_for_cuda(jax.grad(_loss(call), argnums=len(args) - 1), *args)
    own = {f"tdsl_d{PARAMETERS[name]}_tiles", f"tdsl_d{PARAMETERS[name]}_rows__tiles"}
    assert own & set(_kernels(alone)), _kernels(alone)


def test_score_parameter_gradients_are_deterministic_and_batch():
    """Two runs give the same bits (partials summed in a fixed order, no atomics); under
    vmap (the batching of the fused primitive: the separate nests) each batch row matches
    the unbatched gradients."""
    variant = VARIANTS["relative_bias"]
    (q, k, v), arrays = _inputs(variant, seed=8)
    call, names = _attention(variant)
    names += sorted(arrays)
    args = [jnp.asarray(x, jnp.float32) for x in (q, k, v)] + [jnp.asarray(arrays["R"])]
    grad = jax.jit(jax.grad(_loss(call), argnums=(1, 2, 3)))
    first, second = grad(*args), grad(*args)
    for a, b in zip(first, second):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    tables = jnp.stack([args[3], args[3][:, ::-1] * 0.5])
    batched = jax.jit(jax.vmap(lambda R: grad(*args[:3], R)))(tables)
    for n in range(2):
        one = grad(*args[:3], tables[n])
        for a, b in zip(batched, one):
            np.testing.assert_allclose(np.asarray(a[n]), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_explain_shows_the_attention_tile_programs():
    source = attention_source("s_[b,h,i,j]", "(j <= i)")
    k = td.program(source, backend="pallas")
    shapes = {"q_": (2, 100, 4, 64), "k_": (2, 100, 4, 64), "v_": (2, 100, 4, 64), "scale_": ()}
    text = k.explain(shapes, target="pallas")
    forward = text[text.index("out_+lse_: attention tile program") :]
    assert "grid: 2 x 4 x 2 = 16 program instance(s), one per (b, h) and i tile" in forward
    assert "dot: [i x d_1] @ [d_1 x j]" in forward
    assert "bound j: j <= i (tiles outside never visited)" in forward
    assert "tiles per (b, h): 3 of 4 visited, 1 skipped" in forward
    assert "j tiles per i tile: 0: [0, 1), 1: [0, 2)" in forward
    assert "dv__dk_: attention tile program" in text and "dq_: attention tile program" in text


def test_explain_shows_the_partial_sums_of_a_relative_bias_table():
    source = attention_source("s_[b,h,i,j] + R[h, i - j + 99]", "(j <= i)")
    k = td.program(source, backend="pallas")
    shapes = {"q_": (2, 100, 4, 64), "k_": (2, 100, 4, 64), "v_": (2, 100, 4, 64), "scale_": ()}
    text = k.explain({**shapes, "R": (4, 199)}, target="pallas")
    assert "out_+lse_: attention tile program" in text  # the forward fused
    pair = text[text.index("dv__dk_: attention tile program") : text.index("dq_: attention")]
    assert "  dR: partial sums of " in pair
    assert (
        "per program instance (per (h) from the grid, 199 position(s) at i - j + 99 in "
        "windows of 128 per tile), written once, summed after the kernel in a fixed order "
        "(no atomics)" in pair
    )
    assert "  dscale_: partial sums of " in pair and "(one value per program instance)" in pair
    assert "dR: tile program" not in text


def test_explain_shows_an_array_mask_tested_on_every_tile():
    source = attention_source("s_[b,h,i,j]", "(doc[b, i] == doc[b, j])")
    k = td.program(source, backend="pallas")
    shapes = {"q_": (2, 100, 4, 64), "k_": (2, 100, 4, 64), "v_": (2, 100, 4, 64)}
    text = k.explain({**shapes, "scale_": (), "doc": (2, 100)}, target="pallas")
    forward = text[text.index("out_+lse_: attention tile program") :]
    assert (
        "where doc[b, i] == doc[b, j]: on every tile (a pair it fails left out: score -inf"
        in forward
    )
    assert "tiles per (b, h): 4 of 4 visited, 0 skipped" in forward
    gradients = text[text.index("dv__dk_: attention tile program") :]
    assert (
        "where doc[b, i] == doc[b, j]: on every tile (a pair it fails left out: weight 0"
        in gradients
    )
    assert "dq_: attention tile program" in gradients


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", ["causal", "soft_cap"])
def test_forward_and_value_and_grad_lower_to_triton(name, dtype):
    variant = VARIANTS[name]
    (q, k, v), arrays = _inputs(variant)
    call, names = _attention(variant)
    names += sorted(arrays)
    args = [jnp.asarray(x, dtype) for x in (q, k, v)] + [jnp.asarray(arrays[n]) for n in names]
    forward = lowered_for_cuda(call, *args)
    assert forward.count(TRITON_CUSTOM_CALL) == 1  # the whole forward: one kernel
    both = lowered_for_cuda(jax.value_and_grad(_loss(call), argnums=(0, 1, 2)), *args)
    assert _kernels(both) == [
        "tdsl_out__flash",
        "tdsl_dlse__tiles",
        "tdsl_dv__dk__flash",
        "tdsl_dq__flash",
    ]


@pytest.mark.parametrize("width", [8, 80, 256])
def test_head_dims_are_padded_to_a_power_of_two(width):
    """Head dims under 16, between powers of two and the widest (256), forward and every
    gradient, with a partial row and key tile. At these shapes the cost model would store
    the scores (they are smaller than q): `fuse=` recomputes them, as at long T."""
    source = attention_source("s_[b,h,i,j]", "(j <= i)")
    program = td.program(source, backend="pallas", fuse={"s_": "inline"})
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 24, 2, width)), jnp.float32) for _ in range(3))
    scale = jnp.asarray(1 / np.sqrt(width), jnp.float32)

    def call(q, k, v):
        return program(q_=q, k_=k, v_=v, scale_=scale)

    cotangent = jnp.asarray(rng.normal(size=(1, 2, 24, width)), jnp.float32)

    @jax.jit
    def forward_and_backward(*args):
        out, vjp = jax.vjp(call, *args)
        return out, vjp(cotangent)

    out, found = forward_and_backward(q, k, v)

    def ref(q, k, v):
        return jnp.swapaxes(reference(q, k, v, {}, _causal), 1, 2)

    wide = [jnp.asarray(a, jnp.float64) for a in (q, k, v)]
    expected, wanted = reference_vjp(ref, wide, cotangent)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=2e-5, rtol=2e-5)
    for got, want in zip(found, wanted):
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-4, rtol=1e-4)
    both = lowered_for_cuda(jax.value_and_grad(lambda *a: call(*a).sum(), (0, 1, 2)), q, k, v)
    assert _kernels(both) == [
        "tdsl_out__flash",
        "tdsl_dlse__tiles",
        "tdsl_dv__dk__flash",
        "tdsl_dq__flash",
    ]


def test_vmap_keeps_the_fused_kernel():
    """vmap adds a leading free index to the nests: one more outer axis of the grid."""
    variant = VARIANTS["causal"]
    (q, k, v), _ = _inputs(variant)
    call, _ = _attention(variant)
    stacked = [jnp.asarray(np.stack([x, x[::-1] * 0.5]), jnp.float32) for x in (q, k, v)]
    batched = jax.vmap(call)
    out = jax.jit(batched)(*stacked)
    for n in range(2):
        wide = [jnp.asarray(x[n], jnp.float64) for x in stacked]
        expected = reference(*wide, {}, _causal)
        np.testing.assert_allclose(np.asarray(out[n]), np.asarray(expected), atol=2e-5)
    assert _kernels(lowered_for_cuda(batched, *stacked)) == ["tdsl_out__flash"]


def test_jvp_matches_float64():
    """Forward mode: the tangent nests of the fused forward (run as its two nests)."""
    variant = VARIANTS["sliding_window"]
    (q, k, v), _ = _inputs(variant, seed=4)
    call, _ = _attention(variant)
    rng = np.random.default_rng(5)
    primals = tuple(jnp.asarray(x, jnp.float32) for x in (q, k, v))
    tangents = tuple(jnp.asarray(rng.normal(size=x.shape), jnp.float32) for x in (q, k, v))
    out, tangent = jax.jit(lambda p, t: jax.jvp(call, p, t))(primals, tangents)
    wide = [tuple(jnp.asarray(x, jnp.float64) for x in xs) for xs in (primals, tangents)]
    expected, expected_tangent = jax.jit(
        lambda p, t: jax.jvp(lambda *a: reference(*a, {}, variant.rule), p, t)
    )(*wide)
    np.testing.assert_allclose(np.asarray(out), np.asarray(expected), atol=2e-5)
    np.testing.assert_allclose(np.asarray(tangent), np.asarray(expected_tangent), atol=1e-4)


@pytest.mark.parametrize(
    ("name", "which"),
    [("padding_mask", "k"), ("padding_mask", "v"), ("document_sorted", "v")],
)
def test_a_nan_at_a_dropped_key_reaches_nothing(name, which):
    """A NaN in k or v at a key the array mask drops: the fused kernels leave the pair out
    (score -inf, `where(guard, product, 0)`), so the NaN reaches no output and no gradient
    but where a query keeps that key (a document mask: the key's own document's queries)."""
    variant = VARIANTS[name]
    (q, k, v), arrays = _inputs(variant, seed=3)
    B, T, S, H, Hk, E = variant.shape
    wide = {"q": q, "k": k, "v": v}
    keep = np.broadcast_to(
        variant.rule(
            np.zeros((B, H, T, S)),
            arrays,
            *np.meshgrid(
                np.arange(B), np.arange(H), np.arange(T), np.arange(S), indexing="ij", sparse=True
            ),
        )[1],
        (B, H, T, S),
    )
    drop = int(np.nonzero(~keep[0, 0, 0])[0][-1])  # a key the first query drops
    poisoned = {n: x.copy() for n, x in wide.items()}
    poisoned[which][0, drop] = np.nan
    call, names = _attention(variant)
    names += sorted(arrays)
    mods = [jnp.asarray(arrays[n], jnp.float32) for n in names]
    cotangent = jnp.asarray(np.random.default_rng(1).normal(size=(B, T, H, E)), jnp.float32)

    def run(q, k, v):
        out, vjp = jax.vjp(lambda q, k, v: call(q, k, v, *mods), q, k, v)
        return (out, *vjp(cotangent))

    got = jax.jit(run)(*(jnp.asarray(poisoned[n], jnp.float32) for n in "qkv"))
    assert _kernels(lowered_for_cuda(run, *(jnp.asarray(wide[n], jnp.float32) for n in "qkv"))) == [
        "tdsl_out__flash",
        "tdsl_dlse__tiles",
        "tdsl_dv__dk__flash",
        "tdsl_dq__flash",
    ]
    # Where the NaN may go: the queries that keep the key, and what they reach.
    reached = keep[0, :, :, drop].any(axis=0)  # (T,) queries of batch row 0 keeping it
    ref_args = [jnp.asarray(wide[n], jnp.float64) for n in "qkv"]
    expected, grads = reference_vjp(
        lambda q, k, v: reference(q, k, v, arrays, variant.rule), ref_args, cotangent
    )
    wanted = (expected, *grads)
    for what, g, w in zip(("out", "dq", "dk", "dv"), got, wanted):
        g, w = np.asarray(g, np.float64), np.asarray(w)
        finite = np.ones(g.shape, bool)
        if reached.any():  # the document's own queries see the NaN: out and dq there, all k
            finite[0] = False
        assert np.isfinite(g[finite]).all(), what
        if not reached.any():
            assert np.isfinite(g).all(), what
            scale = float(np.abs(w).max())
            assert np.abs(g - w).max() <= 4e-5 * scale, what
        else:
            np.testing.assert_allclose(g[1], w[1], atol=4e-5 * float(np.abs(w).max()))
            if what == "out":
                rows = ~reached
                assert np.isnan(g[0, reached]).all() and np.isfinite(g[0, rows]).all()
                np.testing.assert_allclose(g[0, rows], w[0, rows], atol=4e-5)


def test_a_query_that_keeps_no_key_gives_zero_and_zero_gradients():
    """An array mask `i + off[b] >= j` that keeps no key for the first queries of batch row
    0: their output is 0 and they add nothing to any gradient (finite, as the reference's
    where the rows kept are, zero where they are not), in the fused kernels."""
    B, T, H, E = 2, 40, 2, 16
    off = np.array([-5, 0], np.float32)
    keep = np.arange(T)[None, :, None] + off[:, None, None] >= np.arange(T)[None, None]
    rng = np.random.default_rng(7)
    q, k, v = (jnp.asarray(rng.normal(size=(B, T, H, E)), jnp.float32) for _ in range(3))
    cotangent = jnp.asarray(rng.normal(size=(B, T, H, E)), jnp.float32)

    def call(q, k, v, off):
        return td.nn.attention(
            q, k, v, mask_mod="i + off[b] >= j", mod_args={"off": off}, backend="pallas"
        )

    def run(q, k, v):
        out, vjp = jax.vjp(lambda q, k, v: call(q, k, v, jnp.asarray(off)), q, k, v)
        return (out, *vjp(cotangent))

    assert _kernels(lowered_for_cuda(run, q, k, v)) == [
        "tdsl_out__flash",
        "tdsl_dlse__tiles",
        "tdsl_dv__dk__flash",
        "tdsl_dq__flash",
    ]
    got = jax.jit(run)(q, k, v)

    def ref(q, k, v):
        mask = jnp.asarray(keep)[:, None]
        s = jnp.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(E)
        s = jnp.where(mask, s, -jnp.inf)
        m = jnp.where(mask.any(-1, keepdims=True), s.max(-1, keepdims=True), 0.0)
        p = jnp.where(mask, jnp.exp(s - m), 0.0)
        total = p.sum(-1, keepdims=True)
        p = p / jnp.where(total > 0, total, 1.0)
        return jnp.einsum("bhij,bjhe->bihe", p, v)

    wide = [jnp.asarray(x, jnp.float64) for x in (q, k, v)]
    expected, grads = reference_vjp(ref, wide, cotangent)
    wanted = (expected, *grads)
    empty = ~keep.any(-1)  # (B, T)
    assert empty[0, :5].all() and not empty[1].any()
    for what, g, w in zip(("out", "dq", "dk", "dv"), got, wanted):
        g = np.asarray(g, np.float64)
        assert np.isfinite(g).all(), what
        if what in ("out", "dq"):
            assert (g[empty] == 0).all(), what
        np.testing.assert_allclose(g, np.asarray(w), atol=4e-5 * float(np.abs(w).max()))


@pytest.mark.parametrize("which", ["k", "v"])
def test_a_nan_at_a_causally_dropped_key_reaches_only_the_queries_that_keep_it(which):
    """Causal, a NaN in k or v at the last key: only the last query keeps it, so only its
    output row is NaN (not `0 * NaN` through `p @ V` on the boundary tiles; not a NaN sum
    written as 0); every other row as the float64 reference on clean inputs."""
    variant = VARIANTS["odd_length"]
    (q, k, v), _ = _inputs(variant, seed=6)
    poisoned = {"q": q, "k": k.copy(), "v": v.copy()}
    poisoned[which][:, -1] = np.nan
    call, _ = _attention(variant)
    got = np.asarray(jax.jit(call)(*(jnp.asarray(poisoned[n], jnp.float32) for n in "qkv")))
    assert np.isnan(got[:, -1]).all()
    assert np.isfinite(got[:, :-1]).all()
    expected = np.asarray(reference(*(jnp.asarray(x, jnp.float64) for x in (q, k, v)), {}, _causal))
    np.testing.assert_allclose(got[:, :-1], expected[:, :-1], atol=2e-5)
