"""Row kernels in C for gathers: the gather of a table's rows, and its transpose.

A gathered operand (`tensordsl/binding/gather.py`) is rows of a table read at positions;
here one loop over the positions copies each row (NaN or 0 where a position is outside the
table). Its transpose, the table's cotangent, adds each row to the table row it was read
from: one loop over the rows in the order of their positions, on one thread, so every table
row receives its additions in the same order on every call, the result is the same bits
every time (no atomics, no sort), and it equals a serial `np.add.at` in the table's dtype.
XLA's CPU gather and scatter give the same values (its scatter is serial too) but take
longer on these shapes (the scatter copies its rows into a layout of its own first), and
far longer on a busy machine (benchmarks/RESULTS.md, "the gather's transpose on the C back
end"). Parallel back ends keep the sort and segmented sum, which need no order.

Each entry point has the calling convention of every generated kernel (codegen/c/emit.py),
`entry(out, operands, params)`, with operands `(table or rows, positions)` and `params` =
`(count, size, width)` (the gather: and `fill`): `positions` holds `count` integers, the
table `size x width`, the rows `count x width`; a position outside `[0, size)` (the
gather's -1 for an element read outside its table) reads NaN or 0 and adds nothing. Its XLA
FFI handler (codegen/c/run/ffi.py) is compiled beside it.

>>> print(scatter_source("float32", "int32").entry, gather_source("float64", "int64").entry)
tdsl_scatter_rows_float32_int32 tdsl_gather_rows_float64_int64
"""

from __future__ import annotations

import ctypes
import functools
import pathlib
from dataclasses import dataclass, field
from typing import Any

from codegen import config
from codegen.c import threads
from codegen.c.run import ffi
from codegen.c.run.compiler import BuildError, compile_c, compile_flags
from codegen.cache import disk as disk_cache
from codegen.emit.emitter import STORAGE

#: Table dtypes moved and summed here. Half precisions are left to XLA's gather and
#: scatter (which sums them the same way: in their own precision, in index order).
VALUES = ("float32", "float64")
POSITIONS = ("int32", "int64")
#: The length of `params` of the scatter (count, size, width) and of the gather (and fill).
PARAMS = {"scatter": 3, "gather": 4}


@dataclass(frozen=True)
class RowSource:
    """The C of one row kernel and its entry point's name."""

    entry: str
    text: str


@dataclass(frozen=True)
class CompiledRows:
    """A loaded row kernel: `function(out, operands, params)` and its FFI handler."""

    entry: str
    library: pathlib.Path
    function: Any = field(repr=False)
    ffi_handler: Any = field(repr=False)

    @property
    def name(self) -> str:
        return self.entry

    @property
    def ffi_target(self) -> str:
        """The handler's name for XLA: the entry and the library's file name (a digest of
        its content), so one name always means one handler (`CompiledNest.ffi_target`)."""
        return f"{self.entry}_{self.library.stem[:16]}"


def scatter_source(values: str, positions: str) -> RowSource:
    """The C of the scatter of `values` rows at `positions` (numpy dtype names)."""
    entry = f"tdsl_scatter_rows_{values}_{positions}"
    value, position = STORAGE[values], STORAGE[positions]
    text = f"""\
/* tensordsl: rows summed into a table in the order of their positions (codegen/c/gathers.py).
 * out[size][width] = 0; out[positions[i]] += rows[i] for i = 0, 1, ... count - 1, one
 * thread: the same additions in the same order on every call. */
#include <stdint.h>
#include <string.h>

void {entry}(void *out_, const void **operands, const int64_t *params) {{
    {value} *restrict out = ({value} *)out_;
    const {value} *restrict rows = (const {value} *)operands[0];
    const {position} *restrict positions = (const {position} *)operands[1];
    const int64_t count = params[0], size = params[1], width = params[2];
    if (size > 0 && width > 0) memset(out, 0, sizeof({value}) * (size_t)(size * width));
    for (int64_t i = 0; i < count; ++i) {{
        const int64_t r = (int64_t)positions[i];
        if (r < 0 || r >= size) continue;
        {value} *restrict target = out + r * width;
        const {value} *restrict row = rows + i * width;
        for (int64_t d = 0; d < width; ++d) target[d] += row[d];
    }}
}}
"""
    return RowSource(entry, text)


def gather_source(values: str, positions: str) -> RowSource:
    """The C of the gather of `values` rows at `positions`: row `i` of the output is row
    `positions[i]` of the table, or NaN (`params[3]` nonzero) or 0 where it is outside."""
    entry = f"tdsl_gather_rows_{values}_{positions}"
    value, position = STORAGE[values], STORAGE[positions]
    text = f"""\
/* tensordsl: rows of a table read at positions (codegen/c/gathers.py).
 * out[i] = table[positions[i]], NaN (fill) or 0 where a position is outside [0, size). */
#include <math.h>
#include <stdint.h>
#include <string.h>

void {entry}(void *out_, const void **operands, const int64_t *params) {{
    {value} *restrict out = ({value} *)out_;
    const {value} *restrict table = (const {value} *)operands[0];
    const {position} *restrict positions = (const {position} *)operands[1];
    const int64_t count = params[0], size = params[1], width = params[2];
    const {value} outside = params[3] ? ({value})NAN : ({value})0;
    for (int64_t i = 0; i < count; ++i) {{
        const int64_t r = (int64_t)positions[i];
        {value} *restrict row = out + i * width;
        if (r < 0 || r >= size) {{
            for (int64_t d = 0; d < width; ++d) row[d] = outside;
            continue;
        }}
        if (width > 0) memcpy(row, table + r * width, sizeof({value}) * (size_t)width);
    }}
}}
"""
    return RowSource(entry, text)


SOURCES = {"scatter": scatter_source, "gather": gather_source}


def build_rows(kind: str, values: str, positions: str) -> CompiledRows | None:
    """The compiled `kind` kernel ("gather" or "scatter") for these dtypes (built once per
    compiler setting and cache folder, cached on disk like every kernel), or None where
    there is none: a dtype outside `VALUES` / `POSITIONS`, or no XLA FFI headers to call it
    through (the caller then uses XLA's gather or scatter-add).

    Raises:
        BuildError: when the compiler rejects the source (a tensordsl bug).
    """
    if values not in VALUES or positions not in POSITIONS or ffi.include_dir() is None:
        return None
    settings = (config.c_compiler(), compile_flags(), str(config.cache_dir()))
    return _build(kind, values, positions, settings)


@functools.cache
def _build(kind: str, values: str, positions: str, settings: tuple[Any, ...]) -> CompiledRows:
    """`build_rows` once per kind, dtypes and `settings` (what the library depends on)."""
    include = ffi.include_dir()
    assert include is not None  # build_rows checked
    source = SOURCES[kind](values, positions)
    handler = ffi.handler_source(source.entry, (values, positions), values, PARAMS[kind])
    symbols = (source.entry, ffi.handler_name(source.entry))
    threads.openmp_waiting()  # before the OpenMP runtime may load with the first library
    for rebuild in (False, True):  # a library damaged in the cache is built once more
        library = compile_c(
            source.text + "\n" + handler,
            key=("xla_ffi", ffi.header_digest()),
            include_dirs=(include,),
            rebuild=rebuild,
        )
        loaded = disk_cache.load(library, symbols)
        if loaded is not None:
            break
    else:
        raise BuildError(f"tensordsl bug: {library} was just built but does not load")
    function = getattr(loaded, source.entry)
    function.restype = None
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    return CompiledRows(source.entry, library, function, getattr(loaded, symbols[1]))
