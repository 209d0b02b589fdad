"""Two weighted gradient nests packed into one (attention's dK and dV, each a sum over the
query rows): the record the back ends' pairing returns (`Pair`), and the two rewrites
both pairings make of their members before comparing them. The CUDA pairing is
`codegen.cuda.attention.paired`, the tile programs' `codegen.tiles.attention.pairs`; the
`Backend` record's `pairs` field gives one or the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sympy

from codegen.ir.nest import LoopNest, extent_of, map_expressions


@dataclass(frozen=True)
class Pair:
    """The packed nest of two weighted gradient nests: `outputs[0]` is its columns
    `[0, split)`, `outputs[1]` the rest."""

    nest: LoopNest
    outputs: tuple[str, str]
    split: int
    #: Other gradient nests (of score parameters) that the pair's kernel computes too, as
    #: per-tile partial sums (`codegen.tiles.attention.partials`); empty: none.
    extras: tuple[LoopNest, ...] = ()


def renamed_indices(nest: LoopNest, mapping: Mapping[sympy.Symbol, sympy.Symbol]) -> LoopNest:
    """`nest` with its loop indices renamed at once (through stand-ins, so swaps work)."""
    stand = {old: sympy.Dummy(old.name, integer=True) for old in mapping}
    back = {stand[old]: new for old, new in mapping.items()}
    return map_expressions(nest, lambda x: sympy.sympify(x).xreplace(stand).xreplace(back))


def folded_extents(nest: LoopNest, extents: Mapping[sympy.Symbol, sympy.Integer]) -> LoopNest:
    """`nest` with each max and min of extents alone replaced by its value for the call's
    shapes (the relative bias's `Max(0, Q.shape[1] - R.shape[1] + T)` offsets, 0 where R
    covers every `i - j`): the pair is made for these shapes, and the two members' scores
    then read alike, so their common sub-expressions are computed once."""
    found = {
        x
        for e in nest.expressions()
        for x in sympy.sympify(e).atoms(sympy.Max, sympy.Min)
        if x.free_symbols and all(extent_of(s) is not None for s in x.free_symbols)
    }
    values = {x: x.xreplace(extents) for x in found}
    return map_expressions(nest, lambda x: sympy.sympify(x).xreplace(values))
