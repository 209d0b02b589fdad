"""Nested reductions end to end: causal attention with the scores inlined (never stored),
guards as loop bounds, sum factorisation, the saved-output shortcut, on reference and C,
values and gradients against jax.numpy in float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy

from codegen.ir.nest import (
    LoopNest,
    Operand,
    Range,
    Reduce,
    Term,
    extent_symbol,
    index_symbol,
    scalar_symbol,
    tensor_base,
)
from codegen.passes.factor import factor_sums
from codegen.passes.guards import bound_guards
from codegen.passes.inline import inline
from tensordsl.binding import primitive as jax_bind

i, j, d, e = (index_symbol(n) for n in "ijde")
Q, K, V, S, L = (tensor_base(n) for n in "QKVSL")
E = extent_symbol


def attention_nests() -> tuple[LoopNest, LoopNest]:
    """L (logsumexp of the masked scores) and O, with S inlined into both."""
    scores = LoopNest(
        "S",
        (Range(i, 0, E("Q", 0)), Range(j, 0, E("K", 0))),
        (
            Term(
                Q[i, d] * K[j, d] * scalar_symbol("scale")
                + sympy.Piecewise((0, j <= i), (-sympy.oo, True)),
                (Range(d, 0, E("Q", 1)),),
            ),
        ),
        (Operand("Q", 2), Operand("K", 2), Operand("scale", 0)),
    )
    lse = LoopNest(
        "L",
        (Range(i, 0, E("S", 0)),),
        (Term(S[i, j], (Range(j, 0, E("S", 1)),)),),
        (Operand("S", 2),),
        "logsumexp",
    )
    out = LoopNest(
        "O",
        (Range(i, 0, E("S", 0)), Range(e, 0, E("V", 1))),
        (Term(sympy.exp(S[i, j] - L[i]) * V[j, e], (Range(j, 0, E("S", 1)),)),),
        (Operand("S", 2), Operand("L", 1), Operand("V", 2)),
    )
    return (
        factor_sums(bound_guards(inline(lse, scores))),
        factor_sums(bound_guards(inline(out, scores))),
    )


def test_the_scores_are_inlined_and_the_mask_bounds_the_loops():
    lse, out = attention_nests()
    for nest in (lse, out):
        assert "S" not in nest.operand_names
        (term,) = nest.terms
        assert term.constraints == (i - j,)  # the causal mask: j <= i, no -inf left
        assert not term.body.has(sympy.oo) and term.body.atoms(Reduce)


def _attention(backend):
    lse, out = attention_nests()

    def run(q, k, v, scale):
        ell = jax_bind.call_nest(lse, [q, k, scale], backend=backend, shapes={}, out_dtype=q.dtype)
        o = jax_bind.call_nest(
            out, [ell, v, q, k, scale], backend=backend, shapes={}, out_dtype=q.dtype
        )
        return o, ell

    return run


def _reference(q, k, v, scale):
    s = q @ k.T * scale
    s = jnp.where(jnp.tril(jnp.ones(s.shape, bool)), s, -jnp.inf)
    ell = jax.nn.logsumexp(s, axis=1)
    return jnp.exp(s - ell[:, None]) @ v, ell


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_causal_attention_values_and_gradients(backend):
    rng = np.random.default_rng(0)
    t, width = 9, 5
    q, k, v = (jnp.asarray(rng.normal(size=(t, width))) for _ in range(3))
    scale = jnp.asarray(0.4)
    ct_o, ct_l = jnp.asarray(rng.normal(size=(t, width))), jnp.asarray(rng.normal(size=t))

    def loss(f):
        return lambda *a: jnp.sum(f(*a)[0] * ct_o) + jnp.sum(f(*a)[1] * ct_l)

    got, want = _attention(backend)(q, k, v, scale), _reference(q, k, v, scale)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)
    grads = jax.grad(loss(_attention(backend)), argnums=(0, 1, 2, 3))(q, k, v, scale)
    wants = jax.grad(loss(_reference), argnums=(0, 1, 2, 3))(q, k, v, scale)
    for g, w in zip(grads, wants):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-10)
