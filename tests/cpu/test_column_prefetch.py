"""Tiles that read an operand down its columns prefetch what each row of tiles reads
(`codegen.c.tiles.prefetch`): attention's gradient of V reads its scores `S[i, j]` along `i`.
Which reads are prefetched; values against float64 numpy with outputs poisoned, where the
part prefetched is longer than the limit, at extents around the tile sizes and primes,
float32 and float64, and the gradient of V of the weighted sum through JAX."""

from __future__ import annotations

import jax
import numpy as np
import pytest
import sympy

import tensordsl as td
from codegen.c.emit import emit_c
from codegen.c.schedule import choose_cpu_schedule
from codegen.c.tiles.prefetch import LIMIT, column_reads
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

GRAD_V = "dV[b,j,e] := where(j <= i, exp(S[b,i,j] - L[b,i]), 0) * G[b,i,e]"
PAIRWISE = "D[i,j] := (W[k,i] - X[k,j])^2"
#: Reads along their last axis (the reduced one) or along the vector lanes: no prefetch.
NO_COLUMN_READS = (
    "C[i,e] := A[i,k] * B[k,e]",
    "O[b,i,e] := where(j <= i, exp(S[b,i,j] - L[b,i]), 0) * V[b,j,e]",
)
TOLERANCE = {"float32": 2e-5, "float64": 1e-12}

i, j, e = sympy.symbols("i j e", integer=True)
S, G = sympy.IndexedBase("S"), sympy.IndexedBase("G")


@pytest.mark.parametrize(
    ("read", "found"),
    [
        (S[i, j], True),  # down a column of S
        (S[j, i], False),  # along a row: the reduced index is the last axis
        (G[i, e], False),  # along the vector lanes
        (S[i, j] * G[i, e], True),
        (sympy.IndexedBase("R")[j], False),  # the reduced index not read
    ],
)
def test_column_reads(read, found):
    assert bool(column_reads(read, reduced=i, row=j, vector=e)) == found


def _text(source: str) -> str:
    nest = lower(parse(source)).nest
    dtypes = dict.fromkeys((*nest.operand_names, nest.output), "float32")
    schedule = choose_cpu_schedule(nest, dtypes, kernel=True)
    return emit_c(nest, dtypes=dtypes, schedule=schedule).text


@pytest.mark.parametrize("source", [GRAD_V, PAIRWISE])
def test_a_tile_reading_columns_prefetches_them(source):
    assert "__builtin_prefetch" in _text(source)


@pytest.mark.parametrize("source", NO_COLUMN_READS)
def test_other_tiles_prefetch_nothing(source):
    assert "__builtin_prefetch" not in _text(source)


def _grad_v_reference(s, l, g):
    t = s.shape[1]
    mask = np.arange(t)[None, :, None] >= np.arange(t)[None, None, :]  # [i, j]: j <= i
    p = np.where(mask, np.exp(s.astype(np.float64) - l[..., None]), 0)
    return np.einsum("bij,bie->bje", p, g.astype(np.float64))


def _grad_v_inputs(rng, batch, t, width, dtype):
    s = rng.standard_normal((batch, t, t))
    l = np.log(np.exp(s).sum(-1)) + rng.uniform(0, 1, (batch, t))  # rows below 1
    g = rng.standard_normal((batch, t, width))
    return tuple(x.astype(dtype) for x in (s, l, g))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("batch", "t", "width"), [(2, 37, 32), (3, 9, 7), (2, 64, 64)])
def test_values(dtype, batch, t, width):
    s, l, g = _grad_v_inputs(np.random.default_rng(t + width), batch, t, width, dtype)
    got = np.asarray(td.kernel(GRAD_V, backend="c")(S=s, L=l, G=g))
    want = _grad_v_reference(s, l, g)
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * t)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_values_where_a_row_of_tiles_reads_past_the_limit(dtype):
    t = int(np.sqrt(LIMIT / np.dtype(dtype).itemsize)) + 9  # S[b] longer than LIMIT bytes
    s, l, g = _grad_v_inputs(np.random.default_rng(3), 2, t, 16, dtype)
    got = np.asarray(td.kernel(GRAD_V, backend="c")(S=s, L=l, G=g))
    want = _grad_v_reference(s, l, g)
    np.testing.assert_allclose(got, want, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * t)


def test_pairwise_values():
    rng = np.random.default_rng(5)
    w, x = rng.standard_normal((13, 41)), rng.standard_normal((13, 67))
    got = np.asarray(td.kernel(PAIRWISE, backend="c")(W=w.astype(np.float32), X=x))
    want = ((w[:, :, None] - x[:, None, :]) ** 2).sum(0)
    np.testing.assert_allclose(got, want, rtol=2e-5)


def test_the_gradient_of_v_through_jax():
    weighted = td.kernel(
        "O[b,i,e] := where(j <= i, exp(S[b,i,j] - L[b,i]), 0) * V[b,j,e]", backend="c"
    )
    rng = np.random.default_rng(7)
    s, l, g = _grad_v_inputs(rng, 2, 45, 32, "float32")
    v = rng.standard_normal((2, 45, 32)).astype(np.float32)
    _, vjp = jax.vjp(lambda v: weighted(S=s, L=l, V=v), v)
    (got,) = vjp(g)
    np.testing.assert_allclose(np.asarray(got), _grad_v_reference(s, l, g), rtol=2e-5, atol=1e-3)
