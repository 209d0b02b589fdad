"""Compile generated CUDA with NVRTC through CuPy's low-level binding (no GPU needed).

`cupy_backends.cuda.libs.nvrtc` only needs the NVRTC library (the `cupy-cuda13x[ctk]` wheel
brings it), not a driver, so CI compiles every generated kernel to PTX or CUBIN, checks the
entry point and its parameters, and reads registers and spills from `--ptxas-options=-v`.
Results are cached in memory by (source, options).

>>> available() in (True, False)
True
"""

from __future__ import annotations

import ctypes
import functools
import glob
import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

_LOCK = threading.Lock()
_MEMORY: dict[tuple[str, tuple[str, ...], str], Compiled] = {}

_PTXAS = re.compile(
    r"Compiling entry function '(?P<entry>\w+)'.*?"
    r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
    r"(?P<loads>\d+) bytes spill loads.*?Used (?P<registers>\d+) registers",
    re.S,
)


class NvrtcError(RuntimeError):
    """NVRTC rejected generated code: a tensordsl bug."""


@dataclass(frozen=True)
class Compiled:
    """The result of one compilation: PTX text or CUBIN bytes, the log and ptxas figures
    (the most registers and all spills over the source's kernels), and the PTX NVRTC made on
    the way for either kind of target (a CUBIN's compile gives both: no second compile)."""

    binary: bytes  # PTX (text, as bytes) for compute_XX targets, CUBIN for sm_XX
    log: str
    registers: int | None = None
    spill_stores: int | None = None
    spill_loads: int | None = None
    ptx_bytes: bytes = b""

    @property
    def ptx(self) -> str:
        return self.ptx_bytes.decode()


def _nvrtc() -> Any:
    from cupy_backends.cuda.libs import nvrtc

    return nvrtc


@functools.lru_cache(maxsize=1)
def available() -> bool:
    """True when NVRTC can be loaded here."""
    try:
        _nvrtc().getVersion()
    except Exception:  # ImportError, or the shared library is missing
        return False
    return True


@functools.lru_cache(maxsize=1)
def include_dirs() -> tuple[str, ...]:
    """Folders holding cuda_fp16.h / cuda_bf16.h (the CUDA wheels' include folder)."""
    found: list[str] = []
    try:
        import nvidia  # the namespace package of the CUDA wheels
    except ImportError:
        return ()
    for root in nvidia.__path__:
        for header in sorted(glob.glob(os.path.join(root, "**", "cuda_fp16.h"), recursive=True)):
            folder = os.path.dirname(header)
            if folder not in found:
                found.append(folder)
    return tuple(found)


def compile_source(
    text: str,
    *,
    arch: str = "sm_90",
    options: Sequence[str] = (),
    name: str = "tdsl.cu",
) -> Compiled:
    """Compile `text` for `arch` ("compute_90" gives PTX, "sm_90" a CUBIN).

    Raises:
        NvrtcError: when NVRTC rejects the source; the message has the log and the source.
    """
    flags = (
        f"--gpu-architecture={arch}",
        "--std=c++17",
        *(f"-I{d}" for d in include_dirs()),
        *options,
    )
    key = (text, flags, arch)
    with _LOCK:
        hit = _MEMORY.get(key)
    if hit is not None:
        return hit
    nvrtc = _nvrtc()
    program = nvrtc.createProgram(text, name, [], [])
    try:
        try:
            nvrtc.compileProgram(program, list(flags))
        except Exception as error:
            log = nvrtc.getProgramLog(program)
            raise NvrtcError(
                f"tensordsl bug: NVRTC rejected generated CUDA ({error}).\n{log}\n--- source ---\n"
                + text
            ) from None
        log = nvrtc.getProgramLog(program)
        ptx = nvrtc.getPTX(program)
        ptx_bytes = (ptx.encode() if isinstance(ptx, str) else bytes(ptx)).rstrip(b"\0")
        binary = cubin(program) if arch.startswith("sm_") else ptx_bytes
    finally:
        nvrtc.destroyProgram(program)
    # Over every kernel of the source: the most registers, all spills.
    figures = [
        {k: int(v) for k, v in m.groupdict().items() if k != "entry"} for m in _PTXAS.finditer(log)
    ]
    compiled = Compiled(
        binary,
        log,
        max(f["registers"] for f in figures) if figures else None,
        sum(f["stores"] for f in figures) if figures else None,
        sum(f["loads"] for f in figures) if figures else None,
        ptx_bytes,
    )
    with _LOCK:
        _MEMORY[key] = compiled
    return compiled


@functools.lru_cache(maxsize=1)
def _library() -> ctypes.CDLL:
    """The NVRTC library CuPy loaded (its path read from /proc/self/maps), for the calls
    CuPy's binding lacks."""
    available()  # loads it
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if re.search(r"/libnvrtc\.so[.\d]*$", line)}
    if not paths:
        raise NvrtcError("cannot find the NVRTC library CuPy loaded in /proc/self/maps")
    library = ctypes.CDLL(sorted(paths)[0])
    library.nvrtcGetCUBINSize.argtypes = (ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t))
    library.nvrtcGetCUBIN.argtypes = (ctypes.c_void_p, ctypes.c_char_p)
    return library


def cubin(program: int) -> bytes:
    """The CUBIN of a compiled program, all `nvrtcGetCUBINSize` bytes of it.

    CuPy's `getCUBIN` returns one byte less, and an ELF image may end in NUL bytes of its
    own: neither may be cut, or the driver reads past the end of what it was given.
    """
    library = _library()
    size = ctypes.c_size_t()
    status = library.nvrtcGetCUBINSize(ctypes.c_void_p(program), ctypes.byref(size))
    if status != 0:
        raise NvrtcError(f"nvrtcGetCUBINSize failed with status {status}")
    buffer = ctypes.create_string_buffer(size.value)
    status = library.nvrtcGetCUBIN(ctypes.c_void_p(program), buffer)
    if status != 0:
        raise NvrtcError(f"nvrtcGetCUBIN failed with status {status}")
    return buffer.raw


def ptx_parameters(ptx: str, entry: str) -> tuple[str, ...]:
    """The `.param` types of `entry` in PTX text, e.g. `(".u64", ".u64", ".u64")`."""
    match = re.search(rf"\.entry\s+{re.escape(entry)}\s*\((?P<params>.*?)\)", ptx, re.S)
    if match is None:
        raise ValueError(f"entry {entry} not found in the PTX")
    return tuple(re.findall(r"\.param\s+(\.\w+)", match["params"]))
