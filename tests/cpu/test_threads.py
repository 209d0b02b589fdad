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

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy

import tensordsl as td
from codegen import config
from codegen.c import emit, threads
from codegen.c.emit import emit_c
from codegen.c.run.build import build_c, c_source, clear_memory_cache
from codegen.c.run.compiler import compile_c
from codegen.c.schedule import Schedule, choose_cpu_schedule
from codegen.ir.examples import matmul
from codegen.ir.nest import (
    LoopNest,
    Operand,
    Range,
    Reduce,
    Term,
    default_dtypes,
    extent_symbol,
    index_symbol,
    tensor_base,
)
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.corpus import CORPUS, make_inputs

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


def test_a_nested_reduction_counts_every_turn_of_its_loop():
    """A gradient that sums a product over a long axis inside an elementwise factor
    (squeeze-and-excite's `dE[n,c] := sum_s(dY[n,c,s]*X[n,c,s]) * sigmoid'(E[n,c])`) reads
    two whole tensors: its work is the sum's, so it gets a team like the elementwise nests
    around it, not one thread."""
    n, c, s = (index_symbol(x) for x in "ncs")
    X, dY, E = (tensor_base(x) for x in ("X", "dY", "E"))
    inner = Reduce("sum", X[n, c, s] * dY[n, c, s], s, 0, extent_symbol("X", 2))
    assert threads.body_cost(inner) == 1 + 4 * extent_symbol("X", 2)
    gate = inner * sympy.exp(E[n, c])
    # the update, the product, a load and an exp outside the sum
    assert threads.body_cost(gate) == 3 + threads.FUNCTION_COST + 4 * extent_symbol("X", 2)
    free = (Range(n, 0, extent_symbol("X", 0)), Range(c, 0, extent_symbol("X", 1)))
    operands = (Operand("X", 3), Operand("dY", 3), Operand("E", 2))
    nest = LoopNest("dE", free, (Term(gate, ()),), operands)
    shapes = {"X": (16, 64, 1024), "dY": (16, 64, 1024), "E": (16, 64), "dE": (16, 64)}
    work = threads.nest_work(nest, shapes)
    assert work == 16 * 64 * (1 + 3 + threads.FUNCTION_COST + 4 * 1024)
    assert threads.thread_count(work, 2) == 2


def test_a_logsumexp_counts_the_exp_of_every_value():
    """A logsumexp computes `exp` of every value it reduces: Sinkhorn's row and column
    logsumexps over 512x512 do the work of a sum of `exp`s of the same extents (softmax's
    normaliser) and get the same team. Counted as a plain sum (2.4M units, under two grains)
    they ran on one thread where XLA used both cores."""
    shapes = {"cost": (512, 512), "epsilon": (), "la": (512,), "lb": (512,)}
    row = td.kernel("(logsumexp) A[i] := lb[j] - B[j] - cost[i,j] / epsilon").nest
    column = td.kernel("(logsumexp) B[j] := la[i] - A[i] - cost[i,j] / epsilon").nest
    exps = td.kernel("Z[i] := exp(lb[j] - B[j] - cost[i,j] / epsilon)").nest
    shapes = {**shapes, "A": (512,), "B": (512,)}
    plain = 512 * (1 + 512 * threads.body_cost(row.terms[0].body))
    assert threads.nest_work(row, shapes) == plain + 512 * 512 * threads.FUNCTION_COST
    assert threads.nest_work(row, shapes) == threads.nest_work(exps, shapes)
    assert threads.nest_work(column, shapes) == threads.nest_work(row, shapes)
    assert threads.thread_count(plain, cores=2) == 1
    assert threads.thread_count(threads.nest_work(row, shapes), cores=2) == 2
    assert threads.thread_count(threads.nest_work(column, shapes), cores=2) == 2


def test_a_nested_logsumexp_counts_its_exp_at_every_turn():
    i, j = index_symbol("i"), index_symbol("j")
    X = tensor_base("X")
    inner = Reduce("logsumexp", X[i, j], j, 0, extent_symbol("X", 1))
    assert threads.body_cost(inner) == 1 + (2 + threads.FUNCTION_COST) * extent_symbol("X", 1)
    assert threads.update_cost("sum") == threads.update_cost("max") == 0


