"""The back ends: one `Backend` record per back end, and how "auto" picks one.

This table is the one place that knows back ends by name; everything else asks the record
(`backend(name)`). A new back end is a folder of its own (`codegen/<name>/`, a runner here
beside `c.py` and `cuda.py`) and one row of `BACKENDS`.

A runner executes a nest without differentiation: `runner(nest, operands, shapes, out dtype,
schedule or None, *, precision=None)`, where `shapes` covers every tensor the nest names and
`precision` is that of the contractions given to XLA's dot (`tensordsl.backends.xla_dot`). The
binding (`tensordsl/binding/primitive.py`, `tensordsl/binding/partitioning.py`) traces it into
`nest_p`'s lowering. The compiled back ends are imported when first used, so `import
tensordsl` starts no compiler and never imports CuPy.

>>> BACKEND_NAMES
('auto', 'reference', 'c', 'cuda', 'pallas')
>>> [b.name for b in BACKENDS.values() if b.emits_code]
['c', 'cuda']
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax

from codegen.cuda.geometry import ONLINE_COLUMNS
from codegen.ir.nest import LoopNest
from tensordsl.backends import reference

Shapes = Mapping[str, tuple[int, ...]]
#: A runner executes a nest without differentiation:
#: (nest, operands, shapes, out dtype, schedule or None, *, precision=None).
Runner = Callable[..., jax.Array]
#: Writes the generated code of a nest: (nest, dtypes, role=...) -> source text.
SourceEmitter = Callable[..., str]

#: The name a user passes to let the machine choose (`resolve`).
AUTO = "auto"


@dataclass(frozen=True)
class StaticReport:
    """A back end's static report of the kernels a call runs (`tensordsl.explain.gpu_report`)."""

    #: The report's first line: what it counts, on which machine.
    title: str
    #: `report(nest, dtypes, shapes, *, precision, spell, name)` -> an object whose `lines()`
    #: describe one kernel (`precision`: the kernel's `precision=`, a `jax.lax.Precision` or
    #: None; `spell` rewrites each expression and `name` each output name before they are
    #: printed: `codegen.ir.source.Spell`).
    report: Callable[..., Any]


