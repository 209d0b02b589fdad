"""Tiered builds (issue 37): a kernel missing from the disk cache answers its first calls
from an unoptimised build while the optimised one is made in the background, then the
optimised one takes over between two calls (codegen/c/run/tiers.py, codegen/c/run/build.py)."""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen import config
from codegen.c.run import build, tiers
from codegen.c.run.compiler import BACKGROUND_NICENESS, STATS
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.backends import NEEDS_C_COMPILER

pytestmark = [NEEDS_C_COMPILER, pytest.mark.usefixtures("poisoned_outputs")]

SOURCE = "D[i,j] := (W[k,i] - X[k,j])^2"
DTYPES = {"W": "float64", "X": "float64", "D": "float64"}


@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """A fresh disk cache and no kernel in memory, in tiered mode; waits for the background
    builds before the test's folder goes."""
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TENSORDSL_BUILD", "tiered")
    monkeypatch.delenv("TENSORDSL_BUILD_JOBS", raising=False)
    build.clear_memory_cache()
    yield tmp_path
    build.wait_for_optimised()
    build.clear_memory_cache()


def _nest():
    return lower(parse(SOURCE)).nest


def _inputs():
    rng = np.random.default_rng(7)
    return rng.standard_normal((5, 13)), rng.standard_normal((5, 11))


def _run(compiled, W, X):
    out = np.full((13, 11), np.nan)
    compiled(out, [W, X], {})
    return out


def _expected(W, X):
    return ((W[:, :, None] - X[:, None, :]) ** 2).sum(0)


def _address(function) -> int:
    return ctypes.cast(function, ctypes.c_void_p).value


@pytest.mark.parametrize("value", ["", "tiered", "fast", "full", " Full "])
def test_the_setting_takes_the_three_modes(monkeypatch, value):
    monkeypatch.setenv("TENSORDSL_BUILD", value)
    assert config.build_mode() == (value.strip().lower() or "tiered")


def test_another_setting_is_refused_with_the_modes(monkeypatch):
    monkeypatch.setenv("TENSORDSL_BUILD", "quick")
    with pytest.raises(config.SettingError, match=r"TENSORDSL_BUILD='quick' is not a build mode"):
        config.build_mode()


@pytest.mark.parametrize(("value", "hint"), [("O3", None), ("Fulll", "did you mean 'full'?")])
def test_a_kernel_call_refuses_another_setting_as_the_users_error(monkeypatch, value, hint):
    """A call (eager or jitted) checks the setting before it builds anything: the error is a
    `tensordsl.SettingError` (a `TensorDSLError` and a `ValueError`) in STYLE.md's format,
    the value as written, never the compiler's own `SettingError` from a build thread."""
    monkeypatch.setenv("TENSORDSL_BUILD", value)
    kernel = td.kernel("Y[i] := exp(X[i,j]) * W[j]")
    X, W = np.random.default_rng(3).normal(size=(3, 4)), np.random.default_rng(4).normal(size=4)
    for call in (kernel, jax.jit(kernel)):
        with pytest.raises(td.SettingError) as error:
            call(X, W)
        assert isinstance(error.value, td.TensorDSLError) and isinstance(error.value, ValueError)
        lines = str(error.value).splitlines()
        assert lines[0] == f"TENSORDSL_BUILD={value!r} is not a build mode"
        assert lines[1] == "expected one of tiered, fast, full (the default is tiered)"
        assert lines[2:] == ([f"hint: {hint}"] if hint else [])


def test_a_first_build_is_fast_and_the_optimised_one_takes_over(empty_cache):
    W, X = _inputs()
    compiled = build.build_c(_nest(), dtypes=DTYPES)
    assert compiled.entry == tiers.call_name(compiled.entry.removesuffix(tiers.CALL_SUFFIX))
    np.testing.assert_allclose(_run(compiled, W, X), _expected(W, X), rtol=1e-12)
    build.wait_for_optimised()
    optimised = build.build_c(_nest(), dtypes=DTYPES, mode="full")
    assert not optimised.entry.endswith(tiers.CALL_SUFFIX)
    assert optimised.library != compiled.library
    assert tiers.slot_target(compiled.library, compiled.entry) == _address(optimised.function)
    # The same kernel object now runs the optimised code, with the same results.
    np.testing.assert_allclose(_run(compiled, W, X), _expected(W, X), rtol=1e-12)


def test_a_warm_cache_loads_the_optimised_build_at_once(empty_cache):
    build.build_c(_nest(), dtypes=DTYPES)
    build.wait_for_optimised()
    build.clear_memory_cache()
    compiles = STATS["compiles"]
    again = build.build_c(_nest(), dtypes=DTYPES)
    assert not again.entry.endswith(tiers.CALL_SUFFIX)
    assert STATS["compiles"] == compiles
    W, X = _inputs()
    np.testing.assert_allclose(_run(again, W, X), _expected(W, X), rtol=1e-12)


