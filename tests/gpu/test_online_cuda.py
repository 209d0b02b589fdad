"""The one-pass CUDA kernel (`codegen.cuda.attention.online`): a logsumexp and its softmax-weighted
sum in one kernel, run under the CUDA emulator (outputs poisoned) against float64 numpy that
runs the statements in order (the scores materialised, masks as -inf).

Sizes are small (the emulator runs a thread as a fiber): T not a multiple of the tile, T = 1,
head dims 32, 64 and 128, float32, float64 and bfloat16, causal and not, a sliding window,
a padding mask, a relative position bias, rows with no key in range; every candidate
schedule in both scheduling orders. The gradients of every input go through `jax.grad` on
the cuda back end (forward: this kernel; backward: the derived nests) against the
reference back end.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from codegen.cuda.emulator import emulate
from codegen.cuda.schedule import candidate_gpu_schedules
from codegen.ir.nest import LoopNest
from codegen.passes.online import pair_stored
from tensordsl.backends import cuda as gpu
from tests.gpu import emulated

pytestmark = pytest.mark.skipif(
    not emulate.available(), reason=f"CUDA emulator: {emulate.unavailable_reason()}"
)

ATTENTION = """
S[b,h,i,j] := Q[b,h,i,d] * K[b,h,j,d] * scale + {mask}
(logsumexp) L[b,h,i] := S[b,h,i,j]
O[b,h,i,e] := exp(S[b,h,i,j] - L[b,h,i]) * V[b,h,j,e]
"""
MASKS = {
    "causal": ("where(j <= i, 0, -inf)", lambda i, j: j <= i),
    "full": ("0", lambda i, j: np.ones_like(i + j, bool)),
    "window": (
        "where(j <= i, 0, -inf) + where(i - j <= 4, 0, -inf)",
        lambda i, j: (j <= i) & (i - j <= 4),
    ),  # noqa: E501
    "strict": ("where(j < i, 0, -inf)", lambda i, j: j < i),  # row 0: no key in range
    "rows": ("where(i >= 3, 0, -inf)", lambda i, j: (i >= 3) & (j >= 0)),  # a test of rows
}
PADDED = """
S[b,h,i,j] := Q[b,h,i,d] * K[b,h,j,d] * scale + M[b,j]
(logsumexp) L[b,h,i] := S[b,h,i,j]
O[b,h,i,e] := exp(S[b,h,i,j] - L[b,h,i]) * V[b,h,j,e]
"""
BIAS = """
S[h,i,j] := Q[h,i,d] * K[h,j,d] * scale + R[h,i-j+{T}]
(logsumexp) L[h,i] := S[h,i,j]
O[h,i,e] := exp(S[h,i,j] - L[h,i]) * V[h,j,e]
"""
TOLERANCE = {"float64": 1e-11, "float32": 2e-5, "bfloat16": 2e-2}


def _online_nest(source: str, values: dict) -> LoopNest:
    """The one-pass nest a call of `source` on `values` runs, the scores `S` recomputed in it
    (for some shapes the cost model stores them, a matmul)."""
    import tensordsl as td
    from tensordsl.binding.programs import compiled_statements

    k = td.kernel(source, outputs=("O", "L"), fuse={"S": "inline"})
    runs = pair_stored(compiled_statements(k.program, values, "cuda", k.fuse))
    (nest,) = [n for n in runs if n.online]
    return nest


def _reference(S: np.ndarray, V: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """O and L of the statements in order, float64: L = logsumexp(S), O = exp(S - L) @ V."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        top = np.max(S, axis=-1, keepdims=True)
        shift = np.where(np.isfinite(top), top, 0)
        L = np.log(np.sum(np.exp(S - shift), axis=-1)) + shift[..., 0]
        O = np.einsum("...ij,...je->...ie", np.exp(S - L[..., None]), V)
    return O, L


