"""Small nests stay cheap under load (issue 26): how many threads a C kernel starts, from its
work and the teams other kernels hold, and the OpenMP wait policy set before the runtime
loads (codegen/c/threads.py). The rule is checked, never a time."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import sympy

import tensordsl as td
from codegen import config
from codegen.c import threads
from codegen.c.build import build_c, c_source
from codegen.c.compiler import compile_c
from codegen.c.emit import emit_c
from codegen.c.schedule import Schedule, choose_cpu_schedule
from codegen.ir.examples import matmul
from codegen.ir.nest import default_dtypes

needs_cc = pytest.mark.skipif(
    shutil.which(config.c_compiler()) is None,
    reason=f"no C compiler {config.c_compiler()!r} (set TENSORDSL_CC)",
)
G = threads.GRAIN
CONV = "Y[i] := X[i + k] * W[k]"


# --------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("work", "cores", "held", "expected"),
    [
        (0, 2, 0, 1),
        (2 * G - 1, 2, 0, 1),  # below two grains: no team at all
        (2 * G, 2, 0, 2),
        (100 * G, 2, 0, 2),  # never more than the cores
        (3 * G, 16, 0, 3),  # one thread per grain
        (100 * G, 2, 2, 1),  # another kernel's team holds both cores
        (100 * G, 2, 1, 1),  # one core left: a team of one is no team
        (100 * G, 16, 3, 13),
        (100 * G, 1, 0, 1),  # OMP_NUM_THREADS=1
    ],
)
def test_thread_count(work, cores, held, expected):
    assert threads.thread_count(work, cores, held) == expected


def test_work_counts_operations_not_body_evaluations():
    i, k = sympy.symbols("i k")
    X, W = sympy.IndexedBase("X"), sympy.IndexedBase("W")
    product = threads.body_cost(X[i + k] * W[k])
    assert product == 4  # two loads, a multiply, the update
    gaussian = sympy.exp(-((X[i] - W[k]) ** 2))  # exp(-(X[i] + (-1)*W[k])**2)
    # the update, two loads, the difference, two products by -1, the square, the exp
    assert threads.body_cost(gaussian) == 7 + threads.FUNCTION_COST
    assert threads.body_cost(X[i] ** 0.5) == 2 + threads.FUNCTION_COST
    k = td.kernel(CONV)
    # 9971 outputs, each one store and 30 terms of a product
    assert threads.nest_work(k.nest, {"X": (10000,), "W": (30,), "Y": (9971,)}) == 9971 * 121


# --------------------------------------------------------------------------- generated C


def test_a_parallel_kernel_reserves_its_team_and_gives_it_back():
    text = c_source(matmul())
    assert f"schedule(guided) {threads.CLAUSES}" in text
    body = text[text.rindex("\nvoid tdsl_") :]  # the entry point, after the helpers
    assert body.count("const int threads_ = tdsl_team(work_);") == 1
    assert body.rstrip().splitlines()[-2].strip() == "tdsl_team_done(threads_);"
    assert "return" not in body  # no way out of the kernel that skips tdsl_team_done


def test_a_serial_schedule_has_no_team():
    nest = matmul()
    schedule = choose_cpu_schedule(nest, kernel=True)
    serial = Schedule(schedule.free_order, schedule.reduced_order, parallel=False)
    text = emit_c(nest, dtypes=default_dtypes(nest), schedule=serial).text
    assert "tdsl_team" not in text and "omp parallel" not in text


# --------------------------------------------------------------------------- the C twin

_DRIVER = textwrap.dedent(
    """
    int team(int64_t work) { return tdsl_team(work); }
    void team_done(int threads) { tdsl_team_done(threads); }
    int max_threads(void) {
    #ifdef _OPENMP
        return omp_get_max_threads();
    #else
        return 0;
    #endif
    }
    """
)


@needs_cc
def test_the_c_helper_follows_the_python_rule_and_shares_one_counter():
    source = "#include <stdint.h>\n" + threads.HELPERS + _DRIVER
    first = ctypes.CDLL(str(compile_c(source)))
    second = ctypes.CDLL(str(compile_c(source + "/* another library */\n")))
    cores = first.max_threads()
    if cores == 0:
        pytest.skip("the C compiler builds without OpenMP here: every kernel runs on one thread")
    for library in (first, second):
        threads.share_counter(library)
        library.team.argtypes = [ctypes.c_int64]
    assert threads.teams_held() == 0
    for work in (0, 2 * G - 1, 2 * G, 3 * G, 5 * G, 1000 * G):
        got = first.team(work)
        assert got == threads.thread_count(work, cores), work
        first.team_done(got)
    assert threads.teams_held() == 0
    held = first.team(1000 * G)  # a running team, as XLA runs two kernels at once
    assert held == threads.thread_count(1000 * G, cores)
    assert threads.teams_held() == (held if held > 1 else 0)
    other = second.team(1000 * G)  # another library sees the same counter
    assert other == threads.thread_count(1000 * G, cores, threads.teams_held())
    second.team_done(other)
    first.team_done(held)
    assert threads.teams_held() == 0


@needs_cc
def test_kernels_share_the_counter_and_leave_it_at_zero():
    k = td.kernel("Y[i, j] := exp(-(X[i, d] - Z[j, d])**2)", backend="c")
    rng = np.random.default_rng(1)
    x, z = rng.standard_normal((300, 3)), rng.standard_normal((200, 3))
    want = np.exp(-((x[:, None, :] - z[None, :, :]) ** 2)).sum(-1)
    np.testing.assert_allclose(np.asarray(k(x, z)), want, rtol=1e-12)
    assert threads.teams_held() == 0
    compiled = build_c(k.nest, dtypes={"X": "float64", "Z": "float64", "Y": "float64"})
    library = ctypes.CDLL(str(compiled.library))  # the same handle: dlopen counts references
    pointer = ctypes.c_void_p.in_dll(library, threads.COUNTER_SYMBOL).value
    assert pointer == ctypes.addressof(threads._HELD)


# --------------------------------------------------------------------------- waiting


def test_passive_waiting_is_the_default_and_the_users_setting_wins(monkeypatch):
    for name in config.OPENMP_WAIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert config.openmp_wait_defaults() == {"OMP_WAIT_POLICY": "passive"}
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    assert config.openmp_wait_defaults() == {}
    monkeypatch.delenv("GOMP_SPINCOUNT")
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    assert config.openmp_wait_defaults() == {}
    threads.passive_waiting()
    assert os.environ["OMP_WAIT_POLICY"] == "active"


_CHILD = textwrap.dedent(
    f"""
    import numpy as np
    import tensordsl as td
    k = td.kernel({CONV!r}, backend="c")
    k(np.arange(40.0, dtype=np.float32), np.arange(3.0, dtype=np.float32))
    """
)


@needs_cc
@pytest.mark.parametrize(("user", "seen"), [(None, "PASSIVE"), ("active", "ACTIVE")])
def test_the_openmp_runtime_starts_with_passive_waiting(user, seen):
    env = {k: v for k, v in os.environ.items() if k not in config.OPENMP_WAIT_VARIABLES}
    env |= {"OMP_DISPLAY_ENV": "true", "PYTHONPATH": os.getcwd(), "TENSORDSL_VERBOSE": "0"}
    if user is not None:
        env["OMP_WAIT_POLICY"] = user
    run = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    if "OPENMP DISPLAY ENVIRONMENT" not in run.stderr:
        pytest.skip("the OpenMP runtime does not print its settings (not libgomp?)")
    assert f"OMP_WAIT_POLICY = '{seen}'" in run.stderr
