"""The notebooks: each .ipynb matches its .py twin and was executed (its outputs are
committed), and every twin runs from start to end.

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

nbformat = pytest.importorskip(
    "nbformat", reason="the notebook tests need nbformat (the test extra)"
)
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
def test_ipynb_matches_its_twin_and_was_executed(twin):
    sync = _sync()
    path = NOTEBOOKS / twin
    notebook = path.with_suffix(".ipynb")
    assert notebook.is_file(), f"{notebook.name} missing: run python notebooks/sync.py"
    assert sync.problems(path, notebook.read_text()) == []
    code = "\n".join(source for kind, source in sync.cells(path.read_text()) if kind == "code")
    assert "import tensordsl" in code
    cells = nbformat.reads(notebook.read_text(), as_version=4).cells
    outputs = [output for cell in cells for output in cell.get("outputs", ())]
    assert any(output.get("name") == "stdout" for output in outputs)
    assert any("image/png" in output.get("data", {}) for output in outputs) == ("plt." in code)


TINY_TWIN = '''"""A twin of four cells."""
# %% [markdown]
# # Tiny
# %%
import matplotlib.pyplot as plt
print(6 * 7)
# %%
def f():
    return 1
# %%
figure, axes = plt.subplots()
axes.plot([1, 3, 2])
'''


def test_check_finds_a_stale_cell_and_an_unexecuted_notebook(tmp_path):
    sync = _sync()
    twin = tmp_path / "01_tiny.py"
    twin.write_text(TINY_TWIN)
    unexecuted = nbformat.writes(sync.notebook(twin))
    assert sync.problems(twin, unexecuted) == [
        "cell 1 has execution count None, not 1",
        "cell 2 has execution count None, not 2",
        "cell 3 has execution count None, not 3",
        "cell 3 makes a figure but has no PNG output",
    ]
    twin.write_text(TINY_TWIN.replace("6 * 7", "6 * 9"))
    assert sync.problems(twin, unexecuted) == [
        "cell 1 differs from the twin (run python notebooks/sync.py 01_tiny)"
    ]


def test_sync_executes_a_twin_into_outputs(tmp_path):
    pytest.importorskip("nbclient", reason="executing a notebook needs nbclient (the test extra)")
    pytest.importorskip("ipykernel", reason="executing a notebook needs ipykernel (the test extra)")
    sync = _sync()
    twin = tmp_path / "01_tiny.py"
    twin.write_text(TINY_TWIN)
    notebook = sync.notebook(twin)
    sync.execute(notebook, tmp_path, timeout=120)
    assert sync.problems(twin, nbformat.writes(notebook)) == []
    printed, defined, drawn = (cell.outputs for cell in notebook.cells[1:])
    assert [(output.output_type, output.text) for output in printed] == [("stream", "42\n")]
    assert defined == []
    assert any(output.get("data", {}).get("image/png") for output in drawn)
    assert notebook.metadata == sync.metadata()


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


def test_layers_notebook_trains_the_model_beside_jax_numpy(tmp_path):
    names = ("losses", "losses_reference", "accuracy", "held_out_accuracy")
    variables, stdout = _run("02_layers.py", tmp_path, *names, TENSORDSL_NOTEBOOK_STEPS="120")
    losses, theirs = variables["losses"], variables["losses_reference"]
    assert len(losses) == len(theirs) == 120
    assert max(abs(a - b) for a, b in zip(losses, theirs)) < 1e-8
    assert all(b < a for a, b in zip(losses, losses[1:]))
    assert losses[-1] < 0.8 * losses[60] < 0.5 * losses[0]  # still learning in the second half
    assert variables["accuracy"] > 0.9 and variables["held_out_accuracy"] > 0.85
    assert _is_png(tmp_path / "02_layers_loss.png")
    assert stdout.count("gradient of ") >= 4


def test_performance_notebook_measures_against_the_idiom(tmp_path):
    # Its kernels built optimised (TENSORDSL_BUILD=full), as users' calls run them after the
    # first ones, not unoptimised as the rest of the suite builds (tests/conftest.py): the
    # notebook times them on large inputs, which unoptimised kernels ran twice as long as
    # the optimised ones took to build and run (docs/testing.md).
    names = ("timings", "footprints")
    variables, stdout = _run(
        "03_performance.py",
        tmp_path,
        *names,
        TENSORDSL_NOTEBOOK_ROUNDS="2",
        TENSORDSL_BUILD="full",
    )
    timings = variables["timings"]
    both = ["tensordsl", "jnp idiom"]
    assert list(timings) == [
        "distances, forward",
        "distances, forward + backward",
        "distances 1024², forward",
        "Gaussian sum, N=4000, forward",
    ]
    assert list(timings["distances 1024², forward"]) == [*both, "jnp broadcast"]
    keops = importlib.util.find_spec("pykeops") is not None
    assert list(timings["Gaussian sum, N=4000, forward"]) == both + ["KeOps"] * keops
    assert ("KeOps not timed" in stdout) != keops
    assert all(0 < ms < 60_000 for row in timings.values() for ms in row.values())
    for case, row in timings.items():
        for name, ms in row.items():
            assert f"{case:<36}{name:<16}{ms:10.2f}{ms / row['jnp idiom']:10.2f}" in stdout
    assert stdout.count("largest error") == 4 + keops
    footprints = variables["footprints"]
    assert footprints["distances 2048x2048, k=64"]["jnp broadcast"] == 4 * 2048 * 2048 * 65
    assert footprints["Gaussian sum, N=50000"] == {
        "tensordsl": 4 * 50_000,
        "jnp idiom": 4 * 50_000**2 + 4 * 50_000,
    }
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
