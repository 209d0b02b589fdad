"""A static report of a nest's CUDA kernel for given shapes: see a schedule without a GPU.

For one nest, its schedule and concrete shapes (`cuda_report`): each kernel's grid and block,
the first kernel's blocks per SM on an H100/H200-sized GPU (`SMS`), which index consecutive
lanes step for every access and the distance in elements between their addresses (0: one
address for all, 1: coalesced), and per output element the body evaluations (FMAs, one per
point of the nest's iteration space: a sum of products does one FMA per point) the
schedule's threads execute against those the nest needs, and the bytes its loads request
against the minimum (each input read once). With NVRTC, registers and spills per thread
and static shared memory per block come from ptxas for sm_90.

The counts follow the mapping each strategy writes (`codegen.cuda.schedule`): every
strategy evaluates each point once, except a tile's clamped rows (the last partial tile
recomputes its last row) and an smem, pairwise or mma tile's padding: in the last tile along
a free index, the warps' blocks (mma: its 16 x 8 tiles) that reach into the range compute
whole, zeros outside; slices stop where the reduced range does (mma: in steps of 8); loads are
counted where the staging plan puts them (a value that reads no reduced index once per
output element; a tile shares loads that do not read its row index; an smem tile loads each
element of a staged tile once, a pairwise tile each element in range). A staged access's
lanes are those of the threads that stage it. Caches are not modelled: a load that hits
L1/L2 counts.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> nest = lower(parse("L[i] := X[i,j]"), reduce="logsumexp").nest
>>> r = cuda_report(nest, {"X": "float32", "L": "float32"}, {"X": (4096, 8192)})
>>> r.grids, r.block, r.fmas
(((4096, 1, 1),), (256, 1, 1), (8192.0, 8192.0))
>>> [(a.text, a.lane, a.stride) for a in r.accesses]
[('X[i, j]', 'j', 1)]
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import sympy

from codegen.cuda.emit import GRID_LIMITS, CudaSource, emit_cuda
from codegen.cuda.run import nvrtc
from codegen.cuda.schedule import GpuSchedule
from codegen.cuda.staged.rules import ITEM_BYTES
from codegen.ir.bounds import loop_bounds
from codegen.ir.extents import extent_values, output_shape
from codegen.ir.functions import Clamp, Wrap
from codegen.ir.host import host_function
from codegen.ir.nest import LoopNest, Reduce, Term, accesses, extent_of
from codegen.ir.source import Spell, as_written
from codegen.passes.proven import drop_proven

SMS = 132  # streaming multiprocessors of an H100 SXM or H200
#: The most points of a loop level counted one by one (loop bounds that depend on indices).
COUNT_LIMIT = 1 << 24


@dataclass(frozen=True)
class AccessLanes:
    """How consecutive lanes read one access: the index they step and the stride."""

    text: str
    lane: str | None  # None: no index (smem's staging, which the report does not follow)
    stride: int  # elements between consecutive lanes' addresses
    staged: bool = False  # loaded into shared memory (the lanes are the staging threads')

    @property
    def coalesced(self) -> bool:
        return self.lane is None or abs(self.stride) <= 1


@dataclass(frozen=True)
class CudaReport:
    """The static figures of one nest's CUDA kernels for one set of shapes."""

    schedule: str
    grids: tuple[tuple[int, int, int], ...]  # per kernel, clamped as launched; 0: not launched
    block: tuple[int, int, int]
    outputs: int
    fmas: tuple[float, float] | None  # per output element: executed, useful
    loads: tuple[float, float] | None  # bytes per output element: requested, minimum
    accesses: tuple[AccessLanes, ...]
    registers: int | None = None
    spills: int | None = None  # bytes of spill stores and loads
    shared: int | None = None  # bytes of static shared memory per block

    @property
    def blocks_per_sm(self) -> float:
        return math.prod(self.grids[0]) / SMS

    def lines(self) -> list[str]:
        """The report as indented text lines."""
        grids = " then ".join("x".join(map(str, g)) for g in self.grids if g[0])
        lines = [
            self.schedule,
            f"  grid {grids}, block {'x'.join(map(str, self.block))}: "
            f"{self.blocks_per_sm:.1f} blocks per SM on {SMS} SMs",
        ]
        if self.fmas is not None:
            done, useful = self.fmas
            lines.append(
                f"  per output element: {done:.6g} FMAs executed, {useful:.6g} useful "
                f"({done / useful if useful else 1:.2f}x)"
            )
        if self.loads is not None:
            got, least = self.loads
            lines.append(
                f"  per output element: {got:.6g} bytes loaded, {least:.6g} minimum "
                f"({got / least if least else 1:.2f}x)"
            )
        lanes = [
            f"{a.text}: "
            + ("staged in shared memory" if a.staged or a.lane is None else "")
            + (", " if a.staged and a.lane is not None else "")
            + ("" if a.lane is None else f"lanes step {a.lane}, stride {a.stride}")
            + ("" if a.coalesced else " (not coalesced)")
            for a in self.accesses
        ]
        lines += ["  " + line for line in lanes]
        if self.registers is not None:
            lines.append(
                f"  sm_90: {self.registers} registers, {self.spills} bytes spilled, "
                f"{self.shared} bytes static shared memory"
            )
        else:
            lines.append("  registers: NVRTC is not available here")
        return lines


