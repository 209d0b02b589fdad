"""Range inference: the range of every index, as expressions of the operands' extents.

Tullio's rule: an index used unshifted (`A[i]`) runs over that axis; a shifted index
(`X[i+k]`) gets the intersection of what every use allows given the ranges of the other
indices, so `Y[i] := X[i+k] * W[k]` is a valid correlation. `ranges=` fixes or narrows
indices, and wins over inference.

>>> from tensordsl.frontend.parse import parse
>>> from tensordsl.frontend.translate import translate
>>> found = index_ranges(translate(parse("Y[i] := X[i+k] * W[k]")), None, "")
>>> found["i"]
Range(index=i, start=0, stop=-W.shape[0] + X.shape[0] + 1)
>>> found["k"]
Range(index=k, start=0, stop=W.shape[0])
"""

from __future__ import annotations

from collections.abc import Mapping

import sympy

from codegen.ir.functions import CeilDiv, FloorDiv
from codegen.ir.nest import Range, extent_symbol, index_symbol
from tensordsl.errors import RangeError, close_match
from tensordsl.frontend.translate import AccessUse, Translation

__all__ = ["index_ranges"]

Bounds = dict[str, tuple[sympy.Expr, sympy.Expr]]  # index name -> (start, stop)


def index_ranges(
    translation: Translation, ranges: Mapping[str, int | range] | None, source: str
) -> dict[str, Range]:
    """The range of every index of a translated statement, free indices first.

    Args:
        translation: from `translate`.
        ranges: an extent or a `range` (step 1) per index, from the user; these win.
        source: the statement, for error messages.

    Returns:
        A `Range` per index name, in the order free indices, then reduced indices.

    Raises:
        RangeError: `ranges=` names an unknown index or is not an extent or a range; a free
        index is not on the right-hand side; nothing constrains an index.
    """
    t = translation
    order = t.free + t.reduced
    known = _explicit_ranges(ranges, order, source)
    first_span = dict(t.index_spans)
    for name in t.free:
        if name not in t.body_spans and name not in known:
            raise RangeError(
                f"free index '{name}' does not appear on the right-hand side",
                source,
                first_span[name],
                expected=f"every index on the left to be used on the right, "
                f"or ranges={{'{name}': ...}}",
            )
    known = _infer_ranges(t.free, t.reduced, t.accesses, known, explicit=frozenset(known))
    for name in order:
        if name not in known:
            raise RangeError(
                f"cannot infer the range of index '{name}'",
                source,
                t.body_spans.get(name, first_span[name]),
                expected=f"an access that uses '{name}' alone on some axis, such as 'A[{name}]', "
                f"or ranges={{'{name}': ...}}",
            )
    return {name: _as_range(name, *known[name]) for name in order}


def _as_range(name: str, start: sympy.Expr, stop: sympy.Expr) -> Range:
    return Range(index_symbol(name), sympy.simplify(start), sympy.simplify(stop))


def _explicit_ranges(
    ranges: Mapping[str, int | range] | None, indices: list[str], source: str
) -> Bounds:
    found: Bounds = {}
    for name, value in (ranges or {}).items():
        if name not in indices:
            raise RangeError(
                f"ranges= names {name!r}, which is not an index of the statement",
                source,
                expected="one of " + (", ".join(indices) or "no indices"),
                hint=close_match(str(name), indices),
            )
        if isinstance(value, range) and value.step == 1:
            found[name] = (sympy.Integer(value.start), sympy.Integer(value.stop))
        elif isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            found[name] = (sympy.Integer(0), sympy.Integer(value))
        else:
            raise RangeError(
                f"ranges[{name!r}] is {value!r}",
                source,
                expected="an extent (an int >= 0) or a range with step 1",
            )
    return found


def _bounds(
    use: AccessUse, axis: int, name: str, known: Bounds
) -> list[tuple[str, int, sympy.Expr]]:
    """What `0 <= index < extent` on one axis allows `name`: ('start'|'stop', divisor, numerator).

    A start bound is `CeilDiv(numerator, divisor)`, a stop bound `FloorDiv(...) + 1`.
    """
    affine = use.axes[axis]
    c = affine.coefficient(index_symbol(name))
    low = high = affine.constant
    for other, d in affine.coefficients:
        if other.name != name:
            start, stop = known[other.name]
            low += d * (start if d > 0 else stop - 1)
            high += d * (stop - 1 if d > 0 else start)
    below, beyond = use.widths(axis) or (0, 0)  # pad(e, p): the axis widened by p each end
    first, last = -below, extent_symbol(use.tensor, axis) - 1 + beyond
    if c > 0:
        return [("start", c, first - low), ("stop", c, last - high)]
    return [("start", -c, high - last), ("stop", -c, low - first)]