def _run(nest: LoopNest, values: dict, dtype: str, schedule=None, order="forward"):
    """O and L of the kernel under the emulator (inputs rounded to `dtype`)."""
    arrays = [np.asarray(values[op.name], jnp.dtype(dtype)) for op in nest.operands]
    shapes = {n: np.shape(v) for n, v in values.items()}
    la = gpu.prepare(nest, arrays, shapes, dtype, schedule)
    assert la.source.schedule.strategy == "online"
    out = np.asarray(emulated.run_arrays(la, arrays, order), np.float64)
    return out[..., :-1], out[..., -1]


def _rounded(values: dict, dtype: str) -> dict:
    return {n: np.asarray(np.asarray(v, jnp.dtype(dtype)), np.float64) for n, v in values.items()}


def _check(got, want, dtype):
    tol = TOLERANCE[dtype]
    for g, w in zip(got, want):
        scale = max(1.0, float(np.max(np.abs(w[np.isfinite(w)]), initial=0)))
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * scale)


def _attention(mask: str, T: int, D: int, E: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    values = {
        "Q": rng.normal(size=(2, 1, T, D)),
        "K": rng.normal(size=(2, 1, T, D)),
        "scale": np.asarray(0.3),
        "V": rng.normal(size=(2, 1, T, E)),
    }
    return ATTENTION.format(mask=MASKS[mask][0]), values


def _attention_reference(mask: str, values: dict):
    Q, K, V = values["Q"], values["K"], values["V"]
    S = np.einsum("...id,...jd->...ij", Q, K) * values["scale"]
    T = S.shape[-1]
    i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    keep = MASKS[mask][1](i, j)
    O, L = _reference(np.where(keep, S, -np.inf), V)
    # A mask on the indices is a loop bound: a row with no key in range sums over nothing.
    O[..., ~keep.any(axis=-1), :] = 0
    return O, L


@pytest.mark.parametrize(
    ("mask", "T", "D", "E", "dtype"),
    [
        ("causal", 37, 64, 64, "float32"),  # T not a multiple of 32 rows or keys
        ("causal", 77, 64, 64, "float32"),  # two 64-row tiles: dynamic shared memory
        ("full", 70, 32, 16, "bfloat16"),
        ("window", 70, 16, 8, "float32"),  # tiles before a 64-row tile's window skipped
        ("causal", 1, 32, 32, "float32"),
        ("causal", 20, 128, 128, "float32"),
        ("causal", 33, 16, 24, "float64"),
        ("causal", 21, 32, 32, "bfloat16"),
        ("full", 35, 32, 40, "float32"),
        ("window", 40, 16, 8, "float64"),
        ("strict", 9, 8, 8, "float64"),
        ("rows", 9, 8, 8, "float64"),
    ],
)
def test_attention_matches_numpy(mask, T, D, E, dtype):
    source, values = _attention(mask, T, D, E)
    nest = _online_nest(source, values)
    got = _run(nest, values, dtype)
    _check(got, _attention_reference(mask, _rounded(values, dtype)), dtype)


@pytest.mark.parametrize(("D", "dtype"), [(8, "float32"), (130, "float32"), (8, "float64")])
def test_the_key_tile_is_staged_where_it_fits(D, dtype):
    """float32 stages K per key tile (`codegen.cuda.attention.key_tiles`), read as written when the
    head dim is past the staged depth (checked at run time) and in float64 (no room)."""
    source, values = _attention("causal", 9, D, 3)
    nest = _online_nest(source, values)
    arrays = [np.asarray(values[op.name], dtype) for op in nest.operands]
    shapes = {n: np.shape(v) for n, v in values.items()}
    text = gpu.prepare(nest, arrays, shapes, dtype).source.text
    assert ("ks_[" in text) == (dtype == "float32")
    want = _attention_reference("causal", _rounded(values, dtype))
    _check(_run(nest, values, dtype), want, dtype)


def test_a_row_with_no_key_in_range_gives_zero_and_minus_infinity():
    source, values = _attention("strict", 5, 4, 3)
    O, L = _run(_online_nest(source, values), values, "float64")
    assert np.all(O[:, :, 0] == 0) and np.all(L[:, :, 0] == -np.inf)


@pytest.mark.parametrize("order", ["forward", "reverse"])
def test_every_candidate_schedule(order):
    source, values = _attention("window", 45, 8, 6, seed=3)
    nest = _online_nest(source, values)
    want = _attention_reference("window", values)
    schedules = candidate_gpu_schedules(nest)
    assert len(schedules) >= 3
    for schedule in schedules:
        _check(_run(nest, values, "float64", schedule, order), want, "float64")


def test_one_block_loops_over_every_tile_and_batch():
    """Every loop over blocks is grid-stride: a grid of one block (or two) computes all."""
    source, values = _attention("causal", 70, 8, 6, seed=4)
    nest = _online_nest(source, values)
    arrays = [np.asarray(values[op.name], np.float64) for op in nest.operands]
    shapes = {n: np.shape(v) for n, v in values.items()}
    la = gpu.prepare(nest, arrays, shapes, "float64")
    want = _attention_reference("causal", values)
    for grid in ((1, 1, 1), (2, 1, 1), (1, 2, 1)):
        small = dataclasses.replace(la, grids=(grid,))
        out = np.asarray(emulated.run_arrays(small, arrays), np.float64)
        _check((out[..., :-1], out[..., -1]), want, "float64")


def test_a_padding_mask():
    rng = np.random.default_rng(5)
    T = 13
    M = np.where(rng.random((2, T)) < 0.3, -np.inf, 0.0)
    M[:, 0] = 0.0  # every row keeps a key
    values = {
        "Q": rng.normal(size=(2, 2, T, 8)),
        "K": rng.normal(size=(2, 2, T, 8)),
        "scale": np.asarray(0.5),
        "M": M,
        "V": rng.normal(size=(2, 2, T, 5)),
    }
    nest = _online_nest(PADDED, values)
    S = np.einsum("...id,...jd->...ij", values["Q"], values["K"]) * 0.5 + M[:, None, None, :]
    _check(_run(nest, values, "float32"), _reference(S, values["V"]), "float32")


def test_a_relative_position_bias():
    rng = np.random.default_rng(6)
    T, D, E = 35, 8, 6
    values = {
        "Q": rng.normal(size=(2, T, D)),
        "K": rng.normal(size=(2, T, D)),
        "scale": np.asarray(0.4),
        "R": rng.normal(size=(2, 2 * T)),
        "V": rng.normal(size=(2, T, E)),
    }
    source = BIAS.format(T=T)
    nest = _online_nest(source, values)
    i, j = np.meshgrid(np.arange(T), np.arange(T), indexing="ij")
    S = np.einsum("hid,hjd->hij", values["Q"], values["K"]) * 0.4 + values["R"][:, i - j + T]
    _check(_run(nest, values, "float32"), _reference(S, values["V"]), "float32")


@pytest.mark.parametrize("name", ["causal", "window", "bias"])
def test_values_and_gradients_of_every_input_through_jax(name, monkeypatch):
    """jit and grad on the cuda back end (the forward is the online kernel, dQ, dK and dV
    the weighted one) against the reference back end, in float64; T over a tile."""
    import tensordsl as td

    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    rng = np.random.default_rng(7)
    T = 37
    if name != "bias":
        source, values = _attention(name, T, 4, 3, seed=7)
    else:
        source = BIAS.format(T=T)
        values = {
            "Q": rng.normal(size=(2, T, 4)),
            "K": rng.normal(size=(2, T, 4)),
            "scale": np.asarray(0.4),
            "R": rng.normal(size=(2, 2 * T)),
            "V": rng.normal(size=(2, T, 3)),
        }
    names = tuple(values)
    weights = rng.normal(size=values["V"].shape[:-2] + (T, 3))

    def results(backend):
        k = td.kernel(source, outputs=("O", "L"), backend=backend)

        def loss(*args):
            O, L = k(**dict(zip(names, args)))
            return jnp.sum(O * weights) + jnp.sum(jnp.sin(L))

        args = [jnp.asarray(values[n]) for n in names]
        return jax.jit(jax.value_and_grad(loss, argnums=tuple(range(len(names)))))(*args)

    with jax.enable_x64(True):
        (ours, our_grads), (want, want_grads) = results("cuda"), results("reference")
    np.testing.assert_allclose(ours, want, rtol=1e-10)
    for got, expected in zip(our_grads, want_grads):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-11)


