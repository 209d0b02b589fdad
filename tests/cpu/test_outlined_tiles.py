"""Tile cases emitted as functions of their own (`codegen.c.tiles.outline`) against numpy float64.

Every case body of a tile and dot schedule is outlined here (`OUTLINE_LINES = 1`), so that
each kind of case (interior, edge, reduced edge; full and partial tiles) runs through a call
that must pass it every loop variable it reads.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from cases import BY_NAME, CASES, Case
from test_c_backend import check, run_case

from codegen.c.emit import emit_c
from codegen.c.run.build import build_c, clear_memory_cache
from codegen.c.schedule import Schedule, candidate_schedules
from codegen.c.tiles import outline
from codegen.emit.emitter import Emitter
from tests.backends import NEEDS_C_COMPILER

pytestmark = NEEDS_C_COMPILER
TILED = [
    case
    for case in CASES
    if any(s.strategy in ("tile", "dot") for s in candidate_schedules(case.nest))
]


@pytest.fixture(autouse=True)
def _outline_everything(tmp_path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(outline, "OUTLINE_LINES", 1)
    monkeypatch.setitem(os.environ, "TENSORDSL_CACHE_DIR", str(tmp_path))
    clear_memory_cache()
    yield
    clear_memory_cache()


def test_some_cases_have_tiles() -> None:
    assert {"matmul", "conv_grad"} <= {case.name for case in TILED}


@pytest.mark.parametrize("case", TILED, ids=lambda c: c.name)
def test_outlined_cases_agree(case: Case) -> None:
    dtypes = dict.fromkeys([*case.nest.operand_names, case.nest.output], "float64")
    for schedule in candidate_schedules(case.nest):
        if schedule.strategy not in ("tile", "dot"):
            continue
        text = emit_c(case.nest, dtypes=dtypes, schedule=schedule).text
        assert "static __attribute__((noinline)) void tdsl_case0_(" in text
        out, expected = run_case(case, "float64", schedule, seed=3)
        check(out, expected, "float64")


@pytest.mark.parametrize("taps", [1, 5, 40])
@pytest.mark.parametrize(("strategy", "width"), [("tile", 4), ("tile", 32), ("dot", 3)])
def test_outlined_edge_tiles_agree(taps: int, strategy: str, width: int) -> None:
    # conv_grad's interior, edge and partial tiles along p, each case a function.
    case = BY_NAME["conv_grad"]
    rng = np.random.default_rng(taps)
    arrays = {"dY": rng.standard_normal(44), "W": rng.standard_normal(taps)}
    expected = np.asarray(case.reference(**arrays))
    schedule = Schedule(("p",), (("k",),), strategy=strategy, vector="p", width=width)
    dtypes = dict.fromkeys(["dY", "W", "dX"], "float64")
    text = emit_c(case.nest, dtypes=dtypes, schedule=schedule).text
    assert text.count("static __attribute__((noinline)) void tdsl_case") >= 4

    out = np.full(expected.shape, np.nan)
    operands = [arrays[name] for name in case.nest.operand_names]
    build_c(case.nest, dtypes=dtypes, schedule=schedule)(out, operands, case.extents(arrays))
    check(out, expected, "float64")


def test_short_bodies_stay_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outline, "OUTLINE_LINES", 3)
    nest = BY_NAME["matmul"].nest
    e = Emitter(
        nest, {"A": "float32", "B": "float32", "C": "float32"}, candidate_schedules(nest)[0]
    )
    body = ["x_ = o_i + 1;", "y_ = x_;"]
    names = [("o_i", "const int64_t"), ("n_", "const int64_t")]
    assert outline.outlined_call(e, body, names) == body
    call = outline.outlined_call(e, [*body, "z_ = y_;"], [*names, names[0]])
    assert call == ["tdsl_case0_(out, operands, params, o_i, n_);"]
    (name, args, lines) = e.outlined[0]
    assert (name, args, lines) == (
        "tdsl_case0_",
        (("o_i", "const int64_t"), ("n_", "const int64_t")),
        (*body, "z_ = y_;"),
    )


def test_the_padded_copies_record_what_they_declare() -> None:
    """The variables an outlined case may take (`Prepared.declared`) are the top-level
    declarations of the lines that make the padded copies, with their types, in order."""
    import re

    import sympy

    from codegen.c.schedule import choose_cpu_schedule
    from codegen.c.tiles.padding import lane_masks, prepare_lines
    from codegen.c.tiles.tiles import _tile_paths
    from codegen.passes import grad
    from tensordsl.frontend.lower import lower
    from tensordsl.frontend.parse import parse

    forward = lower(parse("Y[o,y,x] := X[c,y+p,x+q] * W[o,c,p,q]")).nest
    nest = grad.gradient(forward, "X").nest
    dtypes = dict.fromkeys((*nest.operand_names, nest.output), "float32")
    e = Emitter(nest, dtypes, choose_cpu_schedule(nest, dtypes, kernel=True))
    paths = _tile_paths(e)
    vector = sympy.Symbol(e.schedule.vector or "", integer=True)
    masks = lane_masks(paths.edge, paths.tests, vector)
    assert masks is not None
    made = prepare_lines(e, masks)
    top = re.compile(r"^((?:const )?\w+(?: \*)?)\s*(\w+) = ")
    written = [(m.group(2), m.group(1)) for line in made.lines if (m := top.match(line))]
    assert list(made.declared) == written
    assert {t for _, t in made.declared} == {"const int64_t", "float *", "int32_t *"}