def test_a_fast_only_build_keeps_its_own_code(empty_cache, monkeypatch):
    monkeypatch.setenv("TENSORDSL_BUILD", "fast")
    compiled = build.build_c(_nest(), dtypes=DTYPES)
    build.wait_for_optimised()
    assert tiers.slot_target(compiled.library, compiled.entry) != 0
    W, X = _inputs()
    np.testing.assert_allclose(_run(compiled, W, X), _expected(W, X), rtol=1e-12)
    base = compiled.entry.removesuffix(tiers.CALL_SUFFIX)
    own = ctypes.CDLL(str(compiled.library))[base]
    assert tiers.slot_target(compiled.library, compiled.entry) == _address(own)


@pytest.mark.parametrize(("mode", "jobs"), [("full", None), ("tiered", "0")])
def test_full_builds_and_no_background_threads_build_optimised_at_once(
    empty_cache, monkeypatch, mode, jobs
):
    monkeypatch.setenv("TENSORDSL_BUILD", mode)
    if jobs is not None:
        monkeypatch.setenv("TENSORDSL_BUILD_JOBS", jobs)
    compiled = build.build_c(_nest(), dtypes=DTYPES)
    assert not compiled.entry.endswith(tiers.CALL_SUFFIX)


def test_a_jitted_call_gives_the_same_numbers_before_and_after_the_take_over(empty_cache):
    kernel = td.kernel(SOURCE)
    W, X = _inputs()

    def loss(W, X):
        return jnp.sum(kernel(W, X) * jnp.arange(11.0))

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    first = step(W, X)
    assert any("tdsl_slot_" in path.read_text() for path in empty_cache.glob("c/*/*.c"))
    build.wait_for_optimised()
    second = step(W, X)
    ref = jax.value_and_grad(
        lambda W, X: jnp.sum(((W[:, :, None] - X[:, None, :]) ** 2).sum(0) * jnp.arange(11.0)),
        argnums=(0, 1),
    )(W, X)
    for got in (first, second):
        np.testing.assert_allclose(got[0], ref[0], rtol=1e-12)
        for g, r in zip(got[1], ref[1]):
            np.testing.assert_allclose(g, r, rtol=1e-10)


def test_build_ahead_of_time_builds_optimised_kernels(empty_cache):
    kernel = td.kernel(SOURCE)
    kernel.build({"W": (5, 13), "X": (5, 11)}, dtype="float64")
    sources = [path.read_text() for path in empty_cache.glob("c/*/*.c")]
    assert len(sources) == 3  # the forward nest and the gradients of W and X
    assert not any("tdsl_slot_" in text for text in sources)
    compiles = STATS["compiles"]
    build.clear_memory_cache()
    W, X = _inputs()
    # Every kernel the call and its gradient need is on disk, optimised: nothing compiles.
    jax.jit(jax.grad(lambda W, X: kernel(W, X).sum(), argnums=(0, 1)))(W, X)
    assert STATS["compiles"] == compiles


@pytest.mark.skipif(shutil.which("nice") is None, reason="no `nice` command here")
def test_the_optimised_build_compiles_at_the_lowest_priority(empty_cache, monkeypatch):
    # A compiler that notes its niceness: the first build's runs at the process's, so that a
    # first call waits no longer; the background build's at the lowest, using idle cores.
    log = empty_cache / "compiles.log"
    script = empty_cache / "noting-cc"
    script.write_text(f'#!/bin/sh\necho "$(nice) $*" >> {log}\nexec cc "$@"\n')
    script.chmod(0o755)
    monkeypatch.setenv("TENSORDSL_CC", str(script))
    W, X = _inputs()
    compiled = build.build_c(_nest(), dtypes=DTYPES)
    own_entry = _address(
        ctypes.CDLL(str(compiled.library))[compiled.entry.removesuffix(tiers.CALL_SUFFIX)]
    )
    deadline = time.monotonic() + 120
    # Not `wait_for_optimised`: a build it finds still queued it makes itself, waited for.
    while tiers.slot_target(compiled.library, compiled.entry) == own_entry:
        assert time.monotonic() < deadline, "the optimised build never took over"
        time.sleep(0.05)
    np.testing.assert_allclose(_run(compiled, W, X), _expected(W, X), rtol=1e-12)
    kernels = [line.split() for line in log.read_text().splitlines() if ".so.tmp" in line]
    niceness = {words[1]: int(words[0]) for words in kernels}  # by level: -O0, -O3
    own = os.nice(0)
    assert niceness == {tiers.FAST_LEVEL: own, "-O3": max(own, BACKGROUND_NICENESS)}


def test_waiting_for_a_still_queued_optimised_build_also_switches_its_slot(empty_cache):
    # Every background worker busy: the optimised build is still queued when it is waited
    # for, so `wait_for_optimised` makes it itself, and must hand it to the fast build's slot.
    release = threading.Event()
    for n in range(16):
        build._OPTIMISED.start(("busy", n), release.wait, workers=2)
    try:
        compiled = build.build_c(_nest(), dtypes=DTYPES)
        base = compiled.entry.removesuffix(tiers.CALL_SUFFIX)
        own_entry = _address(ctypes.CDLL(str(compiled.library))[base])
        build.wait_for_optimised()
        assert tiers.slot_target(compiled.library, compiled.entry) != own_entry
        W, X = _inputs()
        np.testing.assert_allclose(_run(compiled, W, X), _expected(W, X), rtol=1e-12)
    finally:
        release.set()
