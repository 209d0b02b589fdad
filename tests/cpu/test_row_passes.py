"""Row statistics recomputed as passes over their reader's rows, one kernel for the forward
(`codegen.passes.row_passes`, the C strategy `codegen.c.reductions.statistics`).

Every program here is checked against float64 jax.numpy that runs its statements in order,
on random inputs, with the kernels' outputs poisoned: the forward (which runs the one
row-passes kernel), the forward-mode tangent and every gradient (which run the stored
nests), in float32 and float64, on odd sizes, one row, rows of one element.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.c.schedule import choose_cpu_schedule
from codegen.ir.nest import Reduce
from codegen.passes.row_passes import row_passes
from tensordsl.binding.programs import compiled_statements
from tests.backends import NEEDS_C_COMPILER
from tests.sampling import product

# optimised: the row_passes strategy's own numerical checks run on the kernels users run
pytestmark = [NEEDS_C_COMPILER, pytest.mark.optimised, pytest.mark.usefixtures("poisoned_outputs")]

SOFTMAX = """
    (max) M[i] := X[i,j]
    Z[i] := exp(X[i,j] - M[i])
    P[i,j] := exp(X[i,j] - M[i]) / Z[i]
"""
CAUSAL = """
    (max) M[i] := where(j <= i, X[i,j], -inf)
    Z[i] := where(j <= i, exp(X[i,j] - M[i]), 0)
    P[i,j] := where(j <= i, exp(X[i,j] - M[i]) / Z[i], 0)
"""
LAYERNORM = """
    mu[b] := X[b,f] / F
    var[b] := (X[b,f] - mu[b])^2 / F
    Y[b,f] := (X[b,f] - mu[b]) * rsqrt(var[b] + 0.001) * g[f] + beta[f]
"""
RMSNORM = "ms[b] := X[b,f]^2 / F; Y[b,f] := X[b,f] * rsqrt(ms[b] + 0.001) * g[f]"
LOGSUMEXP = """
    (logsumexp) L[i] := X[i,j]
    P[i,j] := exp(X[i,j] - L[i])
