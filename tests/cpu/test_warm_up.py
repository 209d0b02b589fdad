"""`k.build(shapes)` builds what a first `jit(value_and_grad)` needs, and says so on stderr."""

from __future__ import annotations

import time

import jax
import numpy as np

import tensordsl as td
from codegen.c.run import build
from codegen.progress import BUILDS


def test_build_makes_the_first_jit_value_and_grad_compile_nothing(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TENSORDSL_PROGRESS_AFTER", "0")  # a tiny threshold: no slow build needed
    monkeypatch.setenv("TENSORDSL_BUILD", "full")  # build() makes optimised builds; not fast
    k = td.kernel("D[i,j] := (W[k,i] - X[k,j])^2 * s", backend="c")
    rng = np.random.default_rng(5)
    W, X = rng.normal(size=(4, 6)), rng.normal(size=(4, 7))
    k.build({"W": W, "X": X, "s": ()}, dtype="float64")
    err = capsys.readouterr().err
    assert "tensordsl: building " in err
    built = int(err.split("tensordsl: built ")[1].split()[0])
    assert built >= 3  # the forward nest, the gradient nests of W, X and s

    def no_compiler(*args, **kwargs):
        raise AssertionError("a nest that build() had built was compiled again")

    monkeypatch.setattr(build, "compile_c", no_compiler)
    monkeypatch.setattr(build, "_build", no_compiler)
    loss = jax.jit(jax.value_and_grad(lambda W, X, s: k(W, X, s).sum(), (0, 1, 2)))
    value, (gW, gX, gs) = loss(W, X, 1.5)
    diff = W[:, :, None] - X[:, None, :]
    np.testing.assert_allclose(float(value), 1.5 * (diff**2).sum(), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gW), 1.5 * 2 * diff.sum(2), rtol=1e-12)
    np.testing.assert_allclose(np.asarray(gX), -1.5 * 2 * diff.sum(1), rtol=1e-12)
    np.testing.assert_allclose(float(gs), (diff**2).sum(), rtol=1e-12)
    assert capsys.readouterr().err == ""  # nothing built: no progress line


def test_a_cold_first_call_reports_its_builds_on_stderr(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TENSORDSL_PROGRESS_AFTER", "0")
    k = td.kernel("Y[i] := abs(X[i,j] - c)", backend="c")
    X = np.random.default_rng(6).normal(size=(5, 9))
    gX = jax.jit(jax.grad(lambda X: k(X, 0.25).sum()))(X)
    np.testing.assert_allclose(np.asarray(gX), np.sign(X - 0.25), rtol=1e-12)
    # The forward nest is prefetched, but jit drops the forward (the gradient of a sum does
    # not read it): its build may end after the call returns, and so does the round's line.
    deadline = time.monotonic() + 60
    while BUILDS.pending and time.monotonic() < deadline:
        time.sleep(0.05)
    err = capsys.readouterr().err
    assert "tensordsl: building " in err and "tensordsl: built " in err