def test_a_row_pass_of_a_logsumexp_counts_its_exp():
    """A row-passes kernel (log-softmax: `X[i,j] - logsumexp_k X[i,k]`) counts each nested
    reduction once per row, a logsumexp with the `exp` of every value."""
    from codegen.c.reductions.statistics import row_passes_work

    i, j, k = index_symbol("i"), index_symbol("j"), index_symbol("k")
    X = tensor_base("X")
    free = (Range(i, 0, extent_symbol("X", 0)), Range(j, 0, extent_symbol("X", 1)))

    def work(reduction):
        inner = Reduce(reduction, X[i, k], k, 0, extent_symbol("X", 1))
        nest = LoopNest("Y", free, (Term(X[i, j] - inner),), (Operand("X", 2),))
        return row_passes_work(nest).subs({extent_symbol("X", 0): 8, extent_symbol("X", 1): 64})

    assert work("logsumexp") - work("max") == 8 * 64 * threads.FUNCTION_COST


# --------------------------------------------------------------------------- generated C


def test_a_parallel_kernel_reserves_its_team_and_gives_it_back():
    text = c_source(matmul())
    assert f"#pragma omp parallel {threads.CLAUSES}" in text
    body = text[text.rindex("\nvoid tdsl_") :]  # the entry point, after the helpers
    assert body.count("const int threads_ = tdsl_team(work_, &asked_);") == 1
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
    int team(int64_t work) { int64_t asked = 0; return tdsl_team(work, &asked); }
    void team_done(int threads) { tdsl_team_done(threads); }
    void started(int64_t asked, int64_t now) { tdsl_team_started(asked, now); }
    int64_t now_ns(void) { return tdsl_now_ns(); }
    int max_threads(void) { return omp_get_max_threads(); }
    """
)


@pytest.fixture
def helpers():
    """Two libraries built from the kernels' team helpers, sharing the process's record."""
    source = "#include <stdint.h>\n" + threads.HELPERS + "\n#ifdef _OPENMP" + _DRIVER + "#endif\n"
    libraries = [ctypes.CDLL(str(compile_c(source + f"/* library {n} */\n"))) for n in (1, 2)]
    if not hasattr(libraries[0], "team"):
        pytest.skip("the C compiler builds without OpenMP here: every kernel runs on one thread")
    for library in libraries:
        threads.share_counter(library)
        library.team.argtypes = [ctypes.c_int64]
        library.started.argtypes = [ctypes.c_int64, ctypes.c_int64]
        library.now_ns.restype = ctypes.c_int64
    record = threads.teams()
    assert record.held == 0
    # A kernel of an earlier test in this worker may have met a late team on a loaded machine
    # and started a calm (issue 38): the tests below start from none, whatever the load.
    record.calm_until = 0
    yield libraries
    record.calm_until = 0


@needs_cc
def test_the_c_helper_follows_the_python_rule_and_shares_one_counter(helpers):
    first, second = helpers
    cores = first.max_threads()
    for work in (0, 2 * G - 1, 2 * G, 3 * G, 5 * G, 1000 * G):
        got = first.team(work)
        assert got == threads.thread_count(work, cores), work
        first.team_done(got)
    assert threads.teams().held == 0
    held = first.team(1000 * G)  # a running team, as XLA runs two kernels at once
    assert held == threads.thread_count(1000 * G, cores)
    assert threads.teams().held == (held if held > 1 else 0)
    other = second.team(1000 * G)  # another library sees the same counter
    assert other == threads.thread_count(1000 * G, cores, threads.teams().held)
    second.team_done(other)
    first.team_done(held)
    assert threads.teams().held == 0


@needs_cc
def test_a_late_thread_keeps_kernels_on_one_thread_for_a_while(helpers):
    first, second = helpers
    cores = first.max_threads()
    # A start an hour ahead: the calm it begins outlasts any wait of this process on a loaded
    # machine between these lines (the calm of one started now ends a second later).
    now = first.now_ns() + 3600 * 10**9
    first.started(now - threads.LATE_NS, now)  # on time, just
    assert threads.teams().calm_until == 0
    first.started(now - threads.LATE_NS - 1, now)  # late: every core was taken
    assert threads.teams().calm_until == now + threads.CALM_NS
    assert second.team(1000 * G) == threads.thread_count(1000 * G, cores, crowded=True) == 1
    threads.teams().calm_until = second.now_ns() - 1  # the calm is over
    got = second.team(1000 * G)
    assert got == threads.thread_count(1000 * G, cores)
    second.team_done(got)


_TEAM = textwrap.dedent(
    """
    import sys
    import numpy as np
    from codegen.c.run.build import build_c
    import tensordsl as td
    n = int(sys.argv[1])
    k = td.kernel("K[i, j] := exp(-(X[i, d] - Z[j, d])**2)", backend="c")
    kernel = build_c(k.nest, dtypes={"X": "float32", "Z": "float32", "K": "float32"})
    x = np.random.default_rng(0).standard_normal((n, 3)).astype(np.float32)
    kernel(np.empty((n, n), np.float32), [x, x], {})
    """
)


def _team_lines(n: int) -> list[str]:
    """What the OpenMP runtime says of the threads of each team a fresh process forms for
    one call of a Gaussian kernel of n x n outputs, with two OpenMP threads."""
    env = {**os.environ, "OMP_NUM_THREADS": "2", "PYTHONPATH": os.getcwd()}
    env |= {"TENSORDSL_VERBOSE": "0", "OMP_DISPLAY_AFFINITY": "true"}
    env["OMP_AFFINITY_FORMAT"] = "tdsl team: thread %n of %N"
    run = subprocess.run(
        [sys.executable, "-c", _TEAM, str(n)], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    return [line for line in run.stderr.splitlines() if line.startswith("tdsl team:")]


@needs_cc
def test_a_small_kernel_starts_no_team_and_a_large_one_does():
    small, large = 64, 1024
    k = td.kernel("K[i, j] := exp(-(X[i, d] - Z[j, d])**2)")
    work = {
        n: threads.nest_work(k.nest, {"X": (n, 3), "Z": (n, 3), "K": (n, n)})
        for n in (small, large)
    }
    assert threads.thread_count(work[small], 2) == 1 and threads.thread_count(work[large], 2) == 2
    lines = _team_lines(large)
    if not lines:
        pytest.skip("the OpenMP runtime does not display its threads (OMP_DISPLAY_AFFINITY)")
    assert lines == ["tdsl team: thread 0 of 2", "tdsl team: thread 1 of 2"]
    assert all(line.endswith(" of 1") for line in _team_lines(small))


@needs_cc
def test_kernels_share_the_counter_and_leave_it_at_zero():
    k = td.kernel("Y[i, j] := exp(-(X[i, d] - Z[j, d])**2)", backend="c")
    rng = np.random.default_rng(1)
    x, z = rng.standard_normal((300, 3)), rng.standard_normal((200, 3))
    want = np.exp(-((x[:, None, :] - z[None, :, :]) ** 2)).sum(-1)
    np.testing.assert_allclose(np.asarray(k(x, z)), want, rtol=1e-12)
    assert threads.teams().held == 0
    compiled = build_c(k.nest, dtypes={"X": "float64", "Z": "float64", "Y": "float64"})
    library = ctypes.CDLL(str(compiled.library))  # the same handle: dlopen counts references
    pointer = ctypes.c_void_p.in_dll(library, threads.COUNTER_SYMBOL).value
    assert pointer == ctypes.addressof(threads.teams())


# --------------------------------------------------------------------------- waiting


def test_a_short_spin_is_the_default_and_the_users_setting_wins(monkeypatch):
    for name in config.OPENMP_WAIT_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert config.openmp_wait_defaults() == {"GOMP_SPINCOUNT": "30000", "KMP_BLOCKTIME": "2"}
    users = [("GOMP_SPINCOUNT", "1000"), ("KMP_BLOCKTIME", "0"), ("OMP_WAIT_POLICY", "")]
    for name, value in users:
        monkeypatch.setenv(name, value)
        assert config.openmp_wait_defaults() == {}
        monkeypatch.delenv(name)
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    threads.openmp_waiting()
    assert os.environ["OMP_WAIT_POLICY"] == "active"
    assert "GOMP_SPINCOUNT" not in os.environ


_CHILD = textwrap.dedent(
    f"""
    import numpy as np
    import tensordsl as td
    k = td.kernel({CONV!r}, backend="c")
    k(np.arange(40.0, dtype=np.float32), np.arange(3.0, dtype=np.float32))
    """
)


@needs_cc
@pytest.mark.parametrize(
    ("user", "seen"), [(None, "GOMP_SPINCOUNT = '30000'"), ("active", "OMP_WAIT_POLICY = 'ACTIVE'")]
)
def test_the_openmp_runtime_starts_with_a_short_spin(user, seen):
    env = {k: v for k, v in os.environ.items() if k not in config.OPENMP_WAIT_VARIABLES}
    env |= {"OMP_DISPLAY_ENV": "verbose", "PYTHONPATH": os.getcwd(), "TENSORDSL_VERBOSE": "0"}
    if user is not None:
        env["OMP_WAIT_POLICY"] = user
    run = subprocess.run(
        [sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr
    if "OPENMP DISPLAY ENVIRONMENT" not in run.stderr:
        pytest.skip("the OpenMP runtime does not print its settings (not libgomp?)")
    assert seen in run.stderr


# --------------------------------------------------------------------------- teams compute right


@pytest.fixture
def teams_always(monkeypatch, tmp_path):
    """Every parallel kernel starts a full team whatever its work (a grain of one unit, no
    thread ever late), built in a cache folder of its own, outputs poisoned."""
    forced = threads.HELPERS.replace(str(G), "1").replace(
        f"(now - asked > {threads.LATE_NS})", "(0)"
    )
    assert forced.count("(int64_t)1)") == 1 and "if (0)" in forced
    monkeypatch.setattr(emit, "THREAD_HELPERS", forced)
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")
    clear_memory_cache()
    threads.teams().calm_until = 0
    yield
    clear_memory_cache()


def _two_of_each_strategy():
    found: dict[str, list] = {}
    for case in CORPUS:
        nest = lower(parse(case.source), reduce=case.reduce, ranges=case.ranges).nest
        found.setdefault(choose_cpu_schedule(nest, kernel=True).strategy, []).append(case)
    return [case for cases in found.values() for case in cases[:2]]


@needs_cc
@pytest.mark.parametrize("case", _two_of_each_strategy(), ids=lambda c: c.name)
def test_kernels_run_by_a_team_agree_with_the_reference(teams_always, case):
    inputs = make_inputs(case)
    k = td.kernel(case.source, reduce=case.reduce, ranges=case.ranges, backend="c")
    assert f"#pragma omp parallel {threads.CLAUSES}" in next(iter(k.source("c").values()))
    got = np.asarray(k(**inputs))
    np.testing.assert_allclose(got, case.expected(**inputs), rtol=1e-10, atol=1e-11)


@needs_cc
def test_topk_and_grouped_gradients_run_by_a_team(teams_always):
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((37, 50)), rng.standard_normal(50)
    top = td.kernel("(topk 5) V[i,r] := X[i,j] * w[j]", backend="c")
    want = -np.sort(-(x * w), axis=1)[:, :5]
    np.testing.assert_allclose(np.asarray(top(x, w)), want, rtol=1e-12)
    gaussian = "Y[i] := exp(-((X[i,0]-Z[j,0])^2 + (X[i,1]-Z[j,1])^2)) * B[j]"
    X, Z, B = rng.standard_normal((23, 2)), rng.standard_normal((29, 2)), rng.standard_normal(29)
    ct = rng.standard_normal(23)
    kernel = td.kernel(gaussian, backend="c")
    found = jax.grad(lambda *a: jnp.sum(kernel(*a) * ct), argnums=(0, 1, 2))(X, Z, B)
    D = X[:, None, :] - Z[None, :, :]
    W = ct[:, None] * np.exp(-(D**2).sum(-1)) * B[None, :]
    want = -2 * (W[..., None] * D).sum(1), 2 * (W[..., None] * D).sum(0), (W / B).sum(0)
    for f, e in zip(found, want, strict=True):
        np.testing.assert_allclose(np.asarray(f), e, rtol=1e-10, atol=1e-12)
