"""Run generated CUDA on the CPU: the emulator header (codegen/cuda/emulator/runtime.h) and the
host C++ compiler, launched like a CuPy `RawKernel`.

A translation unit holds one or many kernels: each kernel's text, exactly as `emit_cuda`
returns it, inside its own namespace (so that their helpers and `idx_t` do not clash), and a
descriptor per kernel appended after it (`TDSL_EMU_KERNEL`). Units are compiled by the host
C++ compiler (`TENSORDSL_CXX`) against the CUDA toolkit's headers (`vector_types.h`,
`cuda_fp16.h`, `cuda_bf16.h`), cached on disk by content hash (`codegen.c.run.compiler.compile_c`
with the emulator's toolchain, under `cache_dir()/cuda_emu/`) and loaded with ctypes. A
unit reads `runtime.h` precompiled and links the runtime's code (`runtime.cc`) compiled once
per cache folder (`pch.py`), so its compiler call generates only its kernels. Compilation
still dominates the cost of a kernel, so `build` puts many kernels in one unit and compiles
two units at once; a loaded kernel is kept in memory by its source text.

A launch takes `(grid, block, args)` like `RawKernel`: `args` holds one NumPy array (its
data pointer is passed) or integer/float scalar per kernel parameter, checked against the
kernel's own parameter list. `order="reverse"` runs blocks and threads in reverse order.
A deadlock, a `__trap()` or a bad launch raises `EmulationError` with the emulator's report.

A kernel built with `counting=True` (a unit of its own: `-DTDSL_EMU_COUNT`, every load and
store instrumented, codegen/cuda/emulator/counting.h) also counts per launch: `count(...)`
runs it like a call and returns its `Counts` (FMAs of the text's `TDSL_COUNT_FMA` hooks,
global bytes loaded and stored in the array arguments, shared-memory bank conflicts). The
suite's emulated tests build without it and pay nothing.

>>> available() in (True, False)
True
"""

from __future__ import annotations

import ctypes
import functools
import pathlib
import platform
import re
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codegen import config
from codegen.c.run.compiler import BuildError, Toolchain, compile_c, compiler_version
from codegen.cache import disk as disk_cache
from codegen.cuda.emulator import abi, pch
from codegen.cuda.emulator.abi import EmulationError
from codegen.cuda.emulator.counts import COUNTERS, Counts
from codegen.cuda.run import nvrtc

HEADER = pathlib.Path(__file__).with_name("runtime.h")
RUNTIME = HEADER.with_name("runtime.cc")
COUNTING_HEADER = HEADER.with_name("counting.h")
CACHE_VERSION = 1
ORDERS = {"forward": 0, "reverse": 1}
BASE_FLAGS = (
    "-std=c++20",
    "-O1",
    "-shared",
    "-fPIC",
    "-fvisibility=hidden",
    "-ffp-contract=fast",  # nvcc contracts a*b+c into an FMA by default
    "-w",
)
#: Flags of a counting unit: the hooks, and a call before every load and store (GCC's
#: ThreadSanitizer instrumentation without its runtime: counting.h defines the hooks).
COUNT_FLAGS = (
    "-DTDSL_EMU_COUNT",
    "-fsanitize=thread",
    "--param=tsan-instrument-func-entry-exit=0",
    "--param=tsan-distinguish-volatile=0",
)
#: Linked without the sanitizer's runtime (the driver adds it otherwise).
COUNT_LIBRARIES = (
    "-nodefaultlibs",
    "-lstdc++",
    "-lm",
    "-lc",
    "-lgcc_s",
    "-Wl,-z,defs",
    "-Wl,--wrap=memcpy,--wrap=memmove,--wrap=memset",  # counted too (counting.h)
)
_REQUIRED_HEADERS = ("vector_types.h", "cuda_fp16.h", "cuda_bf16.h", "crt/host_defines.h")
_DYNAMIC_SHARED = re.compile(
    r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s*)?"
    r"(?P<type>[A-Za-z_][\w\s]*?)\s+(?P<name>\w+)\s*\[\s*\]\s*;"
)

