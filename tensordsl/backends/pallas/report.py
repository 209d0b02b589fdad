"""The tile programs a call runs on the pallas back end (`explain(shapes, target="pallas")`).

Reads the nest equations of a forward+backward call's jaxpr (`tensordsl.timing`), as the
CUDA report does, and prints the tile program of each (`codegen.tiles.program.describe`):
grid, tiles, dots, loads and per-tile bounds; a nest tile programs do not handle says why.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from codegen.errors import Unsupported
from codegen.ir.extents import output_shape
from codegen.ir.nest import LoopNest
from codegen.passes.online import unpair
from codegen.tiles.build import tile_program
from tensordsl.timing import equation_dtypes, nest_equations


def tile_report_lines(jaxpr: Any, names: Mapping[LoopNest, str] | None = None) -> list[str]:
    """The tile program of every nest equation of `jaxpr` (a forward+backward call's)."""
    lines = ["pallas tile programs (interpret mode without a GPU, Triton on one)"]
    for eqn in nest_equations(jaxpr):
        nest: LoopNest = eqn.params["nest"]
        dtypes = equation_dtypes(eqn)
        shapes = dict(eqn.params["extents"])
        shapes.update({op.name: v.aval.shape for op, v in zip(nest.operands, eqn.invars)})
        parts: tuple[LoopNest, ...] = (nest,)
        if nest.online:  # the back end runs it as its two nests
            parts = unpair(nest)
            dtypes[nest.online] = dtypes[nest.output]
        for part in parts:
            label = (names or {}).get(part, part.label)
            shapes.setdefault(part.output, output_shape(part, shapes))
            try:
                program = tile_program(part, shapes, dtypes)
            except Unsupported as error:
                lines.append(f"{label}: not run by tile programs: {error.what}")
                continue
            lines += [f"{label}: {program.describe()}"]
    return lines