@dataclass(frozen=True)
class Backend:
    """What the rest of the package may ask of a back end."""

    name: str
    #: Runs a nest (imports the back end's code when first called).
    run: Runner
    #: Starts building the kernel the runner will need, in the background; None: nothing to build.
    prefetch: Callable[[LoopNest, Sequence[Any], Any, Any], None] | None = None
    #: The emitter of its generated code (`k.source(target)`, explain); None: it emits none.
    source_emitter: Callable[[], SourceEmitter] | None = None
    #: Takes a kernel's `schedule=` / `loop_order=` (the C schedules).
    takes_schedule: bool = False
    #: The longest packed row (`codegen.passes.online`) it runs as one pass; 0: as two nests.
    one_pass_rows: int = 0
    #: A program's row statistics run inside the elementwise statement that reads them, as
    #: passes over each row (`codegen.passes.row_passes`): its schedules have a strategy for
    #: them (the C `row_passes`); elsewhere each element would recompute its row's.
    row_passes: bool = False
    #: `profile()` and `explain --time` time its compiled nests one by one.
    profiled: bool = False
    #: Its schedule heuristic, `choose(nest, dtypes)` (a schedule with `in_words()`); None:
    #: it has no schedule (jax.numpy runs the nest).
    scheduler: Callable[[], Callable[..., Any]] | None = None
    #: Gradients that share their loops run as one multi-output nest
    #: (`tensordsl.binding.grouped`); False: each gradient nest alone.
    groups_gradients: bool = False
    #: Pairs gradient nests that one kernel with two outputs computes together:
    #: `pairs(nests, shapes, dtype)` -> `codegen.passes.packing.Pair`s; None: none pair.
    pairs_gradients: Callable[[], Callable[..., Any]] | None = None
    #: Runs a pair with extras (`Pair.extras`: gradients of score parameters as per-tile
    #: partial sums): `run(nest, extras, values by name, shapes, dtype, *, precision)` ->
    #: (the pair's packed output, the extras' gradients); None: its pairs have no extras.
    runs_partials: Callable[[], Callable[..., Any]] | None = None
    #: Stores attention's scores where an input is read beside them (a relative-bias table:
    #: its gradient then sums their cotangent, `codegen.passes.cost`): its attention kernels
    #: do not compute a score parameter's gradient themselves (neither pairs nor partials).
    sums_beside: bool = False
    #: Builds a nest's kernel now: `build(nest, dtypes=, schedule=)` -> a compiled nest
    #: (`function`, `host_parameters`); `profile()` and `explain --build` call it.
    builder: Callable[[], Callable[..., Any]] | None = None
    #: How many compiles this process has run (a kernel loaded from a cache adds none).
    compiles: Callable[[], int] | None = None
    #: The class of the schedules a kernel's `schedule=` takes (with `takes_schedule`).
    schedule_type: Callable[[], type] | None = None
    #: Checks a schedule against a nest, `validate(nest, schedule)`, raising ValueError.
    validate_schedule: Callable[[], Callable[..., None]] | None = None
    #: The XLA FFI call its runner would trace for a nest, `call(nest, operand types,
    #: shapes, dtype, schedule, *, precision)` -> an object with `target` and `attributes`,
    #: or None where the runner does anything else: `nest_p`'s lowering emits that custom
    #: call directly instead of tracing the runner; None: the runner is always traced.
    ffi_call: Callable[[], Callable[..., Any]] | None = None
    #: The static report of its kernels for a call's shapes (`explain(shapes, target=)`).
    static_report: Callable[[], StaticReport] | None = None
    #: Its one-pass kernel in words for concrete shapes, `lines(nest, shapes, *, spell)`, each
    #: line starting with its name (a program's `explain(shapes)`; `spell` as
    #: `StaticReport.report`'s); None: nothing to add.
    one_pass_lines: Callable[[], Callable[..., list[str]]] | None = None
    #: The transpose of a gather on the CPU, `scatter(rows, positions, size)`: each row added
    #: to its position in the order of the positions (deterministic), or None for dtypes it
    #: has no kernel for (`tensordsl.binding.scatter`); None: XLA's scatter-add.
    row_scatter: Callable[[], Callable[..., Any]] | None = None
    #: A gather on the CPU, `gather(table, positions, fill)`: the table's rows at the
    #: positions, NaN (`fill`) or 0 outside, or None for dtypes it has no kernel for
    #: (`tensordsl.binding.gather`); None: XLA's gather.
    row_gather: Callable[[], Callable[..., Any]] | None = None
    #: Runs contractions as XLA's dot where the `xla` strategy applies, elementwise factors
    #: evaluated apart first (`codegen.ir.contraction`): explain prints those prologues.
    xla_dots: bool = False
    #: How it runs a packed row's two statements (`one_pass_rows`) together, in words, for a
    #: program's `explain(shapes)`.
    one_pass_as: str = "as its two nests"
    #: How it runs a nest, in words, for explain's first line where it has no `scheduler`.
    runs_as: str = "jax.numpy: no generated code, no schedule"

    @property
    def emits_code(self) -> bool:
        return self.source_emitter is not None


def _run_reference(
    nest: LoopNest,
    operands: Sequence[jax.Array],
    shapes: Shapes,
    dtype: Any,
    schedule: Any = None,
    *,
    precision: Any = None,
) -> jax.Array:
    """The reference back end (jax.numpy, the test oracle) as a runner. It ignores
    `precision`: an oracle's sums run at `Precision.HIGHEST` (`reference._sum`)."""
    return reference.evaluate(nest, dict(zip(nest.operand_names, operands)), shapes, dtype)


def _runner(module: str, function: str) -> Runner:
    """The runner `function` of `module`, imported when first called (so that `import
    tensordsl` starts no compiler and never imports CuPy)."""

    def run(
        nest: LoopNest,
        operands: Sequence[jax.Array],
        shapes: Shapes,
        dtype: Any,
        schedule: Any = None,
        *,
        precision: Any = None,
    ) -> jax.Array:
        found = getattr(importlib.import_module(module), function)
        return found(nest, operands, shapes, dtype, schedule=schedule, precision=precision)

    return run


def _prefetch_c(nest: LoopNest, operand_dtypes: Sequence[Any], dtype: Any, schedule: Any) -> None:
    from tensordsl.backends.c import prefetch_c

    prefetch_c(nest, operand_dtypes, dtype, schedule)


def _c_source() -> SourceEmitter:
    from codegen.c.run.build import c_source

    return c_source


def _c_builder() -> Callable[..., Any]:
    from codegen.c.run.build import build_c

    return build_c


def _c_compiles() -> int:
    from codegen.c.run.compiler import STATS

    return STATS["compiles"]


def _c_schedule_type() -> type:
    from codegen.c.schedule import Schedule

    return Schedule


def _c_validate() -> Callable[..., None]:
    from codegen.c.schedule import validate

    return validate


def _c_row_scatter() -> Callable[..., Any]:
    from tensordsl.backends.c import scatter_rows

    return scatter_rows


def _c_ffi_call() -> Callable[..., Any]:
    from tensordsl.backends.c import ffi_call_c

    return ffi_call_c


