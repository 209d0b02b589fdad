"""CPU schedules: the loop order and the parallel/vector mapping of a loop nest.

A `Schedule` is separate from the nest: one nest can be emitted under several schedules and
all of them compute the same numbers. Free loops are always outside the reduced loops, so
every output element is reduced in registers and written once.

Strategies (`Schedule.strategy`):

* ``"scalar"`` -- one output element at a time, plain reduction loops;
* ``"tile"`` -- a register tile of ``rows x width`` output elements over the free indices
  `row` and `vector` (the output's contiguous axis), the reduction loops outside the tile's
  lane loops, and ``#pragma omp simd`` over the lanes. Loop bounds may depend on `row` and
  `vector` (gradient nests): interior tiles drop those constraints, other tiles test them
  per lane; the tile grid starts where the interior does (see `codegen.c.tiles`);
* ``"dot"`` -- dot-product-shaped nests (no free index is contiguous in the inputs): a
  register tile of ``rows x width`` dot products over the free indices `row` and `vector`,
  each kept as ``lanes`` vector partial sums over the innermost reduced index
  (``#pragma omp simd``). A function call that reads a row and the lanes but not the
  column is computed per row in one simd loop into lane arrays that every column reads;
* ``"split"`` -- a full reduction to a scalar: the outermost reduced loop is cut into a fixed
  number of chunks reduced in parallel and combined in order (deterministic);
* ``"online"`` -- the one and only strategy of a one-pass softmax-weighted sum
  (`LoopNest.online`, `codegen.passes.online`): blocks of 8 rows, each row's scores in chunks with
  a running max (`codegen.c.online`);
* ``"members"`` -- the one strategy of a multi-output nest (`codegen.ir.members`): tiles of
  rows x lanes, the members' bodies computed together (`codegen.c.members`);
* ``"select"`` -- the one strategy of topk/argtopk: k sorted slots per row (`codegen.c.select`);
* ``"unroll"`` -- a last free index over `width` values only (`codegen.ir.small_axes`: a pair
  read as `X[..., 1-p]`) written out, the free index before it (`vector`) in simd lanes
  (`codegen.c.unroll`);
* ``"xla"`` -- a contraction, alone or with elementwise companions (a bias, a mask, the
  weights around attention's `sum_e dO*V`: `codegen.ir.contraction.xla_plan`): no kernel is
  generated, the runner calls XLA's dot (`jnp.einsum`) and XLA fuses the rest, faster for
  those than a generated loop nest.

The heuristic (`choose_cpu_schedule`):

0. one-pass softmax-weighted sum -> ``online``; topk -> ``select``; multi-output -> ``members``;
   a nest with an XLA plan -> ``xla``, unless the caller asks for a generated kernel;
1. no free index -> ``split``; a small constant last axis and no reduction -> ``unroll``;
2. per term, the innermost reduced index is the one that is the last axis of the most accesses
   (contiguous reads), ties keep the written order;
3. the output's last free index `v` is vectorised (``tile``) when every access that uses it has
   it in its last axis; the register tile's rows are the previous free index, or the one fewest
   reads along the reduced loops use (`shared_row_last`; 6 x 32 float lanes). When `v` is a
   window offset (it shares an access axis with a reduced index, as `k` in
   `dW[o, c, k] = dY[o, i]*X[c, i + k]`) it is often short: the schedule then carries a
   ``small`` schedule taken at run time when `v`'s extent is below the tile width: a tile one
   vector wide (8 float lanes), itself with a ``small`` dot schedule over two other free
   indices for an extent below that (a window offset of 3). So a conv2d output 30 wide keeps
   vector lanes over its output's columns, not over a 3-wide kernel axis. The last tile of an
   axis moves back to end where the axis ends (`codegen.c.tiles`), a whole tile that stores
   only its new lanes, so 30 columns run as four whole tiles of 8. So does a tile whose costly
   work (a function call, a nested reduction) does not read `v` while no access reads `v`
   either (only tests select by it: the coordinates `p` of the Gaussian kernel's `dX[i, p]`):
   the dot products there compute that work in vector lanes once for all the columns;
4. otherwise a sum some term of which computes a nested reduction per value of its innermost
   reduced index (a score parameter's gradient: `sum_e dO[i, e]*V[j, e]` per key `j`) ->
   ``scalar``, whose chunks compute such dot products 8 values at a time in vectors
   (`codegen.c.strategies`; dot lanes over `j` would compute them lane by lane, reading
   their rows across the lanes); for sum/max/min/prod/argmax/argmin, ``dot`` with a 4 x 4
   tile of dot products of 8 float / 4 double lanes (16 accumulator registers); else
   ``scalar``;
5. OpenMP parallelises the free loops (collapsed) when there is enough work, decided at run
   time from the extents (guided schedule; see the thread-count note below).

Thread count: decided by each call from its work, the teams of other kernels and how
crowded the machine is (`codegen.c.threads`): a second thread may wait for a core another
process holds. The free loops are shared out `guided`: with `static`,
each thread has half of the work fixed in advance, so a thread whose core is taken makes
the whole kernel wait; guided chunks shrink, so the other thread takes what is left (the
GPT block's benchmark, `benchmarks/gpt_block.py`, measured the difference). Every output
element is still computed by one thread, so results do not depend on the schedule.

>>> from codegen.ir.examples import matmul as example
>>> matmul = example()
>>> choose_cpu_schedule(matmul).strategy
'xla'
>>> s = choose_cpu_schedule(matmul, kernel=True)
>>> s.strategy, s.free_order, s.row, s.vector
('tile', ('i', 'j'), 'i', 'j')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.c.work import costly_per_row, nested_per_value
from codegen.emit import loop_order as orders
from codegen.emit.loop_order import LoopOrder, default_loop_order, valid_unique, validate_schedule
from codegen.ir.affine import affine_parts
from codegen.ir.contraction import xla_contraction
from codegen.ir.members import member_bodies
from codegen.ir.nest import LoopNest, accesses
from codegen.ir.reductions import REDUCTIONS
from codegen.ir.small_axes import small_extent

STRATEGIES = ("scalar", "tile", "dot", "split", "xla", "online", "members", "select", "unroll")
#: Strategies that generate a kernel (``"xla"`` calls XLA instead).
KERNEL_STRATEGIES = ("scalar", "tile", "dot", "split", "online", "members", "select", "unroll")


@dataclass(frozen=True)
class Schedule(LoopOrder):
    """Loop order and parallel/vector mapping of one nest (see the module docstring)."""

    strategy: str = "scalar"
    parallel: bool = True
    row: str | None = None
    vector: str | None = None
    rows: int = 1
    width: int = 1
    chunks: int = 64  # split: number of chunks of the outermost reduced loop
    lanes: int = 8  # dot: vector partial sums per dot product
    #: Used instead when the vector index's extent is below `width` (decided at run time).
    small: Schedule | None = None

    def describe(self) -> str:
        """One line for the header comment of generated code."""
        parts = [f"strategy={self.strategy}", super().describe()]
        if self.strategy in ("tile", "dot"):
            parts.append(f"tile={self.row or '-'}x{self.vector}={self.rows}x{self.width}")
        if self.strategy == "dot":
            parts.append(f"lanes={self.lanes}")
        if self.strategy == "members":
            parts.append(f"rows={self.row or '-'}x{self.rows} lanes={self.lanes}")
        if self.strategy == "unroll":
            parts.append(f"unroll={self.free_order[-1]}x{self.width} lanes={self.vector}")
        if self.strategy == "split":
            parts.append(f"chunks={self.chunks}")
        if self.strategy == "xla":
            return " ".join([*parts, "(jnp.einsum: XLA's dot, no generated kernel)"])
        parts.append(f"parallel={'yes' if self.parallel else 'no'}")
        if self.small is not None:
            parts.append(f"| if {self.vector} < {self.width}: {self.small.describe()}")
        return " ".join(parts)

    def in_words(self) -> str:
        """The schedule in plain words, for `explain` (`describe` is the terse header form).

        >>> Schedule(("i", "j"), (("k",),), strategy="tile", row="i", vector="j", rows=6,
        ...          width=32).in_words()
        'register tiles of 6 i x 32 j outputs (j in vector lanes), reducing k inside; threads ...'
        """
        shared = self.free_order[:-2] if self.strategy == "unroll" else self.free_order
        loops = ", ".join(shared)
        reduced = " then ".join(", ".join(o) for o in self.reduced_order if o)
        inside = f"reducing {reduced} inside" if reduced else "no reduction"
        outputs = f"{self.rows} {self.row} x {self.width} {self.vector}"
        if self.row is None:
            outputs = f"{self.width} {self.vector}"
        words = {
            "scalar": f"one output element at a time, {inside}",
            "tile": f"register tiles of {outputs} outputs ({self.vector} in vector lanes), "
            + inside,
            "dot": f"{outputs} dot products at a time, each as {self.lanes} vector partial "
            f"sums over {reduced or 'nothing'}",
            "split": f"the reduction over {reduced} cut into {self.chunks} chunks reduced in "
            "parallel and combined in order",
            "online": "one pass over each row's scores with a running max (online softmax), "
            "blocks of 8 rows",
            "xla": "XLA's dot (jnp.einsum): no generated kernel",
            "members": f"every member at once ({self.lanes} lanes, {self.rows} rows), {inside}",
            "select": f"one output row at a time, its k best in sorted slots, {inside}",
            "unroll": f"its {self.width} values of {''.join(self.free_order[-1:])} written out, "
            f"{self.vector} in vector lanes",
        }[self.strategy]
        if self.strategy not in ("xla", "split"):
            words += f"; threads share the {loops} loops" if self.parallel and loops else ""
        if self.small is not None:
            small = self.small
            if small.strategy == "tile" and small.vector == self.vector:
                what = f"{small.width}-lane tiles"
            else:
                what = small.in_words().split(";")[0]
            words += f" ({what} below {self.width} values of {self.vector})"
        return words


def _names(indices: Sequence[sympy.Symbol]) -> tuple[str, ...]:
    return tuple(s.name for s in indices)


def _symbols(nest: LoopNest) -> dict[str, sympy.Symbol]:
    found = {s.name: s for s in nest.free_indices}
    for term in nest.terms:
        found.update({s.name: s for s in term.reduced_indices})
    return found


def validate(nest: LoopNest, schedule: Schedule) -> None:
    """Raise ValueError when `schedule` does not fit `nest`."""
    validate_schedule(nest, schedule, STRATEGIES, ("rows", "width", "chunks", "lanes"))
    free, last = schedule.free_order, nest.free[-1].index.name if nest.free else None
    if (schedule.strategy == "online") != bool(nest.online):
        raise ValueError("the online strategy is for one-pass softmax-weighted sums, and only it")
    if (schedule.strategy == "select") != REDUCTIONS[nest.reduction].selects:
        raise ValueError("the select strategy is for topk/argtopk, and only it")
    if nest.online and free[-1:] != (nest.free[-1].index.name,):
        raise ValueError("a one-pass nest keeps its packed output axis innermost")
    if schedule.strategy == "members" and (member_bodies(nest) is None or free[-1:] != (last,)):
        raise ValueError("the members strategy is for multi-output nests, member axis innermost")
    if schedule.strategy in ("tile", "dot"):
        _validate_tile(nest, schedule)
    if schedule.strategy == "unroll" and (
        small_extent(nest) != schedule.width or free[-1:] != (last,) or schedule.vector != free[-2]
    ):
        raise ValueError("the unroll strategy is for a small last axis, the index before in lanes")
    if schedule.small is not None:
        if schedule.strategy not in ("tile", "dot"):
            raise ValueError("only tile and dot schedules have a schedule for small extents")
        validate(nest, schedule.small)


def _validate_tile(nest: LoopNest, schedule: Schedule) -> None:
    tiled = [schedule.row, schedule.vector] if schedule.row else [schedule.vector]
    if schedule.vector is None or tuple(schedule.free_order[-len(tiled) :]) != tuple(tiled):
        raise ValueError(
            f"a {schedule.strategy} schedule tiles the innermost free loops; "
            f"got free order {schedule.free_order}, tile {tiled}"
        )
    if schedule.row is None and schedule.rows != 1:
        raise ValueError("rows > 1 needs a row index")
    if schedule.strategy == "dot" and not REDUCTIONS[nest.reduction].simd:
        raise ValueError(f"the dot strategy does not support the reduction {nest.reduction}")
    if schedule.strategy == "dot" and any(not order for order in schedule.reduced_order):
        raise ValueError("the dot strategy needs a reduced index in every term")


def _vector_friendly(nest: LoopNest, name: str) -> bool:
    """Every access that uses `name` has it only in its last axis, with coefficient +1."""
    symbol = _symbols(nest)[name]
    for term in nest.terms:
        for access in accesses(term.body):
            *outer, last = access.indices
            if any(symbol in index.free_symbols for index in outer):
                return False
            if symbol in last.free_symbols and affine_parts(last, (symbol,)) != {symbol: 1}:
                return False
    return True


def _wide(dtypes: Mapping[str, str] | None, nest: LoopNest) -> bool:
    return dtypes is not None and "float64" in (dtypes.get(nest.output), *dtypes.values())


def _windowed(nest: LoopNest) -> frozenset[str]:
    """Free indices that share an access axis with a reduced index (`X[c, i + k]`)."""
    found: set[str] = set()
    for term in nest.terms:
        reduced = set(term.reduced_indices)
        for access in accesses(term.body):
            for axis in access.indices:
                if axis.free_symbols & reduced:
                    found.update(s.name for s in axis.free_symbols - reduced)
    return frozenset(found) & set(_names(nest.free_indices))


def _dot_schedule(
    nest: LoopNest, free: tuple[str, ...], reduced: tuple[tuple[str, ...], ...], wide: bool
) -> Schedule | None:
    if not all(reduced) or not REDUCTIONS[nest.reduction].simd:
        return None
    # 4 x 4 dot products of one vector register each (8 float / 4 double lanes): 16
    # accumulator registers plus 8 loads per step (measured best of 2..6 x 3..8 x 8..16).
    row = free[-2] if len(free) > 1 else None
    return Schedule(
        free,
        reduced,
        strategy="dot",
        row=row,
        vector=free[-1],
        rows=4 if row else 1,
        width=4,
        lanes=4 if wide else 8,
    )


def choose_cpu_schedule(
    nest: LoopNest,
    dtypes: Mapping[str, str] | None = None,
    *,
    loop_order: Sequence[str] | None = None,
    kernel: bool = False,
) -> Schedule:
    """The heuristic schedule of `nest` on the CPU (see the module docstring).

    Args:
        nest: the loop nest.
        dtypes: numpy dtype names of the operands and output (tile widths depend on them).
        loop_order: optional index names fixing the order of the free loops and of each
            term's reduced loops (outermost first); indices not named keep their place after
            the named ones. A loop order asks for a generated kernel.
        kernel: True for a generated kernel even where XLA would compute the nest.

    Returns:
        A valid `Schedule`.

    Raises:
        ValueError: when `loop_order` names an unknown index or repeats one.
    """
    order = default_loop_order(nest, loop_order)
    free, reduced = order.free_order, order.reduced_order
    if nest.online or REDUCTIONS[nest.reduction].selects:
        return Schedule(free, reduced, strategy="online" if nest.online else "select")
    if member_bodies(nest) is not None:
        return _members_schedule(nest, free, reduced, _wide(dtypes, nest))
    if not kernel and loop_order is None and xla_contraction(nest, dtypes):
        return Schedule(free, reduced, strategy="xla")
    if not free:
        return Schedule(free, reduced, strategy="split")
    count = small_extent(nest)
    if count is not None and free[-1] == nest.free[-1].index.name:
        return Schedule(free, reduced, strategy="unroll", vector=free[-2], width=count)
    free = orders.shared_row_last(nest, free) if loop_order is None else free
    wide, vector = _wide(dtypes, nest), free[-1]
    row = free[-2] if len(free) > 1 else None
    if _vector_friendly(nest, vector):
        # 6 rows x 32 float lanes: 24 accumulator vectors of 8 floats (measured best here).
        small = None
        windowed = _windowed(nest)
        if vector in windowed and loop_order is None:
            # A window offset (`dW[o, c, k]`) is often short: then dot products over the
            # long reduced axis, tiled over two free indices that are no window offsets.
            plain = [name for name in free if name not in windowed]
            dot_free = (*(n for n in free if n not in plain[-2:]), *plain[-2:])
            small = _dot_schedule(nest, dot_free, reduced, wide) if plain else None
            # Between the two, a tile one vector wide (conv2d's output 30 wide).
            narrow = 4 if wide else 8
            small = Schedule(
                free,
                reduced,
                strategy="tile",
                row=row,
                vector=vector,
                rows=6 if row else 1,
                width=narrow,
                small=small,
            )
        # Costly work per row (a nested reduction, an exp) is done once per tile width of the
        # vector axis: wider tiles (8 x 64 floats) do it fewer times, and each value read
        # along the reduced axis (attention's K and V rows) serves 8 rows (attention's nests
        # ran faster than with 4 x 64). A vector axis shorter than the tile (the
        # Gaussian kernel's coordinates, `dX[i, p]`) runs as dot products instead, whose
        # lanes compute that work in vector form once for all the columns.
        costly = costly_per_row(nest, vector)
        if costly and small is None and not _reads(nest, vector):
            small = _dot_schedule(nest, free, reduced, wide)
        return Schedule(
            free,
            reduced,
            strategy="tile",
            row=row,
            vector=vector,
            rows=(8 if costly else 6) if row else 1,
            width=(32 if costly else 16) if wide else (64 if costly else 32),
            small=small,
        )
    if nested_per_value(nest, reduced):
        return Schedule(free, reduced)
    return _dot_schedule(nest, free, reduced, wide) or Schedule(free, reduced)


def _members_schedule(nest: LoopNest, free: tuple[str, ...], reduced: tuple, wide: bool):
    """`codegen.c.members`: the row (last free index but the member axis) in the lanes where
    all read it contiguously, else 4 rows (1 if a bound reads it) by lanes of the reduction."""
    order = (*(n for n in free if n != nest.free[-1].index.name), nest.free[-1].index.name)
    row = order[-2] if len(order) > 1 else None
    limits = [x for t in nest.terms for x in t.expressions() if x is not t.body]
    given = {"strategy": "members", "row": row, "lanes": 4 if wide else 8}
    if row in {s.name for x in limits for s in sympy.sympify(x).free_symbols}:
        return Schedule(order, reduced, **given)
    if row and _vector_friendly(nest, row):
        return Schedule(order, reduced, **(given | {"vector": row, "lanes": 16 if wide else 32}))
    return Schedule(order, reduced, **given, rows=4 if row else 1)


def _reads(nest: LoopNest, name: str) -> bool:
    """Whether some access of `nest` reads the index `name` (else only tests select by it)."""
    symbol = _symbols(nest)[name]
    return any(
        symbol in index.free_symbols
        for term in nest.terms
        for access in accesses(term.body)
        for index in access.indices
    )


def candidate_schedules(nest: LoopNest) -> tuple[Schedule, ...]:
    """Every kernel schedule the heuristic could pick for `nest`, plus the scalar fallback."""
    if nest.online or REDUCTIONS[nest.reduction].selects:
        return (choose_cpu_schedule(nest),)
    picks = [
        choose_cpu_schedule(nest, {"out": "float32"}, kernel=True),
        choose_cpu_schedule(nest, {"out": "float64"}, kernel=True),
    ]
    free = _names(nest.free_indices)
    reduced = tuple(_names(t.reduced_indices) for t in nest.terms)
    picks.append(Schedule(free, reduced, strategy="scalar", parallel=False))
    picks.append(Schedule(tuple(reversed(free)), tuple(tuple(reversed(o)) for o in reduced)))
    for pick in picks[:2]:
        if pick.small is not None:
            picks += [dataclasses.replace(pick, small=None), pick.small]
    if free and all(reduced):
        picks.append(
            Schedule(
                free,
                picks[0].reduced_order,
                strategy="dot",
                vector=free[-1],
                row=free[-2] if len(free) > 1 else None,
                rows=2 if len(free) > 1 else 1,
                width=3,
                lanes=5,
            )
        )
    return valid_unique(nest, picks, validate)