_LOCK = threading.Lock()
_LIBRARIES: dict[pathlib.Path, ctypes.CDLL] = {}
_KERNELS: dict[tuple[str, str, bool], EmulatedKernel] = {}
_COUNT_LOCK = threading.Lock()
#: Kernels compiled in this process (compiler calls and disk hits: `codegen.c.run.build.STATS`).
STATS = {"kernels": 0}


def cuda_include_candidates() -> list[pathlib.Path]:
    """Where CUDA headers are looked for: `TENSORDSL_CUDA_HOME`, the CUDA wheels
    (`nvidia/*/include`), /usr/local/cuda."""
    home = config.cuda_home()
    found = [home / "include"] if home else []
    found += [pathlib.Path(d) for d in nvrtc.include_dirs()]
    return [*found, pathlib.Path("/usr/local/cuda/include")]


@functools.lru_cache(maxsize=1)
def cuda_include_dir() -> pathlib.Path | None:
    """The first candidate folder with every header the emulator needs, or None."""
    for folder in cuda_include_candidates():
        if all((folder / header).is_file() for header in _REQUIRED_HEADERS):
            return folder
    return None


def unavailable_reason() -> str | None:
    """Why the emulator cannot run here, or None when it can."""
    if cuda_include_dir() is None:
        return "no CUDA headers with crt/host_defines.h (install the CUDA toolkit or set " + (
            "TENSORDSL_CUDA_HOME)"
        )
    if compiler_version(config.cxx_compiler()) == "missing":
        return f"no C++ compiler {config.cxx_compiler()!r} (set TENSORDSL_CXX)"
    return None


def available() -> bool:
    """True when kernels can be compiled for the emulator here."""
    return unavailable_reason() is None


def compile_flags() -> tuple[str, ...]:
    """Every flag of the compiler call (part of the cache key)."""
    fma = ("-mfma",) if platform.machine() in ("x86_64", "AMD64") else ()
    debug = ("-g",) if config.debug() else ()
    include = cuda_include_dir()
    return (*BASE_FLAGS, *fma, *debug, f"-I{HEADER.parent}", f"-I{include}")


def translation_unit(kernels: Sequence[tuple[str, str]]) -> str:
    """One C++ unit for `kernels`, pairs of (CUDA text, entry name); a text with several
    entries (the passes of one source) is compiled once, in one namespace."""
    lines = [
        "/* tensordsl CUDA emulator unit (codegen/cuda/emulator/emulate.py) */",
        '#include "runtime.h"',
    ]
    spaces: dict[str, str] = {}
    for text, entry in kernels:
        space = spaces.get(text)
        if space is None:
            space = spaces[text] = f"tdsl_k{len(spaces)}"
            dynamic = {
                m["name"]: f"thread_local {m['type']} {m['name']}"
                f"[TDSL_EMU_MAX_SHARED / sizeof({m['type']})] __attribute__((aligned(16)));"
                for m in _DYNAMIC_SHARED.finditer(text)
            }
            lines += [f"namespace {space} {{", f'#line 1 "{entry}.cu"', text]
            lines += ['#line 1 "emulator launchers"', *dynamic.values(), "}"]
        lines.append(f"TDSL_EMU_KERNEL({space}, {entry})")
    return "\n".join(lines) + "\n"