def _c_row_gather() -> Callable[..., Any]:
    from tensordsl.backends.c import gather_rows

    return gather_rows


def _pallas_static_report() -> StaticReport:
    from tensordsl.backends.pallas.report import TITLE, tile_report

    return StaticReport(TITLE, tile_report)


def _pallas_pairs() -> Callable[..., Any]:
    from codegen.tiles.attention.pairs import pair_attention

    return pair_attention


def _pallas_partials() -> Callable[..., Any]:
    from tensordsl.backends.pallas.run import run_partials

    return run_partials


def _c_scheduler() -> Callable[..., Any]:
    from codegen.c.schedule import choose_cpu_schedule

    return choose_cpu_schedule


def _cuda_scheduler() -> Callable[..., Any]:
    from codegen.cuda.schedule import choose_gpu_schedule

    return choose_gpu_schedule


def _cuda_pairs() -> Callable[..., Any]:
    from codegen.cuda.attention.paired import pair_weighted

    return pair_weighted


def _cuda_source() -> SourceEmitter:
    from codegen.cuda.emit import cuda_source

    return cuda_source


def _cuda_static_report() -> StaticReport:
    from codegen.cuda.report import SMS, cuda_report

    title = f"cuda kernels (static: grid on {SMS} SMs, per output element; sm_90 by NVRTC)"

    def report(
        nest: LoopNest, dtypes: Any, shapes: Any, *, precision: Any, spell: Any, name: Any
    ) -> Any:
        # its kernels compute in float32 exactly; it names no output but the nest's label
        return cuda_report(nest, dtypes, shapes, spell=spell)

    return StaticReport(title, report)


def _cuda_one_pass_lines() -> Callable[..., list[str]]:
    from codegen.cuda.attention.tile_counts import one_pass_lines

    return one_pass_lines


#: The longest output row (the packed axis, less the logsumexp) the C one-pass kernel
#: accumulates; the accumulators of a block of rows live on the stack.
C_ONE_PASS_ROWS = 1024

#: The longest packed row (the logsumexp included, as `tensordsl.binding.partitioning`
#: compares it) the CUDA one-pass kernel (`codegen.cuda.attention.online`) runs: its registers hold
#: 128 columns per pass over the keys; two passes cost what the two nests would.
CUDA_ONE_PASS_ROWS = 2 * ONLINE_COLUMNS + 1

#: The longest packed row (the logsumexp included) the pallas attention kernel
#: (`tensordsl.backends.pallas.attention`) runs as one pass: head dims up to 256, whole in a tile.
PALLAS_ONE_PASS_ROWS = 257

BACKENDS: dict[str, Backend] = {
    "reference": Backend("reference", _run_reference, sums_beside=True),
    "c": Backend(
        "c",
        _runner("tensordsl.backends.c", "run_c"),
        prefetch=_prefetch_c,
        source_emitter=_c_source,
        takes_schedule=True,
        one_pass_rows=C_ONE_PASS_ROWS,
        xla_dots=True,
        one_pass_as="in one pass over each row where rows are short enough (online softmax)",
        row_passes=True,
        sums_beside=True,
        profiled=True,
        scheduler=_c_scheduler,
        groups_gradients=True,
        builder=_c_builder,
        compiles=_c_compiles,
        schedule_type=_c_schedule_type,
        validate_schedule=_c_validate,
        row_scatter=_c_row_scatter,
        row_gather=_c_row_gather,
        ffi_call=_c_ffi_call,
    ),
    "cuda": Backend(
        "cuda",
        _runner("tensordsl.backends.cuda", "run_cuda"),
        source_emitter=_cuda_source,
        one_pass_rows=CUDA_ONE_PASS_ROWS,
        xla_dots=True,
        one_pass_as="in one kernel where rows are short enough (online softmax, "
        "codegen.cuda.attention.online)",
        scheduler=_cuda_scheduler,
        pairs_gradients=_cuda_pairs,
        static_report=_cuda_static_report,
        one_pass_lines=_cuda_one_pass_lines,
    ),
    # Tile programs lowered to Pallas (interpret mode without a GPU, Triton on one).
    "pallas": Backend(
        "pallas",
        _runner("tensordsl.backends.pallas.run", "run_pallas"),
        one_pass_rows=PALLAS_ONE_PASS_ROWS,
        one_pass_as="in one Pallas kernel, FlashAttention's forward (online softmax over "
        "tiles of the reduced index, tensordsl.backends.pallas.attention)",
        pairs_gradients=_pallas_pairs,
        runs_partials=_pallas_partials,
        static_report=_pallas_static_report,
        runs_as=(
            "Pallas tile programs, no loop schedule: explain(shapes, target='pallas') prints them"
        ),
    ),
}

