"""The emulator's header, precompiled, and its runtime, compiled: what every unit shares.

Every emulator unit starts with `#include "runtime.h"`, which pulls in <cmath> and the CUDA
toolkit's `cuda_fp16.h` and `cuda_bf16.h`: parsing them is most of a small unit's compile
without a precompiled header (docs/testing.md has the figures). A precompiled
`runtime.h.gch` is kept in the cache folder under `cuda_emu_pch/<digest>/` beside copies of
the headers (and of `runtime.cc`), the digest
covering the compiler, its version, the flags and the headers' text, and the units are
compiled with `-I` that folder; the compiler then reads the `.gch` where it is valid for the
unit's flags and the header itself otherwise (same text, same result). The `.gch` is built
(about 2 s) when a process compiles its second unit with those flags, so a private cache
folder used for one unit does not pay for it. Counting units (`-fsanitize=thread`) do not use
it. A `.gch` that cannot be built or written is no error: units read the header; one whose
size is not the size its builder recorded (truncated: g++ stops at it) is removed.

The runtime's code (`runtime.cc`: the scheduler, fibers, `launch`, the warp intrinsics'
waits, the tensor-core product) was most of what a unit compiled besides: every unit
generated it again at -O1 for its kernels to call. It is compiled once per folder, by the
first unit that needs it, into `runtime.o` beside the `.gch` (the same flags, so the same
code) and linked into each unit (`runtime_object`): each unit's library still has its own
copy, its own state and TLS block, as before. An object whose SHA-256 is not the one its
builder recorded is built again. Where none can be built or written, a unit compiles
`runtime.cc` itself (`-DTDSL_EMU_RUNTIME_HERE`); so does every counting unit (runtime.h
includes it under `TDSL_EMU_COUNT`: its accesses are instrumented with the kernels').
"""

from __future__ import annotations

import collections
import fcntl
import functools
import hashlib
import os
import pathlib
import subprocess
import tempfile
import threading
from collections.abc import Sequence

from codegen import config
from codegen.c.run.compiler import compiler_version
from codegen.cache import disk as disk_cache

HEADER = pathlib.Path(__file__).with_name("runtime.h")
_COPIED = ("runtime.h", "runtime.cc", "counting.h")
OBJECT = "runtime.o"
_LOCK = threading.Lock()
_UNITS: collections.Counter[pathlib.Path] = collections.Counter()
_TRIED: set[pathlib.Path] = set()  # folders this process built (or failed to build) a .gch in
_OBJECTS: dict[pathlib.Path, pathlib.Path | None] = {}  # each folder's runtime.o, checked once


def with_header(compiler: str, flags: Sequence[str]) -> tuple[str, ...]:
    """`flags` with `-I` of `HEADER`'s folder replaced by `include_folder`'s answer."""
    here, folder = f"-I{HEADER.parent}", include_folder(compiler, flags)
    return tuple(f"-I{folder}" if flag == here else flag for flag in flags)


def include_folder(compiler: str, flags: Sequence[str]) -> pathlib.Path:
    """The folder to include `runtime.h` from for a unit compiled by `compiler` with `flags`
    (`-I` of `HEADER`'s folder among them, which the caller replaces by the answer): the
    cache's copy, with `runtime.h.gch` from this process's second call on; `HEADER`'s own
    folder where the cache cannot be written."""
    try:
        folder = _folder(compiler, flags)
        with _LOCK:  # one build per folder; the other compiler job waits for it
            _UNITS[folder] += 1
            gch = folder / "runtime.h.gch"
            if gch.is_file() and not _whole(gch):
                gch.unlink()  # g++ stops at a truncated one where it skips a foreign one
            if _UNITS[folder] >= 2 and folder not in _TRIED and not gch.is_file():
                _TRIED.add(folder)
                with open(folder / "lock", "w") as lock:  # one process builds, others wait
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    if not gch.is_file():
                        _precompile(compiler, flags, folder)
    except OSError:
        return HEADER.parent
    return folder