def compile_unit(
    text: str,
    *,
    extra_flags: Sequence[str] = (),
    libraries: Sequence[str] = (),
    key: object = None,
    counting: bool = False,
    symbols: Sequence[str] = (),
    runtime: bool = True,
) -> pathlib.Path:
    """Compile a C++ translation unit into a cached shared object, loaded; return its path.

    A cached object that is not whole, does not load or lacks one of `symbols` (a truncated,
    emptied or swapped file) is compiled again, checked as the C cache checks its libraries
    (`codegen.cache.disk.load`): a truncated library must never reach the loader (SIGBUS).

    Args:
        text: the unit.
        extra_flags: more compiler flags (include folders).
        libraries: linker arguments placed after the source (`-ldl`).
        key: anything else the object depends on (headers outside the flags).
        counting: build with the counters (`COUNT_FLAGS`).
        symbols: names the object must export.
        runtime: the unit includes `runtime.h` and links the runtime's code (`runtime.cc`,
            compiled once per cache folder: `pch.runtime_object`); False for a unit that
            only launches others (the FFI handlers).

    Raises:
        BuildError: when the compiler rejects the unit, or what it built does not load (a
            tensordsl bug; the kept unit is named).
    """
    counted = COUNT_FLAGS if counting else ()
    flags = (*compile_flags(), *counted, *extra_flags)
    cxx = config.cxx_compiler()
    linked: tuple[str, ...] = ()
    if not counting:  # a counting unit compiles the runtime itself (runtime.h)
        shared = pch.runtime_object(cxx, flags) if runtime else None
        here = () if shared or not runtime else ("-DTDSL_EMU_RUNTIME_HERE",)
        flags, linked = (*pch.with_header(cxx, flags), *here), (str(shared),) if shared else ()
    toolchain = Toolchain(
        cxx,
        flags,
        "TENSORDSL_CXX",
        folder="cuda_emu",
        suffix=".cc",
        libraries=(*linked, *libraries, *(COUNT_LIBRARIES if counting else ())),
    )
    headers = (
        HEADER.read_text(),
        RUNTIME.read_text(),
        COUNTING_HEADER.read_text() if counting else "",
    )
    # A C++ library may stay loaded after `dlclose` (its unique symbols make it NODELETE), and
    # the loader then returns it for its path again: where the file swapped in at the path
    # loaded, the rebuilt one is loaded under another name (a key of its own).
    attempts = ((key, False), (key, True), ((key, "reloaded"), False))
    for again, rebuild in attempts:
        path = compile_c(
            text, key=(*headers, CACHE_VERSION, again), toolchain=toolchain, rebuild=rebuild
        )
        if _open(path, symbols) is not None:
            return path
    raise BuildError(f"tensordsl bug: {path} was just built but does not load")


def _open(library: pathlib.Path, symbols: Sequence[str]) -> ctypes.CDLL | None:
    """The loaded `library` (kept open for the process), or None where it is damaged."""
    with _LOCK:
        loaded = _LIBRARIES.get(library)
        if loaded is None:
            loaded = disk_cache.load(library, symbols)
            if loaded is not None:
                _LIBRARIES[library] = loaded
        return loaded


@dataclass(frozen=True)
class EmulatedKernel:
    """A compiled kernel; call it with `(grid, block, args)` like a CuPy RawKernel."""

    entry: str
    library: pathlib.Path
    signature: tuple[str, ...]  # "p" pointer, "i8" int64, "f4" float32, ...
    address: int = field(repr=False)  # of its `tdsl_emu_kernel` descriptor
    _launch: Any = field(repr=False, compare=False)
    counting: bool = False  # built with the counters (`count`)

    def __call__(
        self,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[Any],
        *,
        shared_mem: int = 0,
        order: str = "forward",
    ) -> None:
        """Run the kernel to completion on the calling thread.

        Raises:
            EmulationError: bad arguments, a deadlock, `__trap()` or a bad launch shape.
        """
        if order not in ORDERS:
            raise ValueError(f"order {order!r}: expected one of {', '.join(ORDERS)}")
        pointers, keep = self.pack(args)
        grid3, block3 = abi.dims(grid), abi.dims(block)
        error = ctypes.create_string_buffer(abi.ERROR_BYTES)
        status = self._launch(
            self.address,
            grid3,
            block3,
            int(shared_mem),
            pointers,
            ORDERS[order],
            error,
            abi.ERROR_BYTES,
        )
        del keep
        if status != 0:
            raise EmulationError(error.value.decode(errors="replace"))

    def count(
        self,
        grid: Sequence[int],
        block: Sequence[int],
        args: Sequence[Any],
        *,
        shared_mem: int = 0,
        order: str = "forward",
    ) -> Counts:
        """Run the kernel like a call; return what this launch counted (`Counts`). Global
        bytes are those of loads and stores in the NumPy arrays among `args`.

        Raises:
            EmulationError: as a call, or when the kernel was built without counting.
        """
        if not self.counting:
            raise EmulationError(f"{self.entry} was built without counting (counting=True)")
        library = _LIBRARIES[self.library]
        arrays = [a for a in args if isinstance(a, np.ndarray)]
        ranges = [n for a in arrays for n in (a.ctypes.data, a.ctypes.data + a.nbytes)]
        values = (ctypes.c_longlong * len(COUNTERS))()
        with _COUNT_LOCK:  # the counters are the library's: one counted launch at a time
            library.tdsl_emu_count_reset(
                (ctypes.c_ulonglong * max(len(ranges), 1))(*ranges), len(arrays)
            )
            self(grid, block, args, shared_mem=shared_mem, order=order)
            library.tdsl_emu_count_read(values, len(COUNTERS))
        return Counts(**dict(zip(COUNTERS, (int(v) for v in values), strict=True)))

    def pack(self, args: Sequence[Any]) -> tuple[Any, list[Any]]:
        """`void *args[]` as `cuLaunchKernel` takes it, and the objects it points into."""
        if len(args) != len(self.signature):
            raise EmulationError(
                f"{self.entry} takes {len(self.signature)} arguments "
                f"({' '.join(self.signature)}), got {len(args)}"
            )
        keep = [
            abi.argument(self.entry, n, kind, a)
            for n, (kind, a) in enumerate(zip(self.signature, args, strict=True))
        ]
        pointers = (ctypes.c_void_p * max(len(keep), 1))(
            *(ctypes.cast(ctypes.pointer(k), ctypes.c_void_p) for k in keep)
        )
        return pointers, keep


