"""Emit a loop nest as a C function under a `Schedule`.

Calling convention of the generated entry point::

    void tdsl_<output>_<role>_<hash8>(void *out, const void *const *operands,
                                      const int64_t *params);

* `out`: the C-contiguous output buffer, fully written (element type from `dtypes`);
* `operands`: one data pointer per operand of the nest, in `nest.operands` order
  (C-contiguous; a scalar operand points at its one element); never written;
* `params`: int64 values computed on the host from the extents, in the order of
  `CSource.parameters` (hoisted extent expressions, strides, the amount of work).

Element offsets are int64 throughout. The body of every term is printed after `sympy.cse`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

import sympy

from codegen.c.geometry import CpuGeometry
from codegen.c.reductions.row_dots import ROW_DOT_HELPERS
from codegen.c.reductions.simple import scalar
from codegen.c.schedule import Schedule, choose_cpu_schedule, validate
from codegen.c.strategies import BY_NAME
from codegen.c.threads import HELPERS as THREAD_HELPERS
from codegen.c.threads import work_expression
from codegen.c.tiles.grid import TILE_HELPERS
from codegen.c.tiles.outline import outlined_functions
from codegen.c.tiles.padding import LANE_MASK_HELPERS, prepare_lines
from codegen.c.tiles.tiles import shared_masks, tile, vector_extent
from codegen.emit.emitter import Emitter, Lines, block_lines, c_name, indent_lines
from codegen.emit.signature import STORAGE, accumulation_type, check_dtypes, entry_name
from codegen.ir.nest import LoopNest

__all__ = ["STORAGE", "CSource", "accumulation_type", "emit_c"]


@dataclass(frozen=True)
class CSource:
    """Generated C for one nest: text, entry point and the host parameters it expects."""

    text: str
    entry: str
    parameters: tuple[tuple[str, sympy.Expr], ...]  # (C name, expression of extents)
    signature: str = "void(void *out, const void *const *operands, const int64_t *params)"


_HALF = """\
#include <string.h>
static inline float tdsl_h2f(uint16_t h) { _Float16 x; memcpy(&x, &h, 2); return (float)x; }
static inline uint16_t tdsl_f2h(float f) {
    _Float16 x = (_Float16)f; /* rounds to nearest even */
    uint16_t h; memcpy(&h, &x, 2); return h;
}
static inline float tdsl_bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t tdsl_f2bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16); /* round to nearest even */
}"""


def emit_c(
    nest: LoopNest,
    *,
    dtypes: Mapping[str, str],
    schedule: Schedule | None = None,
    role: str = "forward",
) -> CSource:
    """Generate C for `nest` (see the module docstring for the calling convention).

    Args:
        nest: the loop nest.
        dtypes: numpy dtype name of each operand and of `nest.output`.
        schedule: loop order and mapping; `choose_cpu_schedule` when None.
        role: the nest's role in its kernel ("forward", "grad_A", ...), used in the name.

    Returns:
        The `CSource`.

    Raises:
        ValueError: when the schedule does not fit the nest or a dtype is unsupported.
    """
    check_dtypes(nest, dtypes, STORAGE)
    schedule = schedule or choose_cpu_schedule(nest, dtypes, kernel=True)
    validate(nest, schedule)
    if schedule.record.body is None:
        raise ValueError(f"the {schedule.strategy} strategy generates no C")
    e: Emitter[CpuGeometry] = Emitter(nest, dtypes, schedule)
    work = schedule.record.work or work_expression
    e.named.append(("work_", work(nest)))
    body = _strategy_lines(e, schedule)
    if "team" in e.printer.called:  # a parallel loop: reserve its team
        team = ["int64_t asked_ = 0;", "const int threads_ = tdsl_team(work_, &asked_);"]
        body = [*team, *body, "tdsl_team_done(threads_);"]
    params = [(sym.name, expr) for expr, sym in e.params.items()] + e.named
    entry = entry_name(nest, dtypes, schedule, role)
    return CSource(_assemble(e, entry, params, body), entry, tuple(params))


def _strategy_lines(e: Emitter[CpuGeometry], schedule: CpuGeometry) -> Lines:
    """The loops of `schedule`, and those of its `small` schedules (each in turn) where the
    vector index's extent is shorter than its tile (an interior shorter than the tile, the
    extent less the edges that need per-lane tests, runs whole tested tiles instead:
    `codegen.c.tiles.tiles.tiled`)."""
    here, record = e.variant(schedule=schedule), BY_NAME[schedule.strategy]
    narrow = schedule.small
    if record.wide_and_narrow and narrow is not None and narrow.strategy == schedule.strategy:
        return _wide_and_narrow(e, here, narrow)
    assert record.body is not None  # `emit_c` checked
    body = record.body(here)
    if narrow is None:
        return body
    small = _strategy_lines(e, narrow)
    head = f"if ({vector_extent(here)} >= {schedule.width})"
    return [*block_lines(head, body)[:-1], "} else {", *indent_lines(small), "}"]


def _wide_and_narrow(
    e: Emitter[CpuGeometry], here: Emitter[CpuGeometry], narrow: CpuGeometry
) -> Lines:
    """Wide tiles over the vector axis, then narrow ones (`Schedule.small` a tile): over the
    whole axis where it is shorter than a wide tile, else over the end of the axis where at
    most a narrow tile's width is left after whole wide tiles, instead of a wide tile moved
    back (34 columns: 32 lanes and 8, not 64), storing the lanes the wide tiles did not.
    One narrow tile path serves both, so the source grows by a few lines only."""
    wide = here.schedule.width
    r = next(r for r in e.nest.free if r.index.name == here.schedule.vector)
    lo, hi = e.idx(r.start), e.idx(r.stop)
    n = f"{hi} - {lo}"
    left = f"({n}) % {wide} <= {narrow.width} ? {lo} + ({n}) / {wide} * {wide} : {hi}"
    first = f"(vs_ > {lo} ? {hi} - {narrow.width} : {lo})"
    narrow_here = e.variant(schedule=narrow)
    masks = shared_masks(here, narrow_here)  # padded copies made once for both
    prepared = masks is not None
    rest = tile(narrow_here, (first, hi, "vs_"), prepared)
    if narrow.small is not None:
        head = f"if ({vector_extent(narrow_here)} >= {narrow.width})"
        rest = [*block_lines(head, rest)[:-1], "} else {"]
        rest += [*indent_lines(_strategy_lines(e, narrow.small)), "}"]
    lines = [
        f"const int64_t vs_ = {n} < {wide} ? {lo} : {left};",
        *block_lines(f"if ({n} >= {wide})", tile(here, (lo, "vs_", lo), prepared)),
        *block_lines(f"if (vs_ < {hi})", rest),
    ]
    if masks is None:
        return lines
    made = prepare_lines(e, masks)
    fallback = scalar(e.variant(schedule=dataclasses.replace(here.schedule, small=None)))
    either = [*block_lines(f"if ({made.allocated})", lines)[:-1], "} else {"]
    return [*made.lines, *either, *indent_lines(fallback), "}", *made.freed]


def _assemble(
    e: Emitter[CpuGeometry], entry: str, params: list[tuple[str, sympy.Expr]], body: Lines
) -> str:
    nest = e.nest
    head = [
        *e.header(),
        "#include <math.h>",
        "#include <stdint.h>",
        "",
        e.printer.helpers(),
    ]
    if any(v in ("float16", "bfloat16") for v in e.dtypes.values()):
        head.append(_HALF)
    head.append(TILE_HELPERS)
    if "lane_mask" in e.printer.called:
        head.append(LANE_MASK_HELPERS)
    if "team" in e.printer.called:
        head.append(THREAD_HELPERS)
    if "hsum8" in e.printer.called:
        head.append(ROW_DOT_HELPERS)
    prologue: Lines = []
    for n, op in enumerate(nest.operands):
        ctype = STORAGE[e.dtypes[op.name]]
        pointer = f"((const {ctype} *)operands[{n}])"
        if op.is_scalar:
            value = e.load(op.name).format(f"{pointer}[0]")
            prologue.append(f"const {e.f} in_{c_name(op.name)} = {value};")
        else:
            prologue.append(f"const {ctype} *restrict in_{c_name(op.name)} = {pointer};")
    out_type = STORAGE[e.dtypes[nest.output]]
    prologue.append(f"{out_type} *restrict out_ = ({out_type} *)out;")
    prologue += [f"const int64_t {name} = params[{n}];" for n, (name, _) in enumerate(params)]
    signature = f"void {entry}(void *out, const void *const *operands, const int64_t *params)"
    functions = outlined_functions(e, prologue)
    return "\n".join([*head, "", *functions, *block_lines(signature, [*prologue, *body]), ""])
