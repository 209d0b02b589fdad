"""Attention's dK and dV as one CUDA kernel with two outputs (`codegen.cuda.attention.paired`), run
under the CUDA emulator (outputs poisoned) through `jax.grad` on the cuda back end, against
the backward written out in float64 numpy (FlashAttention's equations: `dV = P^T dO`,
`dS = P * (dO V^T - rowsum(dO * O) + dL)`, `dK = scale * dS^T Q`, `dQ = scale * dS K`).

Odd T (not a multiple of the 32-row tile), T = 1, head dims 32, 64 and 128 (dK and dV of
128 + 128 columns do not pair: more than one pass over the keys), float32 and bfloat16,
causal, full, a sliding window, a padding mask, a relative position bias; the gradient of
every input. The packed nest itself runs every candidate schedule in both scheduling orders.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from codegen.cuda.attention.paired import pair_weighted
from codegen.cuda.emulator import emulate
from codegen.cuda.layout import split_paired
from codegen.cuda.schedule import ONLINE_COLUMNS, candidate_gpu_schedules
from tensordsl.backends import cuda as gpu
from tensordsl.binding import paired
from tests.gpu import emulated
from tests.gpu.test_online_cuda import ATTENTION, BIAS

pytestmark = pytest.mark.skipif(
    not emulate.available(), reason=f"CUDA emulator: {emulate.unavailable_reason()}"
)

MASKS = {
    "causal": ("where(j <= i, 0, -inf)", lambda i, j: j <= i),
    "full": ("0", lambda i, j: np.ones_like(i + j, bool)),
    "window": (
        "where(j <= i, 0, -inf) + where(i - j <= 4, 0, -inf)",
        lambda i, j: (j <= i) & (i - j <= 4),
    ),
    "padded": ("M[b,j]", lambda i, j: np.ones_like(i + j, bool)),
}
TOLERANCE = {"float32": 2e-4, "bfloat16": 5e-2, "float64": 1e-10}


def _values(case: str, T: int, D: int, E: int, seed: int) -> tuple[str, dict]:
    rng = np.random.default_rng(seed)
    lead = (2,) if case == "bias" else (2, 2)
    values = {
        "Q": rng.normal(size=(*lead, T, D)),
        "K": rng.normal(size=(*lead, T, D)),
        "scale": np.asarray(0.3),
        "V": rng.normal(size=(*lead, T, E)),
    }
    if case == "bias":
        values["R"] = rng.normal(size=(2, 2 * T))
        return BIAS.format(T=T), values
    if case == "padded":
        M = np.where(rng.random((2, T)) < 0.3, -np.inf, 0.0)
        M[:, 0] = 0.0  # every row keeps a key
        values["M"] = M
    return ATTENTION.format(mask=MASKS[case][0]), values


def _numpy_gradients(case: str, values: dict, W: np.ndarray) -> dict:
    """Every input's gradient of `sum(O * W) + sum(sin(L))`, float64."""
    Q, K, V, scale = values["Q"], values["K"], values["V"], float(values["scale"])
    T = Q.shape[-2]
    i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    QK = np.einsum("...id,...jd->...ij", Q, K)
    S = QK * scale
    if case == "bias":
        S = S + values["R"][:, i - j + T]
    elif case == "padded":
        S = S + values["M"][:, None, None, :]
    else:
        S = np.where(MASKS[case][1](i, j), S, -np.inf)
    top = np.max(S, axis=-1, keepdims=True)
    L = np.log(np.sum(np.exp(S - top), axis=-1)) + top[..., 0]
    P = np.exp(S - L[..., None])
    O = P @ V
    dO, dL = W, np.cos(L)
    dP = dO @ np.swapaxes(V, -1, -2)
    dS = P * (dP - np.sum(dO * O, axis=-1, keepdims=True) + dL[..., None])
    found = {
        "Q": scale * dS @ K,
        "K": scale * np.swapaxes(dS, -1, -2) @ Q,
        "V": np.swapaxes(P, -1, -2) @ dO,
        "scale": np.sum(dS * QK),
    }
    if case == "bias":
        dR = np.zeros_like(values["R"])
        for h in range(dR.shape[0]):
            np.add.at(dR[h], i - j + T, dS[h])
        found["R"] = dR
    if case == "padded":
        found["M"] = np.sum(dS, axis=(1, 2))
    return found


def _gradients(source: str, values: dict, W: np.ndarray, dtype: str, monkeypatch) -> tuple:
    """(every input's gradient on the emulated cuda back end, the outputs that ran paired,
    what the pairing saw: its nests, operand values and shapes)."""
    import tensordsl as td

    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    seen: list = []
    run_pairs = paired.run_pairs

    def spy(nests, operands, dtypes, shapes, *rest):
        found = run_pairs(nests, operands, dtypes, shapes, *rest)
        if found:
            seen.append((dict(nests), dict(operands), dict(shapes), sorted(found)))
        return found

    monkeypatch.setattr(paired, "run_pairs", spy)
    names = tuple(values)
    k = td.kernel(source, outputs=("O", "L"), backend="cuda", fuse={"S": "inline"})
    weights = jnp.asarray(W, jnp.dtype(dtype))

    def loss(*args):
        O, L = k(**dict(zip(names, args)))
        return jnp.sum(O * weights) + jnp.sum(jnp.sin(L))

    args = [jnp.asarray(values[n], jnp.dtype(dtype)) for n in names]
    grads = jax.grad(loss, argnums=tuple(range(len(names))))(*args)
    return dict(zip(names, grads)), seen


