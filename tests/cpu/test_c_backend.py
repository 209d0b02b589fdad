"""The C back end against numpy float64 references, under every candidate schedule."""

from __future__ import annotations

import multiprocessing
import os
import pathlib

import numpy as np
import pytest
import sympy
from cases import BY_NAME, CASES, Case

from codegen.c.emit import emit_c
from codegen.c.run import compiler
from codegen.c.run.build import build_c, c_source, clear_memory_cache
from codegen.c.run.compiler import BuildError, compile_c
from codegen.c.schedule import Schedule, candidate_schedules, choose_cpu_schedule
from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol, tensor_base
from tests.backends import NEEDS_C_COMPILER

pytestmark = [NEEDS_C_COMPILER, pytest.mark.optimised]
GOLDEN = pathlib.Path(__file__).parent.parent / "golden" / "c"
TOLERANCE = {"float32": 2e-4, "float64": 1e-10}


@pytest.fixture(autouse=True, scope="module")
def _cache_dir(tmp_path_factory: pytest.TempPathFactory):
    saved = os.environ.get("TENSORDSL_CACHE_DIR")
    os.environ["TENSORDSL_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if saved is None:
        del os.environ["TENSORDSL_CACHE_DIR"]
    else:
        os.environ["TENSORDSL_CACHE_DIR"] = saved


def run_case(case: Case, dtype: str, schedule: Schedule | None = None, seed: int = 0):
    """Run `case` on the C back end; returns (result, float64 reference)."""
    arrays = case.inputs(np.random.default_rng(seed))
    expected = np.asarray(case.reference(**arrays))
    is_arg = case.nest.reduction in ("argmax", "argmin")
    dtypes = {name: dtype for name in arrays}
    dtypes[case.nest.output] = "int64" if is_arg else dtype
    operands = [np.ascontiguousarray(arrays[n], dtype=dtypes[n]) for n in case.nest.operand_names]
    if dtype == "float32":  # the reference sees the rounded inputs
        expected = np.asarray(
            case.reference(
                **{
                    n: a.astype(np.float64)
                    for n, a in zip(case.nest.operand_names, operands, strict=True)
                }
            )
        )
    out = np.full(expected.shape, -12345 if is_arg else np.nan, dtype=dtypes[case.nest.output])
    compiled = build_c(case.nest, dtypes=dtypes, schedule=schedule)
    compiled(out, operands, case.extents(arrays))
    return out, expected


def check(out: np.ndarray, expected: np.ndarray, dtype: str) -> None:
    if out.dtype.kind == "i":
        np.testing.assert_array_equal(out, expected)
    else:
        scale = max(1.0, float(np.max(np.abs(expected))))
        np.testing.assert_allclose(
            out, expected, rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype] * scale
        )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_case_matches_numpy(case: Case, dtype: str) -> None:
    out, expected = run_case(case, dtype)
    check(out, expected, dtype)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_candidate_schedule_agrees(case: Case) -> None:
    schedules = candidate_schedules(case.nest)
    assert choose_cpu_schedule(case.nest, kernel=True) in schedules
    for schedule in schedules:
        out, expected = run_case(case, "float64", schedule)
        check(out, expected, "float64")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_inputs_accumulate_in_float(dtype: str) -> None:
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
        import ml_dtypes

        np_dtype = np.dtype(ml_dtypes.bfloat16)
    else:
        np_dtype = np.dtype(np.float16)
    case = BY_NAME["matmul"]
    arrays = case.inputs(np.random.default_rng(1))
    a, b = (arrays[n].astype(np_dtype) for n in ("A", "B"))
    out = np.full((37, 45), np.nan, np_dtype)
    build_c(case.nest, dtypes={"A": dtype, "B": dtype, "C": dtype})(out, [a, b], {})
    expected = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out.astype(np.float64), expected, rtol=2e-2, atol=5e-2)


