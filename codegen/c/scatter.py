"""A row scatter-add in C: the transpose of a gather on the C back end.

The cotangent of a gathered table (`tensordsl/binding/gather.py`) is each gathered row
added to the table row it was read from. Here that is one loop over the rows in the order
of their positions, on one thread: every table row receives its additions in the same
order on every call, so the result is the same bits every time (no atomics, no sort), and
it equals a serial `np.add.at` in the table's dtype. One pass reads each row once and
writes into the table, which a gather's table usually keeps in cache. XLA's CPU scatter
gives the same bits (it is serial too) but takes longer on a gather's cotangent (it copies
it into its own layout first), and far longer on a busy machine (benchmarks/RESULTS.md,
"the gather's transpose on the C back end"). Parallel back
ends keep the sort and segmented sum, which need no order.

The entry point has the calling convention of every generated kernel (codegen/c/emit.py),
`entry(out, operands, params)`, with operands `(rows, positions)` and `params` =
`(count, size, width)`: `rows` is `count x width`, `positions` `count` integers, `out`
`size x width`; a position outside `[0, size)` (the gather's -1 for an element read outside
its table) adds nothing. Its XLA FFI handler (codegen/c/ffi.py) is compiled beside it.

>>> print(scatter_source("float32", "int32").entry)
tdsl_scatter_rows_float32_int32
"""

from __future__ import annotations

import ctypes
import functools
import pathlib
from dataclasses import dataclass, field
from typing import Any

from codegen import config
from codegen.c import ffi, threads
from codegen.c.compiler import BuildError, compile_c, compile_flags
from codegen.cache import disk as disk_cache
from codegen.emit.emitter import STORAGE

#: Table dtypes summed here. Half precisions are left to XLA's scatter, which sums them
#: the same way (in their own precision, in index order).
VALUES = ("float32", "float64")
POSITIONS = ("int32", "int64")
#: The length of `params`: count, size, width.
PARAMS = 3


@dataclass(frozen=True)
class ScatterSource:
    """The C of one scatter kernel and its entry point's name."""

    entry: str
    text: str


@dataclass(frozen=True)
class CompiledScatter:
    """A loaded scatter kernel: `function(out, operands, params)` and its FFI handler."""

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


def scatter_source(values: str, positions: str) -> ScatterSource:
    """The C of the scatter of `values` rows at `positions` (numpy dtype names)."""
    entry = f"tdsl_scatter_rows_{values}_{positions}"
    value, position = STORAGE[values], STORAGE[positions]
    text = f"""\
/* tensordsl: rows summed into a table in the order of their positions (codegen/c/scatter.py).
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
    return ScatterSource(entry, text)


def build_scatter(values: str, positions: str) -> CompiledScatter | None:
    """The compiled scatter for these dtypes (built once per compiler setting and cache
    folder, cached on disk like every kernel), or None where there is none: a dtype outside
    `VALUES` / `POSITIONS`, or no XLA FFI headers to call it through (the caller then uses
    XLA's scatter-add).

    Raises:
        BuildError: when the compiler rejects the source (a tensordsl bug).
    """
    if values not in VALUES or positions not in POSITIONS or ffi.include_dir() is None:
        return None
    settings = (config.c_compiler(), compile_flags(), str(config.cache_dir()))
    return _build(values, positions, settings)


@functools.cache
def _build(values: str, positions: str, settings: tuple[Any, ...]) -> CompiledScatter:
    """`build_scatter` once per dtypes and `settings` (what the library depends on)."""
    include = ffi.include_dir()
    assert include is not None  # build_scatter checked
    source = scatter_source(values, positions)
    handler = ffi.handler_source(source.entry, (values, positions), values, PARAMS)
    symbols = (source.entry, ffi.handler_name(source.entry))
    threads.passive_waiting()  # before the OpenMP runtime may load with the first library
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
    return CompiledScatter(source.entry, library, function, getattr(loaded, symbols[1]))
