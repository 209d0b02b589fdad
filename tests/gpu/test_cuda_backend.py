"""The cuda back end against the reference back end, through JAX: on a real GPU when there is
one, else under the CUDA emulator (`TENSORDSL_CUDA_EMULATE=1`) on the CPU.

Under the emulator a representative part of the corpus runs by default (its kernels are
compiled in a few translation units before the tests), the whole corpus with
`TENSORDSL_EMULATOR_FULL=1`; on a GPU the whole corpus always runs.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from codegen.cuda.emulator import emulate
from codegen.cuda.schedule import candidate_gpu_schedules
from tensordsl.binding import primitive as jax_bind
from tests.corpus import CORPUS, CORPUS_BY_NAME, Case, make_inputs
from tests.gpu import emulated


def _gpu_reason() -> str | None:
    try:
        import cupy  # noqa: F401
    except ImportError:
        return "CuPy is not installed"
    if jax.default_backend() != "gpu":
        return f"no GPU: JAX's default backend is {jax.default_backend()!r}"
    return None


GPU_REASON = _gpu_reason()
EMULATED = GPU_REASON is not None and emulate.available()
REASON = None if GPU_REASON is None or EMULATED else f"{GPU_REASON}; no CUDA emulator either"
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")
FULL = not EMULATED or os.environ.get("TENSORDSL_EMULATOR_FULL", "0") not in ("", "0")
#: The emulated part: every strategy, integer inputs, scalars, max/prod/logsumexp gradients.
EMULATED_CASES = (
    "matmul",
    "batched_matmul",
    "scalar_affine",
    "row_max",
    "logsumexp_rows",
    "prod_with_zero",
    "conv1d_valid",
    "conv1d_same_pad",
    "conv1d_circular_mod",
    "clamped_shift",
    "stencil_1d",
    "full_inner_product",
    "integer_mask",
)
CASES = CORPUS if FULL else tuple(CORPUS_BY_NAME[name] for name in EMULATED_CASES)
DTYPES = ("float32", "float64", "float16", "bfloat16")
TOLERANCE = emulated.TOLERANCE


@pytest.fixture(autouse=True)
def _cuda_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")  # these test generated kernels
    if EMULATED:
        monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")


@pytest.fixture(scope="module", autouse=True)
def _compiled_up_front() -> None:
    """Under the emulator, compile the kernels the tests will trace, many per compiler call."""
    if not EMULATED:
        return
    launches = []
    for case in CASES:
        for inst in emulated.instances(case):
            dtypes = DTYPES if inst.role == "forward" else ("float64",)
            launches += [emulated.launch(inst, dtype) for dtype in dtypes]
            if inst.role == "forward":
                schedules = candidate_gpu_schedules(inst.nest)
                launches += [emulated.launch(inst, "float64", s) for s in schedules]
    emulated.build_all(launches)


def _lowered(case: Case):  # type: ignore[no-untyped-def]
    return _lowered_by_name(case.name)


@functools.cache
def _lowered_by_name(name: str):  # type: ignore[no-untyped-def]
    from tests.compile_only.nests import forward

    return forward(CORPUS_BY_NAME[name])  # cached by name: a Case holds dicts, unhashable


def _inputs(case: Case, dtype: str) -> list[jax.Array]:
    values = make_inputs(case, seed=3)
    return [
        jnp.asarray(v, dtype=jnp.int32 if case.args[n].integer else dtype)
        for n, v in values.items()
    ]


def _call(case: Case, operands: list[jax.Array], backend: str, dtype: str) -> jax.Array:
    return jax_bind.call_nest(_lowered(case), operands, backend=backend, shapes={}, out_dtype=dtype)


def _close(got: jax.Array, want: jax.Array, dtype: str) -> None:
    emulated.assert_close(np.asarray(got), np.asarray(want), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_forward_matches_reference(case: Case, dtype: str) -> None:
    operands = _inputs(case, dtype)
    _close(_call(case, operands, "cuda", dtype), _call(case, operands, "reference", dtype), dtype)


@pytest.mark.parametrize("case", [c for c in CASES if c.differentiable], ids=lambda c: c.name)
def test_gradients_match_reference(case: Case) -> None:
    operands = _inputs(case, "float64")
    floats = [n for n, op in enumerate(operands) if jnp.issubdtype(op.dtype, jnp.floating)]

    def loss(backend: str, *args: jax.Array) -> jax.Array:
        out = _call(case, list(args), backend, "float64")
        weights = jnp.cos(jnp.arange(out.size, dtype=out.dtype)).reshape(out.shape)
        return jnp.sum(out * weights)

    argnums = tuple(floats)
    got = jax.grad(functools.partial(loss, "cuda"), argnums=argnums)(*operands)
    want = jax.grad(functools.partial(loss, "reference"), argnums=argnums)(*operands)
    for g, w in zip(got, want, strict=True):
        _close(g, w, "float64")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_schedule_agrees(case: Case) -> None:
    from tensordsl.backends.cuda import run_cuda

    nest = _lowered(case)
    operands = _inputs(case, "float64")
    want = _call(case, operands, "reference", "float64")
    for schedule in candidate_gpu_schedules(nest):
        # Poison: fill the memory a fresh output will likely reuse with NaN first.
        jnp.full(want.shape, jnp.nan).block_until_ready()
        got = run_cuda(nest, operands, {}, "float64", schedule=schedule)
        _close(got, want, "float64")


def test_inside_jit_with_xla_ops_and_vmap_and_grad_of_grad() -> None:
    case = CORPUS_BY_NAME["matmul"]
    a, b = _inputs(case, "float64")

    def f(backend: str, x: jax.Array, y: jax.Array) -> jax.Array:
        c = _call(case, [jnp.sin(x) * 2.0, y + 1.0], backend, "float64")  # XLA before
        return jnp.tanh(c).sum()  # XLA after: stream ordering matters

    for transform in (jax.jit, lambda g: g):
        got = transform(functools.partial(f, "cuda"))(a, b)
        _close(got, f("reference", a, b), "float64")
    batched_a = jnp.stack([a, a * 0.5, -a])
    got = jax.vmap(functools.partial(f, "cuda"), in_axes=(0, None))(batched_a, b)
    want = jax.vmap(functools.partial(f, "reference"), in_axes=(0, None))(batched_a, b)
    _close(got, want, "float64")

    def gg(backend: str, x: jax.Array) -> jax.Array:
        inner = jax.grad(lambda z: f(backend, z, b))
        return jnp.sum(inner(x) ** 2)

    _close(
        jax.grad(functools.partial(gg, "cuda"))(a),
        jax.grad(functools.partial(gg, "reference"))(a),
        "float64",
    )