def cuda_report(
    nest: LoopNest,
    dtypes: Mapping[str, str],
    shapes: Mapping[str, Sequence[int]],
    schedule: GpuSchedule | None = None,
    *,
    registers: bool = True,
    spell: Spell = as_written,
) -> CudaReport:
    """The static report of `nest`'s CUDA kernels (see the module docstring).

    Args:
        nest: the loop nest.
        dtypes: numpy dtype name of every operand and of the output.
        shapes: the shape of every tensor the nest names (the output's is computed).
        schedule: the schedule; the heuristic's kernel when None.
        registers: read registers and spills from NVRTC where it is available.
        spell: rewrites each access before it is printed (`explain`: a gathered operand as
            the access its user wrote).

    Returns:
        A `CudaReport`.
    """
    shapes = {**shapes, nest.output: output_shape(nest, shapes)}
    nest = drop_proven(nest, extents=extent_values(nest, shapes))  # as the runner emits it
    source = emit_cuda(nest, dtypes=dtypes, schedule=schedule)
    s = source.schedule
    values = _host(source, shapes)
    grids = []
    for n in range(len(source.passes)):
        grid = [int(values[f"grid{n}_{a}"]) for a in range(3)]
        if n and min(grid) < 1:
            grids.append((0, 0, 0))
            continue
        x, y, z = (max(1, min(v, top)) for v, top in zip(grid, GRID_LIMITS, strict=True))
        grids.append((x, y, z))
    outputs = max(math.prod(shapes[nest.output]), 1)
    extents = _extents(nest, shapes)
    counts = _counts(nest, s, extents, dtypes)
    fmas = loads = None
    if counts is not None:
        useful, requested = counts
        factor = _redundancy(nest, s, extents)
        least = sum(
            math.prod(shapes[op.name]) * ITEM_BYTES.get(dtypes[op.name], 4) for op in nest.operands
        )
        fmas = (useful * factor / outputs, useful / outputs)
        loads = (requested / outputs, least / outputs)
    lanes = tuple(_lanes(nest, s, shapes, values.get("width"), spell))
    found = CudaReport(s.describe(), tuple(grids), source.block, outputs, fmas, loads, lanes)
    if registers and nvrtc.available():
        compiled = nvrtc.compile_source(source.text, options=("--ptxas-options=-v",))
        smem = [int(m) for m in re.findall(r"(\d+) bytes smem", compiled.log)]
        return dataclasses.replace(
            found,
            registers=compiled.registers,
            spills=(compiled.spill_stores or 0) + (compiled.spill_loads or 0),
            shared=max(smem, default=0),
        )
    return found


