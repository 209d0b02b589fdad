"""The split strategy under the CUDA emulator: a full reduction over many blocks, in two
kernels that share scratch space, against float64 numpy.

Every reduction (sum, max, min, prod, logsumexp, and the argmax/argmin positions that max and
min save for their gradients) over one and two reduced loops, at lengths shorter than a
block, not a multiple of it, and long enough for many slices; with the heuristic's schedule
(256 threads, up to 1024 slices) and small ones (32 threads; 3 slices, so that a block
reduces several); in both scheduling orders, which must agree bit for bit: the partial
states are combined in a fixed order. Then through JAX (`TENSORDSL_CUDA_EMULATE=1`) by both
launch paths, where the scratch space is an extra output of the call.
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
from codegen.cuda.run import launch as cuda_launch
from codegen.cuda.schedule import GpuSchedule, choose_gpu_schedule
from codegen.ir.nest import LoopNest
from codegen.passes import gradient_rules
from tensordsl.backends import cuda as gpu
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.gpu import emulated
from tests.sampling import product, selected_params

pytestmark = pytest.mark.skipif(
    not emulate.available(), reason=f"CUDA emulator: {emulate.unavailable_reason()}"
)
REDUCTIONS = ("sum", "max", "min", "prod", "logsumexp", "argmax", "argmin")
#: Input shapes: shorter than a block of 32, not a multiple of 32 or 256, many slices; and
#: two reduced loops (the outer one cut into slices, the inner one strided by the threads).
SHAPES = ((1,), (5,), (100,), (2500,), (1, 7), (37, 11), (300, 3))
SCHEDULES = {"heuristic": None, "32x3": (32, 3), "32x1024": (32, 1024)}
DTYPES = ("float64", "float32")
TOLERANCE = {"float64": 1e-12, "float32": 1e-5}


@functools.cache
def nest(reduction: str, rank: int) -> LoopNest:
    """`s := X[i]` (or `X[i,j]`) reduced by `reduction`; argmax/argmin as max/min save them."""
    statement = "s := X[i]" if rank == 1 else "s := X[i,j]"
    if reduction.startswith("arg"):
        forward = lower(parse(statement), reduce=reduction[3:]).nest
        return gradient_rules.auxiliary_nests(forward)["argument"]
    return lower(parse(statement), reduce=reduction).nest


def inputs(reduction: str, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random values, never all equal: near +-1 for prod (no overflow), with ties for the
    positions (the first one wins)."""
    rng = np.random.default_rng(sum(shape) + len(reduction))
    if reduction == "prod":
        values = rng.uniform(0.9, 1.1, shape) * rng.choice([-1.0, 1.0], shape)
    else:
        values = rng.normal(size=shape) * 3
    if reduction.startswith("arg"):
        values = np.round(values)
    return values.astype(dtype)


def expected(reduction: str, x: np.ndarray) -> np.ndarray:
    """The float64 numpy reference (positions are flat, row-major)."""
    x = x.astype(np.float64).reshape(-1)
    if reduction == "logsumexp":
        top = x.max()
        return np.array(top + np.log(np.exp(x - top).sum()))
    return np.array(getattr(np, reduction)(x))


def launch(reduction: str, shape: tuple[int, ...], dtype: str, name: str) -> gpu.Launch:
    n = nest(reduction, len(shape))
    schedule = choose_gpu_schedule(n)
    if SCHEDULES[name] is not None:
        threads, blocks = SCHEDULES[name]
        order = schedule.reduced_order
        schedule = GpuSchedule((), order, "split", threads=threads, blocks=blocks)
    out = "int32" if reduction.startswith("arg") else dtype
    return gpu.prepare(n, [np.zeros(shape, dtype)], {}, out, schedule)


CASES = [
    (r, shape, dtype, name)
    for r in REDUCTIONS
    for shape in SHAPES
    for dtype in (DTYPES if r in ("sum", "logsumexp") else DTYPES[:1])
    for name in SCHEDULES
]


@pytest.fixture(scope="module")
def compiled(request: pytest.FixtureRequest) -> None:
    """Compile every kernel this run tests up front, many per compiler call."""
    selected = {
        (p["reduction"], p["shape"], p["name"])
        for p in selected_params(request, "test_values_against_float64_in_both_orders")
    }
    emulated.build_all(launch(*case) for case in CASES if (case[0], case[1], case[3]) in selected)


def test_the_heuristic_splits_full_reductions_only() -> None:
    for reduction in REDUCTIONS:
        assert choose_gpu_schedule(nest(reduction, 2)).strategy == "split"
    rows = lower(parse("s[i] := X[i,j]")).nest
    assert choose_gpu_schedule(rows).strategy != "split"


