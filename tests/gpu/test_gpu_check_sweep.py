"""The sweep phase of `benchmarks.gpu_check` (benchmarks/gpu_check/sweep.py): its emulated
dry run writes rows in the tuning table's format that say they are no measurement; a GPU
run's rows say where they were measured and prefer the faster back end; `merge` takes
measured rows into a table and refuses dry-run ones."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks.gpu_check import sweep
from codegen.cuda.emulator import emulate
from codegen.tiles import tuning

ROOT = pathlib.Path(__file__).resolve().parents[2]
KEY = tuning.TuningKey("dot", "float32", 64, "none")


def _candidate() -> tuning.TuningRow:
    return sweep.candidates(KEY, quick=False)[1]


@pytest.mark.skipif(not emulate.available(), reason="no CUDA emulator here")
def test_the_emulated_sweep_writes_dry_run_rows(tmp_path: pathlib.Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--out", str(tmp_path)]
    done = subprocess.run(
        [*command, "--emulate", "--quick", "--phases", "sweep"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    rows = [r for r in results["rows"] if r["phase"] == "sweep"]
    pallas = [r for r in rows if r["impl"].startswith("pallas")]
    assert len(pallas) == 2 * sweep.QUICK_CANDIDATES and all(r["status"] == "ok" for r in pallas)
    assert all(r["ms"] > 0 for r in pallas)
    assert {r["impl"] for r in rows if not r["impl"].startswith("pallas")} == {"cuda"}
    table = tuning.parse(json.loads((tmp_path / "tuning-rows.json").read_text()))
    assert {key.mask for key in table} == {"none", "masked"}  # matmul, causal scores
    assert all(r.source == sweep.DRY_RUN and r.backend is None for r in table.values())
    assert "## sweep" in (tmp_path / "RESULTS-GPU.md").read_text()


def test_candidates_are_valid_rows_with_the_default_first() -> None:
    for kind in sweep.CANDIDATES:
        key = tuning.TuningKey(kind, "float32", 1024, "none")
        rows = sweep.candidates(key, quick=False)
        assert tuning.parse({"format": 1, "rows": [rows[0].as_json()]})  # checked
        assert [rows[0].free_tile, rows[0].reduced_tile] == [
            tuning.DEFAULTS[kind]["free_tile"],
            tuning.DEFAULTS[kind]["reduced_tile"],
        ]
        assert len(sweep.candidates(key, quick=True)) == sweep.QUICK_CANDIDATES


@pytest.mark.parametrize(
    ("pallas_ms", "cuda_ms", "faster"), [(1.0, 2.0, "pallas"), (3.0, 2.0, "cuda")]
)
def test_a_gpu_row_says_where_it_was_measured_and_prefers_the_faster(pallas_ms, cuda_ms, faster):
    found = sweep.finish_row(_candidate(), pallas_ms, cuda_ms, "NVIDIA H200", "2027-01-02", False)
    (row,) = tuning.parse({"format": 1, "rows": [found]}).values()
    assert row.measured and row.backend == faster
    assert (
        row.source
        == f"measured on NVIDIA H200, 2027-01-02: pallas {pallas_ms:.4g} ms, cuda {cuda_ms:.4g} ms"
    )
    dry = sweep.finish_row(_candidate(), pallas_ms, cuda_ms, "cpu", "2027-01-02", True)
    assert dry["source"] == sweep.DRY_RUN and dry["backend"] is None


def test_merge_takes_measured_rows_and_refuses_dry_runs(tmp_path: pathlib.Path) -> None:
    into = tmp_path / "tuning.json"
    other = tuning.TuningKey("reduce", "float32", 1024, "none")
    old = sweep.finish_row(
        sweep.candidates(other, quick=True)[0], 1.0, 2.0, "NVIDIA H100", "2027-01-01", False
    )
    into.write_text(json.dumps({"format": 1, "comment": "kept", "rows": [old]}))
    found = tmp_path / "tuning-rows.json"
    sweep.write_rows(found, [sweep.finish_row(_candidate(), 1.0, 2.0, "NVIDIA H200", "d", False)])
    assert sweep.merge(found, into) == 1
    merged = json.loads(into.read_text())
    assert merged["comment"] == "kept"
    assert set(tuning.parse(merged)) == {KEY, other}
    sweep.write_rows(found, [sweep.finish_row(_candidate(), 1.0, 2.0, "cpu", "d", True)])
    with pytest.raises(ValueError, match="no measurement"):
        sweep.merge(found, into)