def _host(source: CudaSource, shapes: Mapping[str, Sequence[int]]) -> dict[str, int]:
    """The host parameters and every kernel's grid (unclamped) for `shapes`."""
    named = [*source.parameters]
    for n, p in enumerate(source.passes):
        named += [(f"grid{n}_{a}", sympy.sympify(g)) for a, g in enumerate(p.grid)]
    host = host_function(named)
    return dict(zip(host.names, (int(v) for v in host.values(shapes)), strict=True))


def _extents(nest: LoopNest, shapes: Mapping[str, Sequence[int]]) -> dict[sympy.Basic, int]:
    found = {}
    for expr in nest.expressions():
        for sym in expr.free_symbols:
            where = extent_of(sym)
            if where is not None and where[0] in shapes:
                found[sym] = sympy.Integer(shapes[where[0]][where[1]])
    return found


_NUMPY = {
    "Max": np.maximum,
    "Min": np.minimum,
    "FloorDiv": np.floor_divide,
    "CeilDiv": lambda a, b: -np.floor_divide(-a, b),
}


def _value(expr: sympy.Expr, points: Mapping[str, np.ndarray], extents: Mapping) -> np.ndarray:
    """`expr` (of indices and extents) at every point, as int64 (Max/Min of several args
    nest as pairs)."""
    expr = sympy.sympify(expr).xreplace(extents)
    names = sorted(points)
    symbols = [sympy.Symbol(n, integer=True) for n in names]
    renamed = expr.xreplace({s: sympy.Symbol(s.name, integer=True) for s in expr.free_symbols})
    function = sympy.lambdify(symbols, renamed, modules=[_NUMPY, "numpy"])
    size = len(next(iter(points.values()))) if points else 1
    return np.broadcast_to(np.asarray(function(*(points[n] for n in names)), np.int64), (size,))


def _counts(
    nest: LoopNest, s: GpuSchedule, extents: Mapping, dtypes: Mapping[str, str]
) -> tuple[float, float] | None:
    """(points evaluated, bytes requested by loads) over the nest as its schedule stages
    it; None where a loop level would be counted one by one past `COUNT_LIMIT` points."""
    outputs = math.prod(max(int((r.stop - r.start).xreplace(extents)), 0) for r in nest.free)

    def grid() -> dict[str, np.ndarray]:  # every output element's free indices
        if outputs > COUNT_LIMIT:
            raise OverflowError
        ranges = [
            np.arange(int(r.start.xreplace(extents)), int(r.stop.xreplace(extents)))
            for r in nest.free
        ]
        found = np.meshgrid(*ranges, indexing="ij") if ranges else []
        return {r.index.name: g.reshape(-1) for r, g in zip(nest.free, found, strict=True)}

    def mean_length(x: Reduce) -> float:
        length = sympy.sympify(x.stop - x.start).xreplace(extents)
        if length.is_Integer:
            return float(max(int(length), 0))
        return float(np.mean(np.maximum(_value(length, grid(), extents), 0)))

    points = requested = 0.0
    try:
        for n, term in enumerate(nest.terms):
            order = [
                r for name in s.reduced_order[n] for r in term.reduced_indices if r.name == name
            ]
            sizes = _level_sizes(term, order, outputs, grid, extents)
            points += sizes[-1] + sum(sizes[0] * mean_length(x) for x in term.body.atoms(Reduce))
            for access in accesses(term.body):
                depth = max(
                    (order.index(r) + 1 for r in access.free_symbols if r in order), default=0
                )
                share = s.record.load_share
                times = sizes[depth] * (share(s, access) if share else 1.0)
                for x in term.body.atoms(Reduce):
                    if access in accesses(x.body):
                        times *= mean_length(x)
                requested += times * ITEM_BYTES.get(dtypes.get(str(access.base), "float32"), 4)
    except OverflowError:
        return None
    if s.record.loads is not None:
        return points, s.record.loads(nest, s, extents, dtypes, points)
    return points, requested


