"""Build time: kernel records, canonical forms shared, background builds, gradients on disk.

Every kernel is checked against a float64 numpy reference on random inputs; outputs start
as NaN, so an element a kernel fails to write shows.
"""

from __future__ import annotations

import json
import os
import pathlib
import pickle
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

import tensordsl as td
from codegen import config
from codegen.c import schedule as cpu_schedule
from codegen.c.run import build, compiler, records
from codegen.c.run.build import build_c, clear_memory_cache
from codegen.c.run.renaming import RENAMED_FIELDS, rename_schedule, schedule_fields
from codegen.c.schedule import Schedule
from codegen.ir.nest import (
    LoopNest,
    Operand,
    Range,
    Reduce,
    Term,
    canonical,
    extent_symbol,
    index_symbol,
    tensor_base,
)
from codegen.passes import grad
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.backends import NEEDS_C_COMPILER

pytestmark = NEEDS_C_COMPILER
ROOT = pathlib.Path(__file__).resolve().parents[2]
AFFINE = "Y[i,j] := A[i,k] * B[k,j] * s + c[j] * (k == 0)"
RENAMED = "Z[p,q] := U[p,r] * V[r,q] * t + w[q] * (r == 0)"
DTYPES = {"A": "float64", "B": "float64", "s": "float64", "c": "float64", "Y": "float64"}

rng = np.random.default_rng(7)


@pytest.fixture
def cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))
    clear_memory_cache()
    return tmp_path


def nest_of(source: str):
    return lower(parse(source)).nest


def run_affine(compiled: build.CompiledNest, m: int = 5, n: int = 7, k: int = 3) -> None:
    """Call `compiled` (AFFINE or RENAMED) on random inputs and check it in float64."""
    a, b, c = rng.standard_normal((m, k)), rng.standard_normal((k, n)), rng.standard_normal(n)
    s = np.array(rng.uniform(0.5, 2.0))
    out = np.full((m, n), np.nan)
    compiled(out, [a, b, s, c], {})
    np.testing.assert_allclose(out, a @ b * s + c, rtol=1e-12, atol=1e-12)


def stats() -> dict[str, int]:
    return dict(compiler.STATS)


def grown(before: dict[str, int]) -> dict[str, int]:
    return {name: compiler.STATS[name] - before[name] for name in before}


def test_a_record_loads_the_kernel_without_emitting(cache: pathlib.Path) -> None:
    nest = nest_of(AFFINE)
    before = stats()
    run_affine(build_c(nest, dtypes=DTYPES))
    assert grown(before) == {"compiles": 1, "disk_hits": 0, "shared": 0, "emitted": 1}
    assert len(list(cache.glob("kernels/*/*.json"))) == 2  # as written and canonical
    clear_memory_cache()
    before = stats()
    run_affine(build_c(nest, dtypes=DTYPES))
    assert grown(before) == {"compiles": 0, "disk_hits": 1, "shared": 0, "emitted": 0}


def test_names_do_not_matter_one_library_serves_both(cache: pathlib.Path) -> None:
    first = build_c(nest_of(AFFINE), dtypes=DTYPES)
    before = stats()
    dtypes = {"U": "float64", "V": "float64", "t": "float64", "w": "float64", "Z": "float64"}
    second = build_c(nest_of(RENAMED), dtypes=dtypes)
    assert grown(before) == {"compiles": 0, "disk_hits": 0, "shared": 1, "emitted": 0}
    assert second.library == first.library and second.entry == first.entry
    assert second.name.startswith("tdsl_Z_forward_") and first.name.startswith("tdsl_Y_forward_")
    assert second.ffi_target != first.ffi_target
    run_affine(second, m=4, n=9, k=2)
    run_affine(first, m=3, n=1, k=6)


CHILD = (
    "import json, numpy as np, tensordsl as td\n"
    "from codegen.c.run import compiler\n"
    f"k = td.kernel({AFFINE!r}, backend='c')\n"
    "r = np.random.default_rng(3)\n"
    "a, b, c = r.standard_normal((4, 3)), r.standard_normal((3, 5)), r.standard_normal(5)\n"
    "got = np.asarray(k(a, b, 1.5, c))\n"
    "np.testing.assert_allclose(got, a @ b * 1.5 + c, rtol=1e-12)\n"
    "print(json.dumps(compiler.STATS))\n"
)