def test_the_cuda_back_end_runs_the_program_in_one_kernel():
    import tensordsl as td

    source, values = _attention("causal", 5, 4, 3)
    k = td.kernel(source, outputs=("O", "L"), backend="cuda")
    sources = k.source("cuda", shapes={n: np.shape(v) for n, v in values.items()})
    assert "strategy=online" in sources["O+L"]
    for gradient in ("dQ", "dK", "dV"):  # each score once per block, not per column
        assert "strategy=weighted" in sources[gradient]


# A sum whose weight recomputes a dot product (the weighted strategy, as attention's
# gradient nests): unnormalised causal attention, a column test, columns past 128.
WEIGHTED = """
S[b,i,j] := Q[b,i,d] * K[b,j,d] * scale
O[b,i,e] := where(j <= i, where(e <= {last}, exp(S[b,i,j]) * V[b,j,e], 0), 0)
"""


def _weighted(T: int, E: int, last: int, seed: int = 9):
    import tensordsl as td
    from tensordsl.binding.programs import compiled_statements

    rng = np.random.default_rng(seed)
    values = {
        "Q": rng.normal(size=(2, T, 6)),
        "K": rng.normal(size=(2, T, 6)),
        "scale": np.asarray(0.3),
        "V": rng.normal(size=(2, T, E)),
    }
    k = td.kernel(WEIGHTED.format(last=last), fuse={"S": "inline"})
    (nest,) = compiled_statements(k.program, values, "cuda", k.fuse)
    return nest, values


