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
  a running max (`codegen.c.attention.online`);
* ``"members"`` -- the one strategy of a multi-output nest (`codegen.ir.members`): tiles of
  rows x lanes, the members' bodies computed together (`codegen.c.attention.members`);
* ``"select"`` -- the one strategy of topk/argtopk: k sorted slots per row
  (`codegen.c.reductions.select`);
* ``"unroll"`` -- a last free index over `width` values only (`codegen.ir.small_axes`: a pair
  read as `X[..., 1-p]`) written out, the free index before it (`vector`) in simd lanes
  (`codegen.c.tiles.unroll`);
* ``"xla"`` -- a contraction, alone or with elementwise companions (a bias, a mask, the
  weights around attention's `sum_e dO*V`: `codegen.ir.contraction.xla_plan`): no kernel is
  generated, the runner calls XLA's dot (`jnp.einsum`) and XLA fuses the rest, faster for
  those than a generated loop nest.

The heuristic (`choose_cpu_schedule`) takes the first record of
`codegen.c.strategies.STRATEGIES` whose `applies` returns a schedule; each record's rule is
in its family's rules (`codegen.c.tiles.rules`, `codegen.c.reductions.rules`,
`codegen.c.attention.rules`). In that order:

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
   the dot products there compute that work in vector lanes once for all the columns. A
   function call or nested reduction that does not read `v` (a gate `sigmoid(E[n, c])` of
   `X[n, c, s] * sigmoid(E[n, c])`, with or without a reduction) is computed once per row and
   tile: such tiles are wider (8 x 64 float lanes). Where `v` is shorter than the tile and none
   of the above applies (a convolution's 16 output channels under 32 float lanes), a ``small``
   tile half as wide with twice the rows (as many accumulators) takes over, rather than every
   tile running on the edge path, whose trip counts are known only at run time;
4. otherwise a sum some term of which computes a nested reduction per value of its innermost
   reduced index (a score parameter's gradient: `sum_e dO[i, e]*V[j, e]` per key `j`; not
   one over at most 8 values fixed when the kernel is made, a top-k's ranks) -> ``scalar``,
   whose chunks compute such dot products 8 values at a time in vectors
   (`codegen.c.reductions.simple`; dot lanes over `j` would compute them lane by lane,
   reading their rows across the lanes); for sum/max/min/prod/argmax/argmin, ``dot`` with a
   4 x 4 tile of dot products of 8 float / 4 double lanes (16 accumulator registers), or one
   row of 4 where every read reads the row index (a row sum `sum_s X[n, c, s]`: rows would
   share nothing, only add streams); else ``scalar``;
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
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen import config
from codegen.c.geometry import Ask, CpuGeometry
from codegen.c.strategies import BY_NAME, STRATEGIES, Strategy
from codegen.cache import memo
from codegen.emit.loop_order import default_loop_order, valid_unique, validate_schedule
from codegen.ir.nest import LoopNest
from codegen.ir.reductions import REDUCTIONS

#: Every strategy's name, in the heuristic's order (`codegen.c.strategies.STRATEGIES`).
CPU_STRATEGIES = tuple(s.name for s in STRATEGIES)


@dataclass(frozen=True)
class Schedule(CpuGeometry):
    """Loop order and parallel/vector mapping of one nest (see the module docstring); its
    words come from its strategy's record."""

    @property
    def record(self) -> Strategy:
        """The record of the schedule's strategy (`codegen.c.strategies`)."""
        return BY_NAME[self.strategy]

    def describe(self) -> str:
        """One line for the header comment of generated code."""
        record = self.record
        parts = [f"strategy={self.strategy}", super().describe(), *record.header(self)]
        if record.body is None:
            return " ".join(parts)
        parts.append(f"parallel={'yes' if self.parallel else 'no'}")
        if self.small is not None:
            assert isinstance(self.small, Schedule)
            parts.append(f"| if {self.vector} < {self.width}: {self.small.describe()}")
        return " ".join(parts)

    def in_words(self) -> str:
        """The schedule in plain words, for `explain` (`describe` is the terse header form).

        >>> Schedule(("i", "j"), (("k",),), strategy="tile", row="i", vector="j", rows=6,
        ...          width=32).in_words()
        'register tiles of 6 i x 32 j outputs (j in vector lanes), reducing k inside; threads ...'
        """
        record = self.record
        shared = self.free_order[: len(self.free_order) - record.inner_free_loops]
        loops = ", ".join(shared)
        reduced = " then ".join(", ".join(o) for o in self.reduced_order if o)
        inside = f"reducing {reduced} inside" if reduced else "no reduction"
        words = record.in_words(self, inside, reduced)
        if record.shares_free_loops:
            words += f"; threads share the {loops} loops" if self.parallel and loops else ""
        if self.small is not None:
            small = self.small
            assert isinstance(small, Schedule)
            own = small.record.small_words
            what = own(small, self) if own is not None else None
            if what is None:
                what = small.in_words().split(";")[0]
            words += f" ({what} below {self.width} values of {self.vector})"
        return words


def _names(indices: Sequence[sympy.Symbol]) -> tuple[str, ...]:
    return tuple(s.name for s in indices)


def validate(nest: LoopNest, schedule: CpuGeometry) -> None:
    """Raise ValueError when `schedule` does not fit `nest`."""
    validate_schedule(nest, schedule, CPU_STRATEGIES, ("rows", "width", "chunks", "lanes"))
    record = BY_NAME[schedule.strategy]
    if record.one_pass != bool(nest.online):
        raise ValueError("the online strategy is for one-pass softmax-weighted sums, and only it")
    if record.selects != REDUCTIONS[nest.reduction].selects:
        raise ValueError("the select strategy is for topk/argtopk, and only it")
    if nest.online and schedule.free_order[-1:] != (nest.free[-1].index.name,):
        raise ValueError("a one-pass nest keeps its packed output axis innermost")
    if record.validate is not None:
        record.validate(nest, schedule)
    if schedule.small is not None:
        if not record.small_schedule:
            raise ValueError("only tile and dot schedules have a schedule for small extents")
        validate(nest, schedule.small)


def _takes(record: Strategy, nest: LoopNest) -> bool:
    """A one-pass nest takes the one-pass record alone, topk the `selects` one alone."""
    return record.one_pass == bool(nest.online) and record.selects == (
        REDUCTIONS[nest.reduction].selects and not nest.online
    )


def choose_cpu_schedule(
    nest: LoopNest,
    dtypes: Mapping[str, str] | None = None,
    *,
    loop_order: Sequence[str] | None = None,
    kernel: bool = False,
) -> Schedule:
    """The heuristic schedule of `nest` on the CPU: the first record of
    `codegen.c.strategies.STRATEGIES` that applies (see the module docstring).

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
    items = None if dtypes is None else tuple(sorted(dtypes.items()))
    order = None if loop_order is None else tuple(loop_order)
    return _kept_choice(nest, items, order, kernel, config.xla_contractions())


@functools.lru_cache(maxsize=4096)
def _kept_choice(
    nest: LoopNest,
    dtypes: tuple[tuple[str, str], ...] | None,
    loop_order: tuple[str, ...] | None,
    kernel: bool,
    xla: bool,
) -> Schedule:
    """The heuristic's choice, made once per process and kept on disk for the next one
    (`codegen.cache.memo`, keyed by the nest, the arguments, `TENSORDSL_XLA_CONTRACTIONS`, the
    one setting the rules read, and the compiler's sources): a warm start reads it back instead
    of running the rules' sympy analyses (loop bounds, XLA plans) again."""
    return memo.memo(
        config.cache_dir(),
        "cpu_schedule",
        (nest, dtypes, loop_order, kernel, xla),
        lambda: _choose(nest, None if dtypes is None else dict(dtypes), loop_order, kernel),
        version=memo.source_version(memo.CODEGEN_ROOT),
        expected=Schedule,
    )


def _choose(
    nest: LoopNest,
    dtypes: Mapping[str, str] | None,
    loop_order: Sequence[str] | None,
    kernel: bool,
) -> Schedule:
    """The first record of `STRATEGIES` that applies (see `choose_cpu_schedule`)."""
    order = default_loop_order(nest, loop_order)
    base = Schedule(order.free_order, order.reduced_order)
    ask = Ask(base, None if loop_order is None else tuple(loop_order), kernel)
    for record in STRATEGIES:
        if _takes(record, nest) and (found := record.applies(nest, None, dtypes, ask)):
            assert isinstance(found, Schedule)  # each record replaces fields of `base`
            return found
    raise AssertionError(f"no strategy applies to {nest}")  # scalar applies to every nest


def candidate_schedules(nest: LoopNest) -> tuple[Schedule, ...]:
    """Every kernel schedule the heuristic could pick for `nest`, plus the scalar fallback."""
    if nest.online or REDUCTIONS[nest.reduction].selects:
        return (choose_cpu_schedule(nest),)  # their one strategy
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
            assert isinstance(pick.small, Schedule)  # the rules replace fields of a Schedule
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