def test_empty_reductions_give_identities() -> None:
    for name, identity in [
        ("matvec", 0.0),
        ("logsumexp", -np.inf),
        ("prod", 1.0),
        ("max", -np.inf),
        ("min", np.inf),
        ("argmax", -1),
    ]:
        nest = BY_NAME[name].nest
        shape = (4, 0, 3) if nest.operands[0].rank == 3 else (4, 0)
        operands = [np.zeros(shape)] + [np.zeros(0)] * (len(nest.operands) - 1)
        out_dtype = "int64" if nest.reduction == "argmax" else "float64"
        dtypes = {n: "float64" for n in nest.operand_names} | {nest.output: out_dtype}
        out = np.full(4, -7, out_dtype)
        build_c(nest, dtypes=dtypes)(out, operands, {})
        np.testing.assert_array_equal(out, np.full(4, identity), err_msg=name)


def test_new_shapes_do_not_recompile() -> None:
    nest = BY_NAME["matmul"].nest
    dtypes = {"A": "float32", "B": "float32", "C": "float32"}
    build_c(nest, dtypes=dtypes)
    before = compiler.STATS["compiles"]
    rng = np.random.default_rng(2)
    for m, kk, n in [(1, 1, 1), (5, 3, 2), (64, 17, 129), (3, 0, 4)]:
        a = rng.standard_normal((m, kk)).astype(np.float32)
        b = rng.standard_normal((kk, n)).astype(np.float32)
        out = np.full((m, n), np.nan, np.float32)
        build_c(nest, dtypes=dtypes)(out, [a, b], {})
        np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    assert compiler.STATS["compiles"] == before


def test_disk_cache_is_reused(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path))
    nest = BY_NAME["matvec"].nest
    dtypes = {"A": "float64", "x": "float64", "y": "float64"}
    compiles = compiler.STATS["compiles"]
    build_c(nest, dtypes=dtypes)
    assert compiler.STATS["compiles"] == compiles + 1
    clear_memory_cache()
    hits = compiler.STATS["disk_hits"]
    build_c(nest, dtypes=dtypes)
    assert compiler.STATS["compiles"] == compiles + 1
    assert compiler.STATS["disk_hits"] == hits + 1
    assert list(tmp_path.glob("c/*/*.so"))


def _build_in_child(cache_dir: str, constant: float) -> float:
    os.environ["TENSORDSL_CACHE_DIR"] = cache_dir
    i = index_symbol("i")
    nest = LoopNest(
        "Y",
        (Range(i, 0, extent_symbol("A", 0)),),
        (Term(tensor_base("A")[i] * sympy.Float(constant)),),
        (Operand("A", 1),),
    )
    out = np.zeros(3)
    build_c(nest, dtypes={"A": "float64", "Y": "float64"})(out, [np.ones(3)], {})
    return float(out.sum())


def test_two_processes_build_the_same_kernel(tmp_path: pathlib.Path) -> None:
    constant = float(np.random.default_rng().uniform(1, 2))
    context = multiprocessing.get_context("spawn")
    with context.Pool(2) as pool:
        results = pool.starmap(_build_in_child, [(str(tmp_path), constant)] * 2)
    assert results == [pytest.approx(3 * constant)] * 2
    assert len(list(tmp_path.glob("c/*/*.so"))) == 1
    assert not list(tmp_path.glob("c/*/*.tmp"))


def test_compiler_failure_is_reported_as_a_bug_with_the_source_path() -> None:
    with pytest.raises(BuildError, match=r"tensordsl bug(.|\n)*generated source kept at (\S+\.c)"):
        compile_c("int broken(void) { return }\n")


def test_bad_schedule_raises_value_error() -> None:
    nest = BY_NAME["matmul"].nest
    with pytest.raises(ValueError, match="not a permutation"):
        emit_c(
            nest,
            dtypes={"A": "float32", "B": "float32", "C": "float32"},
            schedule=Schedule(("i",), (("k",),)),
        )
    with pytest.raises(ValueError, match="loop_order"):
        choose_cpu_schedule(nest, loop_order=("i", "z"))
    with pytest.raises(ValueError, match="only tile and dot"):
        emit_c(
            nest,
            dtypes={"A": "float32", "B": "float32", "C": "float32"},
            schedule=Schedule(("i", "j"), (("k",),), small=Schedule(("i", "j"), (("k",),))),
        )