def _combine(bounds: list[tuple[str, int, sympy.Expr]]) -> tuple[sympy.Expr, sympy.Expr]:
    """Intersect bounds, keeping only the tightest of those that differ by a constant."""
    tightest: dict[tuple[str, int, sympy.Expr], sympy.Expr] = {}
    for kind, divisor, numerator in bounds:
        numerator = sympy.expand(numerator)
        constant, rest = numerator.as_coeff_Add()
        key = (kind, divisor, rest)
        pick = max if kind == "start" else min
        tightest[key] = pick(tightest.get(key, constant), constant)
    starts = [CeilDiv(r + k, d) for (kind, d, r), k in tightest.items() if kind == "start"]
    stops = [FloorDiv(r + k, d) + 1 for (kind, d, r), k in tightest.items() if kind == "stop"]
    return sympy.Max(*starts), sympy.Min(*stops)


def _infer_ranges(
    free: list[str],
    reduced: list[str],
    accesses: tuple[AccessUse, ...],
    known: Bounds,
    *,
    explicit: frozenset[str] = frozenset(),
) -> Bounds:
    """Ranges of every index that the accesses constrain (Tullio's rule, resolved in rounds).

    An index used only unshifted takes the extent of its first axis. Then, repeatedly, an
    index whose accesses involve only resolved indices takes the intersection of what every
    use allows. When none is ready (`X[i+k] * W[k]`), the first index with an unshifted use
    (reduced indices first), or else with a use that reads no unresolved index
    (`X[i+k] * W[k+1]`), takes the intersection of the uses that can be evaluated. Last, an
    index that nothing else constrains and that alone indexes an axis through `mod`, `clamp`
    or `pad(e)` (`X[n, mod(c)]`) runs over that axis.

    An index given by `ranges=` (in `explicit`) never narrows an index used unshifted
    somewhere: with `ranges={"i": 10}`, `X[i+k] * W[k]` keeps `k` over all of W (and a read
    of X outside it is a call-time error), where intersecting would silently drop W's tail.
    """
    uses: dict[str, list[tuple[AccessUse, int]]] = {name: [] for name in free + reduced}
    wrapped: dict[str, sympy.Expr] = {}  # index -> extent of an axis it alone indexes in mod(...)
    for access in accesses:
        for axis, affine in enumerate(access.axes):
            if access.widths(axis) is None:
                if affine.bare_index is not None:
                    wrapped.setdefault(affine.bare_index.name, extent_symbol(access.tensor, axis))
                continue  # mod, clamp, pad(e): any value reads the array (Tullio's rule)
            for index in affine.indices:
                uses[index.name].append((access, axis))
    for name, found in uses.items():
        if any(_bare(a, x) == name for a, x in found):
            uses[name] = [(a, x) for a, x in found if not others(name, a, x) & explicit]

    for name, found in uses.items():
        if name not in known and found and all(_bare(a, x) == name for a, x in found):
            first, axis = found[0]
            known[name] = (sympy.Integer(0), extent_symbol(first.tensor, axis))
    while True:
        todo = [n for n in free + reduced if n not in known and uses[n]]
        ready = [n for n in todo if all(others(n, a, x) <= set(known) for a, x in uses[n])]
        fallback = [
            n for n in reduced + free if n in todo and any(_bare(a, x) == n for a, x in uses[n])
        ] or [
            n
            for n in reduced + free
            if n in todo and any(others(n, a, x) <= set(known) for a, x in uses[n])
        ]
        if not ready and not fallback:
            last = [n for n in reduced + free if n not in known and n in wrapped]
            if not last:
                return known
            known[last[0]] = (sympy.Integer(0), wrapped[last[0]])
            continue
        name = ready[0] if ready else fallback[0]
        usable = [(a, x) for a, x in uses[name] if others(name, a, x) <= set(known)]
        known[name] = _combine([b for a, x in usable for b in _bounds(a, x, name, known)])


def others(name: str, access: AccessUse, axis: int) -> set[str]:
    """The indices other than `name` in the index expression of `axis` of `access`."""
    return {o.name for o in access.axes[axis].indices} - {name}


def _bare(access: AccessUse, axis: int) -> str | None:
    """The index name that indexes `axis` of `access` alone (unshifted), if any."""
    index = access.axes[axis].bare_index
    return None if index is None or not access.plain(axis) else index.name
