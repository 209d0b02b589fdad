"""Every CUDA nest of the corpus, run under the CUDA emulator, against the float64 reference.

* every forward, auxiliary and gradient nest with the heuristic's schedule in float32, in
  both scheduling orders (all kernels compiled in a few translation units): by default those
  of the corpus's sample (`tests/sampling.py`: every function, reduction and kind of access),
  with `-m exhaustive` those of every corpus case;
* a representative subset (every GPU strategy: thread, tile, smem, pairwise, block, split,
  rows, columns; int32 and int64 indices; one and two reduction states; integer outputs and
  inputs; several terms; constraint bounds) with every candidate schedule, in float32, float64,
  float16 and bfloat16, both orders, inputs longer than the corpus's so that several blocks and
  tiles run; in float64 also with grids of at most 2 x 2 x 2 blocks (every loop is grid-stride).

`TENSORDSL_EMULATOR_FULL=1` (`make test-emulator-full`) runs the subset's matrix on every
nest. Needs a C++ compiler and the CUDA headers, no GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import os

import pytest

from codegen.cuda.emulator import emulate
from codegen.cuda.schedule import candidate_gpu_schedules
from tests.compile_only.nests import all_nests
from tests.corpus import CORPUS
from tests.gpu import emulated
from tests.sampling import by_case, corpus_sample_names, selected_params

pytestmark = pytest.mark.skipif(
    not emulate.available(), reason=f"CUDA emulator: {emulate.unavailable_reason()}"
)
FULL = os.environ.get("TENSORDSL_EMULATOR_FULL", "0") not in ("", "0")
DTYPES = ("float32", "float64", "float16", "bfloat16")
ORDERS = ("forward", "reverse")
#: nest id -> how many times longer its inputs are than the corpus's.
SUBSET = {
    "matmul-forward": 3,  # smem (4x4 and 2x1 register tiles), tile, thread, block
    "matmul-grad_A": 3,
    "conv2d_channels-forward": 1,  # smem with a batch index on blockIdx.z
    "pairwise_sq_dist-forward": 3,  # pairwise (4x4 and 2x1 register tiles), not a product
    "logsumexp_rows-forward": 3,  # two reduction states
    "logsumexp_full-forward": 3,  # split (and block), two states
    "full_inner_product-forward": 3,  # split (and block)
    "row_max-argument": 3,  # integer output
    "row_max-grad_X": 3,  # integer input compared with indices
    "conv1d_valid-grad_X": 3,  # constraint bounds
    "stencil_1d-grad_X": 3,  # two terms
    "prod_with_zero-grad_X": 2,  # prod's auxiliary nests as inputs
}
IDS = tuple(n.id for n in all_nests())
#: Full: every nest; those outside SUBSET at the corpus's sizes (some references fix shapes).
MATRIX = {i: SUBSET.get(i, 1) for i in IDS} if FULL else SUBSET


@functools.cache
def instance(nest_id: str, factor: int = 1) -> emulated.Instance:
    case = nest_id.split("-")[0]
    (found,) = (i for i in emulated.corpus_instances((case,), factor) if i.id == nest_id)
    return found


@pytest.fixture(scope="module")
def heuristic_float32(request: pytest.FixtureRequest) -> None:
    """Compile the float32 kernel of every nest this run tests, with the heuristic's schedule,
    up front (the nests of the default sample, or every nest with `-m exhaustive`)."""
    selected = {p["nest_id"] for p in selected_params(request, "test_heuristic_schedule_float32")}
    emulated.build_all(emulated.launch(instance(i), "float32") for i in IDS if i in selected)


@pytest.fixture(scope="module")
def every_schedule() -> None:
    """Compile the matrix's kernels: every candidate schedule in every dtype, up front."""
    launches = []
    for nest_id, factor in MATRIX.items():
        inst = instance(nest_id, factor)
        for schedule in candidate_gpu_schedules(inst.nest):
            launches += [emulated.launch(inst, dtype, schedule) for dtype in DTYPES]
    emulated.build_all(launches)


@pytest.mark.parametrize(
    "nest_id", by_case(IDS, corpus_sample_names(CORPUS), lambda i: i.split("-")[0])
)
def test_heuristic_schedule_float32(nest_id: str, heuristic_float32: None) -> None:
    emulated.check(instance(nest_id), "float32", [None], ORDERS)


@pytest.mark.slow  # every candidate schedule: the heuristic's own run above is the quick check
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nest_id", sorted(MATRIX))
def test_every_schedule_dtype_and_order(nest_id: str, dtype: str, every_schedule: None) -> None:
    inst = instance(nest_id, MATRIX[nest_id])
    schedules = candidate_gpu_schedules(inst.nest)
    emulated.check(inst, dtype, schedules, ORDERS)
    if dtype != "float64":
        return
    want = emulated.expected(inst, dtype)
    for schedule in schedules:
        launch = emulated.launch(inst, dtype, schedule)
        grids = tuple(tuple(min(g, 2) for g in grid) for grid in launch.grids)
        small = dataclasses.replace(launch, grids=grids)
        got = emulated.run(inst, small, dtype)
        emulated.assert_close(got, want, dtype, f"{nest_id} {schedule.describe()} grid<=2")


def test_the_subset_covers_every_strategy_and_index_type() -> None:
    found = {
        (s.strategy, s.index_type)
        for nest_id in SUBSET
        for s in candidate_gpu_schedules(instance(nest_id).nest)
    }
    strategies = {"thread", "tile", "smem", "pairwise", "block", "split", "rows", "columns"}
    assert {(s, i) for s in strategies for i in ("int32",)} <= found
    assert {s for s, i in found if i == "int64"} >= {"thread", "smem", "split"}