def _load(library: pathlib.Path, entry: str, counting: bool = False) -> EmulatedKernel:
    with _LOCK:
        loaded = _LIBRARIES[library]  # opened by `compile_unit`
    descriptor = abi.Descriptor.in_dll(loaded, f"tdsl_emu_kernel_{entry}")
    signature = tuple((descriptor.signature or b"").decode().split())
    launch = abi.LAUNCH(descriptor.launch)
    address = ctypes.addressof(descriptor)
    return EmulatedKernel(entry, library, signature, address, launch, counting)


def build(
    kernels: Iterable[tuple[str, str]],
    *,
    per_unit: int = 48,
    jobs: int = 2,
    counting: bool = False,
) -> list[EmulatedKernel]:
    """Compile (or fetch) every `(text, entry)` pair; many kernels per compiler call.

    Args:
        kernels: CUDA source text and entry name of each kernel.
        per_unit: kernels per translation unit.
        jobs: compiler calls run at once.
        counting: build with the counters (`EmulatedKernel.count`), in units of their own.

    Returns:
        One `EmulatedKernel` per pair, in order. The entries asked for with one text come
        from one library (the emulated launch handler opens one per source).
    """
    wanted = [(text, entry, counting) for text, entry in kernels]
    by_text: dict[str, list[tuple[str, str, bool]]] = {}
    for key in dict.fromkeys(wanted):
        by_text.setdefault(key[0], []).append(key)
    with _LOCK:  # a text with a missing entry is built again with all its entries
        groups = [g for g in by_text.values() if any(k not in _KERNELS for k in g)]
    units: list[list[tuple[str, str, bool]]] = []
    entries: list[set[str]] = []  # an entry is a C symbol: once per unit
    for group in groups:
        names = {entry for _, entry, _ in group}
        n = next(
            (
                n
                for n, u in enumerate(units)
                if len(u) + len(group) <= per_unit and not names & entries[n]
            ),
            None,
        )
        if n is None:
            units.append([])
            entries.append(set())
            n = len(units) - 1
        units[n] += group
        entries[n] |= names

    def compiled(unit: list[tuple[str, str, bool]]) -> pathlib.Path:
        pairs = [(text, entry) for text, entry, _ in unit]
        symbols = [f"tdsl_emu_kernel_{entry}" for _, entry in pairs]
        return compile_unit(translation_unit(pairs), counting=counting, symbols=symbols)

    with ThreadPoolExecutor(max(1, jobs)) as pool:
        libraries = list(pool.map(compiled, units))
    for unit, library in zip(units, libraries, strict=True):
        STATS["kernels"] += len(unit)
        for text, entry, _ in unit:
            loaded = _load(library, entry, counting)
            with _LOCK:
                _KERNELS[(text, entry, counting)] = loaded
    with _LOCK:
        return [_KERNELS[k] for k in wanted]


def kernel(text: str, entry: str, *, counting: bool = False) -> EmulatedKernel:
    """The emulated kernel `entry` of `text` (from memory, the disk cache or the compiler)."""
    return build([(text, entry)], counting=counting)[0]
