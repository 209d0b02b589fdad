"""Tuning as data (codegen/tiles/tuning.py): the committed table, the key of a tile program,
a row's tiles and launch settings reaching the program and the kernel lowered for CUDA, the
default row where there is none, and rows refused with what is wrong."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from codegen.tiles import tuning
from codegen.tiles.build import tile_program, tuning_key
from tensordsl.backends.pallas import run
from tensordsl.backends.pallas.api import lowering_for_gpu
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

MATMUL = "C[i,j] := A[i,k] * B[k,j]"
MATMUL_SHAPES = {"A": (100, 70), "B": (70, 90)}


def nest_of(source: str, **options):
    return lower(parse(source), **options).nest


def _row(key: tuning.TuningKey, **settings) -> tuning.TuningRow:
    values = {**tuning.DEFAULTS[key.kind], "backend": None, "source": "default: a test row"}
    return tuning.TuningRow(key, **{**values, **settings})


@pytest.fixture
def table(monkeypatch):
    """A tuning table of the test's own rows (tile programs built before are forgotten)."""
    rows: dict = {}
    monkeypatch.setattr(tuning, "table", lambda: rows)
    run._program.cache_clear()
    yield rows
    run._program.cache_clear()


def test_the_committed_table_parses_and_every_row_says_where_it_comes_from():
    rows = tuning.table()
    assert all(row.measured or row.source.startswith("default") for row in rows.values())
    assert tuning.parse({"format": 1, "rows": [r.as_json() for r in rows.values()]}) == rows


@pytest.mark.parametrize(
    ("source", "shapes", "dtype", "expected"),
    [
        (MATMUL, MATMUL_SHAPES, "float32", ("dot", "float32", 128, "none")),
        (MATMUL, MATMUL_SHAPES, "bfloat16", ("dot", "bfloat16", 128, "none")),
        (
            "S[i,j] := Q[i,d] * K[j,d] * (j <= i)",
            {"Q": (50, 64), "K": (50, 64)},
            "float32",
            ("dot", "float32", 64, "masked"),
        ),
        (
            "O[i,e] := P[i,j] * V[j,e] * (j <= i)",
            {"P": (300, 300), "V": (300, 32)},
            "float32",
            ("dot", "float32", 512, "bounded"),
        ),
        (
            "(logsumexp) L[i] := X[i,j]",
            {"X": (8, 5000)},
            "float32",
            ("reduce", "float32", 1024, "none"),
        ),
        ("Y[i,j] := exp(X[i,j])", {"X": (8, 9)}, "float16", ("elementwise", "float16", 0, "none")),
    ],
)
def test_the_key_of_a_program_is_its_kind_dtype_extent_bucket_and_mask(
    source, shapes, dtype, expected
):
    nest = nest_of(source)
    dtypes = {**{op.name: dtype for op in nest.operands}, nest.output: dtype}
    assert tuning_key(nest, shapes, dtypes) == tuning.TuningKey(*expected)


def test_without_a_row_the_default_row_is_used_and_says_so(table):
    program = tile_program(nest_of(MATMUL), MATMUL_SHAPES)
    assert program.tuning == tuning.default_row(tuning.TuningKey("dot", "float32", 128, "none"))
    assert "default: no measured row" in program.describe()
    assert [a.tile for a in program.grid] == [32, 32] and program.terms[0].reduced[0].tile == 32


def test_a_row_sets_the_tiles_of_the_program(table):
    key = tuning.TuningKey("dot", "float32", 128, "none")
    table[key] = _row(key, free_tile=64, reduced_tile=16)
    program = tile_program(nest_of(MATMUL), MATMUL_SHAPES)
    assert program.tuning is table[key]
    assert [a.tile for a in program.grid] == [64, 64]
    assert program.terms[0].reduced[0].tile == 16
    assert "free tile 64, reduced tile 16" in program.describe()


def _launch_settings(text: str) -> list[tuple[int, int]]:
    found = re.findall(r"num_stages = (\d+) : i32, num_warps = (\d+) : i32", text)
    return [(int(warps), int(stages)) for stages, warps in found]


