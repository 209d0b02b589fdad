"""Small constant last axes (`codegen.ir.small_axes`, `codegen.c.tiles.unroll`): a pair read as
`X[..., 1-p]` (GPT-J's rotary embedding), a 3-vector or a quaternion read backwards. The C
back end writes the K values out and puts the index before in vector lanes where the strides
allow it, else runs the scalar strategy; both against float64 jax.numpy on random inputs,
forward and every gradient, outputs poisoned, float64 and float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.c.emit import emit_c
from codegen.c.schedule import choose_cpu_schedule
from codegen.ir.nest import default_dtypes
from codegen.ir.small_axes import small_extent
from tensordsl.explain.nests import kernel_nests
from tests.backends import NEEDS_C_COMPILER

pytestmark = [pytest.mark.usefixtures("poisoned_outputs"), pytest.mark.optimised]

BACKENDS = ["reference", pytest.param("c", marks=NEEDS_C_COMPILER)]

ROPE = "Y[b,t,h,f,p] := X[b,t,h,f,p] * C[t,f] + (2*p - 1) * X[b,t,h,f,1-p] * S[t,f]"
PAIRS = "Y[t,f,p] := X[t,f,p] * C[t,f] + (2*p - 1) * X[t,f,1-p] * S[t,f]"
TRIPLES = "Y[n,c] := X[n,2-c] * W[c] + X[n,c]"
QUATERNIONS = "Y[n,q] := X[n,3-q] * s[q] * X[n,q]"


def _pairs(X, C, S):
    """`PAIRS` in jax.numpy: the pair's partner, its sign, over X's first two values."""
    x = X[..., :2]
    sign = jnp.array([-1.0, 1.0], X.dtype)
    return x * C[..., None] + sign * x[..., ::-1] * S[..., None]


def _rope(X, C, S):
    return _pairs(X, C[:, None, :], S[:, None, :])


def _triples(X, W):
    return X[:, 2::-1] * W[:3] + X[:, :3]


def _quaternions(X, s):
    return X[:, 3::-1] * s[:4] * X[:, :4]


CASES = {
    "rope": (ROPE, _rope, {"X": (2, 3, 2, 9, 2), "C": (3, 9), "S": (3, 9)}),
    "pairs": (PAIRS, _pairs, {"X": (5, 13, 2), "C": (5, 13), "S": (5, 13)}),
    # a last axis of 3 read as pairs: p still runs over 2 values, the stride is 3 (scalar)
    "pairs of 3": (PAIRS, _pairs, {"X": (4, 11, 3), "C": (4, 11), "S": (4, 11)}),
    "triples": (TRIPLES, _triples, {"X": (17, 3), "W": (3,)}),
    "triples of 5": (TRIPLES, _triples, {"X": (6, 5), "W": (4,)}),
    "quaternions": (QUATERNIONS, _quaternions, {"X": (19, 4), "s": (4,)}),
}


def _nests(source):
    return kernel_nests(td.kernel(source, backend="c").nest)


@pytest.mark.parametrize(
    ("source", "count"), [(ROPE, 2), (PAIRS, 2), (TRIPLES, 3), (QUATERNIONS, 4)]
)
def test_the_forward_and_the_elementwise_gradients_unroll_the_small_axis(source, count):
    nests = _nests(source)
    elementwise = [n for n in nests.values() if not any(t.reduced for t in n.terms)]
    assert len(elementwise) >= 2  # the forward and the gradient of X
    for nest in elementwise:
        assert small_extent(nest) == count, nest
        schedule = choose_cpu_schedule(nest, kernel=True)
        assert (schedule.strategy, schedule.width) == ("unroll", count)
        assert schedule.vector == schedule.free_order[-2]
        text = emit_c(nest, dtypes=default_dtypes(nest), schedule=schedule).text
        assert "#pragma omp simd" in text
        assert f"const int64_t v_{schedule.free_order[-1]} = {count - 1};" in text


def test_a_whole_axis_without_a_small_bound_is_not_unrolled():
    nest = _nests("Y[i,j] := X[i,j] * 2")["forward"]
    assert small_extent(nest) is None
    assert choose_cpu_schedule(nest, kernel=True).strategy != "unroll"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_small_axes_forward_and_gradients_match_float64(case, dtype, backend):
    source, reference, shapes = CASES[case]
    rng = np.random.default_rng(sorted(CASES).index(case))
    args = [rng.normal(size=shape) for shape in shapes.values()]
    k = td.kernel(source, backend=backend)
    got, vjp = jax.vjp(k, *(a.astype(dtype) for a in args))
    want, want_vjp = jax.vjp(reference, *args)
    tol = 1e-12 if dtype == "float64" else 2e-6
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    cotangent = rng.normal(size=want.shape)
    for grad, expected in zip(vjp(cotangent.astype(dtype)), want_vjp(cotangent), strict=True):
        np.testing.assert_allclose(grad, expected, rtol=tol, atol=tol * 4)


def test_schedules_without_free_indices_still_read_in_words():
    """The words of every strategy are built at once: the unroll strategy's name of its
    axis must not fail for a full reduction (no free index)."""
    text = td.kernel("s := X[i] * X[i]", backend="c").explain({"X": (5,)})
    assert "cut into 64 chunks" in text
