"""The scores of a pair (`codegen.cuda.attention.paired`: attention's dV and dK in one weighted
kernel) read from the staged weights where they hold the same values.

The pair's weights `ws_[key][column]` hold, per key tile, `b1(i, c)` for the first member's
columns and `b2(i, c - C1)` for the second's: attention's `dO[i, :]` and `Q[i, :]`. Its
scores read the same rows inside their nested sums, `sum_d Q[i, d] * K[j, d]` and
`sum_e dO[i, e] * V[j, e]`, once per (row, key) pair from global memory. `staged_term`
rewrites each such read into `WS_[i - j0_, d + offset]`, a read of `ws_`; `condition` is
what must hold at run time for it (the nested ranges inside the staged columns, all
columns in one pass), else the kernel reads as written. The kernel stages the weights before
the key tile and its barrier (`codegen.cuda.attention.key_tiles.stage`), so the rewrite is used only
where a key tile is staged.
"""

from __future__ import annotations

import dataclasses

import sympy

from codegen.cuda.attention.key_tiles import ORIGIN
from codegen.cuda.geometry import ONLINE_COLUMNS
from codegen.emit.printer import TensorView
from codegen.ir.nest import LoopNest, Reduce, Term, tensor_base

#: The tensor name of the staged weights in a rewritten score (not a user's name).
STAGED = "WS_"
#: The row length of a pair's `ws_`: odd, so that the lanes of a row, reading keys
#: `l, l + lanes, ...` of the same column, read distinct banks (as `ks_`).
PITCH = ONLINE_COLUMNS + 1
#: How the printer reads it: the first element of `ws_[keys][PITCH]`, flat.
VIEW = TensorView("(&ws_[0][0])", (str(PITCH), None), "{}")


def pitch(paired: bool) -> int:
    """The row length of `ws_`: `PITCH` for a pair, else `ONLINE_COLUMNS` (the lanes of a
    row read one key's consecutive columns: no conflict)."""
    return PITCH if paired else ONLINE_COLUMNS


def staged_term(nest: LoopNest, key: sympy.Symbol) -> tuple[Term, tuple[sympy.Expr, ...]] | None:
    """The score term of the kernel's terms `nest.terms` (a pair's: a tuple of weights, and
    the weighted values as `Piecewise((b1, c < C1), (b2, True))`) with the reads that `ws_`
    holds rewritten, and the expressions that must be `>= 0` for it; None where none."""
    score, values = nest.terms
    if not isinstance(score.body, sympy.Tuple):
        return None
    (b1, test), (b2, _) = values.body.args
    column, split, stop = nest.free[-1].index, test.rhs, nest.free[-1].stop
    members = ((b1, sympy.Integer(0), split), (b2, split, stop))
    rewrites, conditions = {}, [ONLINE_COLUMNS - (stop - nest.free[-1].start)]
    for nested in sorted(score.body.atoms(Reduce), key=str):
        if nested.body.atoms(Reduce):  # rewritten from the inside out: not here
            continue
        d, found = nested.index, {}
        for access in sorted(nested.body.atoms(sympy.Indexed), key=str):
            for value, offset, end in members:
                if access == value.xreplace({column: d + offset}):
                    found[access] = tensor_base(STAGED)[key - ORIGIN, d + offset]
                    conditions += [nested.start, end - (nested.stop + offset)]
        if found:
            body = nested.body.xreplace(found)
            rewrites[nested] = Reduce(nested.reduction, body, d, nested.start, nested.stop)
    if not rewrites:
        return None
    return dataclasses.replace(score, body=score.body.xreplace(rewrites)), tuple(conditions)
