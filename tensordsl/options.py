"""The options of `td.kernel` and `td.program`, checked before anything is lowered or built:
their names, `init=` (a real number, for a reduction that starts from one) and the user's
schedule or loop order of a kernel's forward nest."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from codegen.ir.nest import LoopNest
from codegen.ir.reductions import REDUCTIONS
from tensordsl.backends import table
from tensordsl.errors import (
    ReductionError,
    ScheduleError,
    UnknownNameError,
    UnsupportedError,
    close_match,
)
from tensordsl.frontend import arguments

OPTIONS = (
    "reduce",
    "ranges",
    "backend",
    "nograd",
    "schedule",
    "loop_order",
    "outputs",
    "precision",
    "fuse",
    "init",
)


#: The reductions `init=` may start (`Reduction.init_combine`).
_STARTED = tuple(name for name, row in REDUCTIONS.items() if row.init_combine)


def initial_value(init: Any, nest: LoopNest, source: str) -> float | None:
    """`init=` checked: a real number, for a statement that reduces something."""
    if init is None:
        return None
    if isinstance(init, bool) or not isinstance(init, int | float | np.integer | np.floating):
        raise ReductionError(
            f"init= is {init!r}", source, expected="a real number, e.g. init=0.0 or init=-inf"
        )
    if REDUCTIONS[nest.reduction].init_combine is None:  # the row's `jnp` function joins it
        gives = "k values" if nest.reduction.endswith("topk") else "a position"
        raise ReductionError(
            f"init= starts a reduction from a value, and '{nest.reduction}' gives {gives}",
            source,
            expected=f"init= with one of {', '.join(_STARTED)}, or no init=",
        )
    if not any(term.reduced for term in nest.terms):
        raise ReductionError(
            "init= starts a reduction, but the statement reduces no index",
            source,
            expected="an index on the right that is not on the left, or no init=",
        )
    return float(init)


def forward_schedule(
    nest: LoopNest, schedule: Any, loop_order: Any, source: str, backend: str
) -> Any:
    """The user's schedule or loop order for the forward nest, checked now.

    Raises:
        UnsupportedError: either on a back end with schedules of its own (`cuda`, `pallas`),
            which would ignore it; the reference back end, the oracle, takes and ignores it.
        ScheduleError: a schedule that is not a `Schedule`, or a bad loop order.
    """
    if schedule is None and loop_order is None:
        return None
    if backend not in (table.AUTO, "reference") and not table.backend(backend).takes_schedule:
        option = "schedule=" if schedule is not None else "loop_order="
        raise UnsupportedError(
            f"{option} orders the loops of the c back end's nests; backend='{backend}' "
            "chooses its own (it would ignore the option)",
            source,
            expected=f"backend='c' (or 'auto' on a CPU) with {option}, or no {option}",
        )
    scheduled = table.SCHEDULED
    assert scheduled.schedule_type is not None and scheduled.scheduler is not None
    assert scheduled.validate_schedule is not None
    validate = scheduled.validate_schedule()
    if schedule is not None and not isinstance(schedule, scheduled.schedule_type()):
        named = isinstance(schedule, str)  # a strategy's name, "tile": say it, hint loop_order=
        raise ScheduleError(
            "schedule= must be a codegen.c.schedule.Schedule, got "
            + (repr(schedule) if named else type(schedule).__name__),
            source,
            expected="a Schedule, e.g. from codegen.c.schedule.candidate_schedules(k.nest)",
            hint="loop_order=('i', 'j', ...) fixes the loop order alone" if named else None,
        )
    order = arguments.names(loop_order, option="loop_order")
    try:
        if schedule is None:
            schedule = scheduled.scheduler()(nest, loop_order=order)
        validate(nest, schedule)
    except ValueError as error:
        raise ScheduleError(
            f"bad schedule: {error}", source, expected="index names of the statement, each once"
        ) from None
    return schedule


def no_init(options: Mapping[str, Any], source: str) -> None:
    if "init" in options:
        raise UnsupportedError(
            "init= applies to a kernel of one statement",
            source,
            expected="init= on td.kernel of one statement; in a program, combine the value in "
            "a statement of its own",
        )


def check_options(options: Mapping[str, Any], caller: str) -> None:
    for name in options:
        if name not in OPTIONS:
            raise UnknownNameError(
                f"{caller} has no option '{name}'",
                expected="options " + ", ".join(OPTIONS),
                hint=close_match(name, OPTIONS),
            )