#: The back-end names a kernel accepts: "auto" or a key of BACKENDS.
BACKEND_NAMES = (AUTO, *BACKENDS)
#: The back end whose compiled nests `profile()` times.
PROFILED = next(b for b in BACKENDS.values() if b.profiled)
#: The back end whose schedules a kernel's `schedule=` and `loop_order=` choose.
SCHEDULED = next(b for b in BACKENDS.values() if b.takes_schedule)
#: The back ends with a static report of the kernels a call runs (`explain(..., target=)`).
REPORT_TARGETS = tuple(b.name for b in BACKENDS.values() if b.static_report is not None)
#: The back ends whose generated code `source()` shows.
CODE_TARGETS = tuple(b.name for b in BACKENDS.values() if b.emits_code)


def backend(name: str, nest: LoopNest | None = None, operands: Sequence[Any] = ()) -> Backend:
    """The record of a back end by name ("auto" resolved for this machine, and for `nest`
    on `operands` where given: `resolve_backend`)."""
    return BACKENDS[resolve_backend(name, nest, operands)]


def resolve_backend(name: str, nest: LoopNest | None = None, operands: Sequence[Any] = ()) -> str:
    """`name` itself, or for "auto": on a GPU, the back end the tuning table prefers for
    `nest`'s kind on `operands` (`preferred_backend`), else cuda where CuPy is installed;
    c elsewhere (`auto_choice`)."""
    if name != AUTO:
        return name
    return auto_choice(() if nest is None else ((nest, operands),)).backend


@dataclass(frozen=True)
class AutoChoice:
    """The back end "auto" took for a call, and why (`explain` prints the reason)."""

    backend: str
    reason: str


def auto_choice(runs: Any) -> AutoChoice:
    """What "auto" takes for a call that runs these nests, each with its operands (arrays,
    or anything with a `shape` and a `dtype`; `runs` may be a function giving them, called
    on a GPU only): without a GPU, c; on a GPU, pallas when the
    tuning table prefers pallas for at least one nest's kind and cuda for none (a call's
    nests run on one back end), else cuda where CuPy is installed, c elsewhere.

    >>> import unittest.mock
    >>> with unittest.mock.patch(f"{__name__}._on_gpu", lambda: False):
    ...     auto_choice(()).reason
    'no GPU (jax runs on cpu)'
    """
    if not _on_gpu():
        return AutoChoice("c", f"no GPU (jax runs on {jax.default_backend()})")
    runs = tuple(runs() if callable(runs) else runs)
    preferred = [(nest.label, preferred_backend(nest, ops)) for nest, ops in runs]
    pallas = [label for label, p in preferred if p == "pallas"]
    cuda = [label for label, p in preferred if p == "cuda"]
    if pallas and not cuda:
        return AutoChoice(
            "pallas", f"on a GPU the tuning table prefers pallas for {', '.join(pallas)}"
        )
    if cuda:
        why = f"on a GPU the tuning table prefers cuda for {', '.join(cuda)}"
    elif runs:
        why = "on a GPU the tuning table has no measured row preferring pallas for these nests"
    else:
        why = "on a GPU"
    if importlib.util.find_spec("cupy") is not None:
        return AutoChoice("cuda", why)
    return AutoChoice("c", f"{why}; CuPy is not installed")


def _on_gpu() -> bool:
    return jax.default_backend() == "gpu"


def preferred_backend(nest: LoopNest, operands: Sequence[Any]) -> str | None:
    """The back end the tuning table (`codegen.tiles.tuning`) prefers on a GPU for nests of
    `nest`'s kind, dtype, reduced extent and mask on `operands` (in `nest.operands` order;
    it needs them all), measured by the GPU sweep; None where it has no row that says (or
    tile programs do not run the nest)."""
    from codegen.tiles import tuning

    if len(operands) != len(nest.operands):
        return None
    shapes = tuple((op.name, tuple(v.shape)) for op, v in zip(nest.operands, operands))
    dtypes = tuple((op.name, str(v.dtype)) for op, v in zip(nest.operands, operands))
    key = _tuning_key(nest, shapes, dtypes)
    return None if key is None else tuning.lookup(key).backend


@functools.lru_cache(maxsize=1024)
def _tuning_key(nest: LoopNest, shapes: tuple, dtypes: tuple) -> Any:
    """`codegen.tiles.build.tuning_key`, once per nest, shapes and dtypes; None for a nest
    tile programs refuse (or whose extents the operands do not give)."""
    from codegen.errors import Unsupported
    from codegen.tiles.build import tuning_key

    try:
        return tuning_key(nest, dict(shapes), dict(dtypes))
    except (Unsupported, KeyError):
        return None
