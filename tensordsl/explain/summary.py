"""The first lines of `explain`: how many nests, on which back end, each one's schedule in
plain words; for a program, what is recomputed and what is stored.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> nest = lower(parse("Y[i] := X[i,j] * W[j]")).nest
>>> print("\\n".join(summary_lines({"forward Y": nest}, "reference")))
1 nest on the reference back end (jax.numpy: no generated code, no schedule)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from codegen.ir.nest import LoopNest
from codegen.ir.reductions import POSITION_DTYPE, REDUCTIONS
from tensordsl.backends import table


def _dtypes(nest: LoopNest, positions: frozenset[str], dtype: str) -> dict[str, str]:
    names = (*nest.operand_names, nest.output)
    found = {t: (POSITION_DTYPE if t in positions else dtype) for t in names}
    if REDUCTIONS[nest.reduction].positional:
        found[nest.output] = POSITION_DTYPE
    return found


def summary_lines(
    nests: Mapping[str, LoopNest],
    backend: str,
    *,
    positions: frozenset[str] = frozenset(),
    schedules: Mapping[str, Any] | None = None,
    dtype: str = "float32",
    auto: Any = None,
) -> list[str]:
    """A count of `nests` (by label) and, on a back end with schedules, the schedule of
    each in words, as its heuristic picks it for `dtype` inputs (or as `schedules` gives).
    With `backend="auto"`, the back end it took and why (`auto`: the call's
    `table.AutoChoice`; without it, the machine's alone)."""
    if backend == table.AUTO and auto is None:
        auto = table.auto_choice(())
    record = table.backend(backend if auto is None else auto.backend)
    count = f"{len(nests)} nest{'s' * (len(nests) != 1)}"
    where = f"the {record.name} back end" + (" (auto)" if backend == table.AUTO else "")
    said = [] if auto is None else [f"  (auto took {auto.backend}: {auto.reason})"]
    if record.scheduler is None:
        return [f"{count} on {where} ({record.runs_as})", *said]
    choose = record.scheduler()
    lines = [f"{count} on {where}, each scheduled for {dtype} inputs as:", *said]
    width = max(len(label) for label in nests)
    for label, nest in nests.items():
        schedule = (schedules or {}).get(label) or choose(nest, _dtypes(nest, positions, dtype))
        lines.append(f"  {label.ljust(width)}  {schedule.in_words()}")
    return lines
