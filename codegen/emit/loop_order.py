"""The loop order of a nest, shared by the CPU and GPU schedules.

A `LoopOrder` names the free loops outermost first and, per term, its reduced loops
outermost first. `Schedule` (CPU) and `GpuSchedule` (CUDA) extend it with their mapping onto
vector lanes or threads; everything that only needs the order (validation, the bounds a loop
order gives, the default order) lives here.

>>> from codegen.ir.examples import matmul as example
>>> matmul = example()
>>> default_loop_order(matmul)
LoopOrder(free_order=('i', 'j'), reduced_order=(('k',),))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import sympy

from codegen.ir.bounds import loop_bounds
from codegen.ir.contraction import xla_plan
from codegen.ir.nest import LoopNest, Term, accesses


@dataclass(frozen=True)
class LoopOrder:
    """Free loops and each term's reduced loops, by index name, outermost first."""

    free_order: tuple[str, ...]
    reduced_order: tuple[tuple[str, ...], ...]

    def describe(self) -> str:
        """`free=i,j reduced=k`, for the header comment of generated code."""
        reduced = ";".join(",".join(o) or "-" for o in self.reduced_order)
        return f"free={','.join(self.free_order) or '-'} reduced={reduced}"


def _names(indices: Sequence[sympy.Symbol]) -> tuple[str, ...]:
    return tuple(s.name for s in indices)


def validate_order(nest: LoopNest, order: LoopOrder) -> None:
    """Raise ValueError unless `order` permutes the nest's free and reduced indices."""
    free = _names(nest.free_indices)
    if sorted(order.free_order) != sorted(free):
        raise ValueError(f"free loop order {order.free_order} is not a permutation of {free}")
    if len(order.reduced_order) != len(nest.terms):
        raise ValueError(f"{len(order.reduced_order)} reduced orders for {len(nest.terms)} terms")
    for reduced, term in zip(order.reduced_order, nest.terms, strict=True):
        if sorted(reduced) != sorted(_names(term.reduced_indices)):
            raise ValueError(
                f"reduced loop order {reduced} is not a permutation of "
                f"{_names(term.reduced_indices)}"
            )


def validate_schedule(
    nest: LoopNest, schedule: Any, strategies: Sequence[str], sizes: Sequence[str]
) -> None:
    """Raise ValueError where a schedule of either back end fails what every schedule checks:
    its loop order, a strategy of its back end (`strategies`), positive fields `sizes` and
    the strategies both back ends have (`validate_shared_strategy`)."""
    validate_order(nest, schedule)
    if schedule.strategy not in strategies:
        raise ValueError(f"unknown strategy {schedule.strategy!r}; expected one of {strategies}")
    if min(getattr(schedule, size) for size in sizes) < 1:
        raise ValueError(f"{', '.join(sizes)} must be positive")
    validate_shared_strategy(nest, schedule.strategy, schedule.free_order)


def validate_shared_strategy(nest: LoopNest, strategy: str, free: Sequence[str]) -> None:
    """Raise ValueError when a strategy both back ends have does not fit the nest: split is
    for full reductions, xla for nests with an XLA plan (`codegen.ir.contraction.xla_plan`)."""
    if strategy == "split" and free:
        raise ValueError("the split strategy is for full reductions (no free index)")
    if strategy == "xla" and xla_plan(nest) is None:
        raise ValueError(
            "the xla strategy is for contractions and their elementwise companions "
            "(codegen.ir.contraction.xla_plan)"
        )


def term_order(nest: LoopNest, order: LoopOrder, n: int) -> tuple[sympy.Symbol, ...]:
    """The reduced indices of term `n` in the loop order (outermost first)."""
    by_name = {s.name: s for s in nest.terms[n].reduced_indices}
    return tuple(by_name[name] for name in order.reduced_order[n])


