"""The XLA FFI handlers that launch generated CUDA without Python (codegen/cuda/run/ffi.cc).

One shared object, compiled by the host C++ compiler against the CUDA driver header
(`cuda.h`, from the CUDA wheels or toolkit) and jaxlib's FFI headers, cached on disk like
every kernel. It exports two handlers with one launch path:

* `tdsl_cuda_launch` for XLA's CUDA platform: loads the kernel's CUBIN once per CUDA
  context and launches it with `cuLaunchKernel` on XLA's stream; libcuda is opened with
  dlopen at first use, so the library loads (and its tests run) where no driver exists;
* `tdsl_cuda_launch_emulated` for the host platform: the CUDA emulator
  (codegen/cuda/emulator/emulate.py) stands in for the driver, so CI runs the same attribute
  parsing, dtype checks, argument packing and poisoning on the CPU.

`launch_attributes` builds a call's attributes; codegen never imports JAX, so registering
the handlers with XLA happens in tensordsl/backends/cuda.py.

>>> attributes = launch_attributes(b"image", [("tdsl_f", (4, 1, 1)), ("tdsl_f_combine", (1, 1, 1))],
...     block=(256, 1, 1), params=[10, 3], dtypes=["float32", "float32", "uint8"], scratch=1)
>>> attributes["entry"], attributes["grid"].tolist(), attributes["dtypes"]
('tdsl_f tdsl_f_combine', [4, 1, 1, 1, 1, 1], 'float32 float32 uint8')
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import pathlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from codegen import config
from codegen.c.run import ffi
from codegen.cuda.emulator.emulate import EmulationError, compile_unit, cuda_include_candidates

SOURCE = pathlib.Path(__file__).with_name("ffi.cc")
HANDLERS = ("tdsl_cuda_launch", "tdsl_cuda_launch_emulated")


@functools.lru_cache(maxsize=1)
def driver_include_dir() -> pathlib.Path | None:
    """A folder holding the CUDA driver header `cuda.h`, or None."""
    candidates = cuda_include_candidates()
    return next((folder for folder in candidates if (folder / "cuda.h").is_file()), None)


def unavailable_reason() -> str | None:
    """Why the launch handlers cannot be built here, or None."""
    if ffi.include_dir() is None:
        return "jaxlib has no XLA FFI C headers"
    if driver_include_dir() is None:
        return 'no CUDA driver header cuda.h (pip install "cupy-cuda13x[ctk]")'
    return None


@functools.lru_cache(maxsize=4)
def _library(cache: str) -> ctypes.CDLL:
    del cache  # part of the lru_cache key only: one library per cache folder
    reason = unavailable_reason()
    if reason is not None:
        raise EmulationError(f"cannot build the CUDA launch handlers: {reason}")
    flags = (f"-I{ffi.include_dir()}", f"-I{driver_include_dir()}")
    key = ("xla_ffi", ffi.header_digest())
    path = compile_unit(
        SOURCE.read_text(),
        extra_flags=flags,
        libraries=("-ldl",),
        key=key,
        symbols=HANDLERS,
        runtime=False,
    )
    return ctypes.CDLL(str(path))


def library() -> ctypes.CDLL:
    """The loaded handler library (built or fetched from the cache on first use)."""
    return _library(str(config.cache_dir()))


def handler(name: str) -> Any:
    """The ctypes function of handler `name` (one of `HANDLERS`)."""
    if name not in HANDLERS:
        raise ValueError(f"unknown handler {name!r}; expected one of {HANDLERS}")
    return getattr(library(), name)


def target_name(name: str) -> str:
    """A target name unique to the loaded library (XLA refuses one name for two handlers)."""
    path = library()._name
    return f"{name}_{hashlib.sha256(str(path).encode()).hexdigest()[:12]}"


def driver_error() -> str:
    """Why the CUDA driver cannot be used in this process ("" when it can)."""
    function = library().tdsl_cuda_driver_error
    function.restype = ctypes.c_char_p
    return (function() or b"").decode()


def image_id(image: bytes, entry: str) -> int:
    """The 63-bit module cache key of `image` and `entry`."""
    digest = hashlib.sha256(image + b"\0" + entry.encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def launch_attributes(
    image: bytes,
    passes: Sequence[tuple[str, Sequence[int]]],
    *,
    block: Sequence[int],
    params: Sequence[int],
    dtypes: Sequence[str],
    scratch: int = 0,
    shared: int = 0,
    poison: bool = False,
    order: int = 0,
) -> dict[str, Any]:
    """The attributes of one `ffi_call` to a launch handler (see codegen/cuda/run/ffi.cc).

    Args:
        image: the CUBIN (CUDA) or the emulator library's path (emulated).
        passes: (entry, grid) of each kernel of the image to launch, in order.
        block: the block of every launch.
        params: the kernels' 64-bit integer parameters.
        dtypes: numpy dtype names of the kernels' pointer arguments: the output, each
            operand, each scratch buffer.
        scratch: how many of the call's outputs after the first are scratch space (passed
            to the kernels after the operands).
        shared: dynamic shared memory in bytes.
        poison: fill the outputs with 0xff bytes before the launch.
        order: the emulator's scheduling order (0 forward, 1 reverse).
    """
    entries = " ".join(entry for entry, _ in passes)
    return {
        "image": np.frombuffer(image, np.uint8),
        "image_id": np.int64(image_id(image, entries)),
        "entry": entries,
        "grid": np.array([n for _, grid in passes for n in grid], np.int64),
        "block": np.array(block, np.int64),
        "shared": np.int64(shared),
        "params": np.array(params, np.int64),
        "scratch": np.int32(scratch),
        "poison": np.int32(poison),
        "order": np.int32(order),
        "dtypes": " ".join(dtypes),
    }
