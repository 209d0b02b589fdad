"""Schedules in other index names: the canonical kernel records (`codegen.c.run.records`) store
one kernel per nest up to renaming, so a schedule is renamed with its nest."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TypeVar

from codegen.c.geometry import CpuGeometry
from codegen.c.schedule import Schedule

S = TypeVar("S", bound=CpuGeometry)

#: The fields of `Schedule` that `rename_schedule` knows: those naming indices (renamed) and
#: the others (numbers, a strategy). A new field turns canonical forms off until it is added.
RENAMED_FIELDS = frozenset(
    ("free_order", "reduced_order", "row", "vector", "small")
    + ("strategy", "parallel", "rows", "width", "chunks", "lanes")
)


def schedule_fields() -> frozenset[str]:
    """The names of `Schedule`'s fields."""
    return frozenset(f.name for f in dataclasses.fields(Schedule))


def schedule_is_renamable() -> bool:
    """Whether `rename_schedule` knows every field of `Schedule`."""
    return schedule_fields() == RENAMED_FIELDS


def rename_schedule(schedule: S, indices: Mapping[str, str]) -> S:
    """`schedule` with its index names renamed (`{old: new}`; others kept)."""

    def new(name: str | None) -> str | None:
        return None if name is None else indices.get(name, name)

    def names(order: Sequence[str]) -> tuple[str, ...]:
        return tuple(indices.get(n, n) for n in order)

    return dataclasses.replace(
        schedule,
        free_order=names(schedule.free_order),
        reduced_order=tuple(names(order) for order in schedule.reduced_order),
        row=new(schedule.row),
        vector=new(schedule.vector),
        small=None if schedule.small is None else rename_schedule(schedule.small, indices),
    )