def child_stats(cache: pathlib.Path) -> dict[str, int]:
    """Call the AFFINE kernel in a fresh process on `cache`; its build counters (as a
    generated kernel: a contraction plus a bias would otherwise run as XLA's dot)."""
    env = {**os.environ, "TENSORDSL_CACHE_DIR": str(cache), "JAX_ENABLE_X64": "1"}
    env["TENSORDSL_XLA_CONTRACTIONS"] = "0"
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_a_warm_process_emits_nothing(cache: pathlib.Path) -> None:
    cold = child_stats(cache)
    assert cold["emitted"] == cold["compiles"] == 1
    assert child_stats(cache) == {"compiles": 0, "disk_hits": 1, "shared": 0, "emitted": 0}


def test_damaged_records_and_libraries_are_rebuilt(cache: pathlib.Path) -> None:
    nest = nest_of(AFFINE)
    library = build_c(nest, dtypes=DTYPES).library
    for record in cache.glob("kernels/*/*.json"):
        record.write_text('{"entry": 1')
    clear_memory_cache()
    run_affine(build_c(nest, dtypes=DTYPES))
    for record in cache.glob("kernels/*/*.json"):
        assert records.KernelRecord.from_json(record.read_bytes()).library == str(library)
    assert child_stats(cache)["compiles"] == 0
    # A new file in its place (this process keeps its loaded copy): the next process rebuilds.
    for old in cache.glob("c/*/*.so"):
        damaged = old.with_suffix(".damaged")
        damaged.write_bytes(b"not a shared object")
        os.replace(damaged, old)
    assert child_stats(cache)["compiles"] == 1
    assert child_stats(cache)["compiles"] == 0


