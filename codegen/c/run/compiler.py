"""The C compiler: its version line, the OpenMP flags that work with it, whether glibc's
vector math library links, and compiling a source into a cached shared object (`compile_c`).

Compilers run for builds that nobody waits for (the optimised build of a tiered kernel,
`background_priority`) run under `nice`, so that the first builds and the trace a first call
waits for keep the cores.

Each is probed by running the compiler (`cc --version`, one-line programs), once per
compiler binary: the answers are kept in the cache folder, keyed by the binary's path, size
and time of change, so a warm process starts no compiler at all. (After installing OpenMP
or libmvec for an unchanged compiler, clear the cache folder.)
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

from codegen import config
from codegen.c.run import tiers
from codegen.cache import disk as disk_cache
from codegen.cache import memo

T = TypeVar("T")


@functools.lru_cache(maxsize=8)
def compiler_version(cc: str) -> str:
    """The first line of `cc --version` (part of the cache key)."""
    return _per_binary(cc, ("version",), functools.partial(_version, cc), str)


@functools.lru_cache(maxsize=8)
def openmp_flags(cc: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    """`-fopenmp` when it compiles and links with `flags` here, else SIMD pragmas only."""
    return _per_binary(cc, ("openmp", flags), functools.partial(_openmp, cc, flags), tuple)


#: Defined when glibc's vector math library links: generated C then declares the float math
#: functions it calls `omp declare simd` (codegen/c/vecmath.py), and `-lmvec` links them.
LIBMVEC_DEFINE = "-DTDSL_LIBMVEC"


@functools.lru_cache(maxsize=8)
def libmvec_flags(cc: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    """`LIBMVEC_DEFINE` when a vectorised `expf` compiled with `flags` links to libmvec."""
    return _per_binary(cc, ("libmvec", flags), functools.partial(_libmvec, cc, flags), tuple)


def _per_binary(cc: str, question: tuple, probe: Callable[[], T], expected: type[T]) -> T:
    """`probe()`, kept on disk for the binary `cc` runs (its path, size, time of change)."""
    path = shutil.which(cc)
    if path is None:
        return probe()
    found = os.stat(path)
    key = (question, cc, path, found.st_size, found.st_mtime_ns)
    folder = config.cache_dir()
    return memo.memo(folder, "compiler", key, probe, version="1", expected=expected)


def _version(cc: str) -> str:
    try:
        done = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return "missing"
    return done.stdout.splitlines()[0] if done.stdout else "unknown"


def _builds(cc: str, source: str, flags: tuple[str, ...], libraries: tuple[str, ...] = ()) -> bool:
    """Whether `cc` with `flags` compiles `source` into a shared object linked with
    `libraries`."""
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "probe.c"
        src.write_text(source)
        output = str(pathlib.Path(tmp) / "p.so")
        command = [cc, *flags, str(src), "-o", output, *libraries]
        try:
            return subprocess.run(command, capture_output=True, check=False).returncode == 0
        except OSError:
            return False


def _openmp(cc: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    probe = "#include <omp.h>\nint f(void) { return omp_get_max_threads(); }\n"
    return ("-fopenmp",) if _builds(cc, probe, (*flags, "-fopenmp")) else ("-fopenmp-simd",)


def _libmvec(cc: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    probe = (
        "#include <math.h>\n#pragma omp declare simd notinbranch\nfloat expf(float);\n"
        "void f(float *x, int n) {\n#pragma omp simd\n"
        "    for (int i = 0; i < n; ++i) x[i] = expf(x[i]);\n}\n"
    )
    # -z defs: every symbol resolved, libmvec's too.
    linked = _builds(cc, probe, flags, ("-Wl,-z,defs", "-lmvec", "-lm"))
    return (LIBMVEC_DEFINE,) if linked else ()


# --------------------------------------------------------------------------- compiling

CACHE_VERSION = 1
#: -fno-math-errno: libm calls never set errno, so the compiler may hoist and vectorise them
#: (NaN and inf results unchanged); see benchmarks/RESULTS.md, GPT-style block.
BASE_FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC", "-std=gnu11")

#: Counters for tests and diagnostics: compiler runs, kernels loaded from the disk cache
#: without compiling, kernels that took the library another nest of the same canonical form
#: built or loaded in this process, C sources emitted.
STATS = {"compiles": 0, "disk_hits": 0, "shared": 0, "emitted": 0}

_STATS_LOCK = threading.Lock()


def count(name: str) -> None:
    """Add one to `STATS[name]` (thread-safe)."""
    with _STATS_LOCK:
        STATS[name] += 1


class BuildError(RuntimeError):
    """The C compiler rejected generated code: a tensordsl bug."""


def compile_flags() -> tuple[str, ...]:
    """All flags the compiler is called with (part of the cache key)."""
    cc = config.c_compiler()
    debug = ("-g",) if config.debug() else ()
    openmp = openmp_flags(cc, BASE_FLAGS)
    vector_math = libmvec_flags(cc, (*BASE_FLAGS, *openmp))
    extra = (*config.c_compiler_flags(), *config.extra_cflags())
    return (*BASE_FLAGS, *openmp, *vector_math, *debug, *extra)


#: Sources longer than this (characters) compile with `-O2` in place of `-O3` (the user's
#: flags, later on the command line, still win): gcc 12 spends 2-4x longer on them at `-O3`
#: (the tiled attention gradients, 56-128 KB: 5-19 s of CPU each instead of 2-9 s; by
#: -ftime-report mostly register liveness and allocation, and `-O2 -fpeel-loops` is as slow),
#: and they ran no slower at `-O2` (the attention sub-layer of benchmarks/natural.py: cold
#: 81 s -> 21 s, forward and forward+backward no slower; docs/backends.md, issue 26).
#: Smaller sources, among them every kernel of the GPT-style block, keep `-O3`.
LARGE_SOURCE = 40_000


def c_toolchain(size: int = 0, *, fast: bool = False) -> Toolchain:
    """The C compiler with `compile_flags()` (`-O2` first for a source of `size` characters
    over `LARGE_SOURCE`; the first build of a tiered kernel's at `tiers.FAST_LEVEL` when
    `fast`), linking libmvec where they define it."""
    flags = compile_flags()
    if fast:
        flags = tiers.fast_flags(flags)
    elif size > LARGE_SOURCE:
        flags = ("-O2", *flags[1:])  # BASE_FLAGS come first: its -O3
    libraries = ("-lmvec", "-lm") if LIBMVEC_DEFINE in flags else ("-lm",)
    return Toolchain(config.c_compiler(), flags, "TENSORDSL_CC", libraries=libraries)


def compile_c(
    text: str,
    *,
    key: object = None,
    include_dirs: Sequence[pathlib.Path] = (),
    rebuild: bool = False,
    toolchain: Toolchain | None = None,
) -> pathlib.Path:
    """Compile C source `text` into a cached shared object and return its path.

    Args:
        text: the C source.
        key: anything else the shared object depends on (headers outside the source).
        include_dirs: extra header folders (`-I`).
        rebuild: compile even when the entry exists (it was found damaged).
        toolchain: another compiler, its flags and cache folder (the CUDA emulator's C++).

    Raises:
        BuildError: when the compiler rejects the source; the message gives its path.
        config.SettingError: when the compiler fails on a one-line program too.
    """
    tool = toolchain or c_toolchain(len(text))
    cc = tool.compiler
    flags = (*tool.flags, *(f"-I{folder}" for folder in include_dirs))
    material = repr((text, flags, compiler_version(cc), CACHE_VERSION, key))
    digest = hashlib.sha256(material.encode()).hexdigest()
    configured = config.cache_dir()
    try:
        return _compile_in(disk_cache.usable_folder(configured), text, digest, tool, flags, rebuild)
    except OSError as error:  # a full disk: once more in a private folder (warned once)
        private = disk_cache.give_up(configured, error)
        return _compile_in(private, text, digest, tool, flags, rebuild)


def _compile_in(
    cache: pathlib.Path,
    text: str,
    digest: str,
    tool: Toolchain,
    flags: tuple[str, ...],
    rebuild: bool,
) -> pathlib.Path:
    """`compile_c` in the cache folder `cache`; OSError where it cannot be written."""
    cc = tool.compiler
    folder = cache / tool.folder / digest[:2]
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / f"{digest}.so"
    if library.exists() and not rebuild:
        count("disk_hits")
        return library
    source = folder / f"{digest}{tool.suffix}"
    disk_cache.atomic_write(source, text.encode())
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{digest}.", suffix=".so.tmp")
    os.close(fd)
    command = [cc, *flags, "-o", tmp, str(source), *tool.libraries]
    count("compiles")
    try:
        _run_compiler(command, tool, flags)
        os.replace(tmp, library)
    except BuildError as error:
        raise BuildError(
            "tensordsl bug: the compiler rejected generated code.\n"
            f"  generated source kept at {source}\n{error}"
        ) from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return library


#: The niceness of compilers run inside `background_priority` (the lowest).
BACKGROUND_NICENESS = 19
_BACKGROUND: contextvars.ContextVar[bool] = contextvars.ContextVar("tdsl_nice", default=False)


@contextlib.contextmanager
def background_priority() -> Iterator[None]:
    """Compilers this thread runs within the context run at the lowest priority (`nice`).

    For builds nobody waits for: the optimised build of a tiered kernel. On a machine with
    few cores, an optimising compiler started beside a first call's unoptimised builds and
    its trace would take a core from them; at the lowest priority it runs on what they
    leave idle (the kernel's fair share between sessions is unchanged: `nice` orders only
    this user's processes, and the build gets every idle core once the call is done)."""
    token = _BACKGROUND.set(True)
    try:
        yield
    finally:
        _BACKGROUND.reset(token)


def _priority_prefix() -> tuple[str, ...]:
    """`nice -n 19` before a background compiler command (nothing without `nice`)."""
    if not _BACKGROUND.get():
        return ()
    nice = shutil.which("nice")
    return () if nice is None else (nice, "-n", str(BACKGROUND_NICENESS))


def _run_compiler(command: list[str], tool: Toolchain, flags: tuple[str, ...]) -> None:
    """Run the compiler (under `nice` in `background_priority`); a failure is the user's
    setting when a one-line program fails too.

    Raises:
        BuildError: the compiler rejects this source (the message: command and output).
        config.SettingError: the compiler cannot be run, or fails on any source.
    """
    if config.debug():
        print("tensordsl: " + " ".join(command), file=sys.stderr)
    try:
        done = subprocess.run(
            [*_priority_prefix(), *command], capture_output=True, text=True, check=False
        )
    except OSError as error:
        raise config.SettingError(
            f"cannot run the compiler {tool.compiler!r} ({error})",
            hint=f"set {tool.knob} to a compiler command",
        ) from None
    if done.returncode == 0:
        return
    failure = _setting_failure(tool, flags)
    if failure is not None:
        raise config.SettingError(failure)
    raise BuildError(f"  command: {' '.join(command)}\n{done.stderr[-4000:].rstrip()}")


@functools.lru_cache(maxsize=8)
def _setting_failure(tool: Toolchain, flags: tuple[str, ...]) -> str | None:
    """Why the compiler setting fails on a one-line program, or None when it works."""
    with tempfile.TemporaryDirectory() as tmp:
        source = pathlib.Path(tmp) / f"probe{tool.suffix}"
        source.write_text("int tdsl_probe(void) { return 0; }\n")
        output = str(pathlib.Path(tmp) / "probe.so")
        command = [tool.compiler, *flags, "-o", output, str(source), *tool.libraries]
        try:
            done = subprocess.run(command, capture_output=True, text=True, check=False)
        except OSError as error:
            return f"cannot run the compiler {tool.compiler!r} ({error}); set {tool.knob}"
    if done.returncode == 0:
        return None
    lines = [
        "the compiler setting fails on a one-line program: "
        f"{tool.knob}={os.environ.get(tool.knob, '')!r}, "
        f"TENSORDSL_CFLAGS={os.environ.get('TENSORDSL_CFLAGS', '')!r}",
        f"  command: {' '.join(command)}",
        *done.stderr[-4000:].rstrip().splitlines(),
        f"expected {tool.knob} to name a compiler and TENSORDSL_CFLAGS to hold flags it takes",
    ]
    return "\n".join(lines)


@dataclass(frozen=True)
class Toolchain:
    """A compiler command, its flags, the knob that sets it and its cache folder."""

    compiler: str
    flags: tuple[str, ...]
    knob: str
    folder: str = "c"
    suffix: str = ".c"
    libraries: tuple[str, ...] = ("-lm",)
