"""The C compiler: its version line and the OpenMP flags that work with it.

Both are probed by running the compiler (`cc --version`, a one-line OpenMP program), once per
compiler binary: the answers are kept in the cache folder, keyed by the binary's path, size
and time of change, so a warm process starts no compiler at all. (After installing OpenMP
for an unchanged compiler, clear the cache folder.)
"""

from __future__ import annotations

import functools
import os
import pathlib
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from typing import TypeVar

from codegen import config, trace_cache

T = TypeVar("T")


@functools.lru_cache(maxsize=8)
def compiler_version(cc: str) -> str:
    """The first line of `cc --version` (part of the cache key)."""
    return _per_binary(cc, ("version",), functools.partial(_version, cc), str)


@functools.lru_cache(maxsize=8)
def openmp_flags(cc: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    """`-fopenmp` when it compiles and links with `flags` here, else SIMD pragmas only."""
    return _per_binary(cc, ("openmp", flags), functools.partial(_openmp, cc, flags), tuple)


def _per_binary(cc: str, question: tuple, probe: Callable[[], T], expected: type[T]) -> T:
    """`probe()`, kept on disk for the binary `cc` runs (its path, size, time of change)."""
    path = shutil.which(cc)
    if path is None:
        return probe()
    found = os.stat(path)
    key = (question, cc, path, found.st_size, found.st_mtime_ns)
    folder = config.cache_dir()
    return trace_cache.memo(folder, "compiler", key, probe, version="1", expected=expected)


def _version(cc: str) -> str:
    try:
        done = subprocess.run([cc, "--version"], capture_output=True, text=True, check=False)
    except OSError:
        return "missing"
    return done.stdout.splitlines()[0] if done.stdout else "unknown"


def _openmp(cc: str, flags: tuple[str, ...]) -> tuple[str, ...]:
    probe = "#include <omp.h>\nint f(void) { return omp_get_max_threads(); }\n"
    with tempfile.TemporaryDirectory() as tmp:
        src = pathlib.Path(tmp) / "probe.c"
        src.write_text(probe)
        command = [cc, *flags, "-fopenmp", str(src), "-o", str(pathlib.Path(tmp) / "p.so")]
        try:
            ok = subprocess.run(command, capture_output=True, check=False).returncode == 0
        except OSError:
            ok = False
    return ("-fopenmp",) if ok else ("-fopenmp-simd",)
