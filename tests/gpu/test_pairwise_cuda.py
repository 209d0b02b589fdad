"""The pairwise strategy (`codegen.cuda.staged.pairwise`) under the CUDA emulator, against float64
numpy on the inputs rounded to each dtype (outputs poisoned).

Bodies that are not a product: squared and absolute differences, a Gaussian kernel with a
scalar, a weight that reads neither free index (`w[k]`), the transposed layout `(W[k,i] -
X[k,j])^2`, two reduced indices, a batch index; the reductions sum, max, min, logsumexp and
argmin. Extents 1, 7, 65, 130 (not multiples of the 64 x 64 tile or the 16-deep slice),
float32, float64 and bfloat16, both scheduling orders, every candidate schedule, a grid of
one block, dynamic shared memory. Then the values and the gradients of X and Y through
`jax.grad` on the cuda back end, against numpy's float64 derivatives.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.cuda.emulator import emulate
from codegen.cuda.schedule import candidate_gpu_schedules, choose_gpu_schedule
from codegen.ir.nest import LoopNest
from tensordsl.backends import cuda as gpu
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.gpu import emulated

pytestmark = pytest.mark.skipif(
    not emulate.available(), reason=f"CUDA emulator: {emulate.unavailable_reason()}"
)
TOLERANCE = {"float64": 1e-12, "float32": 3e-6, "bfloat16": 1e-2}
SQUARED = "D[i,j] := (X[i,k] - Y[j,k])^2"


def _diff(X, Y):
    """X[i,k] - Y[j,k] as an (i, j, k) array."""
    return X[:, None, :] - Y[None, :, :]


#: name -> (source, reduction, numpy reference of the values dict)
BODIES = {
    "squared": (SQUARED, "sum", lambda v: (_diff(v["X"], v["Y"]) ** 2).sum(-1)),
    "abs": (
        "D[i,j] := abs(X[i,k] - Y[j,k])",
        "sum",
        lambda v: np.abs(_diff(v["X"], v["Y"])).sum(-1),
    ),
    "gaussian": (
        "D[i,j] := exp(-g*(X[i,k] - Y[j,k])^2)",
        "sum",
        lambda v: np.exp(-v["g"] * _diff(v["X"], v["Y"]) ** 2).sum(-1),
    ),
    "weighted": (
        "D[i,j] := w[k]*(X[i,k] - Y[j,k])^2",
        "sum",
        lambda v: (v["w"] * _diff(v["X"], v["Y"]) ** 2).sum(-1),
    ),
    "transposed": (
        "D[i,j] := (W[k,i] - V[k,j])^2",
        "sum",
        lambda v: (_diff(v["W"].T, v["V"].T) ** 2).sum(-1),
    ),
    "chebyshev": (
        "D[i,j] := abs(X[i,k] - Y[j,k])",
        "max",
        lambda v: np.abs(_diff(v["X"], v["Y"])).max(-1),
    ),
    "min": ("D[i,j] := X[i,k] - Y[j,k]", "min", lambda v: _diff(v["X"], v["Y"]).min(-1)),
    "logsumexp": (
        "D[i,j] := -(X[i,k] - Y[j,k])^2",
        "logsumexp",
        lambda v: np.logaddexp.reduce(-(_diff(v["X"], v["Y"]) ** 2), axis=-1),
    ),
    "argmin": (
        "D[i,j] := abs(X[i,k] - Y[j,k])",
        "argmin",
        lambda v: np.abs(_diff(v["X"], v["Y"])).argmin(-1),
    ),
}
#: (rows of X, rows of Y, k)
SIZES = ((1, 1, 1), (7, 65, 5), (65, 7, 17), (130, 67, 33))


def _values(m: int, n: int, k: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed + 31 * m + 7 * n + k)
    return {
        "X": rng.normal(size=(m, k)),
        "Y": rng.normal(size=(n, k)),
        "W": rng.normal(size=(k, m)),
        "V": rng.normal(size=(k, n)),
        "w": rng.uniform(0.5, 1.5, size=k),
        "g": np.asarray(0.3),
    }


def _nest(name: str) -> LoopNest:
    source, reduction, _ = BODIES[name]
    return lower(parse(source), reduce=reduction).nest


def _rounded(values: dict, dtype: str) -> dict:
    return {n: np.asarray(np.asarray(v, jnp.dtype(dtype)), np.float64) for n, v in values.items()}


def _run(nest: LoopNest, values: dict, dtype: str, schedule=None, order="forward", grid=None):
    """The kernel's output under the emulator, and its launch."""
    arrays = [np.asarray(values[op.name], jnp.dtype(dtype)) for op in nest.operands]
    out = "int32" if nest.reduction in ("argmax", "argmin") else dtype
    la = gpu.prepare(nest, arrays, {}, out, schedule)
    if grid is not None:
        la = dataclasses.replace(la, grids=(grid,))
    return np.asarray(emulated.run_arrays(la, arrays, order)), la


def _check(got: np.ndarray, want: np.ndarray, dtype: str, what: str = "") -> None:
    if np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    scale = max(1.0, float(np.max(np.abs(want), initial=0)))
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(
        np.asarray(got, np.float64), want, rtol=tol, atol=tol * scale, err_msg=what
    )