def _level_sizes(
    term: Term,
    order: Sequence[sympy.Symbol],
    outputs: int,
    grid: Callable[[], dict],
    extents: Mapping,
) -> list[float]:
    """Points at each level of the term's loops: 0 (the output elements it reaches), then
    each reduced loop. A product where bounds are extents alone, else counted point by point
    (OverflowError past `COUNT_LIMIT`)."""
    bounds = loop_bounds(term, order)
    lengths = [(bounds.stops[r] - bounds.starts[r]).xreplace(extents) for r in order]
    if not bounds.free_tests and all(x.is_Integer for x in lengths):
        sizes = [float(outputs)]
        for x in lengths:
            sizes.append(sizes[-1] * max(int(x), 0))
        return sizes
    level = grid()
    keep = np.ones(outputs, bool)
    for test in bounds.free_tests:
        keep &= _value(test, level, extents) >= 0
    level = {k: v[keep] for k, v in level.items()}
    sizes = [float(keep.sum())]
    for depth, r in enumerate(order):
        lo = _value(bounds.starts[r], level, extents)
        length = np.maximum(_value(bounds.stops[r], level, extents) - lo, 0)
        sizes.append(float(length.sum()))
        if depth == len(order) - 1:
            break
        if sizes[-1] > COUNT_LIMIT:
            raise OverflowError
        level = {k: np.repeat(v, length) for k, v in level.items()}
        starts = np.repeat(lo - np.cumsum(length) + length, length)
        level[r.name] = starts + np.arange(int(sizes[-1]))
    return sizes


def _redundancy(nest: LoopNest, s: GpuSchedule, extents: Mapping) -> float:
    """Executed over useful points of a schedule's mapping (see the module docstring)."""
    if s.record.redundancy is None:
        return 1.0
    sizes = {r.index.name: max(int((r.stop - r.start).xreplace(extents)), 1) for r in nest.free}
    return s.record.redundancy(nest, s, sizes, extents)


def _lanes(
    nest: LoopNest,
    s: GpuSchedule,
    shapes: Mapping[str, Sequence[int]],
    width: int | None,
    spell: Spell,
) -> list[AccessLanes]:
    """For every access: the index consecutive lanes step, and the stride in elements."""
    found: dict[str, AccessLanes] = {}
    for n, term in enumerate(nest.terms):
        lane: str | None = s.free_order[-1] if s.free_order else None
        inner = s.reduced_order[n][-1] if s.reduced_order[n] else None
        nested = sorted(r.index.name for r in term.body.atoms(Reduce))
        if s.record.reduction_lanes is not None and s.record.reduction_lanes(width or 1):
            lane = inner or (nested[0] if nested else None)
        staging = s.record.staging(nest, s)
        for access in accesses(term.body):
            text = str(spell(access))
            if staging is None:
                found.setdefault(text, AccessLanes(text, None, 0))
                continue
            step = staging.get(access, lane)
            stride = _stride(access, step, shapes[str(access.base)])
            found.setdefault(text, AccessLanes(text, step, stride, access in staging))
    return list(found.values())


def _stride(access: sympy.Indexed, lane: str | None, extents: Sequence[int]) -> int:
    """Elements between the addresses of `access` at consecutive values of `lane`."""
    stride, scale = 0, 1
    for axis in reversed(range(len(access.indices))):
        # A wrapped, clamped or padded index steps as its argument away from the edges.
        index = access.indices[axis].replace(
            lambda e: isinstance(e, Clamp | Wrap), lambda e: e.args[0]
        )
        step = [x for x in index.free_symbols if x.name == lane]
        if step:
            stride += int(sympy.diff(index, step[0])) * scale
        scale *= int(extents[axis])
    return stride
