"""Pure contractions on the cuda back end run as XLA's dot (cuBLAS on a GPU), as on the CPU;
everything else, and a contraction asked for as a kernel, as generated CUDA. On a real GPU
when there is one, else under the CUDA emulator."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.cuda.emit import emit_cuda
from codegen.cuda.schedule import candidate_gpu_schedules, choose_gpu_schedule
from codegen.ir.nest import default_dtypes
from tensordsl.explain.nests import schedule_lines
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.gpu.test_cuda_backend import EMULATED, REASON

MATMUL = "C[i,j] := A[i,k] * B[k,j]"
NEST = lower(parse(MATMUL)).nest


@pytest.fixture(autouse=True)
def _cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    if EMULATED:
        monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")


def test_the_heuristic_gives_pure_contractions_of_floats_to_xla(monkeypatch) -> None:
    floats = default_dtypes(NEST)
    assert choose_gpu_schedule(NEST, floats).strategy == "xla"
    assert choose_gpu_schedule(NEST, dict.fromkeys(floats, "int32")).strategy == "smem"
    assert choose_gpu_schedule(NEST, floats, loop_order=("j", "i")).strategy == "smem"
    assert choose_gpu_schedule(NEST, floats, kernel=True).strategy == "smem"
    assert "xla" not in {s.strategy for s in candidate_gpu_schedules(NEST)}
    xla = choose_gpu_schedule(NEST, floats)
    assert xla.describe().startswith("strategy=xla free=i,j reduced=k (jnp.einsum")
    with pytest.raises(ValueError, match="the xla strategy generates no kernel"):
        emit_cuda(NEST, dtypes=floats, schedule=xla)
    assert "strategy=smem" in emit_cuda(NEST, dtypes=floats).text  # k.source("cuda")
    assert "strategy=smem" in td.kernel(MATMUL).source("cuda")["forward"]
    assert schedule_lines(NEST)[2].startswith("  cuda: XLA's dot")  # explain: forward
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    assert choose_gpu_schedule(NEST, floats).strategy == "smem"


def _hlo(f, *args) -> str:
    return jax.jit(f).lower(*args).as_text()


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_matmul_and_its_gradients_run_as_xla_dots(monkeypatch) -> None:
    rng = np.random.default_rng(0)
    A, B = rng.normal(size=(5, 7)), rng.normal(size=(7, 3))
    weights = jnp.arange(15.0).reshape(5, 3)
    k = td.kernel("C[i,j] := A[i,k] * B[k,j] * s", backend="cuda")

    def loss(A, B):
        return jnp.sum(k(A, B, 0.5) * weights)

    np.testing.assert_allclose(k(A, B, 0.5), 0.5 * A @ B, rtol=1e-12)
    want = jax.grad(lambda A, B: jnp.sum(0.5 * A @ B * weights), (0, 1))(A, B)
    for got, expected in zip(jax.grad(loss, argnums=(0, 1))(A, B), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-12)
    text = _hlo(jax.grad(loss, argnums=(0, 1)), A, B)
    assert "dot" in text and "custom_call" not in text
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    assert "custom_call" in _hlo(jax.grad(loss, argnums=(0, 1)), A, B)
    np.testing.assert_allclose(jax.grad(loss, argnums=(0, 1))(A, B)[0], want[0], rtol=1e-12)


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
def test_shapes_an_einsum_does_not_fit_run_the_kernel() -> None:
    rng = np.random.default_rng(1)
    A, B = rng.normal(size=(4, 6)), rng.normal(size=(6, 3))
    k = td.kernel(MATMUL, ranges={"k": 4}, backend="cuda")
    assert "custom_call" in _hlo(k, A, B)
    np.testing.assert_allclose(k(A, B), A[:, :4] @ B[:4], rtol=1e-12)


@pytest.mark.skipif(REASON is not None, reason=REASON or "")
@pytest.mark.parametrize(("precision", "expected"), [(None, "DEFAULT"), ("highest", "HIGHEST")])
def test_the_dots_follow_the_kernels_precision(precision, expected) -> None:
    # On a GPU, DEFAULT is TF32 (what jnp users get); precision="highest" asks for float32.
    rng = np.random.default_rng(2)
    A, B = rng.normal(size=(5, 7)), rng.normal(size=(7, 3))
    k = td.kernel(MATMUL, backend="cuda", precision=precision)
    f = jax.grad(lambda A, B: jnp.sum(jnp.sin(k(A, B))), (0, 1))
    found = re.findall(r"dot_general .*precision = \[(\w+), \w+\]", _hlo(f, A, B))
    assert len(found) == 3 and set(found) == {expected}  # forward, dA and dB
    dA, dB = f(A, B)
    ct = np.cos(A @ B)
    np.testing.assert_allclose(dA, ct @ B.T, rtol=1e-12)
    np.testing.assert_allclose(dB, A.T @ ct, rtol=1e-12)
