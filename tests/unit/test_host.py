"""Host functions (codegen/ir/host.py): extent expressions evaluated on the host, as int64."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import sympy

from codegen.ir.functions import CeilDiv, FloorDiv
from codegen.ir.host import INT64_MAX, compiled_host_function, host_function
from codegen.ir.nest import extent_symbol

n, k = extent_symbol("X", 0), extent_symbol("W", 1)


def expected(x: int, w: int) -> list[int]:
    """The same values, computed independently with exact fractions."""
    return [
        x - w + 1,
        math.floor(Fraction(x - 2 * w - 5, 2)),
        math.ceil(Fraction(x - 11, 4)),
        min(x, 4 * w),
        max(0, x - 3 * w),
    ]


PARAMETERS = [
    ("P0", n - k + 1),
    ("P1", FloorDiv(n - 2 * k - 5, 2)),
    ("P2", CeilDiv(n - 11, 4)),
    ("P3", sympy.Min(n, 4 * k)),
    ("P4", sympy.Max(0, n - 3 * k)),
]


@pytest.mark.parametrize("seed", range(5))
def test_values_match_exact_arithmetic(seed: int) -> None:
    rng = np.random.default_rng(seed)
    x, w = (int(v) for v in rng.integers(1, 40, size=2))
    host = host_function(PARAMETERS)
    values = host({"X": (x, 7), "W": (5, w)})
    assert values.dtype == np.int64
    assert values.tolist() == expected(x, w)
    assert host.names == ("P0", "P1", "P2", "P3", "P4")
    assert host.extents == (("W", 1), ("X", 0))


def test_clamped_to_int64() -> None:
    host = host_function([("big", n * 2**70), ("small", -(n * 2**70)), ("plain", n)])
    assert host.values({"X": (3,)}) == (3 * 2**70, -3 * 2**70, 3)
    assert host({"X": (3,)}).tolist() == [INT64_MAX, -INT64_MAX, 3]


def test_constants_and_missing_shapes() -> None:
    assert host_function([("c", sympy.Integer(7))])({}).tolist() == [7]
    with pytest.raises(KeyError):
        host_function([("P0", n)])({"W": (1, 2)})


def test_cuda_host_values_clamp_the_grid() -> None:
    from codegen.cuda.emit import GRID_LIMITS, emit_cuda
    from tensordsl.backends.cuda import _host_values
    from tensordsl.frontend.lower import lower
    from tensordsl.frontend.parse import parse

    nest = lower(parse("Y[i] := X[i+k] * W[k]")).nest
    source = emit_cuda(nest, dtypes={"X": "float32", "W": "float32", "Y": "float32"})
    grids = []
    for x in (2, 1000, 2**45):  # an empty output, a few blocks, more blocks than CUDA allows
        shapes = {"X": (x,), "W": (3,), "Y": (max(0, x - 2),)}
        params, (grid,), workspace = _host_values(source, shapes)
        assert [int(p) for p in params] == list(host_function(source.parameters).values(shapes))
        assert workspace == 0
        grids.append(grid[0])
    assert grids == [1, math.ceil(998 / source.block[0]), GRID_LIMITS[0]]


def test_split_host_values_size_the_scratch_space_and_skip_an_empty_second_pass() -> None:
    from codegen.cuda.emit import emit_cuda
    from tensordsl.backends.cuda import _host_values
    from tensordsl.frontend.lower import lower
    from tensordsl.frontend.parse import parse

    nest = lower(parse("s := X[i]"), reduce="logsumexp").nest
    source = emit_cuda(nest, dtypes={"X": "float64", "s": "float64"})
    assert source.schedule.strategy == "split" and source.schedule.threads == 256
    assert [p.entry for p in source.passes] == [source.entry, f"{source.entry}_combine"]
    for n, parts in ((0, 1), (256, 1), (257, 2), (256 * 5 + 1, 6), (10**9, 1024)):
        params, grids, workspace = _host_values(source, {"X": (n,), "s": ()})
        assert grids[0] == (parts, 1, 1) and params[-1] == parts
        assert grids[1] == ((1, 1, 1) if parts > 1 else (0, 0, 0))  # (0, 0, 0): not launched
        assert workspace == parts * (8 + 8)  # two float64 states per slice


def test_rebuilt_from_its_source_and_renamed() -> None:
    host = host_function(PARAMETERS)
    again = compiled_host_function(host.names, host.extents, host.source)
    shapes = {"X": (29, 7), "W": (5, 3)}
    assert again == host and again.values(shapes) == host.values(shapes) == tuple(expected(29, 3))
    renamed = host.renamed({"X": "dX"})
    assert renamed.extents == (("W", 1), ("dX", 0))
    assert renamed.values({"dX": (29,), "W": (5, 3)}) == host.values(shapes)
