"""Host functions: expressions of extents, evaluated on the host once per call.

Generated code sees only integers. Every extent-only expression a kernel needs (the hoisted
parameters of its loop bounds and strides, a CUDA launch grid) is an entry of its `params`
array, computed here from the shapes of the tensors the nest names, in exact integer
arithmetic, then clamped to int64.

>>> from codegen.functions import FloorDiv
>>> from codegen.ir import extent_symbol
>>> n, k = extent_symbol("X", 0), extent_symbol("W", 0)
>>> host = host_function([("P0", n - k + 1), ("P1", FloorDiv(n, 2))])
>>> host.extents
(('W', 0), ('X', 0))
>>> host({"X": (10,), "W": (3,)})
array([8, 5])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import sympy

from codegen.ir import extent_of

INT64_MAX = (1 << 63) - 1

# How the host evaluates the functions that appear in extent expressions (integers only).
_HOST_FUNCTIONS: dict[str, Callable[..., int]] = {
    "FloorDiv": lambda a, b: a // b,
    "CeilDiv": lambda a, b: -(-a // b),
    "Min": min,
    "Max": max,
    "floor": lambda a: a,
    "ceiling": lambda a: a,
}


@dataclass(frozen=True)
class HostFunction:
    """Computes named expressions of extents from tensor shapes: `host(shapes)`."""

    names: tuple[str, ...]  # one per value, in order
    extents: tuple[tuple[str, int], ...]  # (tensor, axis) of each extent read, in order
    compute: Callable[..., tuple[int, ...]] = field(repr=False, compare=False)

    def values(self, shapes: Mapping[str, Sequence[int]]) -> tuple[int, ...]:
        """The exact values (Python ints) for `shapes`, which name every tensor read.

        Raises:
            KeyError, IndexError: `shapes` lacks a tensor or an axis that is read.
        """
        return tuple(self.compute(*(int(shapes[name][axis]) for name, axis in self.extents)))

    def __call__(self, shapes: Mapping[str, Sequence[int]]) -> np.ndarray:
        """The values as an int64 array, each clamped to [-INT64_MAX, INT64_MAX]."""
        clamped = [min(max(int(v), -INT64_MAX), INT64_MAX) for v in self.values(shapes)]
        return np.array(clamped, np.int64)


def host_function(parameters: Sequence[tuple[str, sympy.Expr]]) -> HostFunction:
    """A `HostFunction` for `(name, expression of extents)` pairs.

    Args:
        parameters: each value's name and its expression (extent symbols, integers,
            FloorDiv, CeilDiv, Min, Max).

    Returns:
        A `HostFunction` that reads the extents in a fixed order (sorted by name).
    """
    found: set[sympy.Basic] = set()
    for _, expr in parameters:
        found.update(s for s in expr.free_symbols if extent_of(s) is not None)
    ordered = sorted(found, key=str)
    args = [sympy.Symbol(f"e{n}", integer=True) for n in range(len(ordered))]
    renamed = [expr.xreplace(dict(zip(ordered, args, strict=True))) for _, expr in parameters]
    compute = sympy.lambdify(args, renamed, modules=[_HOST_FUNCTIONS, "math"])
    extents = tuple(e for s in ordered if (e := extent_of(s)) is not None)
    return HostFunction(
        tuple(name for name, _ in parameters), extents, lambda *values: tuple(compute(*values))
    )
