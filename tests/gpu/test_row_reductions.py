"""The rows and columns strategies under the CUDA emulator, against float64 numpy.

rows: a row reduction (sum, max, min, logsumexp; argmax as max saves it) over rows of 1, 7,
33, 1000 and 5000 values (one lane per row, several rows per warp, a warp per row, a block
per row), one row and many; float64, float32, float16 and bfloat16 inputs; both scheduling
orders, which must agree bit for bit (the lanes combine in a fixed order). A row reduction
whose sum is nested (LayerNorm's `dM`), with a guard on the free indices. columns: a column
reduction whose reduced loops are cut into many slices. Then softmax and LayerNorm through
JAX (`TENSORDSL_CUDA_EMULATE=1`), forward and gradients, against the reference back end.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.cuda.emulator import emulate
from codegen.cuda.schedule import choose_gpu_schedule
from codegen.ir.nest import LoopNest, Reduce
from codegen.passes import grad, gradient_rules
from tensordsl.backends import cuda as gpu
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.gpu import emulated

pytestmark = pytest.mark.skipif(
    not emulate.available(), reason=f"CUDA emulator: {emulate.unavailable_reason()}"
)
REDUCTIONS = ("sum", "max", "min", "logsumexp", "argmax")
#: (rows, row length): one lane per row, several rows per warp, a warp, a block per row.
SHAPES = ((5, 1), (37, 7), (3, 33), (1, 1000), (2, 5000), (1, 7))
DTYPES = ("float64", "float32", "float16", "bfloat16")
TOLERANCE = {"float64": 1e-12, "float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}
NUMPY = {
    "sum": lambda x: x.sum(1),
    "max": lambda x: x.max(1),
    "min": lambda x: x.min(1),
    "logsumexp": lambda x: np.logaddexp.reduce(x, axis=1),
    "argmax": lambda x: x.argmax(1),
}


@functools.cache
def nest(reduction: str) -> LoopNest:
    if reduction == "argmax":
        forward = lower(parse("M[i] := X[i,j]"), reduce="max").nest
        return gradient_rules.auxiliary_nests(forward)["argument"]
    return lower(parse("M[i] := X[i,j]"), reduce=reduction).nest


def values(shape: tuple[int, int], dtype: str) -> np.ndarray:
    """Random values with ties (argmax: the first wins), exact in `dtype`."""
    rng = np.random.default_rng(shape[0] * 7 + shape[1])
    x = np.round(rng.normal(size=shape) * 3, 1)
    return np.asarray(x, jnp.dtype(dtype))


def launch(reduction: str, shape: tuple[int, int], dtype: str) -> gpu.Launch:
    out = "int32" if reduction == "argmax" else dtype
    return gpu.prepare(nest(reduction), [np.zeros(shape, jnp.dtype(dtype))], {}, out)


def expected_width(length: int) -> int:
    """A row up to a warp long gets its length in lanes (rounded up to a power of two);
    longer, a lane per 32 values, at least a warp and at most the block."""
    lanes = length if length <= 32 else max(32, -(-length // 32))
    return min(256, 1 << (lanes - 1).bit_length())


CASES = [
    (r, shape, dtype)
    for r in REDUCTIONS
    for shape in SHAPES
    for dtype in (
        ("float64", "float32", "float16", "bfloat16") if r == "logsumexp" else ("float32",)
    )
]


@pytest.fixture(scope="module")
def compiled() -> None:
    emulated.build_all(launch(*case) for case in CASES)


def test_the_heuristic_picks_rows_and_columns() -> None:
    for reduction in REDUCTIONS:
        assert choose_gpu_schedule(nest(reduction)).strategy == "rows"
    columns = lower(parse("g[f] := Y[b,t,f] * N[b,t,f]")).nest
    assert choose_gpu_schedule(columns, kernel=True).strategy == "columns"  # else XLA's dot
    elementwise = lower(parse("Z[i,j] := X[i,j] * 2")).nest
    assert choose_gpu_schedule(elementwise).strategy == "thread"


@pytest.mark.parametrize("reduction, shape, dtype", CASES, ids=str)
def test_rows_against_float64_in_both_orders(reduction, shape, dtype, compiled) -> None:
    la = launch(reduction, shape, dtype)
    assert la.source.schedule.strategy == "rows"
    width = dict(zip((p for p, _ in la.source.parameters), la.params))["width"]
    assert width == expected_width(shape[1])
    x = values(shape, dtype)
    got = {order: emulated.run_arrays(la, [x], order) for order in ("forward", "reverse")}
    np.testing.assert_array_equal(got["forward"], got["reverse"])  # a fixed combine order
    want = NUMPY[reduction](np.asarray(x, np.float64))
    if reduction == "argmax":
        np.testing.assert_array_equal(got["forward"], want)
        return
    tol = TOLERANCE[dtype] * max(1.0, float(np.abs(want).max()))
    np.testing.assert_allclose(np.asarray(got["forward"], np.float64), want, rtol=0, atol=tol)


def test_a_nested_sum_per_row_with_a_guard_and_a_small_grid() -> None:
    """LayerNorm's dM: no reduced loop, a nested sum strided across a warp, a guard that
    reads a free index only."""
    statement = "dM[b,t] := -dN[b,t,f]*g[f] * rsqrt(V[b,t] + 0.5) * (t < 3)"
    n = lower(parse(statement)).nest  # sum factorisation nests the sum: rsqrt is costly
    assert n.terms[0].body.atoms(Reduce) and not n.terms[0].reduced
    rng = np.random.default_rng(2)
    for shape in ((2, 5, 1), (1, 4, 45), (3, 7, 300)):
        dn, g = rng.normal(size=shape), rng.normal(size=shape[2])
        v = rng.uniform(0.5, 2, shape[:2])
        la = gpu.prepare(n, [dn, g, v], {}, "float64")
        assert la.source.schedule.strategy == "rows"
        want = -(dn * g).sum(2) / np.sqrt(v + 0.5) * (np.arange(shape[1]) < 3)
        for order in ("forward", "reverse"):
            got = emulated.run_arrays(la, [dn, g, v], order, statement)
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
        small = dataclasses.replace(la, grids=((1, 1, 1),))
        np.testing.assert_allclose(emulated.run_arrays(small, [dn, g, v]), want, atol=1e-12)


@pytest.mark.parametrize("shape", [(1, 1, 3), (2, 3, 5), (8, 33, 7), (4, 300, 40)], ids=str)
def test_columns_cut_into_slices_in_both_orders(shape) -> None:
    n = lower(parse("g[f] := Y[b,t,f] * N[b,t,f]")).nest
    rng = np.random.default_rng(len(shape) + shape[1])
    y, x = rng.normal(size=shape), rng.normal(size=shape)
    la = gpu.prepare(n, [y, x], {}, "float64")
    parts = dict(zip((p for p, _ in la.source.parameters), la.params))["parts"]
    assert la.source.schedule.strategy == "columns"
    assert parts == min(-(-shape[0] * shape[1] // 16), 528)  # 16 values a slice; 528 blocks
    assert len(la.source.passes) == 2 and len(la.passes) == (1 if parts == 1 else 2)
    want = (y * x).sum((0, 1))
    got = {order: emulated.run_arrays(la, [y, x], order) for order in ("forward", "reverse")}
    np.testing.assert_array_equal(got["forward"], got["reverse"])
    np.testing.assert_allclose(got["forward"], want, rtol=1e-12, atol=1e-12)


SOFTMAX = """
(max) M[i] := X[i,j]
Z[i] := exp(X[i,j] - M[i])
P[i,j] := exp(X[i,j] - M[i]) / Z[i]
"""
LAYER_NORM = """
M[b,t] := X[b,t,f] / F
V[b,t] := (X[b,t,f] - M[b,t])^2 / F
N[b,t,f] := (X[b,t,f] - M[b,t]) * rsqrt(V[b,t] + eps) * g[f] + beta[f]
"""


@pytest.fixture
def emulated_cuda(monkeypatch) -> None:
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")


@pytest.mark.parametrize("shape", [(1, 7), (5, 1), (3, 33), (2, 1000)], ids=str)
def test_softmax_forward_and_gradient(shape, emulated_cuda) -> None:
    rng = np.random.default_rng(shape[1])
    x, w = rng.normal(size=shape) * 2, rng.normal(size=shape)
    cuda, ref = (td.kernel(SOFTMAX, backend=b) for b in ("cuda", "reference"))
    with jax.enable_x64(True):
        got = jax.value_and_grad(lambda v: (cuda(X=v) * w).sum())(jnp.asarray(x))
        want = jax.value_and_grad(lambda v: (ref(X=v) * w).sum())(jnp.asarray(x))
    e = np.exp(x - x.max(1, keepdims=True))
    np.testing.assert_allclose(float(got[0]), ((e / e.sum(1, keepdims=True)) * w).sum())
    np.testing.assert_allclose(got[1], want[1], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape", [(1, 1, 7), (2, 3, 33), (1, 2, 1000)], ids=str)
def test_layer_norm_forward_and_gradients(shape, emulated_cuda) -> None:
    rng = np.random.default_rng(sum(shape))
    d = shape[2]
    x, g, beta = rng.normal(size=shape), 1 + 0.1 * rng.normal(size=d), rng.normal(size=d)
    w = rng.normal(size=shape)
    cuda, ref = (td.kernel(LAYER_NORM, backend=b) for b in ("cuda", "reference"))

    def loss(k, *args):
        x, g, beta = args
        return (k(X=x, F=jnp.float64(d), eps=jnp.float64(1e-3), g=g, beta=beta) * w).sum()

    with jax.enable_x64(True):
        args = tuple(jnp.asarray(a) for a in (x, g, beta))
        got = jax.value_and_grad(functools.partial(loss, cuda), argnums=(0, 1, 2))(*args)
        want = jax.value_and_grad(functools.partial(loss, ref), argnums=(0, 1, 2))(*args)
    mean = x.mean(2, keepdims=True)
    normal = (x - mean) / np.sqrt(((x - mean) ** 2).mean(2, keepdims=True) + 1e-3)
    np.testing.assert_allclose(float(got[0]), ((normal * g + beta) * w).sum(), rtol=1e-10)
    for a, b in zip(got[1], want[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)


def test_tests_that_the_shapes_prove_true_are_dropped() -> None:
    """A gradient nest's `b + 1 <= X.shape[0]` for `b` in `[0, dM.shape[0])`: no test in
    the kernel when the shapes make it true everywhere, kept (and obeyed) where not."""
    n = grad.gradient(lower(parse("V[b] := (X[b,f] - M[b])^2")).nest, "M").nest
    assert [str(c) for c in n.terms[0].constraints] == ["X.shape[0] - b - 1"]
    rng = np.random.default_rng(4)
    for rows, kept in ((6, False), (4, True)):
        dv, x, m = rng.normal(size=6), rng.normal(size=(rows, 40)), rng.normal(size=6)
        la = gpu.prepare(n, [dv, x, m], {"dM": (6,)}, "float64")
        assert ("- 1 >= 0" in la.source.text) == kept
        want = np.zeros(6)
        want[:rows] = (dv[:rows, None] * (2 * m[:rows, None] - 2 * x)).sum(1)
        got = emulated.run_arrays(la, [dv, x, m], "reverse", "dM")
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
