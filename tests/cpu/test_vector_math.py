"""float32 math functions in generated C: the documented maximum error against float64 over
each function's whole domain, libm's special values, and the vectorised calls (libmvec)."""

from __future__ import annotations

import dataclasses
import os
import pathlib
import re
import shutil

import numpy as np
import pytest
from math_sweep import DOMAINS, reference, sweep_inputs, ulp_errors

from codegen.c import vecmath
from codegen.c.run import compiler
from codegen.c.run.build import build_c
from codegen.c.schedule import Schedule, choose_cpu_schedule
from codegen.ir.functions import FUNCTIONS
from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol, tensor_base

pytestmark = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler (cc)")

SWEPT = sorted(name for name, spec in FUNCTIONS.items() if spec.float32_ulps is not None)


@pytest.fixture(autouse=True)
def _no_math_errno(monkeypatch: pytest.MonkeyPatch) -> None:
    """GCC vectorises the calls of the tile loops only when they need not set errno, so the
    sweeps measure libmvec's vector variants (where they link) rather than scalar libm."""
    flags = os.environ.get("TENSORDSL_CFLAGS", "")
    monkeypatch.setenv("TENSORDSL_CFLAGS", f"{flags} -fno-math-errno")


def _elementwise(name: str) -> LoopNest:
    """`Y[i] := name(X[i])`."""
    i = index_symbol("i")
    body = FUNCTIONS[name].build(tensor_base("X")[i])
    return LoopNest("Y", (Range(i, 0, extent_symbol("X", 0)),), (Term(body),), (Operand("X", 1),))


def _errors(name: str, x: np.ndarray, got: np.ndarray) -> np.ndarray:
    # The nest's sum starts at +0 (`acc_ = 0; acc_ += value`), so a -0 comes out as +0: the
    # accumulation's doing, not the function's, hence zeros compare without their sign.
    return ulp_errors(got, reference(name, x), zero_signs=False)


def _one_thread(nest: LoopNest, dtypes: dict[str, str]) -> Schedule:
    """The heuristic's schedule on the calling thread alone. OpenMP's worker threads keep the
    floating-point flags of the thread that started them, and XLA runs kernels with
    flush-to-zero on: a pool started inside XLA would flush the subnormal results. Always a
    generated kernel (an elementwise exp is otherwise XLA's, `codegen.ir.xla_elementwise`)."""
    schedule = choose_cpu_schedule(nest, dtypes, kernel=True)
    return dataclasses.replace(schedule, parallel=False)


def _run(name: str, x: np.ndarray) -> np.ndarray:
    nest, dtypes = _elementwise(name), {"X": "float32", "Y": "float32"}
    compiled = build_c(nest, dtypes=dtypes, schedule=_one_thread(nest, dtypes))
    out = np.full_like(x, np.nan)
    compiled(out, [x], {})
    return out


def test_every_swept_function_has_a_domain() -> None:
    assert set(SWEPT) == set(DOMAINS)
    assert all(FUNCTIONS[name].libmvec or FUNCTIONS[name].helper for name in SWEPT)


@pytest.mark.parametrize("name", SWEPT)
def test_float32_error_is_within_the_documented_bound(name: str) -> None:
    x = sweep_inputs(name)
    got = _run(name, x)
    errors = _errors(name, x, got)
    worst = int(np.argmax(errors))
    bound = FUNCTIONS[name].float32_ulps
    want = reference(name, x[worst : worst + 1])[0]
    assert errors[worst] <= bound, (
        f"{name}({x[worst]!r}) = {got[worst]!r}, float64 {want!r}: {errors[worst]:.2f} ulp"
    )


@pytest.mark.parametrize("name", SWEPT)
def test_special_values_are_libms(name: str) -> None:
    # NaN, infinities and zeros exactly as float64 libm rounds them; denormals too
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1e-39], np.float32)
    got = _run(name, special)
    errors = _errors(name, special, got)
    wrong = errors > FUNCTIONS[name].float32_ulps
    assert not wrong.any(), [(x, y) for x, y in zip(special[wrong], got[wrong])]


def _vector_symbols(library_bytes: bytes) -> set[str]:
    return {m.decode() for m in re.findall(rb"_ZGV\w+_(\w+)", library_bytes)}


@pytest.mark.optimised
@pytest.mark.skipif(compiler.LIBMVEC_DEFINE not in compiler.compile_flags(), reason="no libmvec")
@pytest.mark.parametrize("name", SWEPT)
def test_simd_loops_call_the_vector_variants(name: str) -> None:
    nest = _elementwise(name)
    compiled = build_c(nest, dtypes={"X": "float32", "Y": "float32"})
    # exp (and sigmoid, over it) is inline arithmetic (codegen.c.vecmath.EXP_HELPER): no
    # expf at all, vector or scalar
    called = {"sigmoid": set(), "softplus": {"log1pf"}, "exp": set()}.get(name, {f"{name}f"})
    library = compiled.library.read_bytes()
    assert called <= _vector_symbols(library), sorted(_vector_symbols(library))
    if name in ("exp", "sigmoid"):
        assert b"expf" not in library, sorted(_vector_symbols(library))