def bound_indices(nest: LoopNest, order: LoopOrder) -> frozenset[str]:
    """Free indices that some reduced loop bound or per-element test depends on."""
    used: set[str] = set()
    for n, term in enumerate(nest.terms):
        bounds = loop_bounds(term, term_order(nest, order, n))
        for expr in (*bounds.starts.values(), *bounds.stops.values(), *bounds.free_tests):
            used.update(s.name for s in expr.free_symbols)
    return frozenset(used) & set(_names(nest.free_indices))


def _last_axis_uses(term: Term) -> dict[str, int]:
    """How often each index is the last axis (contiguous) of an access in the term."""
    counts: dict[str, int] = {}
    for access in accesses(term.body):
        for name in _names(tuple(access.indices[-1].free_symbols)):
            counts[name] = counts.get(name, 0) + 1
    return counts


def _reduced_order(term: Term) -> tuple[str, ...]:
    """The written order, with the index that is the last axis of most accesses innermost."""
    names = list(_names(term.reduced_indices))
    if not names:
        return ()
    counts = _last_axis_uses(term)
    innermost = max(reversed(names), key=lambda name: counts.get(name, 0))
    names.remove(innermost)
    return (*names, innermost)


def default_loop_order(nest: LoopNest, loop_order: Sequence[str] | None = None) -> LoopOrder:
    """The free indices as written; per term, the reduced index read contiguously innermost.

    Args:
        nest: the loop nest.
        loop_order: optional index names fixing the order of the free loops and of each
            term's reduced loops (outermost first); indices not named keep their place after
            the named ones.

    Raises:
        ValueError: when `loop_order` names an unknown index or repeats one.
    """
    free = _names(nest.free_indices)
    reduced = tuple(_reduced_order(t) for t in nest.terms)
    if loop_order is None:
        return LoopOrder(free, reduced)
    loop_order = tuple(loop_order)
    known = set(free).union(*map(set, reduced))
    unknown = [name for name in loop_order if name not in known]
    if unknown or len(set(loop_order)) != len(loop_order):
        raise ValueError(
            f"loop_order {loop_order} must name distinct indices of the nest "
            f"{sorted(known)}; unknown: {unknown}"
        )

    def reorder(names: tuple[str, ...]) -> tuple[str, ...]:
        named = [n for n in loop_order if n in names]
        return (*named, *(n for n in names if n not in named))

    return LoopOrder(reorder(free), tuple(reorder(order) for order in reduced))


S = TypeVar("S")


def valid_unique(
    nest: LoopNest, picks: Sequence[S], check: Callable[[LoopNest, Any], None]
) -> tuple[S, ...]:
    """The schedules of `picks` that `check` accepts for `nest`, first occurrences only."""
    unique: list[S] = []
    for schedule in picks:
        try:
            check(nest, schedule)
        except ValueError:
            continue
        if schedule not in unique:
            unique.append(schedule)
    return tuple(unique)


def shared_row_last(nest: LoopNest, free: tuple[str, ...]) -> tuple[str, ...]:
    """`free` (index names) with the tile's row (the index before the last) moved to the free
    index that the most reads along the reduced loops do not use, when that is more than for
    the index written there: each such read then serves every row of a tile. Attention's
    query gradient in the (B, T, H, E) layout, `dq[b, i, h, d]`, reads `k[b, j, h, :]` and
    `v[b, j, h, :]` along the keys `j`: tiled over h, each key row would serve one row of
    the tile; tiled over the queries i (the order b, h, i, d), all of them."""
    if len(free) < 3:
        return free
    symbols = {s.name: s for s in nest.free_indices}
    along = [
        access.free_symbols
        for term in nest.terms
        for access in accesses(term.body)
        if access.free_symbols & set(term.reduced_indices)
    ]

    def shared(name: str) -> int:
        return sum(symbols[name] not in used for used in along)

    best = max(reversed(free[:-1]), key=shared)  # the innermost of equals
    if shared(best) <= shared(free[-2]):
        return free
    return (*(n for n in free[:-1] if n != best), best, free[-1])
