"""Programs on the cuda back end (fused: the scores of attention recomputed in every nest)
against the reference back end, values and gradients in float64: on a real GPU when there
is one, else under the CUDA emulator on the CPU."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.corpus import make_inputs
from tests.gpu.test_cuda_backend import EMULATED, REASON
from tests.programs import PROGRAMS_BY_NAME

pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
CASES = ("causal_attention", "relative_bias_attention", "layernorm", "softmax")


@pytest.fixture(autouse=True)
def _cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")  # these test generated kernels
    if EMULATED:
        monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")


@pytest.mark.parametrize("name", CASES)
def test_program_values_and_gradients_match_the_reference(name):
    import tensordsl as td

    case = PROGRAMS_BY_NAME[name]
    values = [jnp.asarray(v) for v in make_inputs(case, seed=4).values()]
    floats = tuple(n for n, v in enumerate(values) if jnp.issubdtype(v.dtype, jnp.floating))

    def results(backend):
        k = td.kernel(case.source, outputs=case.outputs, backend=backend)
        outs = k(*values)
        outs = outs if isinstance(outs, tuple) else (outs,)

        def loss(*args):
            got = k(*args)
            got = got if isinstance(got, tuple) else (got,)
            return sum(jnp.sum(jnp.where(jnp.isfinite(o), o, 0) * 0.7) for o in got)

        return outs, jax.grad(loss, argnums=floats)(*values)

    (ours, our_grads), (want, want_grads) = results("cuda"), results("reference")
    for got, expected in zip((*ours, *our_grads), (*want, *want_grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-10, atol=1e-12)


SHARED_KV = """
S[b,h,i,j] := Q[b,h,i,d] * K[j,d] * scale + where(j <= i, 0, -inf)
(logsumexp) L[b,h,i] := S[b,h,i,j]
O[b,h,i,e] := exp(S[b,h,i,j] - L[b,h,i]) * V[j,e]
"""
PER_QUERY = """
S[i,j] := Q[i,d] * K[j,d] * scale + where(j <= i, 0, -inf)
(logsumexp) L[i] := S[i,j]
O[i,e] := exp(S[i,j] - L[i]) * V[j,e]
"""


@pytest.mark.parametrize("form", ["4-D Q, 2-D K and V", "vmap over Q only"])
def test_attention_whose_keys_and_values_lack_the_batch_index(form):
    """Issue 27: the smem strategy was picked for a weighted sum whose weight holds the
    inlined scores (a nested reduction) and could not print it."""
    import tensordsl as td

    rng = np.random.default_rng(27)
    Q, K, V = rng.normal(size=(2, 2, 5, 3)), rng.normal(size=(5, 3)), rng.normal(size=(5, 4))
    cotangent = rng.normal(size=(2, 2, 5, 4))

    def results(backend):
        if form == "vmap over Q only":
            k = td.kernel(PER_QUERY, outputs=("O",), backend=backend)
            run = jax.vmap(
                jax.vmap(lambda q, kk, v: k(q, kk, 0.5, v)[0], (0, None, None)), (0, None, None)
            )
        else:
            k = td.kernel(SHARED_KV, outputs=("O",), backend=backend)

            def run(q, kk, v):
                return k(q, kk, 0.5, v)[0]

        out = run(Q, K, V)
        grads = jax.grad(lambda *a: jnp.vdot(run(*a), cotangent), argnums=(0, 1, 2))(Q, K, V)
        return out, grads

    (ours, our_grads), (want, want_grads) = results("cuda"), results("reference")
    for got, expected in zip((ours, *our_grads), (want, *want_grads)):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-10, atol=1e-12)