@pytest.mark.parametrize(
    ("reduction", "shape", "name"),
    product(
        REDUCTIONS,
        [pytest.param(s, id="x".join(map(str, s))) for s in SHAPES],
        list(SCHEDULES),
        every=3,
    ),
)
def test_values_against_float64_in_both_orders(reduction, shape, name, compiled) -> None:
    for dtype in DTYPES if reduction in ("sum", "logsumexp") else DTYPES[:1]:
        la = launch(reduction, shape, dtype, name)
        x = inputs(reduction, shape, dtype)
        parts = dict(zip((p for p, _ in la.source.parameters), la.params))["parts"]
        assert len(la.passes) == (1 if parts == 1 else 2)  # one slice: no second kernel
        got = {order: emulated.run_arrays(la, [x], order) for order in ("forward", "reverse")}
        np.testing.assert_array_equal(got["forward"], got["reverse"])  # a fixed order
        want = expected(reduction, x)
        if reduction.startswith("arg"):
            assert int(got["forward"]) == int(want), (reduction, shape, name)
            continue
        tol = TOLERANCE[dtype]
        np.testing.assert_allclose(got["forward"], want, rtol=tol, atol=tol * np.abs(x).max())


def test_a_grid_smaller_than_the_slices_covers_them(compiled) -> None:
    la = launch("logsumexp", (2500,), "float64", "32x1024")
    assert la.grid[0] == 79 and len(la.passes) == 2
    x = inputs("logsumexp", (2500,), "float64")
    small = dataclasses.replace(la, grids=((2, 1, 1), la.grids[1]))
    np.testing.assert_allclose(emulated.run_arrays(small, [x]), expected("logsumexp", x))


@pytest.mark.parametrize("mode", ["ffi", "callback"])
def test_through_jax_with_scratch_space_as_an_extra_output(monkeypatch, mode: str) -> None:
    if mode == "ffi" and cuda_launch.unavailable_reason() is not None:
        pytest.skip(f"CUDA launch handler: {cuda_launch.unavailable_reason()}")
    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "reverse")
    monkeypatch.setenv("TENSORDSL_GPU_CALL", mode)
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    # The emulator runs on JAX's CPU devices, also on a machine with a GPU.
    x = jax.device_put(inputs("logsumexp", (300, 7), "float64"), jax.devices("cpu")[0])
    lse = td.kernel("s := X[i,j]", reduce="logsumexp", backend="cuda")
    np.testing.assert_allclose(jax.jit(lse)(x), expected("logsumexp", x), rtol=1e-12)
    top = td.kernel("s := X[i,j]", reduce="max", backend="cuda")
    got = jax.jit(jax.grad(lambda v: top(jnp.sin(v))))(x)  # the saved argmax is split too
    want = np.zeros(x.size)
    want[np.argmax(np.sin(x))] = np.cos(x).reshape(-1)[np.argmax(np.sin(x))]
    np.testing.assert_allclose(got, want.reshape(x.shape), rtol=1e-12)


#: Several terms, and loop bounds that depend on the outer loop (lanes = the whole block).
BOUNDED = {
    "s := X[i,j] * (j <= i)": lambda X, Y: np.tril(X).sum(),
    "s := where(j <= i, X[i,j], 0) + where(i < 2, Y[i,j], 0)": lambda X, Y: (
        np.tril(X).sum() + Y[:2].sum()
    ),
    "s := X[i,j] * (i == 0) + Y[i, j]": lambda X, Y: X[0].sum() + Y.sum(),
}


def bounded_launches(x: np.ndarray) -> list[tuple[str, gpu.Launch]]:
    found = []
    for statement in BOUNDED:
        n = lower(parse(statement)).nest
        operands = [x] * len(n.operands)
        for name in ("heuristic", "32x3"):
            schedule = choose_gpu_schedule(n)
            if SCHEDULES[name] is not None:
                threads, blocks = SCHEDULES[name]
                schedule = dataclasses.replace(schedule, threads=threads, blocks=blocks)
            found.append((statement, gpu.prepare(n, operands, {}, "float64", schedule)))
    return found


def test_several_terms_and_bounds_that_depend_on_the_outer_loop() -> None:
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(40, 9)), rng.normal(size=(40, 9))
    launches = bounded_launches(x)
    emulated.build_all(la for _, la in launches)
    for statement, la in launches:
        assert la.source.schedule.strategy == "split" and len(la.passes) == 2
        arrays = [x, y][: len(la.source.operands)]
        want = BOUNDED[statement](x, y)
        for order in ("forward", "reverse"):
            got = emulated.run_arrays(la, arrays, order, statement)
            np.testing.assert_allclose(got, want, rtol=1e-12, err_msg=statement)
