"""Tullio.jl's own tests (test/parsing.jl, test/gradients.jl, test/einsum.jl in
mcabbott/Tullio.jl), translated into this language and run on the reference and C back ends.

One case per `@test` / `@test_throws` (or per statement Tullio only runs); conventions in
harness.py. What cannot be expressed is listed in `SKIPPED`, each with its reason, and runs
as a skipped test that prints it: in-place updates, scatter, index arrays (issue 25 §1),
Julia's own types and macro options. The C half of the gradient cases is marked slow (it
compiles about a hundred gradient kernels).
"""

from __future__ import annotations

import shutil

import jax
import numpy as np
import pytest

import tensordsl as td
from codegen import config
from tests.tullio import cases_einsum, cases_gradients, cases_parsing
from tests.tullio.harness import Case, Skip

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

CASES: list[tuple[str, Case]] = [
    *(("parsing", c) for c in cases_parsing.CASES),
    *(("gradients", c) for c in cases_gradients.CASES),
    *(("einsum", c) for c in cases_einsum.CASES),
]
#: Every Tullio test that the language cannot express, with the reason.
SKIPPED: list[tuple[str, Skip]] = [
    *(("parsing", s) for s in cases_parsing.SKIPS),
    *(("gradients", s) for s in cases_gradients.SKIPS),
    *(("einsum", s) for s in cases_einsum.SKIPS),
]
HAVE_CC = shutil.which(config.c_compiler()) is not None
NO_CC = pytest.mark.skipif(not HAVE_CC, reason=f"no C compiler {config.c_compiler()!r}")


def _params() -> list:
    params = []
    for file, case in CASES:
        for backend in ("reference", "c"):
            marks = [NO_CC] if backend == "c" else []
            if backend == "c" and file == "gradients":
                marks.append(pytest.mark.slow)
            params.append(
                pytest.param(case, backend, id=f"{file}-{case.id}-{backend}", marks=marks)
            )
    return params


@pytest.mark.parametrize(("case", "backend"), _params())
def test_translated(case: Case, backend: str) -> None:
    case.check(lambda: case.build(backend), case.inputs)


@pytest.mark.parametrize("backend", ["reference", pytest.param("c", marks=NO_CC)])
@pytest.mark.parametrize("name", ["ties_max", "ties_min"])
def test_ties_go_to_the_first(name: str, backend: str) -> None:
    """Tullio: `_gradient(f1, [2,2,3,3]) in ([0,0,1,0], [0,0,0,1])` and `_gradient(f2,
    [2,2,3,3]) == [1,0,0,0]`: here always the first extreme, as jnp."""
    source, want = next((s, w) for n, s, w in cases_gradients.TIES if n == name)
    kernel = td.kernel(source, backend=backend)
    got = jax.grad(lambda x: kernel(x))(np.array([2.0, 2, 3, 3]))
    assert got.tolist() == want.tolist()


@pytest.mark.parametrize("skip", [pytest.param(s, id=f"{file}-{s.id}") for file, s in SKIPPED])
def test_not_expressible(skip: Skip) -> None:
    pytest.skip(f"{skip.tullio}: {skip.reason}")


def test_ids_unique() -> None:
    ids = [f"{f}-{c.id}" for f, c in CASES] + [f"{f}-{s.id}" for f, s in SKIPPED]
    assert len(ids) == len(set(ids))
