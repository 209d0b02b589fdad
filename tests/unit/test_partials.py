"""codegen.passes.partials: which gradient nests split into per-row partial sums, and what
the partial nest is (its numbers are checked in tests/jax/test_score_parameters.py)."""

from __future__ import annotations

import pytest

from codegen.ir.nest import LoopNest, Operand, Range, Reduce, Term, index_symbol, tensor_base
from codegen.passes.partials import row_partials

h, b, i, j, d = (index_symbol(n) for n in "hbijd")
A = tensor_base("A")


def _nest(free_extent: int = 2, rows: int = 64, inner=None, body=None) -> LoopNest:
    reduced = (Range(b, 0, 2), Range(i, 0, rows), inner or Range(j, 0, i + 1))
    term = Term(A[b, h, i, j] * (j - i) if body is None else body, reduced)
    return LoopNest("dW", (Range(h, 0, free_extent),), (term,), (Operand("A", 4),))


SHAPES = {"A": (2, 2, 64, 64), "dW": (2,)}


def test_a_short_gradient_over_many_rows_splits():
    rows = row_partials(_nest(), SHAPES)
    assert rows is not None
    assert [r.index for r in rows.nest.free] == [h, b, i]
    assert [r.index for r in rows.nest.terms[0].reduced] == [j]
    assert rows.nest.terms[0].reduced[0].stop == i + 1  # the key range still follows the row
    assert rows.summed == (1, 2)


@pytest.mark.parametrize(
    ("nest", "why"),
    [
        (_nest(free_extent=2048), "enough free points already"),
        (_nest(rows=8), "too few rows to gain"),
        (
            LoopNest(
                "dW",
                (Range(h, 0, 2),),
                (Term(A[0, h, 0, j], (Range(j, 0, 64),)),),
                (Operand("A", 4),),
            ),
            "one reduced index: nothing to split off",
        ),
        (
            LoopNest(
                "dW",
                (Range(h, 0, 2),),
                (Term(A[b, h, i, j], (Range(b, 0, 2), Range(i, 0, h + 8), Range(j, 0, 64))),),
                (Operand("A", 4),),
            ),
            "a row range that moves with a free index is no rectangle",
        ),
        (
            _nest(body=Reduce("sum", A[b, h, i, i], i, 0, 4) * A[b, h, i, j]),
            "a body that binds a split index again",
        ),
    ],
)
def test_what_does_not_split(nest, why):
    assert row_partials(nest, SHAPES) is None, why
