"""Tile programs as data (codegen/tiles): pure Python, no JAX kernel machinery."""

from __future__ import annotations

import pytest
import sympy

from codegen.errors import Unsupported
from codegen.ir.examples import gaussian, matmul
from codegen.ir.nest import (
    LoopNest,
    Operand,
    Range,
    Reduce,
    Term,
    extent_symbol,
    index_symbol,
    tensor_base,
)
from codegen.tiles.attention.build import attention_program
from codegen.tiles.build import tile_program
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse


def nest_of(source: str, **options):
    return lower(parse(source), **options).nest


def test_matmul_is_one_dot_over_a_grid_of_output_tiles():
    program = tile_program(matmul(), {"A": (100, 70), "B": (70, 30)})
    assert [(a.index.name, a.extent, a.tile, a.count) for a in program.grid] == [
        ("i", 100, 32, 4),
        ("j", 30, 32, 1),
    ]
    (term,) = program.terms
    assert term.dot is not None
    assert (term.dot.rows.name, term.dot.reduced.name, term.dot.columns.name) == ("i", "k", "j")
    assert [(a.index.name, a.tile, a.count) for a in term.reduced] == [("k", 32, 3)]
    assert program.padded_shape == (128, 32)
    assert not term.masked  # a dot zeroes the tail of its last reduced tile itself
    assert {load.kind for load in term.loads} == {"tile"}


def test_dot_tiles_are_at_least_sixteen_wide():
    program = tile_program(matmul(), {"A": (3, 5), "B": (5, 2)})
    assert program.block == (16, 16)
    assert program.terms[0].reduced[0].tile == 16


def test_elementwise_body_is_tile_code_with_a_masked_tail():
    program = tile_program(gaussian(), {"X": (20, 2), "Z": (37, 2), "B": (37,)})
    (term,) = program.terms
    assert term.dot is None
    assert term.masked  # 37 keys in tiles of 16
    assert program.grid[0].tile == 32
    text = program.describe()
    assert "elementwise tile code" in text and "3 tiles of 16" in text


def test_causal_gradient_bounds_its_loop_per_output_tile():
    nest = nest_of("dQ[i,d] := dY[i,j] * K[j,d] * (j <= i)")
    program = tile_program(nest, {"dY": (100, 100), "K": (100, 64)})
    (term,) = program.terms
    assert [(b.index.name, b.coefficient) for b in term.bounds] == [("j", -1)]
    assert "bound j: j <= i (tiles outside never visited)" in program.describe()


def test_causal_scores_are_a_dot_masked_on_boundary_tiles():
    nest = nest_of("S[i,j] := Q[i,d] * K[j,d] * (j <= i)")
    program = tile_program(nest, {"Q": (64, 16), "K": (64, 16)})
    (term,) = program.terms
    assert term.dot is not None and term.masked
    assert "dot: [i x d] @ [d x j]" in program.describe()
    assert "where: on boundary tiles only" in program.describe()


def test_shifted_and_gathered_loads_are_named():
    nest = nest_of("Y[i] := X[i+k] * W[k] + X[2*i]")
    program = tile_program(nest, {"X": (20,), "W": (3,)})
    kinds = {str(load.access): load.kind for t in program.terms for load in t.loads}
    assert kinds["X[i + k]"] == "gather"  # two loop indices in one position
    assert kinds["X[2*i]"] == "gather"
    assert kinds["W[k]"] == "tile"
    shifted = tile_program(nest_of("Y[i] := X[i+1]"), {"X": (20,)})
    assert shifted.terms[0].loads[0].kind == "shifted"


@pytest.mark.parametrize(
    ("source", "reduce", "words"),
    [
        ("(topk 3) V[i,r] := X[i,j]", None, "do not reduce with 'topk' yet"),
        ("Y[i] := X[i,j]", "argmax", None),
    ],
)
def test_what_tile_programs_refuse_is_worded(source, reduce, words):
    nest = nest_of(source, **({"reduce": reduce} if reduce else {}))
    shapes = {"X": (4, 9)}
    if words is None:
        assert tile_program(nest, shapes).reduction == "argmax"
        return
    with pytest.raises(Unsupported, match=words):
        tile_program(nest, shapes)


def test_explain_with_target_pallas_shows_every_nests_tile_program():
    import tensordsl as td

    k = td.kernel("S[i,j] := Q[i,d] * K[j,d] * (j <= i)")
    text = k.explain({"Q": (100, 64), "K": (100, 64)}, target="pallas", summary=False)
    tiles = text[text.index("pallas tile programs") :]
    for nest in ("forward: tile program for S", "grad_Q:", "grad_K:"):
        assert nest in tiles
    assert "grid: 4 x 4 = 16 program instance(s), output tile 32 x 32" in tiles
    assert tiles.count("dot: ") == 3
    assert "bound j: j <= i (tiles outside never visited)" in tiles


def _centred_dq():
    """Attention's float64 dQ nest: `sum_j P * sum_e dO[i,e]*(V[j,e] - O[i,e]) * K[j,p]`,
    whose second nested sum reads the rows (i) on its key side: no tile dot."""
    i, j, d, e, p = (index_symbol(n) for n in "ijdep")
    Q, K, V, L, O, dO = (tensor_base(n) for n in ("Q", "K", "V", "L", "O", "dO"))
    score = Reduce("sum", Q[i, d] * K[j, d], d, 0, extent_symbol("Q", 1))
    centred = Reduce("sum", dO[i, e] * (V[j, e] - O[i, e]), e, 0, extent_symbol("V", 1))
    body = sympy.exp(score - L[i]) * centred * K[j, p]
    rows, cols = Range(i, 0, extent_symbol("Q", 0)), Range(p, 0, extent_symbol("K", 1))
    operands = tuple(Operand(n, 1 if n == "L" else 2) for n in ("Q", "K", "V", "L", "O", "dO"))
    nest = LoopNest(
        "dQ", (rows, cols), (Term(body, (Range(j, 0, extent_symbol("K", 0)),)),), operands
    )
    return nest, {n: (70, 4) for n in ("Q", "K", "V", "O", "dO", "dQ")} | {"L": (70,)}, centred


def test_a_nested_sum_that_is_no_dot_runs_per_pair_in_float64_only():
    nest, shapes, centred = _centred_dq()
    wide = {name: "float64" for name in shapes}
    program = attention_program(nest, shapes, wide)
    assert [n.body for n in program.pairs] == [centred.body]
    assert [str(d.node.body) for d in program.dots] == ["K[j, d]*Q[i, d]"]  # q . k: a dot
    assert (program.rows.tile, program.loop.tile) == (32, 32)
    assert (
        "  per (i, j) pair: sum_e((V[j, e] - O[i, e])*dO[i, e]) (no dot: elementwise on "
        "[i x j x e])"
    ) in program.describe().splitlines()
    narrow = {name: "float32" for name in shapes}
    assert attention_program(nest, shapes, narrow) is None
