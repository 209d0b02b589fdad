"""The forms of a two-operand contraction that XLA's CPU dot takes as they are: the operands'
order and a copy where one pays (`cpu_dot_form`), each run of axes that stay together merged
into one axis (`merged_runs`, `merged_dot`).

XLA's CPU dot takes an operand as it is only where its free axes are one axis; with several (a
projection `N[b,t,f] * W[f,s,h,e]`, whose free axes are `b,t` and `s,h,e`) it makes a
transposed copy of the operand first, a loop that runs in every call. Free axes that are
neighbours in their operand merge into one by a reshape, which moves no data; the dot's
result is reshaped back and transposed into the output's order, where XLA fuses that
transposition into the result's readers. jnp's einsum gives XLA the axes as they are written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp


class CpuDotForm(NamedTuple):
    """A two-tensor einsum as XLA's CPU dot runs it fast: its operands taken in `order`, the
    first transposed by `permutation` (None: as it is), then `subscripts`."""

    subscripts: str
    order: tuple[int, int]
    permutation: tuple[int, ...] | None


#: The fewest points of the other operand's free axes for which copying one operand pays.
MIN_REUSE = 16


def cpu_dot_form(subscripts: str, sizes: Mapping[str, int]) -> CpuDotForm | None:
    """The form of a two-tensor einsum that XLA's CPU dot runs as its fast library kernel, or
    None where the einsum has it already or no form has it.

    XLA's CPU dot over one contracted axis is fast where its left operand holds the batch
    axes, then its free axes, then the contracted axis, and the result is batch, left free,
    right free axes in that order; it folds transpositions into the dot, so a transposed
    copy must be made apart (over several contracted axes XLA makes one itself). The
    operands are swapped where that is enough; else the operand whose free axes lead the
    result is transposed, where the other's free axes reuse each copied element
    `MIN_REUSE` times or more.

    Args:
        subscripts: the einsum, two inputs (no letter twice in one input).
        sizes: the extent of each letter.

    Returns:
        The form, or None.

    >>> cpu_dot_form("hij,hid->hjd", dict(h=2, i=256, j=256, d=64))
    CpuDotForm(subscripts='hji,hid->hjd', order=(0, 1), permutation=(0, 2, 1))
    >>> cpu_dot_form("hjd,hid->hij", dict(h=2, i=256, j=256, d=64))
    CpuDotForm(subscripts='hid,hjd->hij', order=(1, 0), permutation=None)
    >>> cpu_dot_form("hij,hjd->hid", dict(h=2, i=256, j=256, d=64)) is None
    True
    """
    inputs, out = subscripts.split("->")
    parts = inputs.split(",")
    if len(parts) != 2 or any(len(set(p)) != len(p) for p in parts):
        return None
    first, second = parts
    if any(letter not in out + other for p, other in zip(parts, parts[::-1]) for letter in p):
        return None  # a letter summed within one operand
    contracted = {letter for letter in first if letter in second and letter not in out}
    batch = [letter for letter in out if letter in first and letter in second]
    if len(contracted) != 1:  # several: XLA merges them into one axis, transposing as it must
        return None

    def free(lhs: str, rhs: str) -> tuple[list[str], list[str]] | None:
        left = [letter for letter in out if letter in lhs and letter not in rhs]
        right = [letter for letter in out if letter in rhs and letter not in lhs]
        return (left, right) if out == "".join(batch + left + right) else None

    def fast(lhs: str, rhs: str) -> bool:
        found = free(lhs, rhs)
        kept = [letter for letter in lhs if letter not in batch]
        return found is not None and kept[: len(found[0])] == found[0]

    if fast(first, second):
        return None
    if fast(second, first):
        return CpuDotForm(f"{second},{first}->{out}", (1, 0), None)
    for order in ((0, 1), (1, 0)):
        lhs, rhs = parts[order[0]], parts[order[1]]
        found = free(lhs, rhs)
        if found is None or math.prod(sizes[letter] for letter in found[1]) < MIN_REUSE:
            continue
        want = "".join(batch + found[0] + [letter for letter in rhs if letter in contracted])
        permutation = tuple(lhs.index(letter) for letter in want)
        return CpuDotForm(f"{want},{rhs}->{out}", order, permutation)
    return None


class Runs(NamedTuple):
    """A two-operand einsum with its runs merged: `subscripts` over one letter per run (the
    run's first letter), the operands' merged `shapes`, and `expanded`, the original letters
    of the merged result's axes in order (the result is reshaped to them, then transposed to
    the einsum's output)."""

    subscripts: str
    shapes: tuple[tuple[int, ...], tuple[int, ...]]
    expanded: str


def merged_runs(subscripts: str, shapes: Sequence[Sequence[int]]) -> Runs | None:
    """The einsum `subscripts` over operands of `shapes` with its runs merged, or None where
    it is not a product of two operands over distinct axes or no two axes stay together.

    A run is a stretch of free axes (in one operand and the output) neighbours in their
    operand. Batch axes stay as they are: XLA's dot takes several, and an operand that XLA
    computes inside the dot's fusion (a transposed slice) would be computed twice, once for
    each shape its readers ask for. Contracted axes stay too: merged, a weight gradient's
    operand is copied transposed behind a barrier (`cpu_dot_form`), which XLA compiles
    slower than its own copy. The merged result lists the batch axes, then the free runs,
    in the order XLA's CPU dot takes without a copy with the fewest axes out of place.

    Args:
        subscripts: the einsum, e.g. ``"btf,fshe->sbhte"``.
        shapes: the operands' shapes.

    Returns:
        The merged einsum, or None.

    >>> merged_runs("btf,fshe->sbhte", [(4, 64, 64), (64, 3, 4, 16)])
    Runs(subscripts='bf,fs->bs', shapes=((256, 64), (64, 192)), expanded='btshe')
    >>> merged_runs("ik,kj->ij", [(2, 3), (3, 4)]) is None
    True
    """
    inputs, out = subscripts.split("->")
    parts = inputs.split(",")
    if len(parts) != 2 or any(len(set(p)) != len(p) for p in (*parts, out)):
        return None
    first, second = parts
    if any(letter not in out + other for p, other in zip(parts, parts[::-1]) for letter in p):
        return None  # a letter summed within one operand: jnp's einsum sums it first
    sizes = {letter: n for p, s in zip(parts, shapes) for letter, n in zip(p, s)}

    def kind(letter: str) -> str:
        shared = letter in first and letter in second
        return ("batch" if letter in out else "contracted") if shared else "free"

    def runs(p: str) -> list[str]:
        found: list[str] = []
        for n, letter in enumerate(p):
            previous = p[n - 1] if n else ""
            together = bool(previous) and kind(previous) == kind(letter) == "free"
            found[-1:] = [found[-1] + letter] if together else [*found[-1:], letter]
        return found

    cut = [runs(p) for p in parts]
    if all(len(run) == 1 for p in cut for run in p):
        return None
    batch = [run for run in cut[0] if kind(run[0]) == "batch"]
    free = [[run for run in p if kind(run[0]) == "free"] for p in cut]
    merged_sizes = {run[0]: math.prod(sizes[letter] for letter in run) for p in cut for run in p}
    merged = ["".join(run[0] for run in p) for p in cut]
    # The result in an order that XLA's CPU dot gives without a copy (the output's own where it
    # is one of them), the fewest axes out of place before the transposition into the output.
    orders = [batch + free[0] + free[1], batch + free[1] + free[0]]

    def taken(order: list[str]) -> bool:
        text = f"{merged[0]},{merged[1]}->{''.join(run[0] for run in order)}"
        form = cpu_dot_form(text, merged_sizes)
        return form is None or form.permutation is None

    def out_of_place(order: list[str]) -> int:
        at = [out.index(letter) for letter in "".join(order)]
        return sum(a > b for n, a in enumerate(at) for b in at[n + 1 :])

    result = min((o for o in orders if taken(o)), key=out_of_place, default=orders[0])
    left, right = (tuple(merged_sizes[run[0]] for run in p) for p in cut)
    return Runs(
        f"{merged[0]},{merged[1]}->{''.join(run[0] for run in result)}",
        (left, right),
        "".join(result),
    )


def merged_dot(
    subscripts: str,
    tensors: Sequence[jax.Array],
    dot: Callable[[str, list[jax.Array]], jax.Array],
) -> jax.Array | None:
    """`dot(subscripts, tensors)` computed on the tensors' merged runs (`merged_runs`), its
    result reshaped and transposed back into the einsum's output; None where nothing merges."""
    runs = merged_runs(subscripts, [jnp.shape(t) for t in tensors])
    if runs is None:
        return None
    sizes = {
        letter: n
        for tensor, letters in zip(tensors, subscripts.split("->")[0].split(","))
        for letter, n in zip(letters, jnp.shape(tensor))
    }
    found = dot(runs.subscripts, [jnp.reshape(t, s) for t, s in zip(tensors, runs.shapes)])
    found = jnp.reshape(found, tuple(sizes[letter] for letter in runs.expanded))
    out = subscripts.split("->")[1]
    permutation = tuple(runs.expanded.index(letter) for letter in out)
    return found if permutation == tuple(range(len(out))) else jnp.transpose(found, permutation)
