"""Smoke tests of the layer-level benchmark scripts at tiny sizes: they check results before
timing, print their tables and write their own RESULTS.md section (no timing assertions)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from benchmarks import attention, gaussian, gpt_block, gpt_model, natural, scores_beside
from benchmarks.common import markers, write_section
from tests.backends import NEEDS_C_COMPILER

pytestmark = NEEDS_C_COMPILER
NUMBER = r"\d+\.\d\d"


def _section(path, name: str) -> str:
    text = path.read_text()
    begin, end = markers(name)
    assert text.count(begin) == 1 and text.count(end) == 1
    return text[text.index(begin) : text.index(end)]


@pytest.fixture
def results(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# CPU benchmarks\n\nwritten by run_cpu.py\n")
    return path


def test_gpt_block_quick_checks_times_and_writes_its_section(results):
    assert gpt_block.main(["--quick", "--no-first-calls", "--out", str(results)]) == 0
    assert results.read_text().startswith("# CPU benchmarks\n\nwritten by run_cpu.py\n")
    section = _section(results, "gpt_block")
    size = str(gpt_block.QUICK_SIZES[0])
    for impl in (gpt_block.JNP, gpt_block.OURS):
        assert re.search(rf"^\| {size} \| {impl} \| {NUMBER} \| {NUMBER} \|", section, re.M)
    assert "### Targets (issue 14)" in section


def test_gpt_model_quick_checks_times_and_writes_its_section(results):
    assert gpt_model.main(["--quick", "--out", str(results)]) == 0
    section = _section(results, "gpt_model")
    assert str(gpt_model.QUICK) in section
    for mode in gpt_model.MODES:
        assert re.search(rf"^\| {re.escape(mode)} \| {NUMBER} \| {NUMBER} \| \d", section, re.M)


def test_the_gpt_models_agree():
    """Ours and jax.numpy's decoder: the same logits and gradients on one random batch
    (independent code: jnp's attention, GELU and cross-entropy)."""
    c = gpt_model.QUICK
    params = gpt_model.init(c)
    tokens, targets = gpt_model.tokens_of(c)
    fns = gpt_model.functions(c)
    ours, theirs = (
        fns[impl][1](params, tokens, targets) for impl in (gpt_model.OURS, gpt_model.JNP)
    )
    assert gpt_model.mismatches(ours, theirs, 1e-4) == []
    assert float(ours[0]) > 0.5 * np.log(c.vocab)  # a random model: near log(vocab)


def test_gpt_block_check_reports_wrong_values_and_failures_instead_of_times():
    x = np.linspace(1, 2, 5, dtype=np.float32)
    want = (x, (np.float32(3), x))
    right = (lambda x: x, lambda x: (np.float32(3), x))
    wrong = (lambda x: x * 1.01, lambda x: (np.float32(3), x + 1))
    assert gpt_block.check(gpt_block.OURS, right, [x], want) == {"builds": 0}
    found = gpt_block.check(gpt_block.OURS, wrong, [x], want)
    assert found["fwd"] == "error: differs from jax.numpy:  (max rel err 1.0e-02)"
    assert found["fwd+bwd"].startswith("error: differs from jax.numpy: [1] (max rel err 5.0e-01)")

    def broken(x):
        raise ValueError("no such kernel")

    found = gpt_block.check(gpt_block.OURS, (broken, broken), [x], want)
    assert found["fwd"] == found["fwd+bwd"] == "error: ValueError: no such kernel"


def test_gpt_block_first_call_child_counts_the_kernels_it_builds():
    found = gpt_block.compile_child({"impl": gpt_block.OURS, "layers": 2, "size": (1, 4, 8, 2)})
    assert found["first_s"] > 0 and found["second_s"] > 0
    assert found["compiles"] + found["disk_hits"] >= 1


def test_gaussian_quick_checks_against_float64_and_writes_its_section(results):
    assert gaussian.main(["--quick", "--out", str(results)]) == 0
    section = _section(results, "gaussian")
    for impl in (gaussian.OURS, gaussian.JNP):
        assert re.search(rf"^\| 500 \| {re.escape(impl)} \| {NUMBER} \| {NUMBER} \|", section, re.M)
    # KeOps is timed where pykeops compiles here, else the reason is in its row.
    assert re.search(rf"^\| 500 \| KeOps \(CPU\) \| ({NUMBER}|not run: .+) \|", section, re.M)


def test_gaussian_reference_is_the_kernel_it_claims():
    data = gaussian.inputs(7)
    rows = np.arange(7)
    y, dx = gaussian.reference(data, rows)
    x, z, b = (data[k].astype(np.float64) for k in ("X", "Z", "B"))
    want = [sum(np.exp(-((x[i] - z[j]) ** 2).sum()) * b[j] for j in range(7)) for i in range(7)]
    np.testing.assert_allclose(y, want, rtol=1e-12)
    step = 1e-6
    bumped = dict(data, X=data["X"].astype(np.float64))
    bumped["X"][2, 1] += step
    moved = gaussian.reference(bumped, rows)[0]
    numeric = float((moved - y) @ data["ct"].astype(np.float64)) / step
    assert dx[2, 1] == pytest.approx(numeric, rel=1e-4)


def test_attention_quick_checks_times_and_writes_its_section(results):
    assert attention.main(["--quick", "--no-memory", "--out", str(results)]) == 0
    section = _section(results, "attention")
    for impl in (attention.XLA, attention.OURS):
        assert re.search(rf"^\| {impl} \| {NUMBER} \| {NUMBER} \|", section, re.M)
    write_section(results, "attention", section + markers("attention")[1])
    assert _section(results, "attention") == section


def test_attention_memory_child_measures_one_call():
    found = attention.memory_child(attention.OURS, "fwd", attention.Shape(1, 2, 64, 8))
    assert found["peak_growth"] >= 0


def test_natural_quick_checks_times_and_writes_its_section(results):
    assert natural.main(["--quick", "--no-cold", "--out", str(results)]) == 0
    section = _section(results, "natural")
    for row in natural.ROWS:
        cells = rf"^\| {re.escape(row.name)} \| {NUMBER} \| {NUMBER} \| {NUMBER} \| {NUMBER} \|"
        assert re.search(cells, section, re.M), row.name
    assert re.search(r"^\| MLP \|.*\| H stored \|$", section, re.M)


def test_natural_cold_child_builds_in_a_fresh_cache():
    found = natural.cold("softmax", quick=True)
    assert found["cold_s"] > 0


def test_scores_beside_quick_checks_and_prints_its_table(capsys):
    assert scores_beside.main(["--quick"]) == 0
    table = capsys.readouterr().out
    for mod in scores_beside.MODS:
        for mode in scores_beside.MODES:
            row = rf"^\| {mod} \| 1, 16 \| {re.escape(mode)} \| {NUMBER} \| {NUMBER} \|"
            assert re.search(row, table, re.M)
