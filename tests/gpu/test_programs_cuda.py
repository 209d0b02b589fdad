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
