"""Compile generated C, load it with ctypes, cache it in memory and on disk.

The disk cache lives under `config.cache_dir()/c/`, one shared object per key (sha256 of the
source text, compiler flags, compiler version and `CACHE_VERSION`); another `Toolchain` (the
CUDA emulator's C++ compiler) has its own folder. Every write goes to a temporary file
first and is moved into place with `os.replace`, so two processes building the same kernel
at once both succeed and a build that dies half way leaves no entry. An entry is checked
before and after loading and rebuilt once when it is damaged; a cache folder that cannot be
written is replaced by a private one (codegen/disk_cache.py). Shapes are run-time
parameters: a new shape never recompiles.

When the compiler fails, a one-line program is compiled with the same command: if that fails
too, the user's compiler setting (`TENSORDSL_CC`, `TENSORDSL_CFLAGS`) is at fault and a
`config.SettingError` shows the command; otherwise the generated code is (a `BuildError`).

When jaxlib's FFI headers are present, each shared object also holds an XLA FFI handler for
its entry point (codegen/ffi.py), so that JAX can call the kernel without Python; if the
headers are missing or the handler does not build, the kernel is built alone and
`CompiledNest.ffi_handler` is None.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import pathlib
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codegen import config, disk_cache, ffi
from codegen.c import CSource, emit_c
from codegen.host import HostFunction, host_function
from codegen.ir import LoopNest
from codegen.reductions import default_dtypes
from codegen.schedule import Schedule, choose_cpu_schedule

CACHE_VERSION = 1
#: -fno-math-errno: libm calls never set errno, so the compiler may hoist and vectorise them
#: (NaN and inf results unchanged); see benchmarks/RESULTS.md, GPT-style block.
BASE_FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-shared", "-fPIC", "-std=gnu11")

#: Counters for tests and diagnostics: compiler runs, disk-cache hits.
STATS = {"compiles": 0, "disk_hits": 0}

_LOCK = threading.RLock()
_MEMORY: dict[tuple[object, ...], CompiledNest] = {}


class BuildError(RuntimeError):
    """The C compiler rejected generated code: a tensordsl bug."""


@functools.lru_cache(maxsize=8)
def compiler_version(cc: str) -> str:
    """The first line of `cc --version` (part of the cache key)."""
    try:
        done = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return "missing"
    return done.stdout.splitlines()[0] if done.stdout else "unknown"


@functools.lru_cache(maxsize=8)
def _openmp_flags(cc: str) -> tuple[str, ...]:
    """`-fopenmp` when it compiles and links here, else SIMD pragmas only (detected once)."""
    probe = "#include <omp.h>\nint f(void) { return omp_get_max_threads(); }\n"
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "probe.c"
        src.write_text(probe)
        command = [cc, *BASE_FLAGS, "-fopenmp", str(src), "-o", str(pathlib.Path(tmp) / "p.so")]
        try:
            ok = subprocess.run(command, capture_output=True, check=False).returncode == 0
        except OSError:
            ok = False
    return ("-fopenmp",) if ok else ("-fopenmp-simd",)


#: Defined when glibc's vector math library links: generated C then declares the float math
#: functions it calls `omp declare simd` (codegen/vecmath.py), and `-lmvec` links them.
LIBMVEC_DEFINE = "-DTDSL_LIBMVEC"


@functools.lru_cache(maxsize=8)
def _libmvec_flags(cc: str) -> tuple[str, ...]:
    """`LIBMVEC_DEFINE` when a vectorised `expf` links to libmvec here (detected once)."""
    probe = (
        "#include <math.h>\n#pragma omp declare simd notinbranch\nfloat expf(float);\n"
        "void f(float *x, int n) {\n#pragma omp simd\n"
        "    for (int i = 0; i < n; ++i) x[i] = expf(x[i]);\n}\n"
    )
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "probe.c"
        src.write_text(probe)
        library = str(pathlib.Path(tmp) / "p.so")
        command = [cc, *BASE_FLAGS, *_openmp_flags(cc), str(src), "-o", library]
        command += ["-Wl,-z,defs", "-lmvec", "-lm"]  # every symbol resolved, libmvec's too
        try:
            ok = subprocess.run(command, capture_output=True, check=False).returncode == 0
        except OSError:
            ok = False
    return (LIBMVEC_DEFINE,) if ok else ()


def compile_flags() -> tuple[str, ...]:
    """All flags the compiler is called with (part of the cache key)."""
    cc = config.c_compiler()
    debug = ("-g",) if config.debug() else ()
    vector_math = _libmvec_flags(cc)
    return (*BASE_FLAGS, *_openmp_flags(cc), *vector_math, *debug, *config.extra_cflags())


def _c_toolchain() -> Toolchain:
    """The C compiler with `compile_flags()`, linking libmvec where they define it."""
    flags = compile_flags()
    libraries = ("-lmvec", "-lm") if LIBMVEC_DEFINE in flags else ("-lm",)
    return Toolchain(config.c_compiler(), flags, "TENSORDSL_CC", libraries=libraries)


def compile_c(
    text: str,
    *,
    key: object = None,
    include_dirs: Sequence[pathlib.Path] = (),
    toolchain: Toolchain | None = None,
    rebuild: bool = False,
) -> pathlib.Path:
    """Compile C source `text` into a cached shared object and return its path.

    Args:
        text: the C source.
        key: anything else the shared object depends on (headers outside the source).
        include_dirs: extra header folders (`-I`).
        toolchain: another compiler, its flags and cache folder (the CUDA emulator's C++).
        rebuild: compile even when the entry exists (it was found damaged).

    Raises:
        BuildError: when the compiler rejects the source; the message gives its path.
        config.SettingError: when the compiler fails on a one-line program too.
    """
    tool = toolchain or _c_toolchain()
    cc = tool.compiler
    flags = (*tool.flags, *(f"-I{folder}" for folder in include_dirs))
    material = repr((text, flags, compiler_version(cc), CACHE_VERSION, key))
    digest = hashlib.sha256(material.encode()).hexdigest()
    folder = disk_cache.usable_folder(config.cache_dir()) / tool.folder / digest[:2]
    folder.mkdir(parents=True, exist_ok=True)
    library = folder / f"{digest}.so"
    if library.exists() and not rebuild:
        STATS["disk_hits"] += 1
        return library
    source = folder / f"{digest}{tool.suffix}"
    disk_cache.atomic_write(source, text.encode())
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{digest}.", suffix=".so.tmp")
    os.close(fd)
    command = [cc, *flags, "-o", tmp, str(source), *tool.libraries]
    STATS["compiles"] += 1
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


def _run_compiler(command: list[str], tool: Toolchain, flags: tuple[str, ...]) -> None:
    """Run the compiler; a failure is the user's setting when a one-line program fails too.

    Raises:
        BuildError: the compiler rejects this source (the message: command and output).
        config.SettingError: the compiler cannot be run, or fails on any source.
    """
    if config.debug():
        print("tensordsl: " + " ".join(command), file=sys.stderr)
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as error:
        raise config.SettingError(
            f"cannot run the compiler {tool.compiler!r} ({error}); set {tool.knob} to a "
            "compiler command"
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


@dataclass(frozen=True)
class CompiledNest:
    """A compiled nest: call it with the output, the operands and the extents."""

    nest: LoopNest
    source: CSource
    library: pathlib.Path
    function: Callable[..., None] = field(repr=False)
    host: HostFunction = field(repr=False)
    #: The XLA FFI handler in the same library (a ctypes function), or None without one.
    ffi_handler: Any = field(default=None, repr=False, compare=False)

    @property
    def ffi_target(self) -> str:
        """A name for the FFI handler unique to the loaded library: the entry name and a digest
        of the library's path (its file name is the digest of its content; two cache folders
        give two loaded copies, and XLA refuses one name for two handler addresses)."""
        digest = hashlib.sha256(str(self.library).encode()).hexdigest()[:16]
        return f"{self.source.entry}_{digest}"

    def all_extents(
        self,
        operand_shapes: Sequence[Sequence[int]],
        out_shape: Sequence[int],
        extents: Mapping[str, Sequence[int]],
    ) -> dict[str, Sequence[int]]:
        """The shape of every tensor the nest names: operands, output and `extents`."""
        names = self.nest.operand_names
        if len(operand_shapes) != len(names):
            raise ValueError(f"expected {len(names)} operands {names}, got {len(operand_shapes)}")
        full: dict[str, Sequence[int]] = dict(zip(names, operand_shapes, strict=True))
        full[self.nest.output] = out_shape
        full.update(extents)
        return full

    def host_parameters(self, extents: Mapping[str, Sequence[int]]) -> np.ndarray:
        """The int64 `params` array for one call."""
        try:
            return self.host(extents)
        except (KeyError, IndexError) as error:
            raise ValueError(
                f"extents {dict(extents)} miss {error} for {self.nest.output}"
            ) from None

    def __call__(
        self,
        out: np.ndarray,
        operands: Sequence[np.ndarray],
        extents: Mapping[str, Sequence[int]],
    ) -> None:
        """Compute the nest into `out` (C-contiguous, fully written); operands are read only."""
        full = self.all_extents([np.shape(a) for a in operands], out.shape, extents)
        for array in (out, *operands):
            if not array.flags.c_contiguous:
                raise ValueError("operands and output must be C-contiguous")
        params = self.host_parameters(full)
        pointers = (ctypes.c_void_p * max(len(operands), 1))(*(a.ctypes.data for a in operands))
        self.function(out.ctypes.data, pointers, params.ctypes.data)


def build_c(
    nest: LoopNest,
    *,
    dtypes: Mapping[str, str],
    schedule: Schedule | None = None,
    role: str = "forward",
) -> CompiledNest:
    """Emit, compile (or fetch from the caches) and load `nest`.

    Args:
        nest: the loop nest.
        dtypes: numpy dtype name of each operand and of the output.
        schedule: as for `emit_c`; the heuristic's choice when None.
        role: the nest's role in its kernel ("forward", "grad_A", ...).

    Returns:
        A `CompiledNest`, callable as `compiled(out, operands, extents)`.

    Raises:
        BuildError: when the compiler rejects the generated code (a tensordsl bug).
    """
    schedule = schedule or choose_cpu_schedule(nest, dtypes, kernel=True)
    memory_key = (
        nest,
        tuple(sorted(dtypes.items())),
        schedule,
        role,
        compile_flags(),
        str(config.cache_dir()),
        str(ffi.include_dir()),
    )
    with _LOCK:
        hit = _MEMORY.get(memory_key)
        if hit is not None:
            return hit
        source = emit_c(nest, dtypes=dtypes, schedule=schedule, role=role)
        dump = config.dump_dir()
        if dump is not None:
            dump.mkdir(parents=True, exist_ok=True)
            disk_cache.atomic_write(dump / f"{source.entry}.c", source.text.encode())
        loaded, library, has_handler = _load_nest(nest, source, dtypes)
        function = getattr(loaded, source.entry)
        function.restype = None
        function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        handler = getattr(loaded, ffi.handler_name(source.entry)) if has_handler else None
        host = host_function(source.parameters)
        compiled = CompiledNest(nest, source, library, function, host, handler)
        _MEMORY[memory_key] = compiled
        return compiled


def _load_nest(
    nest: LoopNest, source: CSource, dtypes: Mapping[str, str]
) -> tuple[ctypes.CDLL, pathlib.Path, bool]:
    """Compile (or find) and load `source`; a damaged cache entry is rebuilt once."""
    for rebuild in (False, True):
        library, has_handler = _compile_nest(nest, source, dtypes, rebuild=rebuild)
        symbols = (source.entry, *((ffi.handler_name(source.entry),) if has_handler else ()))
        loaded = disk_cache.load(library, symbols)
        if loaded is not None:
            return loaded, library, has_handler
    raise BuildError(
        f"tensordsl bug: {library} was just built but does not load or lacks {symbols}"
    )


def _compile_nest(
    nest: LoopNest, source: CSource, dtypes: Mapping[str, str], rebuild: bool = False
) -> tuple[pathlib.Path, bool]:
    """Compile `source` with its FFI handler when possible; say whether the handler is in."""
    folder = ffi.include_dir()
    if folder is not None:
        handler = ffi.handler_source(
            source.entry,
            [dtypes[name] for name in nest.operand_names],
            dtypes[nest.output],
            len(source.parameters),
        )
        key = ("xla_ffi", ffi.header_digest())
        text = source.text + "\n" + handler
        try:
            return compile_c(text, key=key, include_dirs=(folder,), rebuild=rebuild), True
        except BuildError as error:
            warnings.warn(
                f"tensordsl: the XLA FFI handler of {source.entry} did not build; "
                f"JAX calls this kernel through buffer_callback instead.\n{error}",
                stacklevel=3,
            )
    return compile_c(source.text, rebuild=rebuild), False


def clear_memory_cache() -> None:
    """Forget every loaded kernel (the disk cache stays)."""
    with _LOCK:
        _MEMORY.clear()


def c_source(nest: LoopNest, dtypes: Mapping[str, str] | None = None, role: str = "forward") -> str:
    """The generated C of `nest` (float32 by default), as `k.source("c")` shows it."""
    return emit_c(nest, dtypes=dtypes or default_dtypes(nest), role=role).text
