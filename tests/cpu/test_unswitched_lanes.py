"""An elementwise tile whose `where` has a row's condition writes its lane loop once per value
of it (`codegen.c.tiles.unswitch`): logsumexp's gradient `dL[i] * where(L[i] == -inf, 0,
exp(S[i, j] - L[i]))`. The text, and values against float64 numpy with outputs poisoned:
rows on both sides of the condition, a NaN or infinite factor times the `where`'s 0 (NaN, as
in numpy), extents around the tile sizes and primes, float32 and float64; the gradient of a
logsumexp through JAX with an empty row."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.c.emit import emit_c
from codegen.c.schedule import choose_cpu_schedule
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

GUARDED = "dS[b,i,j] := D[b,i] * where(L[b,i] < -1e30, 0, exp(S[b,i,j] - L[b,i]))"
TOLERANCE = {"float32": 2e-6, "float64": 1e-14}


def _text(source: str) -> str:
    nest = lower(parse(source)).nest
    dtypes = dict.fromkeys((*nest.operand_names, nest.output), "float32")
    schedule = choose_cpu_schedule(nest, dtypes, kernel=True)
    assert schedule.strategy == "tile"
    return emit_c(nest, dtypes=dtypes, schedule=schedule).text


def test_the_lane_loop_is_written_per_value_of_the_row_condition():
    text = _text(GUARDED)
    assert "const float wv0_ = 0;" in text
    assert "? 0 :" not in text


def test_a_lane_condition_stays_a_choice():
    text = _text("Y[i,j] := where(X[i,j] < 0, 0, exp(X[i,j]))")
    assert "wv0_" not in text


def _inputs(rng, batch, rows, cols, dtype):
    s = rng.standard_normal((batch, rows, cols))
    l = rng.standard_normal((batch, rows))
    l[:, ::3] = -np.inf  # every third row: the condition holds
    d = rng.standard_normal((batch, rows))
    d[0, 0], d[0, 3] = np.nan, np.inf  # times the where's 0: NaN
    return tuple(x.astype(dtype) for x in (s, l, d))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("batch", "rows", "cols"), [(2, 13, 37), (1, 6, 32), (3, 7, 5)])
def test_values(dtype, batch, rows, cols):
    s, l, d = _inputs(np.random.default_rng(rows * cols), batch, rows, cols, dtype)
    got = np.asarray(td.kernel(GUARDED, backend="c")(S=s, L=l, D=d))
    with np.errstate(invalid="ignore", over="ignore"):
        exp = np.exp(s.astype(np.float64) - l[..., None])
        want = d[..., None] * np.where(l[..., None] < -1e30, 0.0, exp)
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=0)
    assert np.isnan(got[0, 0]).all() and np.isnan(got[0, 3]).all()


def test_the_gradient_of_a_logsumexp_with_an_empty_row():
    lse = td.kernel("(logsumexp) L[i] := S[i,j]", backend="c")
    s = np.random.default_rng(0).standard_normal((9, 35)).astype(np.float32)
    s[4] = -np.inf  # an empty row: no gradient, not NaN
    ct = np.random.default_rng(1).standard_normal(9).astype(np.float32)
    got = jax.grad(lambda s: jnp.vdot(lse(S=s), ct))(s)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse64 = np.log(np.exp(s.astype(np.float64)).sum(1, keepdims=True))
        want = ct[:, None] * np.exp(s - lse64)
    want[4] = 0
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-5, atol=1e-7)
