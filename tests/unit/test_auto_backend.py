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
