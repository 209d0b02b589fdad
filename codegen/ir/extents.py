"""Extents and shapes of a nest for concrete tensor shapes: properties of the IR.

A nest's ranges are expressions of extent symbols (`X.shape[0]`); given the shape of every
tensor it names, they become integers.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, k = index_symbol("i"), index_symbol("k")
>>> n, m = extent_symbol("X", 0), extent_symbol("W", 0)
>>> nest = LoopNest("Y", (Range(i, 0, n - m + 1),),
...                 (Term(tensor_base("X")[i + k], (Range(k, 0, m),)),),
...                 (Operand("X", 1), Operand("W", 1)))
>>> output_shape(nest, {"X": (10,), "W": (3,)})
(8,)
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence

import sympy

from codegen.ir.host import host_function
from codegen.ir.nest import LoopNest, extent_of, extent_symbol

Shapes = Mapping[str, Sequence[int]]


def extent_values(nest: LoopNest, shapes: Shapes) -> dict[sympy.Symbol, int]:
    """The value of every extent symbol of `nest`, from the shapes of the tensors it names."""
    values = {}
    for name in nest.extent_tensors():
        for axis, n in enumerate(shapes[name]):
            values[extent_symbol(name, axis)] = int(n)
    return values


def evaluate_int(expr: sympy.Expr, extents: Mapping[sympy.Symbol, int]) -> int:
    """An expression of extents, evaluated to an integer."""
    value = sympy.sympify(sympy.sympify(expr).xreplace(extents))
    assert value.is_Integer, f"not an integer after substitution: {expr} -> {value}"
    return int(value)


def output_shape(nest: LoopNest, shapes: Shapes) -> tuple[int, ...]:
    """The shape of the nest's output for the given tensor shapes (an empty range gives 0)."""
    return tuple(max(0, int(n)) for n in _output_extents(nest)(shapes))


@functools.lru_cache(maxsize=4096)
def _output_extents(nest: LoopNest) -> Callable[[Shapes], Sequence[int]]:
    """The extents of the output's axes from tensor shapes, made once per nest (JAX's abstract
    evaluation asks at every call): read directly where each is one axis of a tensor."""
    axes = [extent_of(r.stop) if r.start == 0 else None for r in nest.free]
    if all(axis is not None for axis in axes):
        return lambda shapes: [shapes[name][axis] for name, axis in axes]  # type: ignore[misc]
    return host_function([(f"n{d}", r.stop - r.start) for d, r in enumerate(nest.free)]).values