def _weighted_reference(values: dict, last: int) -> np.ndarray:
    S = np.einsum("bid,bjd->bij", values["Q"], values["K"]) * values["scale"]
    T = S.shape[-1]
    P = np.where(np.tril(np.ones((T, T), bool)), np.exp(S), 0)
    O = np.einsum("bij,bje->bie", P, values["V"])
    O[..., last + 1 :] = 0
    return O


@pytest.mark.parametrize(
    ("T", "E", "last", "dtype"),
    [(37, 5, 2, "float32"), (33, 130, 200, "float64"), (20, 7, 100, "bfloat16")],
)
def test_a_weighted_sum_matches_numpy(T, E, last, dtype):
    nest, values = _weighted(T, E, last)
    arrays = [np.asarray(values[op.name], jnp.dtype(dtype)) for op in nest.operands]
    shapes = {n: np.shape(v) for n, v in values.items()}
    want = _weighted_reference(_rounded(values, dtype), last)
    schedules = candidate_gpu_schedules(nest) if dtype == "float64" else (None,)
    for schedule in schedules:
        la = gpu.prepare(nest, arrays, shapes, dtype, schedule)
        assert la.source.schedule.strategy == "weighted"
        for order in ("forward", "reverse"):
            got = np.asarray(emulated.run_arrays(la, arrays, order), np.float64)
            tol = TOLERANCE[dtype]
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.max(np.abs(want)))


@pytest.mark.parametrize("E", [128, 200])
def test_wide_rows_run_in_one_kernel_through_jax(E, monkeypatch):
    """Head dims up to 256 run as the one-pass kernel (more than 128 columns: two passes
    over the keys), not as the two nests."""
    import tensordsl as td

    monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    source, values = _attention("causal", 6, 8, E, seed=11)
    k = td.kernel(source, outputs=("O", "L"), backend="cuda", fuse={"S": "inline"})
    shapes = {n: np.shape(v) for n, v in values.items()}
    assert "strategy=online" in k.source("cuda", shapes)["O+L"]
    O, L = k(**{n: np.asarray(v, np.float32) for n, v in values.items()})
    want = _attention_reference("causal", _rounded(values, "float32"))
    _check((np.asarray(O, np.float64), np.asarray(L, np.float64)), want, "float32")