"""


def _softmax(X: jax.Array) -> jax.Array:
    e = jnp.exp(X - X.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _causal(X: jax.Array) -> jax.Array:
    rows, cols = X.shape
    keep = np.arange(cols)[None, :] <= np.arange(rows)[:, None]
    m = jnp.where(keep, X, -jnp.inf).max(-1, keepdims=True)
    e = jnp.where(keep, jnp.exp(jnp.where(keep, X, m) - m), 0)
    return e / e.sum(-1, keepdims=True)


def _layernorm(X: jax.Array, F: jax.Array, g: jax.Array, beta: jax.Array) -> jax.Array:
    mu = X.sum(-1, keepdims=True) / F
    var = ((X - mu) ** 2).sum(-1, keepdims=True) / F
    return (X - mu) / jnp.sqrt(var + 0.001) * g + beta


def _rmsnorm(X: jax.Array, F: jax.Array, g: jax.Array) -> jax.Array:
    return X / jnp.sqrt((X**2).sum(-1, keepdims=True) / F + 0.001) * g


def _logsumexp(X: jax.Array) -> jax.Array:
    return jnp.exp(X - jax.nn.logsumexp(X, -1, keepdims=True))


#: name: (source, float64 reference, the statistics the forward's one kernel computes, or
#: that stay stored: no function that they and the elements both evaluate)
PROGRAMS: dict[str, tuple[str, Callable[..., jax.Array], str]] = {
    "softmax": (SOFTMAX, _softmax, "M, Z recomputed"),
    "causal softmax": (CAUSAL, _causal, "M, Z recomputed"),
    "LayerNorm": (LAYERNORM, _layernorm, "mu, var kept"),
    "RMSNorm": (RMSNORM, _rmsnorm, "ms kept"),
    "logsumexp": (LOGSUMEXP, _logsumexp, "L kept"),
    "LayerNorm, fuse=inline": (LAYERNORM, _layernorm, ""),
}
#: `fuse=` of a program: mean and variance recomputed inside the output, whose one nest the
#: row_passes strategy runs (forward and backward; its X gradient goes through the mean
#: read both outside and inside the variance's sum)
FUSE = {"LayerNorm, fuse=inline": {"mu": "inline", "var": "inline"}}
SHAPES = [(37, 131), (6, 1), (1, 9), (300, 5)]


def _inputs(name: str, shape: tuple[int, int], dtype: str, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    found = {"X": (2 * rng.standard_normal(shape)).astype(dtype)}
    if name.startswith(("LayerNorm", "RMSNorm")):
        found["F"] = np.asarray(shape[1], dtype)
        found["g"] = rng.uniform(0.5, 1.5, shape[1]).astype(dtype)
    if name.startswith("LayerNorm"):
        found["beta"] = rng.standard_normal(shape[1]).astype(dtype)
    return found


def _program(name: str) -> Any:
    return td.program(PROGRAMS[name][0], backend="c", fuse=FUSE.get(name, {}))


def _tolerance(dtype: str) -> float:
    return 2e-5 if dtype == "float32" else 1e-12


def _close(found: jax.Array, expected: jax.Array, dtype: str) -> None:
    expected = np.asarray(expected)
    scale = max(float(np.abs(expected).max(initial=0.0)), 1.0)
    np.testing.assert_allclose(
        np.asarray(found, np.float64), expected, atol=_tolerance(dtype) * scale
    )


def test_the_softmax_forward_is_one_kernel_of_row_passes() -> None:
    """M and Z are recomputed inside P as passes over each row, the maximum once."""
    k = _program("softmax")
    values = _inputs("softmax", (37, 131), "float32")
    stored = compiled_statements(k.program, values, "c")
    shapes = k.program.concrete_shapes({"X": (37, 131)})
    (nest,), decisions = row_passes(stored, outputs=("P",), shapes=shapes)
    assert decisions == ("P: M, Z recomputed as passes over each row of P (one kernel)",)
    nested = sorted(nest.terms[0].body.atoms(Reduce), key=str)
    assert [r.reduction for r in nested] == ["max", "sum"]
    dtypes = dict.fromkeys((*nest.operand_names, nest.output), "float32")
    assert choose_cpu_schedule(nest, dtypes).strategy == "row_passes"
    text = k.explain({"X": (37, 131)})
    assert "forward alone (not differentiated): P: M, Z recomputed as passes" in text


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_program_absorbs_its_statistics_where_they_share_a_function(name: str) -> None:
    k = _program(name)
    shape = (37, 131)
    values = _inputs(name, shape, "float32")
    stored = compiled_statements(k.program, values, "c", k.fuse)
    shapes = k.program.concrete_shapes({n: np.shape(v) for n, v in values.items()})
    runs, decisions = row_passes(stored, outputs=k.outputs, shapes=shapes)
    said = PROGRAMS[name][2]
    assert len(decisions) == (1 if said else 0)
    assert all(d.startswith(f"{k.outputs[0]}: {said} ") for d in decisions)
    assert len(runs) == (1 if "recomputed" in said else len(stored))
    if not said:  # the inlined statistics: the one stored nest runs as row passes
        (nest,) = stored
        dtypes = dict.fromkeys((*nest.operand_names, nest.output), "float32")
        assert choose_cpu_schedule(nest, dtypes).strategy == "row_passes"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_forward(name: str, shape: tuple[int, int], dtype: str) -> None:
    values = _inputs(name, shape, dtype)
    found = jax.jit(_program(name))(**values)
    wide = {n: jnp.asarray(v, jnp.float64) for n, v in values.items()}
    _close(found, jax.jit(PROGRAMS[name][1])(**wide), dtype)


@pytest.mark.parametrize(
    ("name", "shape", "dtype"),
    product(sorted(PROGRAMS), [(37, 131), (6, 1)], ["float32", "float64"], every=3),
)
def test_gradients_and_tangents(name: str, shape: tuple[int, int], dtype: str) -> None:
    values = _inputs(name, shape, dtype)
    names = [n for n in values if np.ndim(values[n])]
    rng = np.random.default_rng(1)
    ct = rng.standard_normal(shape)
    k, reference = _program(name), PROGRAMS[name][1]

    def ours(*moved: jax.Array) -> jax.Array:
        return k(**{**values, **dict(zip(names, moved))})

    def theirs(*moved: jax.Array) -> jax.Array:
        wide = {n: jnp.asarray(v, jnp.float64) for n, v in values.items()}
        return reference(**{**wide, **dict(zip(names, moved))})

    primals = [values[n] for n in names]
    found = jax.jit(jax.vjp(ours, *primals)[1])(jnp.asarray(ct, dtype))
    wide = [jnp.asarray(p, jnp.float64) for p in primals]
    # The reference jitted too: eagerly each of its jnp operations is compiled alone.
    expected = jax.jit(lambda *p: jax.vjp(theirs, *p)[1](ct))(*wide)
    for f, e in zip(found, expected, strict=True):
        _close(f, e, dtype)
    tangents = tuple(rng.standard_normal(np.shape(p)).astype(dtype) for p in primals)
    _, slope = jax.jit(lambda *p: jax.jvp(ours, p, tangents))(*primals)
    _, expected_slope = jax.jit(lambda p, t: jax.jvp(theirs, p, t))(
        tuple(wide), tuple(jnp.asarray(t, jnp.float64) for t in tangents)
    )
    _close(slope, expected_slope, dtype)


def test_a_statistic_the_program_returns_stays_stored() -> None:
    """M is an output: computed by its own kernel; Z alone is recomputed inside P."""
    k = td.program(SOFTMAX, backend="c", outputs=("P", "M"))
    values = _inputs("softmax", (37, 131), "float32")
    stored = compiled_statements(k.program, values, "c")
    shapes = k.program.concrete_shapes({"X": (37, 131)})
    runs, decisions = row_passes(stored, outputs=k.outputs, shapes=shapes)
    assert [n.output for n in runs] == ["M", "P"]
    assert decisions == ("P: Z recomputed as passes over each row of P (one kernel)",)
    P, M = jax.jit(k)(**values)
    X = jnp.asarray(values["X"], jnp.float64)
    _close(P, _softmax(X), "float32")
    _close(M, X.max(-1), "float32")


def test_long_rows_and_few_rows_keep_their_kernels() -> None:
    """Past `ROW_LIMIT` elements a row no longer stays in cache; below `MIN_ROWS` rows the
    threads have too little to share: the statistics stay stored."""
    k = _program("softmax")
    for shape in [(4, 20000), (3, 64)]:
        values = _inputs("softmax", shape, "float32")
        stored = compiled_statements(k.program, values, "c")
        shapes = k.program.concrete_shapes({"X": shape})
        assert row_passes(stored, outputs=("P",), shapes=shapes)[1] == ()


def test_no_row_passes_where_programs_are_not_fused(monkeypatch: pytest.MonkeyPatch) -> None:
    """`TENSORDSL_FUSE=0` runs every statement as written: M, Z and P as three kernels."""
    from tensordsl.binding.program_grad import FusedProgram

    k = _program("softmax")
    values = _inputs("softmax", (37, 131), "float32")
    stored = compiled_statements(k.program, values, "c")
    shapes = k.program.concrete_shapes({"X": (37, 131)})
    fused = FusedProgram(stored, ("X",), ("P",), "c", frozenset(), None, shapes)
    assert [n.output for n in fused.forward] == ["P"]
    monkeypatch.setenv("TENSORDSL_FUSE", "0")
    unfused = FusedProgram(stored, ("X",), ("P",), "c", frozenset(), None, shapes)
    assert unfused.forward == unfused.runs == stored
    P = jax.jit(k)(**values)
    _close(P, _softmax(jnp.asarray(values["X"], jnp.float64)), "float32")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_forward(dtype: str) -> None:
    """A 16-bit output is not the accumulation type: the row kernel evaluates the exp again
    for the elements instead of keeping the sum's values (which would round them)."""
    X = jnp.asarray(_inputs("softmax", (37, 131), "float32")["X"], dtype)
    found = jax.jit(_program("softmax"))(X)
    expected = _softmax(jnp.asarray(X, jnp.float64))
    np.testing.assert_allclose(np.asarray(found, np.float64), expected, atol=2e-3)


def test_special_values_as_the_statements_in_order() -> None:
    """NaN, +inf and a row of -inf give what the three statements give run in order (numpy,
    float64): the row's maximum propagates NaN from any lane, `exp(inf - inf)` is NaN."""
    X = _inputs("softmax", (12, 37), "float32")["X"]
    X[1, 5], X[2, 36], X[3, :] = np.nan, np.inf, -np.inf
    X[4, 0] = -np.inf  # one element: weight 0
    found = np.asarray(jax.jit(_program("softmax"))(X), np.float64)
    wide = X.astype(np.float64)
    with np.errstate(invalid="ignore"):
        M = wide.max(1, keepdims=True)
        expected = np.exp(wide - M) / np.exp(wide - M).sum(1, keepdims=True)
    np.testing.assert_allclose(found, expected, atol=2e-6, equal_nan=True)
    assert np.isnan(found[1:4]).all() and not np.isnan(found[[0, 4]]).any()
