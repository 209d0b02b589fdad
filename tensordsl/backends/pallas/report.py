"""The tile programs a call runs on the pallas back end (`explain(shapes, target="pallas")`):
its `Backend.static_report`, read by `tensordsl.explain.gpu_report` as CUDA's is.

Each nest's tile program is printed (`codegen.tiles.program.describe`): grid, tiles, dots,
loads and per-tile bounds, the tuning row used (or "default: no measured row") and how its
dots round at the kernel's `precision=`; an attention kernel's (`codegen.tiles.attention`:
a one-pass nest, attention's gradient nests) its grid, dots, weights, bounds per row tile
and the tiles visited and skipped, and the score parameters' gradients it computes as
partial sums; a nest tile programs do not handle says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from codegen.errors import Unsupported
from codegen.ir.nest import LoopNest
from codegen.ir.source import Spell, as_written
from codegen.tiles.attention.build import attention_program
from codegen.tiles.attention.partials import partial_of
from codegen.tiles.build import tile_program
from tensordsl.backends.pallas.run import precision_mode

TITLE = "pallas tile programs (interpret mode without a GPU, Triton on one)"


@dataclass(frozen=True)
class TileReport:
    """What `explain` prints of one nest."""

    text: tuple[str, ...]

    def lines(self) -> list[str]:
        return list(self.text)


def tile_report(
    nest: LoopNest,
    dtypes: Mapping[str, str],
    shapes: Mapping[str, Any],
    *,
    precision: Any = None,
    extras: Sequence[LoopNest] = (),
    spell: Spell = as_written,
    name: Callable[[str], str] = str,
) -> TileReport:
    """The tile program of `nest` for these shapes and dtypes, its dots at the kernel's
    `precision` (None: jnp's default), or why there is none; `extras`: gradients of score
    parameters the kernel computes too, as partial sums (`Pair.extras`); `spell` and `name`
    rewrite its expressions and names for people (`codegen.tiles.program.TileProgram.describe`)."""
    flash = attention_program(nest, shapes, dtypes, precision=precision_mode(precision))
    if flash is not None:
        found = tuple(partial_of(flash, extra, shapes) for extra in extras)
        flash = replace(flash, partials=tuple(p for p in found if p is not None))
        return TileReport(tuple(flash.describe(spell=spell, name=name).split("\n")))
    try:
        program = tile_program(nest, shapes, dtypes, precision=precision_mode(precision))
    except Unsupported as error:
        return TileReport((f"not run by tile programs: {error.what}",))
    return TileReport(tuple(program.describe(spell=spell, name=name).split("\n")))
