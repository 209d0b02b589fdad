"""What the emulator counts per launch (`Counts`), and what a nest needs at least: its useful
FMAs (`useful_fmas`) and its minimum global traffic (`min_global_bytes`).

A kernel built with counting (`emulate.build(..., counting=True)`, text from
`emit_cuda(..., counting=True)`) returns `Counts` from `EmulatedKernel.count`; see
codegen/cuda/emulator/counting.h for how each counter is taken.

Useful FMAs are the nest's own work, each value computed once: every term folds one value
per point of its iteration space (the constraints applied: a causal mask keeps the pairs
`j <= i`); every nested reduction (a score's dot product) does its length per distinct
value of the indices it reads over that space, once however many terms or columns use it.
A one-pass nest (`LoopNest.online`: a logsumexp of scores and the softmax-weighted sum of
weights, packed along the last free index) counts one logsumexp step per score and one FMA
per score and column for the weighted sum.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> nest = lower(parse("C[i,j] := A[i,k] * B[k,j]")).nest
>>> useful_fmas(nest, {"A": (5, 3), "B": (3, 7)})
105
>>> min_global_bytes(nest, {"A": (5, 3), "B": (3, 7)}, {"A": "float32", "B": "float32",
...                                                      "C": "float32"})
284
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np
import sympy

from codegen.ir.extents import output_shape
from codegen.ir.nest import LoopNest, Reduce, Term, extent_of

#: The counters `tdsl_emu_count_read` returns, in its order (counting.h).
COUNTERS = (
    "fmas",
    "loaded",
    "stored",
    "shared_loads",
    "shared_stores",
    "requests",
    "conflicts",
)
ITEM_BYTES = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8}
#: The most points of a term's iteration space counted (one by one, with NumPy).
POINT_LIMIT = 1 << 25


@dataclass(frozen=True)
class Counts:
    """One launch's counters (or a sum of launches').

    fmas: `TDSL_COUNT_FMA` hooks passed (body evaluations and nested reduction steps);
    loaded, stored: bytes of global loads and stores in the launch's arrays;
    shared_loads, shared_stores: shared-memory accesses (one per lane);
    requests: shared-memory requests (a warp's lanes at one access site, once);
    conflicts: wavefronts those requests took past one per phase (bank conflicts).
    """

    fmas: int = 0
    loaded: int = 0
    stored: int = 0
    shared_loads: int = 0
    shared_stores: int = 0
    requests: int = 0
    conflicts: int = 0

    @property
    def global_bytes(self) -> int:
        """Bytes loaded from and stored to global memory."""
        return self.loaded + self.stored

    def __add__(self, other: Counts) -> Counts:
        return Counts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))


def _extents(nest: LoopNest, shapes: Mapping[str, Sequence[int]]) -> dict[sympy.Basic, int]:
    found: dict[sympy.Basic, int] = {}
    for expr in nest.expressions():
        for symbol in expr.free_symbols:
            where = extent_of(symbol)
            if where is not None and where[0] in shapes:
                found[symbol] = int(shapes[where[0]][where[1]])
    return found


def _domain(
    nest: LoopNest, term: Term, extents: Mapping[sympy.Basic, int]
) -> dict[sympy.Symbol, np.ndarray]:
    """Every point of the term's iteration space (free and reduced indices), as arrays; a
    one-pass nest's packed column (the logsumexp, the last of its last free index) left out."""
    ranges = [*nest.free, *term.reduced]
    bounds = []
    for n, r in enumerate(ranges):
        lo, hi = (int(sympy.sympify(x).xreplace(extents)) for x in (r.start, r.stop))
        if nest.online and n == len(nest.free) - 1:
            hi -= 1
        bounds.append(range(lo, max(hi, lo)))
    if math.prod(len(b) for b in bounds) > POINT_LIMIT:
        raise ValueError(f"more than {POINT_LIMIT} points in the iteration space of {nest.output}")
    grids = np.meshgrid(*(np.arange(b.start, b.stop) for b in bounds), indexing="ij")
    points = {r.index: g.reshape(-1) for r, g in zip(ranges, grids, strict=True)}
    size = grids[0].size if grids else 1
    keep = np.ones(size, bool)
    tests = [sympy.Ge(c, 0) for c in term.constraints]
    if term.guard != sympy.true:
        tests.append(term.guard)
    for test in tests:
        test = test.xreplace(extents)
        symbols = sorted(test.free_symbols, key=str)
        function = sympy.lambdify(symbols, test, modules="numpy")
        keep &= np.broadcast_to(function(*(points[s] for s in symbols)), (size,))
    return {s: v[keep] for s, v in points.items()}


def _distinct(points: Mapping[sympy.Symbol, np.ndarray], used: set[sympy.Basic]) -> int:
    """How many distinct values the indices `used` take over `points`."""
    columns = [points[s] for s in sorted(used & set(points), key=str)]
    if not columns:
        return 1 if len(next(iter(points.values()), np.zeros(1))) else 0
    return len(np.unique(np.stack(columns, axis=1), axis=0))


def useful_fmas(nest: LoopNest, shapes: Mapping[str, Sequence[int]]) -> int:
    """The FMAs `nest` needs with every value computed once (see the module docstring)."""
    extents = _extents(nest, shapes)
    total = 0
    nested_seen: set[tuple[sympy.Basic, tuple]] = set()
    for n, term in enumerate(nest.terms):
        # A one-pass nest's terms are the scores (its logsumexp) and the weights of its
        # weighted sum, whose products with the scores' softmax run over the scores' space.
        points = _domain(nest, nest.terms[0] if nest.online else term, extents)
        scores = nest.online and n == 0  # not per column of the packed weighted sum
        used = set(term.body.free_symbols) | set(term.reduced_indices) if scores else set(points)
        total += _distinct(points, used)
        for nested in sorted(term.body.atoms(Reduce), key=str):
            used = set(nested.free_symbols) & set(points)
            count = _distinct(points, used)
            length = int(sympy.sympify(nested.stop - nested.start).xreplace(extents))
            key = (nested, tuple(sorted(map(str, used))))
            if key not in nested_seen:
                nested_seen.add(key)
                total += count * max(length, 0)
    return total


def min_global_bytes(
    nest: LoopNest, shapes: Mapping[str, Sequence[int]], dtypes: Mapping[str, str]
) -> int:
    """Bytes of global traffic at least: each operand element read once, each output
    element written once."""
    out = output_shape(nest, shapes)
    total = math.prod(out) * ITEM_BYTES[dtypes[nest.output]]
    for op in nest.operands:
        total += math.prod(shapes[op.name]) * ITEM_BYTES[dtypes[op.name]]
    return total