def _rounded(values: dict, dtype: str) -> dict:
    return {n: np.asarray(np.asarray(v, jnp.dtype(dtype)), np.float64) for n, v in values.items()}


@pytest.mark.parametrize(
    ("case", "T", "D", "E", "dtype"),
    [
        ("causal", 37, 64, 64, "float32"),  # T not a multiple of the tiles
        ("causal", 1, 32, 32, "float32"),
        ("causal", 20, 128, 128, "float32"),  # 256 columns: dK and dV apart
        ("causal", 21, 32, 32, "bfloat16"),
        ("full", 35, 32, 24, "float32"),  # dK and dV of different widths
        ("window", 40, 16, 8, "float32"),
        ("padded", 13, 8, 5, "float32"),
        ("bias", 35, 8, 6, "float32"),
    ],
)
def test_gradients_of_every_input_match_numpy(case, T, D, E, dtype, monkeypatch):
    source, values = _values(case, T, D, E, seed=T + D)
    W = np.random.default_rng(1).normal(size=values["V"].shape)
    got, seen = _gradients(source, values, W, dtype, monkeypatch)
    want = _numpy_gradients(case, _rounded(values, dtype), _rounded({"W": W}, dtype)["W"])
    assert [outputs for *_, outputs in seen] == ([] if D + E > ONLINE_COLUMNS else [["dK", "dV"]])
    tol = TOLERANCE[dtype]
    for name, value in want.items():
        scale = max(1.0, float(np.max(np.abs(value))))
        np.testing.assert_allclose(
            np.asarray(got[name], np.float64), value, rtol=tol, atol=tol * scale, err_msg=name
        )


def test_the_packed_nest_under_every_candidate_schedule(monkeypatch):
    """The pair's kernel as `jax.grad` runs it, then under every candidate schedule in both
    scheduling orders (float32), against its own two gradients from numpy."""
    source, values = _values("window", 45, 8, 6, seed=3)
    W = np.random.default_rng(2).normal(size=values["V"].shape)
    _, seen = _gradients(source, values, W, "float32", monkeypatch)
    ((nests, operands, shapes, _),) = seen
    (pair,) = pair_weighted(nests, shapes, "float32")
    assert split_paired(pair.nest) is not None
    arrays = [np.asarray(operands[op.name], np.float32) for op in pair.nest.operands]
    rounded = {op.name: np.asarray(a, np.float64) for op, a in zip(pair.nest.operands, arrays)}
    want = _numpy_gradients("window", _rounded(values, "float32"), W)
    first, second = ("K", "V") if pair.outputs == ("dK", "dV") else ("V", "K")
    schedules = candidate_gpu_schedules(pair.nest)
    assert len(schedules) >= 3 and {s.strategy for s in schedules} == {"weighted"}
    assert rounded["dO"].shape == W.shape
    for schedule in schedules:
        la = gpu.prepare(pair.nest, arrays, shapes, "float32", schedule)
        assert "ss2_" in la.source.text
        for order in ("forward", "reverse"):
            out = np.asarray(emulated.run_arrays(la, arrays, order), np.float64)
            for got, name in ((out[..., : pair.split], first), (out[..., pair.split :], second)):
                scale = max(1.0, float(np.max(np.abs(want[name]))))
                np.testing.assert_allclose(got, want[name], rtol=2e-4, atol=2e-4 * scale)


def test_float64_pairs_do_not_fit_static_shared_memory(monkeypatch):
    """With float64 accumulation the second score array would take the kernel past the
    48 KiB of static shared memory: dK and dV run apart (and stay correct)."""
    source, values = _values("causal", 9, 8, 8, seed=4)
    W = np.random.default_rng(4).normal(size=values["V"].shape)
    got, seen = _gradients(source, values, W, "float64", monkeypatch)
    assert seen == []
    want = _numpy_gradients("causal", values, W)
    for name in ("K", "V"):
        np.testing.assert_allclose(np.asarray(got[name]), want[name], rtol=1e-10, atol=1e-10)


def test_the_setting_runs_them_apart(monkeypatch):
    monkeypatch.setenv("TENSORDSL_PAIR_GRADIENTS", "0")
    source, values = _values("causal", 9, 8, 8, seed=5)
    W = np.random.default_rng(3).normal(size=values["V"].shape)
    got, seen = _gradients(source, values, W, "float32", monkeypatch)
    assert seen == []
    want = _numpy_gradients("causal", _rounded(values, "float32"), W)
    np.testing.assert_allclose(np.asarray(got["K"]), want["K"], rtol=2e-4, atol=2e-4)
