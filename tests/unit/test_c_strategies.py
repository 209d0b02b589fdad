"""Every C strategy is one `Strategy` record (`codegen/c/strategies.py`); every record with a
kernel has a golden source in tests/golden/c (those of the scalar, tile, dot and split
strategies pinned by tests/cpu/test_c_backend.py, the others' here); no module of
`codegen/c` compares strategy names.

Pure Python (no compiler). `TENSORDSL_UPDATE_GOLDEN=1` rewrites the files pinned here, on
purpose only.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from codegen.c.emit import emit_c
from codegen.c.schedule import CPU_STRATEGIES, choose_cpu_schedule
from codegen.c.strategies import BY_NAME, STRATEGIES
from codegen.ir.members import switch
from codegen.ir.nest import LoopNest, Operand, Range, Term, index_symbol, tensor_base
from tests.strategy_cases import ATTENTION
from tests.unit.test_cuda_strategies import name_tests

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "c"
#: The strategies with no generated kernel: XLA's dot computes the nest (the runner's).
WITHOUT_KERNEL = {"xla"}


def _statement(source: str) -> Callable[[], LoopNest]:
    def build() -> LoopNest:
        from tensordsl.frontend.lower import lower
        from tensordsl.frontend.parse import parse

        return lower(parse(source)).nest

    return build


def _one_pass() -> LoopNest:
    """Causal attention's forward as the C back end runs it: one pass (`LoopNest.online`)."""
    import numpy as np

    import tensordsl as td
    from codegen.passes.online import pair_stored
    from tensordsl.binding.programs import compiled_statements

    rng = np.random.default_rng(5)
    values = {name: rng.uniform(-2.0, 2.0, (2, 37, 6)) for name in "QKV"}
    k = td.kernel(ATTENTION, outputs=("O", "L"), fuse={"S": "inline"})
    nests = pair_stored(compiled_statements(k.program, values, "c", k.fuse))
    (nest,) = [n for n in nests if n.online]
    return nest


def _members() -> LoopNest:
    """Two outputs of one loop nest packed along `m` (`codegen.ir.members`)."""
    j, i, m = (index_symbol(n) for n in "jim")
    A, b = tensor_base("A"), tensor_base("b")
    body = switch(m, (A[i, j] * b[i], A[i, j] ** 2))
    return LoopNest(
        "G",
        (Range(j, 0, 40), Range(m, 0, 2)),
        (Term(body, (Range(i, 0, 30),)),),
        (Operand("A", 2), Operand("b", 1)),
    )


def _row_passes() -> LoopNest:
    """Softmax's program with its row maximum and sum recomputed as passes over each row of
    P (`codegen.passes.row_passes`): one kernel, exp(X - M) kept in the output row."""
    from codegen.ir.examples import softmax_program
    from codegen.passes.row_passes import row_passes

    shapes = {"X": (64, 96), "M": (64,), "Z": (64,), "P": (64, 96)}
    (nest,) = row_passes(softmax_program(), outputs=("P",), shapes=shapes)[0]
    return nest


#: A nest per strategy that no golden of tests/cpu/test_c_backend.py pins.
CASES: dict[str, Callable[[], LoopNest]] = {
    "online": _one_pass,
    "select": _statement("(topk 5) V[i,r] := X[i,j] * w[j]"),
    "members": _members,
    "row_passes": _row_passes,
    "unroll": _statement("Y[f,p] := X[f,p] * C[f] + (2*p - 1) * X[f,1-p] * S[f]"),
}


def _golden_strategies() -> set[str]:
    """The strategies named in the header comment (`schedule: strategy=...`) of a golden."""
    found: set[str] = set()
    for path in sorted(GOLDEN.glob("*.c")):
        found |= set(re.findall(r"^ \* schedule: strategy=(\w+)", path.read_text(), re.M))
    return found


def test_every_strategy_is_one_record() -> None:
    """The heuristic's strategies are the records, in order; xla has no body."""
    names = [s.name for s in STRATEGIES]
    assert len(names) == len(set(names)) == len(BY_NAME)
    assert tuple(names) == CPU_STRATEGIES
    assert STRATEGIES[-1].name == "scalar"  # the fallback: applies to every nest
    for record in STRATEGIES:
        assert (record.body is None) == (record.name in WITHOUT_KERNEL)


def test_every_record_with_a_kernel_has_a_golden() -> None:
    kernels = set(BY_NAME) - WITHOUT_KERNEL
    golden = _golden_strategies()
    assert golden == kernels, sorted(golden ^ kernels)


@pytest.mark.parametrize("strategy", sorted(CASES))
def test_the_strategy_source_is_the_golden_one(strategy: str) -> None:
    nest = CASES[strategy]()
    dtypes = dict.fromkeys((*nest.operand_names, nest.output), "float32")
    assert choose_cpu_schedule(nest, dtypes, kernel=True).strategy == strategy
    text = emit_c(nest, dtypes=dtypes).text
    path = GOLDEN / f"strategy_{strategy}.c"
    if os.environ.get("TENSORDSL_UPDATE_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"missing {path}; run with TENSORDSL_UPDATE_GOLDEN=1"
    assert text == path.read_text()


def test_no_module_tests_strategy_names() -> None:
    """The schedule, the emitter and explain read the record (`Strategy`) of a schedule's
    strategy; a test such as `strategy == "tile"` in `codegen/c` fails here."""
    found = {
        path.relative_to(ROOT).as_posix(): n
        for path in sorted((ROOT / "codegen" / "c").rglob("*.py"))
        if (n := name_tests(path.read_text()))
    }
    assert found == {}


def test_tiles_refuse_a_bound_that_is_not_affine_in_a_tiled_index() -> None:
    """dB of `where(j < i + 1, B[2i] + A[i, j], 0)` sums over `j <= floordiv(p, 2)`: no tile
    strategy takes it (their corners bound affine constraints only), and a forced dot
    schedule is refused rather than emitted with an undeclared lane variable."""
    import dataclasses

    from codegen.c.schedule import validate
    from codegen.passes import grad

    forward = _statement("Y[i] := where(j < i + 1, B[2i] + A[i, j], 0)")()
    nest = grad.gradient(forward, "B").nest
    schedule = choose_cpu_schedule(nest, dict.fromkeys(["A", "B", "dY", nest.output], "float64"))
    assert schedule.strategy not in ("tile", "dot", "unroll"), schedule.describe()
    free = tuple(r.index.name for r in nest.free)
    dot = dataclasses.replace(
        schedule, strategy="dot", free_order=free, row=None, vector=free[-1], width=4, lanes=4
    )
    with pytest.raises(ValueError, match="not affine in the tiled"):
        validate(nest, dot)


def test_a_short_output_axis_gets_a_half_width_tile_with_twice_the_rows():
    """A convolution's 16 output channels under 32 float lanes: the run-time `small` tile."""
    from tensordsl.frontend.lower import lower
    from tensordsl.frontend.parse import parse

    nest = lower(parse("Y[n,h,w,o] := X[n,h+p,w+q,c] * K[p,q,c,o]")).nest
    dtypes = {"X": "float32", "K": "float32", "Y": "float32"}
    tile = choose_cpu_schedule(nest, dtypes, kernel=True)
    assert (tile.strategy, tile.vector, tile.rows, tile.width) == ("tile", "o", 6, 32)
    assert tile.small is not None
    assert (tile.small.strategy, tile.small.rows, tile.small.width) == ("tile", 12, 16)
