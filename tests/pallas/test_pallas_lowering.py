"""Pallas kernels lowered for CUDA on a machine without a GPU: the lowered module holds the
Triton kernel call (`__gpu$xla.gpu.triton`), one per nest, not an interpreted fallback.

`jax.lax.platform_dependent` keeps only the branch of the platform lowered for, so lowering
for "cuda" here goes through Pallas' Triton lowering (Triton IR is built now; no PTX)."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl.backends.pallas.api import TRITON_CUSTOM_CALL, lowering_for_gpu
from tests.corpus import CORPUS, make_inputs

CASES = {
    "contraction": ("C[i,j] := A[i,k] * B[k,j]", {"A": (40, 70), "B": (70, 24)}),
    "elementwise": ("Y[i,j] := exp(A[i,j]) * B[j]", {"A": (40, 70), "B": (70,)}),
    "causal_scores": ("S[i,j] := Q[i,d] * K[j,d] * (j <= i)", {"Q": (48, 32), "K": (48, 32)}),
    "row_max": ("(max) M[i] := A[i,j] * B[j]", {"A": (40, 70), "B": (70,)}),
    "row_prod": ("(prod) P[i] := A[i,j] * B[j]", {"A": (40, 70), "B": (70,)}),
    "full_sum_scaled": ("s := a * X[i,j] * X[i,j]", {"a": (), "X": (40, 30)}),
}


def lowered_for_cuda(function, *args) -> str:
    with lowering_for_gpu():
        return jax.jit(function).trace(*args).lower(lowering_platforms=("cuda",)).as_text()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_value_and_grad_lower_to_triton(name, dtype):
    source, shapes = CASES[name]
    k = td.kernel(source, backend="pallas")
    rng = np.random.default_rng(0)
    args = [jnp.asarray(rng.normal(size=shapes[n]), dtype) for n in k.inputs]
    assert lowered_for_cuda(k, *args).count(TRITON_CUSTOM_CALL) == 1

    def loss(*values):
        return k(*values).astype(jnp.float32).sum()

    both = jax.value_and_grad(loss, argnums=tuple(range(len(args))))
    text = lowered_for_cuda(both, *args)
    # The forward, then one gradient nest per input (row_max: its argmax nest too).
    assert text.count(TRITON_CUSTOM_CALL) >= 1 + len(args)


def test_the_cpu_lowering_interprets():
    source, shapes = CASES["contraction"]
    k = td.kernel(source, backend="pallas")
    rng = np.random.default_rng(1)
    args = [jnp.asarray(rng.normal(size=shapes[n]), jnp.float32) for n in k.inputs]
    text = jax.jit(k).trace(*args).lower().as_text()
    assert TRITON_CUSTOM_CALL not in text and "while" in text


#: Corpus cases whose kernels do not lower for CUDA, and the primitive Pallas' Triton
#: lowering lacks (measured on JAX 0.10.2).
UNLOWERABLE = {"gelu_erf": "erf"}


@pytest.mark.parametrize("case", [c for c in CORPUS if c.differentiable], ids=lambda c: c.name)
def test_every_corpus_kernel_and_gradient_lowers_to_triton(case):
    """value_and_grad of every differentiable corpus kernel, float32: one Triton call per
    nest at least (the forward and each float input's gradient nest)."""
    inputs = make_inputs(case)
    k = td.kernel(case.source, reduce=case.reduce, ranges=case.ranges, backend="pallas")
    names = [n for n in k.inputs if np.issubdtype(np.asarray(inputs[n]).dtype, np.floating)]
    args = [jnp.asarray(inputs[n], jnp.float32) for n in names]

    def loss(*values):
        return k(**{**inputs, **dict(zip(names, values))}).sum()

    both = jax.value_and_grad(loss, argnums=tuple(range(len(args))))
    if case.name in UNLOWERABLE:
        with pytest.raises(NotImplementedError, match=UNLOWERABLE[case.name]):
            lowered_for_cuda(both, *args)
        return
    assert lowered_for_cuda(both, *args).count(TRITON_CUSTOM_CALL) >= 1 + len(args)


def _kernel_names(text: str) -> list[str]:
    calls = [line for line in text.splitlines() if TRITON_CUSTOM_CALL in line]
    return [re.search(r'name = "([^"]*)"', line).group(1) for line in calls]


#: Score parameters whose gradients the dK+dV kernel computes as per-tile partial sums.
SCORE_PARAMETERS = {
    "relative_bias_table": ("S + R[h, i - j + 39]", (2, 79)),
    "alibi_slopes": ("S - sl[h] * abs(i - j)", (2,)),
    "soft_cap": ("c * tanh(S / c)", ()),
}


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", sorted(SCORE_PARAMETERS))
def test_score_parameter_gradients_lower_inside_the_fused_kernels(name, dtype):
    """value_and_grad of attention with a score parameter, every input differentiated: the
    four fused Triton kernels, the parameter's gradient inside dK+dV (no kernel of its own)."""
    score_mod, shape = SCORE_PARAMETERS[name]
    rng = np.random.default_rng(2)
    q, k, v = (jnp.asarray(rng.normal(size=(1, 40, 2, 16)), dtype) for _ in range(3))
    param = jnp.asarray(rng.uniform(1.0, 2.0, size=shape), dtype)
    mod = {"relative_bias_table": "R", "alibi_slopes": "sl", "soft_cap": "c"}[name]

    def loss(q, k, v, p):
        out = td.nn.attention(
            q, k, v, causal=True, score_mod=score_mod, mod_args={mod: p}, backend="pallas"
        )
        return out.astype(jnp.float32).sum()

    both = jax.value_and_grad(loss, argnums=(0, 1, 2, 3))
    assert _kernel_names(lowered_for_cuda(both, q, k, v, param)) == [
        "tdsl_out__flash",
        "tdsl_dlse__tiles",
        "tdsl_dv__dk__flash",
        "tdsl_dq__flash",
    ]
