"""The default run's sample of a long list of cases; the other cases are marked `exhaustive`.

A check that runs over many cases (the corpus on a compiled back end, every attention variant
with every gradient) keeps its kind in the default run on a sample: every `every`-th case, plus
the first case of each feature the sample would otherwise miss (a reduction, a function, an
operator, integer inputs...). So every kind of check and every feature stays in the default
run, and `python -m pytest -m exhaustive` (or `-m ""`, everything) runs the rest.

>>> [p.id for p in sampled(["a", "b", "c", "d", "e"], every=2, ids=str)]
['a', 'b', 'c', 'd', 'e']
>>> [p.id for p in sampled(["a", "b", "c", "d", "e"], every=2, ids=str) if not p.marks]
['a', 'c', 'e']
>>> kept = sampled(["x1", "y1", "x2"], every=9, ids=str, features=lambda c: {c[0]})
>>> [p.id for p in kept if not p.marks]
['x1', 'y1']
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

import pytest

#: Cases beyond a check's default sample: `-m exhaustive` runs them (pyproject.toml).
EXHAUSTIVE = pytest.mark.exhaustive


def sampled(
    cases: Sequence[Any],
    *,
    every: int,
    ids: Callable[[Any], str],
    features: Callable[[Any], Iterable[Hashable]] = lambda case: (),
) -> list[Any]:
    """`cases` as pytest parameters, those outside the default sample marked `exhaustive`.

    The sample is every `every`-th case (from the first) and each case that brings a feature
    no earlier case of the sample has; it depends on the order of `cases` only, never on a
    random draw, so a failure names the same case in every run.
    """
    covered: set[Hashable] = set()
    found = []
    for position, case in enumerate(cases):
        own = set(features(case))
        kept = position % every == 0 or not own <= covered
        if kept:
            covered |= own
        marks = () if kept else (EXHAUSTIVE,)
        found.append(pytest.param(case, id=ids(case), marks=marks))
    return found


def selected_params(request: pytest.FixtureRequest, test: str) -> list[dict[str, Any]]:
    """The parameters of each case of test function `test` that this run selected (after
    `-m`, `-k` and node ids): what a module fixture that builds every case's kernels up
    front needs to build."""
    return [
        item.callspec.params
        for item in request.session.items
        if getattr(item, "originalname", None) == test
    ]


_CALL = re.compile(r"([A-Za-z_]\w*)\s*\(")
_OPERATOR = re.compile(r"\^|//|%|<=|>=|==|!=|<|>|&|\||\band\b|\bor\b|\bnot\b")


def source_features(source: str, reduce: str = "sum") -> set[Hashable]:
    """What a statement exercises, read off its text: its reduction, every function it calls,
    every operator beyond + - * /, shifted, strided and gathered (nested) accesses."""
    found: set[Hashable] = {("reduce", reduce)}
    found |= {("call", name) for name in _CALL.findall(source)}
    found |= {("operator", op) for op in _OPERATOR.findall(source)}
    accesses = re.findall(r"\[([^\[\]]*(?:\[[^\]]*\][^\[\]]*)*)\]", source)
    if any(re.search(r"[+\-]\s*\d", a) for a in accesses):
        found.add(("access", "shifted"))
    if any(re.search(r"\d\s*\*?\s*[A-Za-z]", a) for a in accesses):
        found.add(("access", "strided"))
    if any("[" in a for a in accesses):
        found.add(("access", "gathered"))
    return found


def corpus_features(case: Any) -> set[Hashable]:
    """A corpus case's features (tests/corpus.py): its statement's, and integer inputs,
    explicit ranges, ties at an extremum, no gradient."""
    found = source_features(case.source, case.reduce)
    flags = {
        "integer inputs": any(arg.integer for arg in case.args.values()),
        "scalar inputs": any(arg.shape == () for arg in case.args.values()),
        "ranges": bool(case.ranges),
        "ties": case.ties,
        "not differentiable": not case.differentiable,
    }
    return found | {("case", flag) for flag, present in flags.items() if present}


def corpus_sample(cases: Sequence[Any], every: int = 3) -> list[Any]:
    """Corpus cases as parameters: a feature-covering sample by default, the rest
    `exhaustive`."""
    return sampled(cases, every=every, ids=lambda case: case.name, features=corpus_features)


def corpus_sample_names(cases: Sequence[Any], every: int = 3) -> frozenset[str]:
    """The names of the corpus cases in the default sample (`corpus_sample`)."""
    return frozenset(p.id for p in corpus_sample(cases, every) if not p.marks)


def by_case(
    items: Sequence[Any],
    names: frozenset[str],
    case: Callable[[Any], str],
    ids: Callable[[Any], str] = str,
) -> list[Any]:
    """Parameters `items` (nests, launches... of corpus cases), `exhaustive` where their case
    (`case(item)`) is outside `names`, the default sample (`corpus_sample_names`)."""
    return [
        pytest.param(item, id=ids(item), marks=() if case(item) in names else (EXHAUSTIVE,))
        for item in items
    ]


def product(*axes: Sequence[Any], every: int, cover: int = 2) -> list[Any]:
    """The combinations of `axes` (a parametrize over several names), sampled: every pair of
    values of two axes is in the default sample (all-pairs testing: greedily, the combination
    that covers the most pairs not yet covered, the first of equals; `cover=1`: every value of
    every axis), and every `every`-th combination.

    >>> combos = product(["plain", "causal"], ["c", "ref"], ["f32", "f64"], every=9)
    >>> [p.id for p in combos if not p.marks]
    ['plain-c-f32', 'plain-ref-f64', 'causal-c-f64', 'causal-ref-f32']
    >>> [p.id for p in product(["a", "b", "c"], [1, 2], every=9, cover=1) if not p.marks]
    ['a-1', 'b-2', 'c-1']
    """
    # A value may be a pytest.param (a back end with its skip mark): its marks are kept.
    params = [[v if hasattr(v, "marks") else pytest.param(v) for v in axis] for axis in axes]
    combos = list(itertools.product(*(range(len(axis)) for axis in params)))

    def pairs(combo: tuple) -> set:
        return set(itertools.combinations(enumerate(combo), cover))

    kept = {position for position in range(len(combos)) if position % every == 0}
    missing = set().union(*(pairs(c) for c in combos)) - set().union(
        *(pairs(combos[k]) for k in kept)
    )
    while missing:
        best = max(range(len(combos)), key=lambda k: (len(pairs(combos[k]) & missing), -k))
        kept.add(best)
        missing -= pairs(combos[best])
    found = []
    for position, combo in enumerate(combos):
        chosen = [params[axis][value] for axis, value in enumerate(combo)]
        values = [v for p in chosen for v in p.values]
        marks = [m for p in chosen for m in p.marks]
        found.append(
            pytest.param(
                *values,
                id="-".join(p.id or "-".join(map(str, p.values)) for p in chosen),
                marks=[*marks, *(() if position in kept else (EXHAUSTIVE,))],
            )
        )
    return found


#: Folders whose tests are the CUDA tier's own checks: they run every case they have.
CUDA_TIERS = ("tests/gpu/", "tests/compile_only/")


def sample_emulated_cases(items: Sequence[Any], every: int = 3) -> None:
    """Mark `exhaustive` the `backend="cuda"` cases of a test function outside `CUDA_TIERS`
    beyond a sample: every `every`-th such case of the function (in collection order, the
    first always), and each case that brings a value of a two-valued axis (a dtype, an
    order, a mode: two values among the function's CUDA cases) its sample lacks.

    Without a GPU these cases run in the CUDA emulator, which compiles each kernel as C++
    (about 0.6 s of g++ CPU a kernel, 2026-12-07): the 262 of them took 349 s of the suite's
    2,967 s of test time, 1.3 s each; the sample keeps 150 of them, 241 s of that time (most
    functions have one to three CUDA cases, and the first is always kept). The checks they
    make stay in the default run on every back end, on every case for the reference and C
    back ends and on the sample for CUDA; the CUDA tier (`CUDA_TIERS`) checks every CUDA
    strategy on every case it has, and NVRTC compiles every function's CUDA text
    (tests/compile_only).

    >>> class Item:
    ...     def __init__(self, name, **params):
    ...         self.nodeid = f"tests/cpu/test_x.py::{name}[...]"
    ...         self.callspec = type("Spec", (), {"params": params})()
    ...         self.marks = []
    ...     def get_closest_marker(self, name):
    ...         return next((m for m in self.marks if m.name == name), None)
    ...     def add_marker(self, mark):
    ...         self.marks.append(mark.mark)
    >>> items = [Item("t", backend=b, case=c, dtype=d) for c in "abcde" for d in ("f32", "f64")
    ...          for b in ("c", "cuda")]
    >>> sample_emulated_cases(items, every=3)
    >>> [(i.callspec.params["case"], i.callspec.params["dtype"]) for i in items
    ...  if i.callspec.params["backend"] == "cuda" and not i.marks]
    [('a', 'f32'), ('a', 'f64'), ('b', 'f64'), ('d', 'f32'), ('e', 'f64')]
    """
    functions: dict[str, list[Any]] = {}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("backend") != "cuda" or item.nodeid.startswith(CUDA_TIERS):
            continue
        if item.get_closest_marker("exhaustive") or item.get_closest_marker("slow"):
            continue
        functions.setdefault(item.nodeid.split("[")[0], []).append(item)
    for cases in functions.values():
        values: dict[str, set[str]] = {}
        for item in cases:
            for name, value in item.callspec.params.items():
                values.setdefault(name, set()).add(repr(value))
        small = {name for name, seen in values.items() if len(seen) == 2}
        covered: set[tuple[str, str]] = set()
        for position, item in enumerate(cases):
            own = {(n, repr(v)) for n, v in item.callspec.params.items() if n in small}
            if position % every == 0 or not own <= covered:
                covered |= own
            else:
                item.add_marker(EXHAUSTIVE)