def test_benchmark_quick_run_writes_its_section(tmp_path) -> None:
    from benchmarks import vector_math

    out = tmp_path / "RESULTS.md"
    assert vector_math.main(["--quick", "--out", str(out)]) == 0
    text = out.read_text()
    for name in vector_math.RANGES:
        assert re.search(rf"^\| {name} \| (\d+\.\d\d \(\d+\.\d\d\) \| ){{3}}", text, re.M)
    for layer in vector_math.LAYERS:
        assert re.search(rf"^\| {re.escape(layer)} \| \d+\.\d\d \| \d+\.\d\d \|", text, re.M)


# Beyond the fast range of libmvec's variants (|x| > ~87 for expf) every lane of a vector
# went to scalar libm: the helpers of codegen.c.vecmath.WIDE_RANGE shift the argument back,
# and exp is inline arithmetic (EXP_HELPER, clamped to [-104, 89]). Their results there:
# within the documented bound of float64, with NaN, the infinities, the underflows to 0 and
# the subnormal results as libm gives them.
WIDE = sorted(["exp", *vecmath.WIDE_RANGE])


def _far(name: str) -> np.ndarray:
    """Arguments beyond each side's limit and clamp, around both, and the special values."""
    row = vecmath.WIDE_RANGE.get(name)
    limits = (row.below, row.above, row.clamp) if row else (87.0, 88.72284, 89.0, 104.0)
    clamp = row.clamp if row else 150.0
    edges = [*limits, 103.97208, 126.0, 149.0, 150.0]
    near = [side * e * f for e in edges for side in (-1, 1) for f in (0.999, 1.0, 1.001)]
    rng = np.random.default_rng(len(name))
    swept = rng.uniform(-2.2 * clamp, 2.2 * clamp, 20_000)
    specials = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38, 1e-45, -1e-45]
    return np.concatenate([swept, near, specials]).astype(np.float32)


@pytest.mark.parametrize("name", WIDE)
def test_far_arguments_keep_ieee_results(name: str) -> None:
    x = _far(name)
    got = _run(name, x)
    errors = _errors(name, x, got)
    worst = int(np.argmax(errors))
    assert errors[worst] <= FUNCTIONS[name].float32_ulps, (name, x[worst], got[worst])
    with np.errstate(all="ignore"):
        want32 = reference(name, x).astype(np.float32)  # float64 rounded once: numpy's
    assert np.array_equal(np.isnan(got), np.isnan(x))  # NaN stays NaN, nothing else is
    assert np.array_equal(got[np.isinf(want32)], want32[np.isinf(want32)])
    assert np.array_equal(got[want32 == 0] == 0, np.ones(int((want32 == 0).sum()), bool))


def test_exp_rounds_subnormal_results() -> None:
    # exp(x) for x in (-103.97, -87.34) is subnormal in float32: within the bound in
    # subnormal steps, and rounded correctly below -95, where the error of the scaled call
    # is far below a step
    x = np.linspace(-104.5, -87.4, 4001, dtype=np.float32)
    got = _run("exp", x)
    steps = np.abs(got - reference("exp", x)) / 2.0**-149  # in subnormal steps
    assert steps.max() <= FUNCTIONS["exp"].float32_ulps, (x[np.argmax(steps)], steps.max())
    assert steps[x < -95].max() <= 0.501, steps[x < -95].max()
    assert (got[x > -103.0] > 0).all() and (got[x < -104.0] == 0).all()


@pytest.mark.parametrize("name", WIDE)
def test_float32_calls_go_through_the_wide_range_helper(name: str) -> None:
    nest, dtypes = _elementwise(name), {"X": "float32", "Y": "float32"}
    compiled = build_c(nest, dtypes=dtypes, schedule=_one_thread(nest, dtypes))
    text = pathlib.Path(compiled.library).with_suffix(".c").read_text()
    assert f"tdsl_{name}(in_" in text and f"float tdsl_{name}(float x)" in text


@pytest.mark.skipif(compiler.LIBMVEC_DEFINE not in compiler.compile_flags(), reason="no libmvec")
def test_a_vector_call_after_exp_is_made_once_per_loop(tmp_path) -> None:
    # with the clamp's bounds as constants, GCC computed `log(1 + exp(x))` once more per
    # bound, on zero lanes, and libmvec's log took its slow path in every iteration (16x)
    import subprocess

    import tensordsl as td

    def log_calls(body: str) -> int:
        source = td.kernel(f"Y[b,f] := {body}", backend="c").source()["forward"]
        c_file = tmp_path / "nest.c"
        c_file.write_text(source)
        command = ["gcc", *compiler.compile_flags(), "-S", str(c_file), "-o", str(tmp_path / "s")]
        subprocess.run(command, check=True)
        return len(re.findall(r"call\s+_ZGV\w+_logf", (tmp_path / "s").read_text()))

    assert log_calls("log(1 + exp(X[b,f]))") == log_calls("log(1 + X[b,f]*X[b,f])") > 0
