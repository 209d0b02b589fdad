"""The C compiler: its version line, the OpenMP flags that work with it, and whether glibc's
vector math library links.

Each is probed by running the compiler (`cc --version`, one-line programs), once per
compiler binary: the answers are kept in the cache folder, keyed by the binary's path, size
and time of change, so a warm process starts no compiler at all. (After installing OpenMP
or libmvec for an unchanged compiler, clear the cache folder.)
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

from codegen import config
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
