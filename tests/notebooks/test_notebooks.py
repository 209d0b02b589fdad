"""The notebooks: each .ipynb matches its .py twin, and every twin runs from start to end.

A twin runs in a fresh Python process (as a notebook kernel would), in a temporary folder
(where it saves its figures), with matplotlib's non-interactive Agg back end; afterwards the
process writes some of the notebook's variables to JSON for the assertions here.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"

pytest.importorskip("nbformat", reason="the notebook tests need nbformat (the test extra)")
pytest.importorskip("matplotlib", reason="the notebook tests need matplotlib (the test extra)")

DRIVER = """
import json, runpy, sys
names = runpy.run_path(sys.argv[1], run_name="__main__")
wanted = {name: names[name] for name in sys.argv[3:]}
with open(sys.argv[2], "w") as f:
    json.dump(wanted, f)
"""


def _sync():
    spec = importlib.util.spec_from_file_location("notebook_sync", NOTEBOOKS / "sync.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(twin: str, tmp_path: pathlib.Path, *names: str, **settings: str) -> tuple[dict, str]:
    """Run notebooks/<twin> in a fresh process (`settings` added to its environment); return
    the named variables and its stdout."""
    env = dict(os.environ, MPLBACKEND="Agg", **settings)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    out = tmp_path / "variables.json"
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, str(NOTEBOOKS / twin), str(out), *names],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text()), done.stdout


def _is_png(path: pathlib.Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


TWINS = ["01_quickstart.py", "02_layers.py", "03_performance.py", "04_gpt.py"]


def test_four_notebooks_each_with_a_twin():
    assert [t.name for t in _sync().twins()] == TWINS


@pytest.mark.parametrize("twin", TWINS)
def test_ipynb_matches_its_twin(twin):
    sync = _sync()
    path = NOTEBOOKS / twin
    notebook = path.with_suffix(".ipynb")
    assert notebook.is_file(), f"{notebook.name} missing: run python notebooks/sync.py"
    assert notebook.read_text() == sync.notebook(path), "stale: run python notebooks/sync.py"
    code = "\n".join(source for kind, source in sync.cells(path.read_text()) if kind == "code")
    assert "import tensordsl" in code


def test_sync_cells_split_markdown_and_code():
    cells = _sync().cells("'''doc'''\n# %% [markdown]\n# # Title\n#\n# text\n\n# %%\nx = 1\n")
    assert cells == [("markdown", "# Title\n\ntext"), ("code", "x = 1")]


def test_quickstart_checks_every_gradient(tmp_path):
    variables, stdout = _run("01_quickstart.py", tmp_path, "gradient_errors")
    errors = variables["gradient_errors"]
    assert sorted(errors) == [
        "conv1d: dW",
        "conv1d: dX",
        "distances: dW",
        "distances: dX",
        "matmul: dA",
        "matmul: dB",
    ]
    assert max(errors.values()) < 1e-10
    assert "dX[c, p] = sum_o,k dY[o, p - k]*W[o, c, k]" in stdout


def test_layers_notebook_trains_the_model(tmp_path):
    variables, stdout = _run("02_layers.py", tmp_path, "losses", "accuracy")
    losses = variables["losses"]
    assert len(losses) >= 50
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.5 * first, (first, last)
    assert variables["accuracy"] > 0.9
    assert _is_png(tmp_path / "02_layers_loss.png")
    assert stdout.count("gradient of ") >= 4


def test_performance_notebook_reads_the_benchmark_results(tmp_path):
    results = json.loads((ROOT / "benchmarks" / "results" / "cpu.json").read_text())
    variables, stdout = _run("03_performance.py", tmp_path, "cases", "machine")
    assert variables["cases"] == [row["case"] for row in results["rows"]]
    assert variables["machine"] == results["machine"]
    first = results["rows"][0]["impls"]["tensordsl C"]["fwd"]["median_s"] * 1e3
    assert f"{first:.2f}" in stdout
    assert f"measured {results['machine']['date']} on {results['machine']['model']}" in stdout
    assert _is_png(tmp_path / "03_performance.png")


def test_gpt_notebook_trains_the_decoder_beside_jax_numpy(tmp_path):
    pytest.importorskip("optax", reason="notebook 04 trains with optax (the test extra)")
    names = ("losses_td", "losses_jnp", "gradient_error", "text_sample", "VOCAB")
    variables, stdout = _run("04_gpt.py", tmp_path, *names, TENSORDSL_NOTEBOOK_STEPS="40")
    ours, theirs = variables["losses_td"], variables["losses_jnp"]
    assert len(ours) == len(theirs) == 40
    assert abs(ours[0] - theirs[0]) < 1e-4  # the same function, the same first batch
    assert variables["gradient_error"] < 1e-4
    assert sum(ours[-5:]) / 5 < 0.85 * sum(ours[:5]) / 5  # it learns
    assert max(abs(a - b) for a, b in zip(ours, theirs)) < 0.02  # and like jax.numpy
    assert len(variables["text_sample"]) == len("The ") + 160
    assert _is_png(tmp_path / "04_gpt_loss.png")
    assert f"vocabulary of {variables['VOCAB']}" in stdout
