"""Host functions: expressions of extents, evaluated on the host once per call.

Generated code sees only integers. Every extent-only expression a kernel needs (the hoisted
parameters of its loop bounds and strides, a CUDA launch grid) is an entry of its `params`
array, computed here from the shapes of the tensors the nest names, in exact integer
arithmetic, then clamped to int64.

>>> from codegen.ir.functions import FloorDiv
>>> from codegen.ir.nest import extent_symbol
>>> n, k = extent_symbol("X", 0), extent_symbol("W", 0)
>>> host = host_function([("P0", n - k + 1), ("P1", FloorDiv(n, 2))])
>>> host.extents
(('W', 0), ('X', 0))
>>> host({"X": (10,), "W": (3,)})
array([8, 5])
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import sympy
from sympy.printing.pycode import PythonCodePrinter

from codegen.ir.nest import extent_of

INT64_MAX = (1 << 63) - 1

# How the host evaluates the functions that appear in extent expressions (integers only).
_HOST_FUNCTIONS: dict[str, Callable[..., int]] = {
    "FloorDiv": lambda a, b: a // b,
    "CeilDiv": lambda a, b: -(-a // b),
    "CeilPow2": lambda a: 1 << max(a - 1, 0).bit_length(),
    "Min": min,
    "Max": max,
    # An index fixed at a constant (`X[mod(7)]`, `X[clamp(end+3)]`) is an extent expression
    # too; an empty axis is never read, so its position there does not matter.
    "Wrap": lambda e, n: e % n if n > 0 else 0,
    "Clamp": lambda e, n: min(max(e, 0), n - 1) if n > 0 else 0,
    "Padded": lambda e, n: min(max(e, 0), n - 1) if n > 0 else 0,
    "floor": lambda a: a,
    "ceiling": lambda a: a,
}
_NAMESPACE = {**vars(math), **_HOST_FUNCTIONS}


@dataclass(frozen=True)
class HostFunction:
    """Computes named expressions of extents from tensor shapes: `host(shapes)`."""

    names: tuple[str, ...]  # one per value, in order
    extents: tuple[tuple[str, int], ...]  # (tensor, axis) of each extent read, in order
    compute: Callable[..., tuple[int, ...]] = field(repr=False, compare=False)
    #: `compute` as Python source (a lambda of one argument per extent): what a cache stores.
    source: str = field(default="", repr=False)

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

    def renamed(self, tensors: Mapping[str, str]) -> HostFunction:
        """The same function reading the extents of renamed tensors (`{old: new}`)."""
        extents = tuple((tensors.get(name, name), axis) for name, axis in self.extents)
        return replace(self, extents=extents)


def host_function(parameters: Sequence[tuple[str, sympy.Expr]]) -> HostFunction:
    """A `HostFunction` for `(name, expression of extents)` pairs.

    Args:
        parameters: each value's name and its expression (extent symbols, integers,
            FloorDiv, CeilDiv, CeilPow2, Min, Max, Wrap, Clamp, Padded).

    Returns:
        A `HostFunction` that reads the extents in a fixed order (sorted by name).
    """
    found: set[sympy.Basic] = set()
    for _, expr in parameters:
        found.update(s for s in expr.free_symbols if extent_of(s) is not None)
    ordered = sorted(found, key=str)
    args = [sympy.Symbol(f"e{n}", integer=True) for n in range(len(ordered))]
    renaming = dict(zip(ordered, args, strict=True))
    # The printer lambdify uses, with the same settings: Python integers stay exact.
    printer = PythonCodePrinter(
        {
            "fully_qualified_modules": False,
            "inline": True,
            "allow_unknown_functions": True,
            "user_functions": {name: name for name in _HOST_FUNCTIONS},
        }
    )
    values = "".join(f"{printer.doprint(expr.xreplace(renaming))}, " for _, expr in parameters)
    source = f"lambda {', '.join(map(str, args))}: ({values})"
    extents = tuple(e for s in ordered if (e := extent_of(s)) is not None)
    return compiled_host_function(tuple(name for name, _ in parameters), extents, source)


def compiled_host_function(
    names: Sequence[str], extents: Sequence[tuple[str, int]], source: str
) -> HostFunction:
    """A `HostFunction` from its parts, `source` as `host_function` wrote it (a cache stores
    the parts: no sympy work to load them)."""
    compute = eval(source, dict(_NAMESPACE))  # noqa: S307 - our own generated expression
    return HostFunction(tuple(names), tuple((t, int(a)) for t, a in extents), compute, source)