def test_the_heuristic_picks_pairwise_for_these_bodies_and_not_for_their_gradients() -> None:
    for name in BODIES:
        assert choose_gpu_schedule(_nest(name)).strategy == "pairwise", name
    k = td.kernel(SQUARED, backend="cuda")
    sources = k.source("cuda")
    assert "strategy=pairwise" in sources["forward"]
    # dX[i,k] reads X[i,k] with both free indices: it keeps the tile strategy
    assert "strategy=tile" in sources["grad_X"] and "strategy=tile" in sources["grad_Y"]


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("name", ["squared", "abs", "gaussian", "transposed"])
def test_bodies_match_numpy(name: str, size, dtype: str) -> None:
    values = _values(*size)
    got, la = _run(_nest(name), values, dtype)
    assert la.source.schedule.strategy == "pairwise"
    _check(got, BODIES[name][2](_rounded(values, dtype)), dtype, name)


@pytest.mark.parametrize("name", ["weighted", "chebyshev", "min", "logsumexp", "argmin"])
@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_other_reductions_and_a_weight_of_the_slice(name: str, order: str) -> None:
    values = _values(70, 66, 19, seed=1)
    got, _ = _run(_nest(name), values, "float64", order=order)
    _check(got, BODIES[name][2](values), "float64", name)


@pytest.mark.parametrize("name", ["squared", "argmin"])
def test_every_candidate_schedule_in_both_orders(name: str) -> None:
    nest = _nest(name)
    values = _values(37, 70, 21, seed=2)
    want = BODIES[name][2](values)
    schedules = candidate_gpu_schedules(nest)
    assert [s.strategy for s in schedules].count("pairwise") == 3  # 4x4, int64, 2x1 by 8
    for schedule in schedules:
        for order in ("forward", "reverse"):
            got, _ = _run(nest, values, "float64", schedule, order)
            _check(got, want, "float64", f"{schedule.describe()} {order}")


def test_one_block_loops_over_every_tile() -> None:
    values = _values(130, 140, 20, seed=3)
    want = BODIES["gaussian"][2](values)
    for grid in ((1, 1, 1), (2, 1, 1), (1, 3, 1)):
        got, _ = _run(_nest("gaussian"), values, "float64", grid=grid)
        _check(got, want, "float64", str(grid))


def test_a_batch_index_and_two_reduced_indices() -> None:
    rng = np.random.default_rng(4)
    X, Y = rng.normal(size=(3, 20, 5, 4)), rng.normal(size=(3, 70, 5, 4))
    nest = lower(parse("D[b,i,j] := (X[b,i,k,l] - Y[b,j,k,l])^2")).nest
    got, la = _run(nest, {"X": X, "Y": Y}, "float64")
    assert la.source.schedule.strategy == "pairwise" and la.grids[0][2] == 3
    want = ((X[:, :, None] - Y[:, None]) ** 2).sum((-1, -2))
    _check(got, want, "float64")


def test_many_accesses_in_float64_take_dynamic_shared_memory() -> None:
    source = "D[i,j] := (A[i,k] - P[j,k])^2 + (B[i,k] - Q[j,k])^2 + abs(C[i,k] - R[j,k])"
    nest = lower(parse(source)).nest
    rng = np.random.default_rng(5)
    values = {n: rng.normal(size=(40 if n in "ABC" else 70, 18)) for n in "ABCPQR"}
    got, la = _run(nest, values, "float64")
    assert la.source.shared > 48 * 1024  # six arrays of 16 x 66 doubles
    d = {a + b: values[a][:, None] - values[b][None] for a, b in ("AP", "BQ", "CR")}
    want = (d["AP"] ** 2 + d["BQ"] ** 2 + np.abs(d["CR"])).sum(-1)
    _check(got, want, "float64")


@pytest.mark.parametrize("name", ["squared", "gaussian"])
def test_values_and_gradients_of_x_and_y_through_jax(name: str, monkeypatch) -> None:
    """jit(value_and_grad) on the cuda back end (forward: this kernel; dX, dY: their own
    nests) against numpy's float64 derivatives; extents past a tile."""
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    values = _values(67, 70, 18, seed=6)
    X, Y, g = values["X"], values["Y"], float(values["g"])
    weights = np.random.default_rng(7).normal(size=(67, 70))
    scalars = {"g": np.asarray(g)} if name == "gaussian" else {}
    k = td.kernel(BODIES[name][0], backend="cuda", nograd=tuple(scalars))

    def loss(x, y):
        return jnp.sum(k(X=x, Y=y, **scalars) * weights)

    with jax.enable_x64(True):
        value, (dX, dY) = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(X, Y)
    d = _diff(X, Y)
    if name == "squared":
        D, dD_dd = (d**2).sum(-1), 2 * d
    else:
        D, dD_dd = np.exp(-g * d**2).sum(-1), -2 * g * d * np.exp(-g * d**2)
    np.testing.assert_allclose(value, (D * weights).sum(), rtol=1e-11)
    np.testing.assert_allclose(dX, np.einsum("ij,ijk->ik", weights, dD_dd), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(dY, -np.einsum("ij,ijk->jk", weights, dD_dd), rtol=1e-10, atol=1e-12)