def runtime_object(compiler: str, flags: Sequence[str]) -> pathlib.Path | None:
    """`runtime.cc` compiled by `compiler` with `flags` (those of a unit, `-I` of `HEADER`'s
    folder among them) into the object a unit links, in `include_folder`'s folder: built by
    the first unit that asks (one process builds, others wait), checked once per process
    (and built again where it went since: a cache folder emptied).
    None where the cache cannot be written or the object cannot be built: the unit then
    compiles `runtime.cc` itself."""
    try:
        folder = _folder(compiler, flags)
        with _LOCK:
            known = _OBJECTS.get(folder)
            if folder not in _OBJECTS or (known is not None and not known.is_file()):
                with open(folder / "lock", "w") as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX)
                    if not _sealed(folder / OBJECT):
                        _compile_object(compiler, flags, folder)
                _OBJECTS[folder] = folder / OBJECT if _sealed(folder / OBJECT) else None
            return _OBJECTS[folder]
    except OSError:
        return None


def _folder(compiler: str, flags: Sequence[str]) -> pathlib.Path:
    """The cache's folder for `compiler` and `flags`, holding copies of the headers;
    OSError where it cannot be written."""
    cache = disk_cache.usable_folder(config.cache_dir())
    folder = cache / "cuda_emu_pch" / _digest(compiler, tuple(flags))
    for name, data in _headers().items():
        path = folder / name
        if not path.is_file() or path.read_bytes() != data:
            disk_cache.atomic_write(path, data)
    return folder


@functools.cache
def _headers() -> dict[str, bytes]:
    """The text of the headers copied beside the `.gch`, read once per process."""
    return {name: HEADER.with_name(name).read_bytes() for name in _COPIED}


@functools.cache
def _digest(compiler: str, flags: tuple[str, ...]) -> str:
    """The name of the cache folder for `compiler` with `flags` (and the headers' text),
    hashed once per process and setting, not once per unit."""
    material = repr((compiler, compiler_version(compiler), flags, _headers()))
    return hashlib.sha256(material.encode()).hexdigest()[:24]


def _precompile(compiler: str, flags: Sequence[str], folder: pathlib.Path) -> None:
    """Write `folder/runtime.h.gch` (through a temporary file); nothing where it fails."""
    here = f"-I{HEADER.parent}"
    own = [f"-I{folder}" if flag == here else flag for flag in flags if flag != "-shared"]
    fd, tmp = tempfile.mkstemp(dir=folder, prefix="runtime.h.gch.", suffix=".tmp")
    os.close(fd)
    command = [compiler, *own, "-x", "c++-header", str(folder / "runtime.h"), "-o", tmp]
    try:
        done = subprocess.run(command, capture_output=True, check=False)
        if done.returncode == 0:
            size = str(os.path.getsize(tmp)).encode()
            disk_cache.atomic_write(folder / "runtime.h.gch.size", size)
            os.replace(tmp, folder / "runtime.h.gch")
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _compile_object(compiler: str, flags: Sequence[str], folder: pathlib.Path) -> None:
    """Write `folder/runtime.o` and its SHA-256 (through a temporary file); nothing where it
    fails."""
    here = f"-I{HEADER.parent}"
    own = [f"-I{folder}" if flag == here else flag for flag in flags if flag != "-shared"]
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f"{OBJECT}.", suffix=".tmp")
    os.close(fd)
    command = [compiler, *own, "-c", str(folder / "runtime.cc"), "-o", tmp]
    try:
        done = subprocess.run(command, capture_output=True, check=False)
        if done.returncode == 0:
            digest = hashlib.sha256(pathlib.Path(tmp).read_bytes()).hexdigest()
            disk_cache.atomic_write(folder / f"{OBJECT}.sha256", digest.encode())
            os.replace(tmp, folder / OBJECT)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _sealed(path: pathlib.Path) -> bool:
    """Whether `path` has the SHA-256 its builder wrote beside it (whole, not swapped)."""
    try:
        recorded = path.with_name(f"{path.name}.sha256").read_text()
        return hashlib.sha256(path.read_bytes()).hexdigest() == recorded
    except (OSError, ValueError):
        return False


def _whole(gch: pathlib.Path) -> bool:
    """Whether `gch` has the size its builder wrote beside it (not truncated)."""
    try:
        return (gch.parent / "runtime.h.gch.size").read_text() == str(gch.stat().st_size)
    except (OSError, ValueError):
        return False
