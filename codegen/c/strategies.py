"""One `Strategy` record per C strategy, in the heuristic's order: everything the schedule,
the emitter and `explain` ask of a strategy.

A strategy's loops live in its family's modules, and its rules (`reductions/rules.py`,
`attention/rules.py`, `tile_rules.py`) say when it applies, what it checks and its words; its
record here ties them together with the function that writes its loops. The heuristic
(`codegen.c.schedule.choose_cpu_schedule`) takes the first record whose `applies` returns a
schedule; `validate`, `Schedule.describe`, `Schedule.in_words` and `emit_c` read the record
of the schedule's strategy. No module compares strategy names
(tests/unit/test_c_strategies.py). Adding a strategy: its emitter and rules in its family's
folder, one record in `STRATEGIES` at its place in the heuristic's order, and a golden source
(tests/unit/test_c_strategy_goldens.py).

>>> [s.name for s in STRATEGIES][:4]
['online', 'select', 'members', 'xla']
>>> BY_NAME["xla"].body is None, BY_NAME["tile"].small_schedule
(True, True)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import sympy

from codegen.c.attention import rules as attention
from codegen.c.attention.members import members
from codegen.c.attention.online import online
from codegen.c.geometry import Ask, CpuGeometry, Dtypes, Shapes
from codegen.c.reductions import rules as reductions
from codegen.c.reductions.select import select
from codegen.c.reductions.simple import scalar, split
from codegen.c.reductions.statistics import row_passes, row_passes_work
from codegen.c.tiles import rules as tiles
from codegen.c.tiles.dot import dot
from codegen.c.tiles.tiles import tile
from codegen.c.tiles.unroll import unrolled
from codegen.emit.emitter import Emitter, Lines
from codegen.ir.nest import LoopNest

#: `applies(nest, shapes, dtypes, ask)`: the strategy's schedule of the nest, or None where
#: it does not fit (or a record before it in the heuristic's order should take it).
Applies = Callable[[LoopNest, Shapes, Dtypes, Ask], CpuGeometry | None]
#: `in_words(schedule, inside, reduced)`: the schedule in plain words, given the words for
#: its reduced loops (`reducing k inside`, or `no reduction`) and their names (`k`).
Words = Callable[[CpuGeometry, str, str], str]


@dataclass(frozen=True)
class Strategy:
    """Everything the schedule, the emitter and `explain` need of one strategy."""

    name: str
    #: The heuristic's rule: a schedule of this strategy for the nest, or None.
    applies: Applies
    #: The schedule's header words after its loop order (`Schedule.describe`).
    header: Callable[[CpuGeometry], tuple[str, ...]]
    #: The schedule in plain words, for `explain` (`Schedule.in_words`).
    in_words: Words
    #: Writes the function's loops through the emitter; None: no kernel (the runner calls
    #: XLA: "xla").
    body: Callable[[Emitter[CpuGeometry]], Lines] | None
    #: Raises ValueError where a schedule of this strategy does not fit the nest.
    validate: Callable[[LoopNest, CpuGeometry], None] | None = None
    #: For one-pass nests (`LoopNest.online`) alone, and they for it alone.
    one_pass: bool = False
    #: For topk/argtopk nests alone, and they for it alone.
    selects: bool = False
    #: Whether its threads share the free loops (`in_words` says so where they do).
    shares_free_loops: bool = True
    #: The innermost free loops its threads do not share (unroll's lanes and small axis).
    inner_free_loops: int = 0
    #: Whether a schedule of it may carry a `small` schedule for short vector axes.
    small_schedule: bool = False
    #: Its words as the `small` schedule of another (None: its own words); a tile keeping
    #: the lanes of the wide one is "8-lane tiles".
    small_words: Callable[[CpuGeometry, CpuGeometry], str | None] | None = None
    #: Its kernel's work units for the team rule (`codegen.c.threads`), where they are not
    #: `work_expression`'s (each term's body per element).
    work: Callable[[LoopNest], sympy.Expr] | None = None
    #: Register tiles whose narrow `small` tiles of the same strategy take the end of the
    #: vector axis after whole wide tiles (`codegen.c.emit`), not the whole axis.
    wide_and_narrow: bool = False


#: Every strategy, in the heuristic's order: the first whose `applies` returns a schedule is
#: the nest's (a one-pass nest takes only `one_pass` records, topk only `selects` ones).
STRATEGIES: tuple[Strategy, ...] = (
    Strategy(
        "online",
        attention.online_applies,
        header=reductions.no_header,
        in_words=attention.online_words,
        body=online,
        one_pass=True,
    ),
    Strategy(
        "select",
        reductions.select_applies,
        header=reductions.no_header,
        in_words=reductions.select_words,
        body=select,
        selects=True,
    ),
    Strategy(
        "members",
        attention.members_applies,
        header=attention.members_header,
        in_words=attention.members_words,
        body=members,
        validate=attention.members_validate,
    ),
    Strategy(
        "xla",
        reductions.xla_applies,
        header=reductions.xla_header,
        in_words=reductions.xla_words,
        body=None,
        shares_free_loops=False,
    ),
    Strategy(
        "split",
        reductions.split_applies,
        header=reductions.split_header,
        in_words=reductions.split_words,
        body=split,
        shares_free_loops=False,
    ),
    Strategy(
        "row_passes",
        reductions.row_passes_applies,
        header=reductions.no_header,
        in_words=reductions.row_passes_words,
        body=row_passes,
        inner_free_loops=1,
        work=row_passes_work,
    ),
    Strategy(
        "unroll",
        tiles.unroll_applies,
        header=tiles.unroll_header,
        in_words=tiles.unroll_words,
        body=unrolled,
        validate=tiles.unroll_validate,
        inner_free_loops=2,
    ),
    Strategy(
        "tile",
        tiles.tile_applies,
        header=tiles.tile_header,
        in_words=tiles.tile_words,
        body=tile,
        validate=tiles.tile_validate,
        small_schedule=True,
        small_words=tiles.lane_tiles_words,
        wide_and_narrow=True,
    ),
    Strategy(
        "dot",
        tiles.dot_applies,
        header=tiles.dot_header,
        in_words=tiles.dot_words,
        body=dot,
        validate=tiles.dot_validate,
        small_schedule=True,
    ),
    Strategy(
        "scalar",
        reductions.scalar_applies,
        header=reductions.no_header,
        in_words=reductions.scalar_words,
        body=scalar,
    ),
)
#: The record of each strategy by its name (`Schedule.strategy`).
BY_NAME: dict[str, Strategy] = {s.name: s for s in STRATEGIES}
