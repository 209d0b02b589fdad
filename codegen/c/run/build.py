"""Compile generated C, load it with ctypes, cache it in memory and on disk.

The disk cache lives under `config.cache_dir()/c/`, one shared object per key (sha256 of the
source text, compiler flags, compiler version and `CACHE_VERSION`); another `Toolchain` (the
CUDA emulator's C++ compiler) has its own folder. Every write goes to a temporary file
first and is moved into place with `os.replace`, so two processes building the same kernel
at once both succeed and a build that dies half way leaves no entry. A library is checked
before and after loading and rebuilt once when it is damaged; a cache folder that cannot be
written is replaced by a private one (codegen/cache/disk.py). Shapes are run-time
parameters: a new shape never recompiles.

When the compiler fails, a one-line program is compiled with the same command: if that fails
too, the user's compiler setting (`TENSORDSL_CC`, `TENSORDSL_CFLAGS`) is at fault and a
`config.SettingError` shows the command; otherwise the generated code is (a `BuildError`).

What is compiled is the nest's canonical form (`codegen.ir.nest.canonical`: tensors and indices
renamed by position), so nests that differ only in their names share one shared object (and
its results do not depend on which of them was built first). A kernel record
(codegen/c/run/records.py) remembers, for a nest as written and for its canonical form, the
shared object, its entry point and its host function, so that a process finding the record
loads the kernel without emitting C.

Builds run once per kernel however many threads ask (codegen/cache/once.py), and `prefetch_c`
starts one in a background thread (`TENSORDSL_BUILD_JOBS` of them at once): the binding
starts every kernel of a traced function while it is traced, so independent compiles run in
parallel with each other and with the rest of the trace.

When jaxlib's FFI headers are present, each shared object also holds an XLA FFI handler for
its entry point (codegen/c/run/ffi.py), so that JAX can call the kernel without Python; if the
headers are missing or the handler does not build, the kernel is built alone and
`CompiledNest.ffi_handler` is None.

Every library loaded shares one counter of the threads its kernels' teams hold, and the first
load sets the OpenMP runtime's wait policy (codegen/c/threads.py).
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import dataclasses
import functools
import pathlib
import threading
import warnings
from collections.abc import Callable, Hashable, Iterator, Mapping
from dataclasses import dataclass

from codegen import config, progress
from codegen.c import threads
from codegen.c.emit import CSource, emit_c
from codegen.c.run import ffi, records, tiers
from codegen.c.run.compiled import CompiledNest
from codegen.c.run.compiler import (
    BuildError,
    background_priority,
    c_toolchain,
    compile_c,
    compile_flags,
    compiler_version,
    count,
)
from codegen.c.schedule import Schedule, choose_cpu_schedule, validate
from codegen.cache import disk as disk_cache
from codegen.cache.once import OnceMap
from codegen.emit.signature import STORAGE, check_dtypes, entry_name
from codegen.ir.host import compiled_host_function, host_function
from codegen.ir.nest import LoopNest, canonical_names, default_dtypes

#: By request; every kernel built or loaded is counted once, for the progress line.
_BUILT: OnceMap[CompiledNest] = OnceMap(progress.BUILDS)
_EMITTED: OnceMap[records.KernelRecord] = OnceMap()  # by canonical record digest
#: Optimised builds of tiered kernels, made in the background (not on the progress line).
_OPTIMISED: OnceMap[CompiledNest] = OnceMap()
#: Optimised builds started, for `wait_for_optimised`: the fast build each takes over.
_STARTED: dict[_Request, CompiledNest] = {}
_STARTED_LOCK = threading.Lock()
_WARNED: set[_Request] = set()


@dataclass(frozen=True)
class _Settings:
    """What a build reads from the environment, read once per request."""

    compiler: str
    version: str
    flags: tuple[str, ...]
    cache_dir: str
    ffi_headers: str
    fast: bool = False  # the first, unoptimised build of a tiered kernel (codegen/c/run/tiers.py)


def _settings(*, fast: bool = False) -> _Settings:
    cc = config.c_compiler()
    include = ffi.include_dir()
    headers = f"{include} {ffi.header_digest()}" if include is not None else "none"
    folder = str(disk_cache.usable_folder(config.cache_dir()))
    flags = tiers.fast_flags(compile_flags()) if fast else compile_flags()
    return _Settings(cc, compiler_version(cc), flags, folder, headers, fast)


@dataclass(frozen=True)
class _Request:
    """One kernel to build: the key of the in-memory cache."""

    nest: LoopNest
    dtypes: tuple[tuple[str, str], ...]
    schedule: Schedule
    role: str
    settings: _Settings


@functools.lru_cache(maxsize=4096)
def _heuristic(nest: LoopNest, dtypes: tuple[tuple[str, str], ...]) -> Schedule:
    return choose_cpu_schedule(nest, dict(dtypes), kernel=True)


def _request(
    nest: LoopNest,
    dtypes: Mapping[str, str],
    schedule: Schedule | None,
    role: str,
    *,
    fast: bool = False,
) -> _Request:
    items = tuple(sorted(dtypes.items()))
    schedule = schedule or _heuristic(nest, items)
    return _Request(nest, items, schedule, role, _settings(fast=fast))


def build_c(
    nest: LoopNest,
    *,
    dtypes: Mapping[str, str],
    schedule: Schedule | None = None,
    role: str = "forward",
    mode: str | None = None,
) -> CompiledNest:
    """Emit, compile (or fetch from the caches) and load `nest`.

    Args:
        nest: the loop nest.
        dtypes: numpy dtype name of each operand and of the output.
        schedule: as for `emit_c`; the heuristic's choice when None.
        role: the nest's role in its kernel ("forward", "grad_A", ...).
        mode: "tiered", "fast" or "full" (`config.build_mode`); None: the setting's, or
            "full" inside `optimised_builds()`.

    Returns:
        A `CompiledNest`, callable as `compiled(out, operands, extents)`; in tiered mode, the
        unoptimised build until the optimised one takes over (codegen/c/run/tiers.py).

    Raises:
        BuildError: when the compiler rejects the generated code (a tensordsl bug).
        ValueError: when the schedule does not fit the nest or a dtype is unsupported.
    """
    request, key, build = _job(nest, dtypes, schedule, role, mode)
    compiled = _BUILT.get(key, build)
    if compiled.warning is not None and request not in _WARNED:
        _WARNED.add(request)
        warnings.warn(compiled.warning, stacklevel=2)
    return compiled


def prefetch_c(
    nest: LoopNest,
    *,
    dtypes: Mapping[str, str],
    schedule: Schedule | None = None,
    role: str = "forward",
) -> None:
    """Start building `nest` in a background thread, as `build_c` would build it, so that a
    later `build_c` finds it built (or waits for it). Nothing when `TENSORDSL_BUILD_JOBS` is 0.
    Errors are raised by that `build_c`."""
    jobs = config.build_jobs()
    if jobs < 1:
        return
    request, key, build = _job(nest, dtypes, schedule, role, None)

    def still_wanted() -> bool:
        return _settings(fast=request.settings.fast) == request.settings

    _BUILT.start(key, build, still_wanted=still_wanted, workers=jobs)


_MODE: contextvars.ContextVar[str | None] = contextvars.ContextVar("tdsl_build", default=None)


@contextlib.contextmanager
def optimised_builds() -> Iterator[None]:
    """Within this context every kernel this thread asks for is built optimised and waited
    for, whatever `TENSORDSL_BUILD` says (`k.build()`: optimised ahead of time)."""
    token = _MODE.set("full")
    try:
        yield
    finally:
        _MODE.reset(token)


def _job(
    nest: LoopNest,
    dtypes: Mapping[str, str],
    schedule: Schedule | None,
    role: str,
    mode: str | None,
) -> tuple[_Request, Hashable, Callable[[], CompiledNest]]:
    """The request for `mode`, its key in `_BUILT` and how it is built. Tiered needs
    background threads: with `TENSORDSL_BUILD_JOBS=0` it builds optimised at once."""
    mode = mode or _MODE.get() or config.build_mode()
    request = _request(nest, dtypes, schedule, role, fast=mode == "fast")
    if mode != "tiered" or config.build_jobs() < 1:
        return request, request, functools.partial(_build, request)
    return request, ("tiered", request), functools.partial(_build_tiered, request)


def _build_tiered(request: _Request) -> CompiledNest:
    """The optimised kernel where its record is on disk; else the fast build, with the
    optimised build started in the background to take over its slot when it has loaded."""
    found = _exact(request)[1]
    if found is not None:
        count("disk_hits")
        return found
    fast_settings = _settings(fast=True)
    quick = _build(dataclasses.replace(request, settings=fast_settings))
    with _STARTED_LOCK:
        _STARTED[request] = quick
    _OPTIMISED.start(
        request,
        functools.partial(_take_over, quick, request, background=True),
        still_wanted=lambda: _settings() == request.settings,
        workers=max(1, config.build_jobs()),
    )
    return quick


def _take_over(quick: CompiledNest, request: _Request, *, background: bool) -> CompiledNest:
    """Build `request` optimised and make the fast build `quick` call it from now on; in the
    `background` (nobody waits for it) its compiler runs at the lowest priority."""
    with background_priority() if background else contextlib.nullcontext():
        optimised = _build(request)
    tiers.take_over(quick.library, quick.entry, optimised.function)
    return optimised


def wait_for_optimised() -> None:
    """Wait until every optimised build started in the background so far has taken over
    (or failed: its error is raised here)."""
    with _STARTED_LOCK:
        started = list(_STARTED.items())
    for request, quick in started:
        # A build still queued is made here, waited for: at the usual priority.
        _OPTIMISED.get(request, functools.partial(_take_over, quick, request, background=False))


def _exact(request: _Request) -> tuple[records.KernelRecord | None, CompiledNest | None]:
    """The request's own record on disk and its kernel loaded, each None when missing (or,
    for the kernel, when its library does not load). Nothing is read with a dump folder:
    every kernel is generated (and dumped) again."""
    if config.dump_dir():
        return None, None
    nest, settings = request.nest, request.settings
    digest = records.record_digest(
        nest, dict(request.dtypes), request.schedule, request.role, settings
    )
    record = records.read_record(pathlib.Path(settings.cache_dir), digest)
    return record, None if record is None else _load(nest, record)


def _build(request: _Request) -> CompiledNest:
    """Load the request's kernel from its record, else from its canonical form's record,
    else emit, compile and record it; a library that does not load is built again."""
    nest, settings = request.nest, request.settings
    record, compiled = _exact(request)
    if compiled is not None:
        count("disk_hits")
        return compiled
    folder = pathlib.Path(settings.cache_dir)
    exact = records.record_digest(
        nest, dict(request.dtypes), request.schedule, request.role, settings
    )
    for rebuild in (record is not None, True):
        shared = _shared_record(request, rebuild=rebuild)
        compiled = _load(nest, shared)
        if compiled is not None:
            records.write_record(folder, exact, shared)
            return compiled
    raise BuildError(f"tensordsl bug: {shared.library} was just built but does not load")


def _shared_record(request: _Request, *, rebuild: bool) -> records.KernelRecord:
    """The record of the request's canonical form, with the nest's own name: read, or made
    by emitting and compiling it once however many requests share that form."""
    nest, dtypes, schedule = request.nest, dict(request.dtypes), request.schedule
    _check(nest, dtypes, schedule)
    form = records.canonical_form(nest, dtypes, schedule)
    emitted = form or (nest, dtypes, schedule)
    digest = records.record_digest(*emitted, request.role, request.settings)
    folder = pathlib.Path(request.settings.cache_dir)

    made_here = []

    def make() -> records.KernelRecord:
        made_here.append(True)
        fresh = rebuild or config.dump_dir() is not None
        found = None if fresh else records.read_record(folder, digest)
        if found is not None:
            count("disk_hits")
            return found
        to_canonical = {} if form else canonical_names(nest)[0]
        made = _emit(
            request.role,
            *emitted,
            to_canonical=to_canonical,
            rebuild=rebuild,
            fast=request.settings.fast,
        )
        records.write_record(folder, digest, made)
        return made

    record = _EMITTED.get((digest, rebuild), make)
    if not made_here:
        count("shared")
    name = entry_name(nest, dtypes, schedule, request.role)
    warning = record.warning and record.warning.replace(record.name, name)
    return dataclasses.replace(record, name=name, warning=warning)


def _check(nest: LoopNest, dtypes: Mapping[str, str], schedule: Schedule) -> None:
    """`emit_c`'s checks, on the nest as written (its errors name the user's tensors)."""
    check_dtypes(nest, dtypes, STORAGE)
    validate(nest, schedule)
    if schedule.record.body is None:
        raise ValueError(f"the {schedule.strategy} strategy generates no C")


def _emit(
    role: str,
    nest: LoopNest,
    dtypes: Mapping[str, str],
    schedule: Schedule,
    *,
    to_canonical: Mapping[str, str],
    rebuild: bool,
    fast: bool,
) -> records.KernelRecord:
    """Emit and compile `nest` (a canonical form, where the request's has one); `fast`: the
    first build of a tiered kernel, whose entry point calls through a slot."""
    source = emit_c(nest, dtypes=dtypes, schedule=schedule, role=role)
    count("emitted")
    dump = config.dump_dir()
    if dump is not None:
        disk_cache.atomic_write(dump / f"{source.entry}.c", source.text.encode())
    library, entry, error = _compile_nest(nest, source, dtypes, rebuild, fast)
    warning = error and (
        f"tensordsl: the XLA FFI handler of {source.entry} did not build; "
        f"JAX calls this kernel through buffer_callback instead.\n{error}"
    )
    host = host_function(source.parameters)
    return records.KernelRecord(
        name=source.entry,
        entry=entry,
        library=str(library),
        handler=ffi.include_dir() is not None and error is None,
        host_names=host.names,
        host_extents=host.renamed(to_canonical).extents,
        host_source=host.source,
        warning=warning,
    )


def _load(nest: LoopNest, record: records.KernelRecord) -> CompiledNest | None:
    """`record`'s kernel for `nest`, or None when its library does not load."""
    symbols = (record.entry, *((ffi.handler_name(record.entry),) if record.handler else ()))
    threads.openmp_waiting()  # before the first kernel loads the OpenMP runtime
    loaded = disk_cache.load(pathlib.Path(record.library), symbols)
    if loaded is None:
        return None
    threads.share_counter(loaded)
    try:
        host = compiled_host_function(record.host_names, record.host_extents, record.host_source)
    except Exception:  # noqa: BLE001 - a damaged record is rebuilt, never a crash
        return None
    function = getattr(loaded, record.entry)
    handler = getattr(loaded, ffi.handler_name(record.entry)) if record.handler else None
    function.restype = None
    function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    to_nest = {new: old for old, new in canonical_names(nest)[0].items()}
    return CompiledNest(
        nest,
        record.name,
        record.entry,
        pathlib.Path(record.library),
        function,
        host.renamed(to_nest),
        handler,
        record.warning,
    )


def _compile_nest(
    nest: LoopNest, source: CSource, dtypes: Mapping[str, str], rebuild: bool, fast: bool
) -> tuple[pathlib.Path, str, str | None]:
    """Compile `source` with its FFI handler when possible (a fast build with its slot, at
    `tiers.FAST_LEVEL`): the library, its entry point, and the error text when the handler
    did not build."""
    text, entry, toolchain = source.text, source.entry, None
    if fast:
        text = f"{text}\n{tiers.slot_source(entry)}"
        entry, toolchain = tiers.call_name(entry), c_toolchain(fast=True)
    folder = ffi.include_dir()
    if folder is None:
        return compile_c(text, rebuild=rebuild, toolchain=toolchain), entry, None
    handler = ffi.handler_source(
        entry,
        [dtypes[name] for name in nest.operand_names],
        dtypes[nest.output],
        len(source.parameters),
    )
    key = ("xla_ffi", ffi.header_digest())
    try:
        library = compile_c(
            text + "\n" + handler,
            key=key,
            include_dirs=(folder,),
            rebuild=rebuild,
            toolchain=toolchain,
        )
        return library, entry, None
    except BuildError as error:
        return compile_c(text, rebuild=rebuild, toolchain=toolchain), entry, str(error)


def clear_memory_cache() -> None:
    """Forget every loaded kernel (the disk cache stays)."""
    _BUILT.clear()
    _EMITTED.clear()
    _OPTIMISED.clear()
    _WARNED.clear()
    with _STARTED_LOCK:
        _STARTED.clear()


def c_source(nest: LoopNest, dtypes: Mapping[str, str] | None = None, role: str = "forward") -> str:
    """The generated C of `nest` (float32 by default), as `k.source("c")` shows it."""
    return emit_c(nest, dtypes=dtypes or default_dtypes(nest), role=role).text