def test_gradients_are_derived_once_and_read_back(
    cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nest = nest_of("Y[i] := X[i+k] * W[k] + exp(X[i])")
    first = grad.gradient(nest, "X")
    grad.gradient.cache_clear()

    def refuse(*_: object) -> None:
        raise AssertionError("derived again")

    with monkeypatch.context() as patched:
        patched.setattr(grad, "_derive_gradient", refuse)
        assert grad.gradient(nest, "X") == first  # read back from the disk
    grad.gradient.cache_clear()
    (entry,) = cache.glob("memo/gradient/*/*.pickle")
    entry.write_bytes(b"damaged")
    assert grad.gradient(nest, "X") == first  # derived again, and stored again
    assert pickle.loads(entry.read_bytes()) == first
    grad.gradient.cache_clear()


def test_schedules_are_chosen_once_and_read_back(
    cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nest = nest_of("Y[i,j] := X[i,k] * exp(W[k,j])")
    dtypes = {"X": "float32", "W": "float32", "Y": "float32"}
    first = cpu_schedule.choose_cpu_schedule(nest, dtypes)
    other = cpu_schedule.choose_cpu_schedule(nest, {**dtypes, "Y": "float64"}, kernel=True)
    cpu_schedule._kept_choice.cache_clear()

    def refuse(*_: object) -> None:
        raise AssertionError("chosen again")

    with monkeypatch.context() as patched:
        patched.setattr(cpu_schedule, "_choose", refuse)
        assert cpu_schedule.choose_cpu_schedule(nest, dtypes) == first  # read back
        assert (
            cpu_schedule.choose_cpu_schedule(nest, {**dtypes, "Y": "float64"}, kernel=True) == other
        )
    cpu_schedule._kept_choice.cache_clear()
    for entry in cache.glob("memo/cpu_schedule/*/*.pickle"):
        entry.write_bytes(b"damaged")
    assert cpu_schedule.choose_cpu_schedule(nest, dtypes) == first  # chosen again, stored again
    # The one setting the rules read keys its own entries.
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    with monkeypatch.context() as patched:
        patched.setattr(cpu_schedule, "_choose", refuse)
        with pytest.raises(AssertionError, match="chosen again"):
            cpu_schedule.choose_cpu_schedule(nest, dtypes)
    cpu_schedule._kept_choice.cache_clear()


def test_kernels_start_building_while_a_function_is_traced(
    cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    x = rng.standard_normal((6, 6))
    monkeypatch.setenv("TENSORDSL_BUILD_JOBS", "0")
    before = stats()
    jax.jit(td.kernel("Y[i,j] := sin(X[i,j]) * X[j,i]", backend="c")).trace(x)
    time.sleep(0.5)
    assert grown(before)["compiles"] == 0
    # (JAX caches abstract evaluations: a nest traced before starts no build when traced again.)
    monkeypatch.setenv("TENSORDSL_BUILD_JOBS", "2")
    k = td.kernel("Y[i,j] := tanh(X[i,j]) * X[j,i]", backend="c")
    traced = jax.jit(jax.grad(lambda x: (k(x) ** 2).sum())).trace(x)  # not lowered
    deadline = time.monotonic() + 120
    while grown(before)["compiles"] < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert grown(before)["compiles"] == 2  # the forward and the gradient of X
    got = traced.lower().compile()(x)
    expected = 2 * (np.tanh(x) * x.T) * (1 - np.tanh(x) ** 2) * x.T
    expected += (2 * (np.tanh(x) * x.T) * np.tanh(x)).T
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-10, atol=1e-12)
    assert grown(before)["compiles"] == 2


def test_keys_do_not_depend_on_the_hash_seed() -> None:
    script = (
        "from codegen.cache import memo\n"
        "from codegen.passes.grad import gradient\n"
        "from tensordsl.frontend.lower import lower\n"
        "from tensordsl.frontend.parse import parse\n"
        "n = lower(parse('Y[i] := where(j <= i, exp(S[i,j] - L[i]), 0) * V[j]')).nest\n"
        "print(memo.digest_of(n, gradient(n, 'S').nest))\n"
    )
    digests = set()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "TENSORDSL_CACHE_DIR": "/nonexistent"}
        done = subprocess.run(
            [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        digests.add(done.stdout.strip())
    assert len(digests) == 1


def test_canonical_forms_that_would_merge_two_nests_are_not_used(cache: pathlib.Path) -> None:
    a, i0, q = index_symbol("a"), index_symbol("i0"), tensor_base("Q")
    # A nested sum over an index named i0: renaming the free index `a` to i0 would capture it.
    body = Reduce("sum", q[a, i0], i0, 0, extent_symbol("Q", 1))
    nest = LoopNest("Y", (Range(a, 0, extent_symbol("Q", 0)),), (Term(body),), (Operand("Q", 2),))
    dtypes = {"Q": "float64", "Y": "float64"}
    assert records.canonical_form(nest, dtypes, Schedule(("a",), ((),))) is None
    values = rng.standard_normal((5, 4))
    out = np.full(5, np.nan)
    build_c(nest, dtypes=dtypes)(out, [values], {})  # built under its own names
    np.testing.assert_allclose(out, values.sum(1), rtol=1e-12)
    j = index_symbol("j")
    plain = LoopNest(
        "Y", nest.free, (Term(Reduce("sum", q[a, j], j, 0, extent_symbol("Q", 1))),), nest.operands
    )
    assert records.canonical_form(plain, dtypes, Schedule(("a",), ((),))) is not None


def test_canonical_renames_a_free_index_that_no_expression_uses() -> None:
    nest = grad.gradient(nest_of("M[b] := X[b,f] / F"), "X").nest  # dX[b, f] = dM[b] / F
    assert [s.name for s in canonical(nest).free_indices] == ["i0", "i1"]


def test_schedule_renaming_knows_every_field() -> None:
    # A new field of Schedule that names indices must be renamed by rename_schedule
    # (then listed in RENAMED_FIELDS); until then canonical records are off, not wrong.
    assert schedule_fields() == RENAMED_FIELDS
    schedule = Schedule(("i", "j"), (("k",),), strategy="tile", row="i", vector="j")
    renamed = rename_schedule(schedule, {"i": "i0", "j": "i1", "k": "r0"})
    assert (renamed.free_order, renamed.reduced_order) == (("i0", "i1"), (("r0",),))
    assert (renamed.row, renamed.vector, renamed.strategy) == ("i0", "i1", "tile")


def test_build_jobs_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORDSL_BUILD_JOBS", "3")
    assert config.build_jobs() == 3
    monkeypatch.setenv("TENSORDSL_BUILD_JOBS", "")
    assert config.build_jobs() >= 1
    monkeypatch.setenv("TENSORDSL_BUILD_JOBS", "many")
    with pytest.raises(ValueError, match="TENSORDSL_BUILD_JOBS='many' is not a number of jobs"):
        config.build_jobs()
