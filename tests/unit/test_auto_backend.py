"""`backend="auto"` as data: on a GPU, the back end the tuning table prefers for a nest's
kind (codegen/tiles/tuning.py), today's choice where no row says; checked on the CPU with the
machine and the table monkeypatched (nothing runs on the chosen back end here)."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from codegen.tiles import tuning
from tensordsl.backends import table
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

MATMUL = lower(parse("C[i,j] := A[i,k] * B[k,j]")).nest
ROW_LSE = lower(parse("(logsumexp) L[i] := X[i,j]")).nest
DOT = tuning.TuningKey("dot", "float32", 64, "none")


def operands(*shapes, dtype="float32"):
    rng = np.random.default_rng(0)
    return [rng.normal(size=s).astype(dtype) for s in shapes]


@pytest.fixture
def gpu(monkeypatch):
    """A machine with a GPU and CuPy, and a tuning table of the test's own rows."""
    rows: dict = {}
    monkeypatch.setattr(table, "_on_gpu", lambda: True)
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "cupy" else real(name, *a)
    )
    monkeypatch.setattr(tuning, "table", lambda: rows)
    return rows


def _prefer(key: tuning.TuningKey, backend: str | None) -> tuning.TuningRow:
    return tuning.TuningRow(
        key, **tuning.DEFAULTS[key.kind], backend=backend, source="default: a test row"
    )


def test_without_a_row_auto_keeps_todays_choice(gpu):
    assert table.resolve_backend("auto", MATMUL, operands((50, 64), (64, 40))) == "cuda"
    assert table.resolve_backend("auto") == "cuda"


def test_a_row_preferring_pallas_sends_its_kind_to_pallas(gpu):
    gpu[DOT] = _prefer(DOT, "pallas")
    assert table.resolve_backend("auto", MATMUL, operands((50, 64), (64, 40))) == "pallas"
    assert table.backend("auto", MATMUL, operands((50, 64), (64, 40))).name == "pallas"
    # Another key (a longer reduced extent, another dtype, another kind): no row, cuda.
    assert table.resolve_backend("auto", MATMUL, operands((50, 300), (300, 40))) == "cuda"
    bf16 = operands((50, 64), (64, 40), dtype="float16")
    assert table.resolve_backend("auto", MATMUL, bf16) == "cuda"
    assert table.resolve_backend("auto", ROW_LSE, operands((8, 64))) == "cuda"


def test_a_row_preferring_cuda_or_nothing_keeps_cuda(gpu):
    for preferred in ("cuda", None):
        gpu[DOT] = _prefer(DOT, preferred)
        assert table.resolve_backend("auto", MATMUL, operands((50, 64), (64, 40))) == "cuda"


def test_a_named_back_end_is_never_changed(gpu):
    gpu[DOT] = _prefer(DOT, "pallas")
    for name in ("c", "cuda", "reference"):
        assert table.resolve_backend(name, MATMUL, operands((50, 64), (64, 40))) == name


def test_on_the_cpu_auto_is_c_whatever_the_table_says(monkeypatch):
    monkeypatch.setattr(table, "_on_gpu", lambda: False)
    monkeypatch.setattr(tuning, "table", lambda: {DOT: _prefer(DOT, "pallas")})
    assert table.resolve_backend("auto", MATMUL, operands((50, 64), (64, 40))) == "c"


def test_the_kernel_call_asks_with_its_nest_and_operands(gpu, monkeypatch):
    """td.kernel's call resolves "auto" for its forward nest (its gradients follow it)."""
    import tensordsl as td

    asked = []

    def resolve(name, nest=None, values=()):
        asked.append((name, nest, [tuple(v.shape) for v in values]))
        return "reference"

    monkeypatch.setattr(table, "resolve_backend", resolve)
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]")
    a, b = operands((5, 4), (4, 3))
    np.testing.assert_allclose(np.asarray(k(a, b)), a.astype(np.float64) @ b, rtol=1e-5)
    assert ("auto", k.nest, [(5, 4), (4, 3)]) in asked


PROGRAM = "C[i,j] := A[i,k] * B[k,j]\nD[i,j] := tanh(C[i,j])"


def _program_backend(monkeypatch) -> list[str]:
    """The back ends a program's calls run on (the program run by the reference back end)."""
    import tensordsl.program_kernel as program_kernel

    taken = []
    real = program_kernel.run_program

    def run(program, values, *, backend, **options):
        taken.append(backend)
        return real(program, values, backend="reference", **options)

    monkeypatch.setattr(program_kernel, "run_program", run)
    return taken


def test_a_program_on_a_gpu_takes_pallas_where_the_table_prefers_it(gpu, monkeypatch):
    """td.program resolves "auto" per call for the nests the call runs (fused for its
    shapes): pallas where the table prefers pallas for one of them and cuda for none."""
    import tensordsl as td

    taken = _program_backend(monkeypatch)
    p = td.program(PROGRAM, outputs="D")
    a, b = operands((50, 64), (64, 40))
    want = np.tanh(a.astype(np.float64) @ b)
    (out,) = p(a, b)
    np.testing.assert_allclose(np.asarray(out), want, rtol=1e-5, atol=1e-5)
    assert taken == ["cuda"]  # no row: today's choice
    gpu[DOT] = _prefer(DOT, "pallas")
    p(a, b)
    assert taken[-1] == "pallas"
    text = p.explain({"A": (50, 64), "B": (64, 40)})
    assert "(auto took pallas: on a GPU the tuning table prefers pallas for" in text
    p(*operands((50, 300), (300, 40)))  # another reduced extent: no row
    assert taken[-1] == "cuda"
    gpu[DOT] = _prefer(DOT, "cuda")
    p(a, b)
    assert taken[-1] == "cuda"
    text = p.explain({"A": (50, 64), "B": (64, 40)})
    assert "(auto took cuda: on a GPU the tuning table prefers cuda for" in text


def test_explain_says_what_auto_took_on_the_cpu(monkeypatch):
    import tensordsl as td

    monkeypatch.setattr(table, "_on_gpu", lambda: False)
    monkeypatch.setattr(tuning, "table", lambda: {DOT: _prefer(DOT, "pallas")})
    taken = _program_backend(monkeypatch)
    p = td.program(PROGRAM, outputs="D")
    p(*operands((50, 64), (64, 40)))
    assert taken == ["c"]
    text = p.explain({"A": (50, 64), "B": (64, 40)})
    assert "on the c back end (auto), each scheduled" in text
    assert "(auto took c: no GPU (jax runs on cpu))" in text
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]")
    assert "(auto took c: no GPU (jax runs on cpu))" in k.explain()
