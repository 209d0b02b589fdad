"""Random sums of products for the term-structure fuzzer, and their float64 oracle built from
Einstein's rule term by term (issue 36): after products are distributed over sums, each term
is summed over exactly the reduced indices it reads.

A drawn `Sum` is a list of signed products; a product is a constant and tensor accesses
whose indices are partly shared (free `i`, `j`; reduced `k`, `r`, `s`), and at most one
parenthesised sum of products (so that distributing it is never ambiguous,
docs/language.md). A cancelling pair (`+ P ... - P`, its halves apart) is drawn often;
inputs may hold infinities, NaN and zeros of both signs. The oracle evaluates every
distributed term on its own with `einsum` over the indices it reads and adds the terms:
it knows nothing of how tensordsl groups them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from hypothesis import strategies as st

FREE = ("i", "j")
REDUCED = ("k", "r", "s")
EXTENTS = (1, 2, 3, 5)
SPECIALS = (np.inf, -np.inf, np.nan, 0.0, -0.0)

#: A product: a constant and accesses `(tensor, indices)`; `inner` a parenthesised sum of
#: signed products (empty: none).
Access = tuple[str, tuple[str, ...]]


@dataclass(frozen=True)
class Product:
    constant: float
    accesses: tuple[Access, ...]
    inner: tuple[tuple[int, Product], ...] = ()

    def source(self) -> str:
        factors = [f"{a}[{','.join(ix)}]" if ix else a for a, ix in self.accesses]
        if self.inner:
            factors.append(f"({_signed(self.inner)})")
        if self.constant != 1:
            factors.insert(0, repr(self.constant))
        return " * ".join(factors)

    def distributed(self) -> list[tuple[float, tuple[Access, ...]]]:
        """`(coefficient, accesses)` per term once the inner sum is distributed."""
        if not self.inner:
            return [(self.constant, self.accesses)]
        return [
            (self.constant * sign * c, self.accesses + more)
            for sign, p in self.inner
            for c, more in p.distributed()
        ]


def _signed(terms: tuple[tuple[int, Product], ...]) -> str:
    text = ""
    for n, (sign, p) in enumerate(terms):
        op = ("- " if sign < 0 else "+ ") if n else ("-" if sign < 0 else "")
        text += f" {op}{p.source()}" if n else f"{op}{p.source()}"
    return text


@dataclass(frozen=True)
class Sum:
    """One fuzz case: `Y[free] := terms`, its extents and inputs."""

    free: tuple[str, ...]
    terms: tuple[tuple[int, Product], ...]
    extents: tuple[tuple[str, int], ...]
    specials: bool
    dtype: str
    program: bool  # run as `H := body; Y := 2*H` (H inlined or stored)
    seed: int

    @property
    def output(self) -> str:
        return f"[{','.join(self.free)}]" if self.free else ""

    @property
    def source(self) -> str:
        body = _signed(self.terms)
        if self.program:
            return f"H{self.output} := {body}; Y{self.output} := 2 * H{self.output}"
        return f"Y{self.output} := {body}"

    def shapes(self) -> dict[str, tuple[int, ...]]:
        extent = dict(self.extents)
        return {a: tuple(extent[i] for i in ix) for a, ix in _accesses(self.terms)}

    def inputs(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        values = {}
        for name, shape in sorted(self.shapes().items()):
            value = np.array(rng.normal(size=shape) + 0.25)
            if self.specials and value.size and rng.random() < 0.7:
                flat = value.reshape(-1)
                spots = rng.integers(0, flat.size, size=2)
                flat[spots] = rng.choice(SPECIALS, size=2)
            values[name] = value
        return values

    def oracle(self, values: dict, xp=np, *, magnitude: bool = False) -> object:
        """Each distributed term summed over the reduced indices it reads (`einsum`),
        broadcast over the free indices, added in order; twice that for a program.
        `magnitude`: the same with every value and coefficient positive (a scale for the
        rounding of a sum that cancels)."""
        extent = dict(self.extents)
        total = xp.zeros(tuple(extent[i] for i in self.free))
        if magnitude:
            values = {n: xp.abs(v) for n, v in values.items()}
        for sign, product in self.terms:
            for coefficient, accesses in product.distributed():
                scale = abs(coefficient) if magnitude else sign * coefficient
                total = total + scale * self._term(accesses, values, xp)
        return 2 * total if self.program else total

    def _term(self, accesses: tuple[Access, ...], values: dict, xp) -> object:
        read = sorted({i for _, ix in accesses for i in ix}, key=(*FREE, *REDUCED).index)
        kept = "".join(i for i in self.free if i in read)
        letters = ",".join("".join(ix) for _, ix in accesses)
        term = xp.einsum(f"{letters}->{kept}", *(values[a] for a, _ in accesses))
        # broadcast over the free indices the term does not read
        shape = tuple(dict(self.extents)[i] if i in read else 1 for i in self.free)
        extents = tuple(dict(self.extents)[i] for i in self.free)
        return xp.broadcast_to(xp.reshape(term, shape), extents)


def _accesses(terms: tuple[tuple[int, Product], ...]) -> list[Access]:
    found = []
    for _, p in terms:
        found += list(p.accesses)
        found += _accesses(p.inner)
    return found


class _Names:
    """Fresh tensor names, or a tensor already drawn (its indices with it)."""

    def __init__(self) -> None:
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"T{self.count}"


@st.composite
def _product(draw: st.DrawFn, names: _Names, free, depth: int) -> Product:
    indices = (*free, *REDUCED)
    accesses = []
    for _ in range(draw(st.integers(1, 2))):
        ix = draw(st.lists(st.sampled_from(indices), min_size=0, max_size=2, unique=True))
        accesses.append((names.fresh(), tuple(ix)))
    constant = draw(st.sampled_from((1.0, 1.0, 2.0, 0.5, -1.5)))
    inner: tuple = ()
    if depth == 0 and draw(st.booleans()):
        inner = tuple(
            (draw(st.sampled_from((1, -1))), draw(_product(names, free, depth + 1)))
            for _ in range(draw(st.integers(2, 3)))
        )
    return Product(constant, tuple(accesses), inner)


@st.composite
def sums(draw: st.DrawFn, specials: bool | None = None) -> Sum:
    """A random `Sum` (see the module docstring)."""
    names = _Names()
    free = FREE[: draw(st.integers(0, 2))]
    terms = [
        (draw(st.sampled_from((1, -1))), draw(_product(names, free, 0)))
        for _ in range(draw(st.integers(1, 3)))
    ]
    if draw(st.integers(0, 2)):  # a cancelling pair, its halves apart
        pair = draw(st.sampled_from([p for _, p in terms] + [draw(_product(names, free, 0))]))
        first = draw(st.integers(0, len(terms)))
        terms.insert(first, (1, pair))
        terms.insert(draw(st.integers(first + 1, len(terms))), (-1, pair))
    used = {i for _, ix in _accesses(tuple(terms)) for i in ix}
    extents = tuple((i, draw(st.sampled_from(EXTENTS))) for i in (*FREE, *REDUCED) if i in used)
    return Sum(
        free=tuple(i for i in free if i in used),
        terms=tuple(terms),
        extents=extents,
        specials=draw(st.booleans()) if specials is None else specials,
        dtype=draw(st.sampled_from(("float64", "float32"))),
        program=draw(st.integers(0, 3)) == 0,
        seed=draw(st.integers(0, 2**16)),
    )
