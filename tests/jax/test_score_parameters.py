"""The gradient of a score modifier's own parameters (ALiBi's learnt slopes, a relative-bias
table, a learnt soft-cap, per head or one scalar), with those of q, k and v: against float64
jax.numpy with materialised scores, on reference, C and CUDA (emulated without a GPU), at
shapes where a parameter's gradient runs as per-row partial sums (`codegen.passes.partials`,
the nest named `<gradient>_rows_`, checked to run: the soft-caps; the slopes and the table,
read beside the scores, sum the scores' cotangent instead), outputs poisoned."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl import nn
from tensordsl.explain.timing import nest_equations
from tests.backends import BACKENDS
from tests.jax.test_nn import attention_jnp, check

B, T, H, E = 2, 40, 2, 4  # B * T = 80 rows: enough to split (partials.GAIN)
I = np.arange(T)[:, None]  # query positions, against
J = np.arange(T)[None, :]  # key positions
CAUSAL = I >= J


def _slopes(rng):
    return jnp.asarray(rng.uniform(0.1, 1.0, size=H))


def _table(rng):
    return jnp.asarray(0.5 * rng.normal(size=(H, 2 * T - 1)))


def _caps(rng):
    return jnp.asarray(rng.uniform(0.5, 2.0, size=H))


def _cap(rng):
    return jnp.asarray(rng.uniform(0.5, 2.0))  # 0-d: read bare, a learnt scalar


#: name -> (score_mod, its parameter's name, the parameter from a Generator, the jnp score
#: modification of (scores (B, H, T, T), parameter), the partial nest a call must run or None)
CASES = {
    "alibi_learnt_slopes": (
        "S + slope[h] * (j - i)",
        "slope",
        _slopes,
        lambda s, a: s + a[:, None, None] * (J - I),
        None,  # read beside the scores: dS * (j - i) summed (tests/jax/test_scores_beside.py)
    ),
    "relative_bias_table": (
        f"S + R[h, i - j + {T - 1}]",
        "R",
        _table,
        lambda s, r: s + r[:, I - J + T - 1],
        None,  # the table has 2T - 1 elements per head: enough points to share out as it is
    ),
    "softcap_learnt_per_head": (
        "cap[h] * tanh(S / cap[h])",
        "cap",
        _caps,
        lambda s, c: c[:, None, None] * jnp.tanh(s / c[:, None, None]),
        "dcap_rows_",
    ),
    "softcap_learnt_scalar": (
        "cap * tanh(S / cap)",
        "cap",
        _cap,
        lambda s, c: c * jnp.tanh(s / c),
        "dcap_rows_",
    ),
}


@pytest.fixture
def poisoned_and_emulated(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs poisoned (an element no thread writes shows as NaN), CUDA emulated where
    there is no GPU."""
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    if jax.default_backend() != "gpu":
        monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")


def _inputs(name: str):
    rng = np.random.default_rng(sorted(CASES).index(name) + 40)
    q, k, v = (jnp.asarray(rng.normal(size=(B, T, H, E))) for _ in range(3))
    return q, k, v, CASES[name][2](rng)


def _ours(name: str, backend: str):
    score_mod, param, *_ = CASES[name]

    def run(q, k, v, a):
        return nn.attention(
            q, k, v, causal=True, score_mod=score_mod, mod_args={param: a}, backend=backend
        )

    return run


def _theirs(name: str):
    mod = CASES[name][3]
    return lambda q, k, v, a: attention_jnp(
        q, k, v, mask=jnp.asarray(CAUSAL), mod=lambda s: mod(s, a)
    )


@pytest.mark.usefixtures("poisoned_and_emulated")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_score_parameter_gradients(name, backend):
    """The output and the gradients of q, k, v and the modifier's parameter (float64)."""
    try:
        check(_ours(name, backend), _theirs(name), _inputs(name), "float64", (0, 1, 2, 3))
    except td.UnsupportedError as error:  # the CUDA emulator without a C++ compiler
        pytest.skip(str(error))


@pytest.mark.parametrize("name", sorted(n for n in CASES if CASES[n][4]))
def test_a_parameter_gradient_runs_by_rows(name):
    """The parameter's gradient is the per-row partial nest summed after it, not one nest
    with as few free points as the parameter has elements."""
    q, k, v, a = _inputs(name)
    ct = jnp.asarray(np.random.default_rng(1).normal(size=q.shape))
    ours = _ours(name, "reference")
    jaxpr = jax.make_jaxpr(jax.grad(lambda *x: jnp.sum(ours(*x) * ct), argnums=(0, 1, 2, 3)))(
        q, k, v, a
    )
    nests = {e.params["nest"].output: e.params["nest"] for e in nest_equations(jaxpr.jaxpr)}
    rows = nests[CASES[name][4]]
    assert {"b", "i"} <= {r.index.name for r in rows.free}  # a row of pairs per element
    assert [r.index.name for r in rows.terms[0].reduced] == ["j"]
    assert CASES[name][4].removesuffix("_rows_") not in nests
