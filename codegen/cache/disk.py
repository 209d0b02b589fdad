"""The disk cache of compiled kernels: a usable folder, atomic writes, and entries checked
before they are used.

Every write goes to a temporary name in the same folder and is renamed into place, so a
reader never sees half a file. A folder that cannot be created or written is replaced, with
one warning, by a private temporary folder.

A damaged cache entry (a truncated or emptied file, another kernel's file in its place)
must never crash the process. A truncated library must not even reach `dlopen`: glibc maps
its segments past the end of the file and the process dies of SIGBUS when the loader touches
them. So a file is checked in three steps: it is a complete ELF file (every loadable segment
and the section table lie inside it; on Linux), `dlopen` succeeds, and it exports every
symbol the caller expects. A library that loads but lacks a symbol is closed again, so that
the file rebuilt at the same path is loaded afresh (the loader reuses an open library of the
same path).

>>> import pathlib, tempfile
>>> empty = pathlib.Path(tempfile.mkdtemp()) / "empty.so"
>>> _ = empty.write_bytes(b"")
>>> complete(empty), load(empty, ("f",))
(False, None)
"""

from __future__ import annotations

import _ctypes
import atexit
import contextlib
import ctypes
import functools
import os
import pathlib
import shutil
import struct
import sys
import tempfile
import time
import warnings
from collections.abc import Sequence
from typing import Any

from codegen.config import SettingError

_PT_LOAD = 1
#: e_ident's class byte -> (header layout, program header layout, offset and size fields).
_LAYOUTS = {
    1: ("16sHHIIIIIHHHHHH", "IIIIIIII", (1, 4)),  # ELF32: p_offset, p_filesz
    2: ("16sHHIQQQIHHHHHH", "IIQQQQQQ", (2, 5)),  # ELF64: p_offset, p_filesz
}


#: A temporary file older than this (seconds) is left over from a process that died (a
#: build killed by SIGKILL, a full disk): removed by the next write to its folder. No
#: write or build in progress is this old.
STALE_AFTER = 3600.0


def remove_stale(folder: pathlib.Path, *, age: float = STALE_AFTER) -> None:
    """Remove `*.tmp` files in `folder` last changed more than `age` seconds ago."""
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.name.endswith(".tmp"):
                with contextlib.suppress(OSError):  # another process may remove it first
                    if now - entry.stat().st_mtime > age:
                        os.unlink(entry.path)


def atomic_write(path: pathlib.Path, data: bytes) -> None:
    """Write `data` to a temporary file next to `path`, then rename it to `path`; where
    the write fails (a full disk), the temporary file is removed and the error raised."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            _write(handle, data, tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write(handle: Any, data: bytes, name: str) -> None:
    """`handle.write(data)` to the file `name` (a seam for tests that fill the disk)."""
    handle.write(data)


def _writable(folder: pathlib.Path) -> bool:
    """Whether `folder` exists or can be made, and takes a new file (tried, not guessed)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError:
        return False
    return True


#: Cache folders a write failed in (a full disk), and the private folder used instead.
_REPLACED: dict[pathlib.Path, pathlib.Path] = {}


def give_up(configured: pathlib.Path, error: OSError) -> pathlib.Path:
    """The private folder to use instead of `configured`, where a write failed (warned
    about once); `usable_folder(configured)` returns it from now on.

    Raises:
        SettingError: no temporary folder can be made either.
    """
    if configured not in _REPLACED:
        reason = error.strerror or str(error)
        _REPLACED[configured] = _private(configured, f"a write failed there ({reason})")
        usable_folder.cache_clear()
    return _REPLACED[configured]


@functools.lru_cache(maxsize=8)
def usable_folder(configured: pathlib.Path) -> pathlib.Path:
    """`configured` when it can be created and written, else a private temporary folder
    (warned about once per configured folder).

    Raises:
        SettingError: no temporary folder can be made either.
    """
    if configured in _REPLACED:
        return _REPLACED[configured]
    if _writable(configured / "c"):
        return configured
    return _private(configured, "it cannot be created or written")


def _private(configured: pathlib.Path, why: str) -> pathlib.Path:
    try:
        private = pathlib.Path(tempfile.mkdtemp(prefix="tensordsl-cache-"))
    except OSError as error:
        raise SettingError(
            f"the kernel cache folder {configured} (TENSORDSL_CACHE_DIR) cannot be written, "
            f"and no temporary folder can be made either ({error})"
        ) from None
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    warnings.warn(
        f"tensordsl: the kernel cache folder {configured} is not used: {why}; "
        f"using the private folder {private} for this process (set TENSORDSL_CACHE_DIR to "
        "a writable folder to keep compiled kernels between runs)",
        stacklevel=4,
    )
    return private


def complete(path: pathlib.Path) -> bool:
    """Whether `path` holds a whole ELF shared object (always True off Linux: not checked)."""
    if not sys.platform.startswith("linux"):
        return True
    try:
        data = path.read_bytes()
    except OSError:
        return False
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] not in _LAYOUTS:
        return False
    header, program, (offset_at, size_at) = _LAYOUTS[data[4]]
    order = "<" if data[5] == 1 else ">"
    fields = struct.unpack_from(order + header, data)
    phoff, shoff = fields[5], fields[6]
    phentsize, phnum, shentsize, shnum = fields[9], fields[10], fields[11], fields[12]
    if phoff + phnum * phentsize > len(data) or shoff + shnum * shentsize > len(data):
        return False
    for n in range(phnum):
        segment = struct.unpack_from(order + program, data, phoff + n * phentsize)
        if segment[0] == _PT_LOAD and segment[offset_at] + segment[size_at] > len(data):
            return False
    return True


def load(path: pathlib.Path, symbols: Sequence[str]) -> ctypes.CDLL | None:
    """The loaded library at `path` if it is whole and exports `symbols`, else None."""
    if not complete(path):
        return None
    try:
        library = ctypes.CDLL(str(path.absolute()))  # a bare name would be searched for
    except OSError:
        return None
    if all(hasattr(library, name) for name in symbols):
        return library
    _ctypes.dlclose(library._handle)
    return None