@pytest.mark.parametrize("strategy", ["tile", "dot"])
@pytest.mark.parametrize("width", [1, 3, 8])
def test_tiles_over_constrained_indices(strategy: str, width: int) -> None:
    # The loop bounds of k depend on the tiled p: interior tiles drop the constraints,
    # edge tiles test them per lane; both must give the reference numbers.
    case = BY_NAME["conv_grad"]
    schedule = Schedule(("p",), (("k",),), strategy=strategy, vector="p", width=width, lanes=3)
    source = emit_c(
        case.nest, dtypes=dict.fromkeys(["dY", "W", "dX"], "float32"), schedule=schedule
    )
    assert "o_p - " in source.text  # the interior-tile test
    out, expected = run_case(case, "float64", schedule)
    check(out, expected, "float64")


def test_loop_order_override() -> None:
    case = BY_NAME["matmul"]
    schedule = choose_cpu_schedule(case.nest, loop_order=("j", "i", "k"))
    assert schedule.free_order == ("j", "i")
    out, expected = run_case(case, "float64", schedule)
    check(out, expected, "float64")


GOLDEN_CASES = ["matmul", "conv_grad", "full_sum", "argmax", "logsumexp", "pairwise", "two_terms"]


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_golden_c(name: str) -> None:
    text = c_source(BY_NAME[name].nest)
    path = GOLDEN / f"{name}.c"
    if os.environ.get("TENSORDSL_UPDATE_GOLDEN") == "1" or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert text == path.read_text(), "generated C changed; rerun with TENSORDSL_UPDATE_GOLDEN=1"


def _saved_position_nest() -> LoopNest:
    """`OUT[i, j] = where(j + 2**24 == POS[i], V[i], 0)`: POS is an int32 saved position."""
    i, j = index_symbol("i"), index_symbol("j")
    pos, value = tensor_base("POS"), tensor_base("V")
    body = sympy.Piecewise((value[i], sympy.Eq(j + 2**24, pos[i])), (0, True))
    return LoopNest(
        "OUT",
        (Range(i, 0, extent_symbol("POS", 0)), Range(j, 0, 40)),
        (Term(body),),
        (Operand("V", 1), Operand("POS", 1)),
    )


def test_integer_operands_compare_as_integers() -> None:
    # Positions above 2**24 are not floats: 2**24 + 1 rounds to 2**24, so a float
    # comparison would also select j = 0 and write V there.
    nest = _saved_position_nest()
    dtypes = {"V": "float32", "POS": "int32", "OUT": "float32"}
    assert "(float)in_POS" not in emit_c(nest, dtypes=dtypes).text
    positions = np.array([2**24 + 1, 2**24 + 3, 2**24 + 17, 2**24 + 39, 7], np.int32)
    values = np.random.default_rng(0).uniform(1, 2, positions.shape).astype(np.float32)
    expected = np.zeros((len(positions), 40), np.float32)
    for row, position in enumerate(positions):
        if 0 <= position - 2**24 < 40:
            expected[row, position - 2**24] = values[row]
    for schedule in candidate_schedules(nest):
        out = np.full(expected.shape, np.nan, np.float32)
        build_c(nest, dtypes=dtypes, schedule=schedule)(out, [values, positions], {})
        np.testing.assert_array_equal(out, expected, err_msg=schedule.describe())