def test_a_rows_tiles_and_launch_settings_reach_the_kernel(table):
    key = tuning.TuningKey("dot", "float32", 128, "none")
    table[key] = _row(key, free_tile=64, reduced_tile=16, num_warps=8, num_stages=3)
    k = td.kernel(MATMUL, backend="pallas")
    rng = np.random.default_rng(7)
    a, b = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in MATMUL_SHAPES.values())
    with lowering_for_gpu():
        text = jax.jit(k).trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert _launch_settings(text) == [(8, 3)]
    assert "grid_x = 2 : i32, grid_y = 2 : i32" in text  # 100 x 90 in tiles of 64
    # The same row in interpret mode: the product, against float64.
    want = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    np.testing.assert_allclose(np.asarray(k(a, b)), want, rtol=1e-5, atol=1e-5)


def test_without_a_row_the_kernel_launches_with_the_defaults(table):
    k = td.kernel(MATMUL, backend="pallas")
    a, b = (jnp.ones(s, jnp.float32) for s in MATMUL_SHAPES.values())
    with lowering_for_gpu():
        text = jax.jit(k).trace(a, b).lower(lowering_platforms=("cuda",)).as_text()
    assert _launch_settings(text) == [(4, 2)]


def test_explain_shows_the_tuning_row_and_precision_of_each_kernel():
    k = td.kernel("S[i,j] := Q[i,d] * K[j,d] * (j <= i)", precision="highest")
    text = k.explain({"Q": (100, 64), "K": (100, 64)}, target="pallas", summary=False)
    tiles = text[text.index("pallas tile programs") :]
    assert tiles.count("tuning (dot, float32, reduced extent <= ") == 3
    assert tiles.count("default: no measured row") == 3
    assert (
        tiles.count("dots on a GPU: exact float32 (FMAs, no tensor cores) (precision highest") == 3
    )
    plain = td.kernel("S[i,j] := Q[i,d] * K[j,d] * (j <= i)")
    text = plain.explain({"Q": (100, 64), "K": (100, 64)}, target="pallas", summary=False)
    assert "TF32 tensor cores, float32 accumulation (jnp's default) (precision default" in text


GOOD = {
    "kind": "dot",
    "dtype": "bfloat16",
    "reduced": 64,
    "mask": "bounded",
    "free_tile": 64,
    "reduced_tile": 32,
    "num_warps": 4,
    "num_stages": 3,
    "backend": "pallas",
    "source": "measured on NVIDIA H200, 2027-01-01: an example",
}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"free_tile": 48}, "free_tile 48 is not a power of two"),
        ({"reduced_tile": 8}, "a dot's tiles are at least 16 wide"),
        ({"kind": "gemm"}, "kind 'gemm' is none of dot, reduce, elementwise"),
        ({"reduced": 100}, "reduced 100 is no bucket"),
        ({"mask": "causal"}, "mask 'causal' is none of none, bounded, masked"),
        ({"num_stages": 0}, "num_stages 0 is not in 1..8"),
        ({"backend": "xla"}, "backend 'xla' is none of"),
        ({"source": "fast"}, "source must say 'measured on <device>, <date>: ...'"),
    ],
)
def test_a_bad_row_is_refused_with_what_is_wrong(change, words):
    assert tuning.parse({"format": 1, "rows": [GOOD]})  # the row as given is good
    with pytest.raises(ValueError, match=re.escape(words)):
        tuning.parse({"format": 1, "rows": [{**GOOD, **change}]})


def test_a_table_of_another_format_or_with_a_key_twice_is_refused():
    with pytest.raises(ValueError, match="tuning table of format 2; expected 1"):
        tuning.parse({"format": 2, "rows": []})
    with pytest.raises(ValueError, match="a second row for dot, bfloat16"):
        tuning.parse({"format": 1, "rows": [GOOD, GOOD]})
    with pytest.raises(ValueError, match="missing or unknown field 'source'"):
        tuning.parse({"format": 1, "rows": [{k: v for k, v in GOOD.items() if k != "source"}]})


def test_a_programs_explain_shows_its_precision():
    p = td.program("S[i,j] := Q[i,d] * K[j,d]; O[i,e] := S[i,j] * V[j,e]", precision="highest")
    shapes = {"Q": (40, 16), "K": (40, 16), "V": (40, 16)}
    text = p.explain(shapes, target="pallas")
    tiles = text[text.index("pallas tile programs") :]
    assert "(precision highest, tolerance 1e-05)" in tiles
    assert "(precision default" not in tiles
