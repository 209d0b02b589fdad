"""How a translated Tullio.jl test case is written and checked (see test_tullio.py).

A case is one `@test` (or `@test_throws`, or a statement that must simply run) of Tullio's
`test/parsing.jl`, `test/gradients.jl` or `test/einsum.jl`, translated to 0-based positions:
an index `i` of Tullio is `i + 1` here and a position `p` is `p - 1`, so Tullio's
`A[2i+1]` reads `A[2i+2]` here; outputs always start at position 0 (Tullio with OffsetArrays
gives the same values at shifted positions). Expected values are computed by numpy from
Tullio's own formula or expected result, never by tensordsl.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np

import tensordsl as td

RNG = np.random.default_rng(1825)
A10 = np.arange(1.0, 11.0) ** 2  # Tullio's `A = [i^2 for i in 1:10]`


@dataclass(frozen=True)
class Case:
    """One translated test: `check(run, inputs)` raises on failure; `run(**inputs)` calls the
    kernel (or program) on a back end."""

    id: str
    tullio: str  # the Tullio line it translates
    source: str
    inputs: dict[str, Any]
    check: Callable[..., None] = field(repr=False)
    options: dict[str, Any] = field(default_factory=dict)
    program: bool = False

    def build(self, backend: str) -> Any:
        make = td.program if self.program else td.kernel
        return make(self.source, backend=backend, **self.options)


@dataclass(frozen=True)
class Skip:
    """A Tullio test that cannot be expressed in this language, with the reason."""

    id: str
    tullio: str
    reason: str


def value(id: str, tullio: str, source: str, inputs: dict, expected: Any, **options: Any) -> Case:
    """The output equals `expected` (an array, or a function of the inputs)."""

    def check(build: Callable[[], Any], inputs: dict) -> None:
        want = expected(**inputs) if callable(expected) else expected
        got = np.asarray(build()(**inputs))
        assert got.shape == np.shape(want), (got.shape, np.shape(want))
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)

    return Case(id, tullio, source, inputs, check, options)


def program(id: str, tullio: str, source: str, inputs: dict, expected: Any) -> Case:
    case = value(id, tullio, source, inputs, expected)
    return Case(case.id, tullio, source, inputs, case.check, program=True)


def shape(id: str, tullio: str, source: str, inputs: dict, want: tuple, **options: Any) -> Case:
    def check(build: Callable[[], Any], inputs: dict) -> None:
        assert np.shape(build()(**inputs)) == want

    return Case(id, tullio, source, inputs, check, options)


def error(id: str, tullio: str, source: str, inputs: dict | None, **options: Any) -> Case:
    """Tullio refuses it (`@test_throws`); here it raises a worded TensorDSLError."""

    def check(build: Callable[[], Any], inputs: dict | None) -> None:
        try:
            kernel = build()
            if inputs is not None:
                kernel(**inputs)
        except td.TensorDSLError:
            return
        raise AssertionError(f"{source!r} did not raise")

    return Case(id, tullio, source, inputs or {}, check, options)


def gradient(
    id: str,
    tullio: str,
    source: str,
    inputs: dict,
    forward: Callable[..., np.ndarray],
    wrt: tuple[str, ...] | None = None,
    loss: Callable[[Any], Any] = jax.numpy.sin,
    **options: Any,
) -> Case:
    """Tullio's `gradtest`: the gradient of `sum(loss(f(x)))` equals central differences of
    the numpy `forward` (and the forward matches it)."""
    names = tuple(inputs) if wrt is None else wrt

    def check(build: Callable[[], Any], inputs: dict) -> None:
        kernel = build()
        np.testing.assert_allclose(kernel(**inputs), forward(**inputs), rtol=1e-10, atol=1e-10)

        def objective(*values: Any) -> Any:
            return loss(kernel(**{**inputs, **dict(zip(names, values, strict=True))})).sum()

        got = jax.grad(objective, argnums=tuple(range(len(names))))(*(inputs[n] for n in names))
        for name, g in zip(names, got, strict=True):
            np.testing.assert_allclose(
                g, numeric(forward, inputs, name, loss), rtol=1e-5, atol=1e-6
            )

    return Case(id, tullio, source, inputs, check, options)


def numeric(forward: Callable[..., np.ndarray], inputs: dict, name: str, loss: Any) -> np.ndarray:
    """Central differences of `sum(loss(forward(inputs)))` with respect to `inputs[name]`."""
    x = np.asarray(inputs[name], np.float64)
    out = np.zeros_like(x)
    for flat in range(x.size):
        for sign in (1, -1):
            moved = x.copy()
            moved.flat[flat] += sign * 1e-6
            value = np.sum(np.asarray(loss(forward(**{**inputs, name: moved}))))
            out.flat[flat] += sign * value / 2e-6
    return out


def rand(*shape: int) -> np.ndarray:
    return RNG.uniform(0.2, 1.0, shape)


def randn(*shape: int) -> np.ndarray:
    return RNG.normal(size=shape)