@pytest.mark.parametrize("reduction", ["argmax", "argmin"])
def test_positions_with_nan_ties_and_infinities_agree_with_numpy(reduction: str) -> None:
    # NaN wins (its first position), ties go to the first position, a row of -inf/+inf
    # still has a position: numpy's rules, under every schedule (lanes, tiles, chunks).
    case = BY_NAME[reduction]
    rng = np.random.default_rng(3)
    values = rng.integers(-3, 4, size=(9, 5, 7)).astype(np.float32)
    values[1, 3, 2] = values[1, 0, 5] = np.nan
    values[2, 4, 6] = np.nan
    values[3] = -np.inf
    values[4] = np.inf
    values[5, 2, 1] = np.inf
    values[6, 0, 0] = np.nan
    values[7] = np.nan
    pick = np.argmax if reduction == "argmax" else np.argmin
    expected = pick(values.reshape(9, -1), axis=1)
    dtypes = {"A": "float32", "Y": "int64"}
    for schedule in candidate_schedules(case.nest):
        out = np.full(expected.shape, -12345, np.int64)
        build_c(case.nest, dtypes=dtypes, schedule=schedule)(out, [values], {})
        np.testing.assert_array_equal(out, expected, err_msg=schedule.describe())


@pytest.mark.parametrize("taps", [1, 5, 40, 60])
def test_tile_grid_regions(taps: int) -> None:
    # The tile grid along p starts where p's interior starts (p >= taps - 1, p < 44): with 40
    # taps the prefix is longer than a tile and the interior narrower than one; with 60 taps
    # there is no interior at all. Every region must give the reference numbers.
    case = BY_NAME["conv_grad"]
    rng = np.random.default_rng(taps)
    arrays = {"dY": rng.standard_normal(44), "W": rng.standard_normal(taps)}
    expected = np.asarray(case.reference(**arrays))
    operands = [arrays[name] for name in case.nest.operand_names]
    dtypes = dict.fromkeys(["dY", "W", "dX"], "float64")
    for strategy, width in (("tile", 4), ("tile", 32), ("dot", 3)):
        schedule = Schedule(("p",), (("k",),), strategy=strategy, vector="p", width=width)
        out = np.full(expected.shape, np.nan)
        build_c(case.nest, dtypes=dtypes, schedule=schedule)(out, operands, case.extents(arrays))
        check(out, expected, "float64")


def _logsumexp_rows(x: np.ndarray) -> np.ndarray:
    """float64 logsumexp of each row, as jax.nn.logsumexp: NaN propagates, a row whose
    largest value is +-inf gives it, otherwise shifted by the largest value."""
    out = np.empty(len(x))
    for n, row in enumerate(x.astype(np.float64)):
        top = row.max() if row.size else -np.inf
        if np.isnan(row).any():
            out[n] = np.nan
        elif not np.isfinite(top):
            out[n] = top
        else:
            out[n] = top + np.log(np.exp(row - top).sum())
    return out


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_logsumexp_in_vectorised_chunks_keeps_the_special_values(dtype: str) -> None:
    """The scalar strategy computes logsumexp in chunks of values, each reduced by a max pass
    and an exp-sum pass and combined; rows of 600 values span three chunks."""
    nest = BY_NAME["logsumexp"].nest
    dtypes = {"A": dtype, "Y": dtype}
    scalar = Schedule(("i",), (("k",),))
    assert "reduction(max:c_)" in emit_c(nest, dtypes=dtypes, schedule=scalar).text
    rng = np.random.default_rng(9)
    x = rng.normal(size=(10, 600)) * 30
    x[1, 400] = np.nan  # in the second chunk
    x[2, 7] = np.inf
    x[3] = -np.inf
    x[4, ::2] = -np.inf
    x[5, 3], x[5, 530] = np.nan, np.inf
    x[6] += 1e4  # overflows exp without the shift
    x[7, :] = -1e4
    x[8, :256] = -np.inf  # a first chunk of -inf, then values
    x[9, 300] = 500  # the largest value after the first chunk: rescales its sum
    x = x.astype(dtype)
    out = np.full(10, np.nan, dtype)
    build_c(nest, dtypes=dtypes, schedule=scalar)(out, [x], {})
    np.testing.assert_allclose(out, _logsumexp_rows(3 * x.astype(np.float64)), rtol=1e-5)
