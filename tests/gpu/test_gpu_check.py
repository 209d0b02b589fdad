"""`python -m benchmarks.gpu_check --emulate` runs every phase on the CPU and writes its files,
so that the command a GPU visit starts with cannot rot between visits."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from benchmarks import gpu_check
from benchmarks.gpu_check import cases as gpu_check_cases
from benchmarks.gpu_check import phases as gpu_check_phases
from benchmarks.gpu_check import sweep as gpu_check_sweep
from codegen.cuda.emulator import emulate

ROOT = pathlib.Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(not emulate.available(), reason="no CUDA emulator here")


def _run(out: pathlib.Path, *extra: str, timeout: float = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--out", str(out), *extra]
    return subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def _expected_rows() -> set[tuple[str, str, str]]:
    """(phase, case, mode) of every row the quick emulated run must write."""
    corpus = {
        ("corpus", f"{n} forward {d}", "")
        for n in gpu_check_phases.QUICK_CORPUS
        for d in ("float32", "float64")
    }
    corpus |= {("corpus", "matmul grad A", ""), ("corpus", "matmul grad B", "")}
    corpus |= {("corpus", "logsumexp_rows grad X", "")}
    corpus.add(("corpus", gpu_check_phases.LARGE_LABEL, ""))
    timings = {("timings", c.name, c.modes[0]) for c in gpu_check_cases.CASES}
    sweep = {
        ("sweep", f"{c.name} {gpu_check_sweep._shape_text(c.toy_shapes)}", "float32")
        for c in gpu_check_sweep.CASES[:2]
    }
    tests = {
        ("tests", "tests/gpu (JAX FFI)", ""),
        ("tests", "test_cuda_backend (CuPy callback)", ""),
    }
    return {("machine", "machine", ""), *tests, *corpus, *timings, *sweep}


def test_emulated_check_writes_a_row_per_phase_and_case(tmp_path: pathlib.Path) -> None:
    done = _run(tmp_path, "--emulate", "--quick")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert [p["phase"] for p in results["phases"]] == list(gpu_check.PHASES)
    assert all(p["status"] == "ok" for p in results["phases"]), results["phases"]
    rows = {(r["phase"], r["case"], r.get("mode", "")) for r in results["rows"]}
    assert _expected_rows() <= rows, _expected_rows() - rows
    measured = [r for r in results["rows"] if r["phase"] == "timings" and r["status"] == "ok"]
    assert {r["impl"] for r in measured} >= {gpu_check_cases.OURS, "jnp"}
    assert all(r["ms"] > 0 for r in measured)
    table = (tmp_path / "RESULTS-GPU.md").read_text()
    assert done.stdout.strip().endswith(table.strip()[-200:])  # printed too
    lines = table.splitlines()
    for phase, case, mode in _expected_rows():
        found = [x for x in lines if x.startswith(f"| {case} |") and f"| {mode} |" in x]
        assert found or (not mode and f"| {case} |" in table), (phase, case, mode)
    for phase in gpu_check.PHASES:
        assert f"## {phase}" in table


def test_a_phase_past_its_limit_is_recorded_and_the_others_still_run(
    tmp_path: pathlib.Path,
) -> None:
    # A limit of about 2 ms stops both phases while they import; each says so.
    done = _run(tmp_path, "--emulate", "--phases", "machine,corpus", "--time-scale", "1e-5")
    assert done.returncode == 1
    results = json.loads((tmp_path / "results.json").read_text())
    assert [(p["phase"], p["status"]) for p in results["phases"]] == [
        ("machine", "timeout"),
        ("corpus", "timeout"),
    ]
    assert "| machine | timeout |" in (tmp_path / "RESULTS-GPU.md").read_text()


def test_peaks_by_device_name() -> None:
    assert gpu_check.peaks_for("NVIDIA H200")["bandwidth"] == 4.8e12
    assert gpu_check.peaks_for("NVIDIA H100 PCIe")["bandwidth"] == 2.0e12
    assert gpu_check.peaks_for("NVIDIA H100 80GB HBM3")["bfloat16"] == 989e12
    assert gpu_check.peaks_for("TFRT_CPU_0") == {}


def test_unknown_phase_is_refused(tmp_path: pathlib.Path) -> None:
    done = _run(tmp_path, "--phases", "machine,bogus", timeout=60)
    assert done.returncode == 2
    assert "unknown phases ['bogus']" in done.stderr


def test_it_runs_from_the_checkout_without_pythonpath(tmp_path: pathlib.Path) -> None:
    # As after `pip install --no-deps --no-build-isolation -e .`: nothing on PYTHONPATH.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [sys.executable, "-m", "benchmarks.gpu_check", "--out", str(tmp_path)]
    done = subprocess.run(
        [*command, "--emulate", "--phases", "machine"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    machine = json.loads((tmp_path / "results.json").read_text())["machine"]
    assert machine["emulated"] is True and machine["jax"]
