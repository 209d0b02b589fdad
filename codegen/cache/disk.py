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
import ctypes
import functools
import os
import pathlib
import shutil
import struct
import sys
import tempfile
import warnings
from collections.abc import Sequence

from codegen.config import SettingError

_PT_LOAD = 1
#: e_ident's class byte -> (header layout, program header layout, offset and size fields).
_LAYOUTS = {
    1: ("16sHHIIIIIHHHHHH", "IIIIIIII", (1, 4)),  # ELF32: p_offset, p_filesz
    2: ("16sHHIQQQIHHHHHH", "IIQQQQQQ", (2, 5)),  # ELF64: p_offset, p_filesz
}


def atomic_write(path: pathlib.Path, data: bytes) -> None:
    """Write `data` to a temporary file next to `path`, then rename it to `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def _writable(folder: pathlib.Path) -> bool:
    """Whether `folder` exists or can be made, and takes a new file (tried, not guessed)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError:
        return False
    return True


@functools.lru_cache(maxsize=8)
def usable_folder(configured: pathlib.Path) -> pathlib.Path:
    """`configured` when it can be created and written, else a private temporary folder
    (warned about once per configured folder).

    Raises:
        SettingError: no temporary folder can be made either.
    """
    if _writable(configured / "c"):
        return configured
    try:
        private = pathlib.Path(tempfile.mkdtemp(prefix="tensordsl-cache-"))
    except OSError as error:
        raise SettingError(
            f"the kernel cache folder {configured} (TENSORDSL_CACHE_DIR) cannot be written, "
            f"and no temporary folder can be made either ({error})"
        ) from None
    atexit.register(shutil.rmtree, private, ignore_errors=True)
    warnings.warn(
        f"tensordsl: the kernel cache folder {configured} cannot be created or written; "
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
