"""How Python hands a launch to an emulator unit: the descriptor each kernel exports
(`TDSL_EMU_KERNEL` in runtime.h), the C signature of its `launch`, and each argument as the
ctypes value its parameter's kind (`p` pointer, `i4`, `i8`, `u4`, `u8`, `f4`, `f8`) takes.

>>> argument("k", 0, "i4", 7).value
7
>>> argument("k", 1, "i4", 2**40)
Traceback (most recent call last):
...
codegen.cuda.emulator.abi.EmulationError: k: argument 1 = 1099511627776 does not fit int32
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np

#: Bytes of the buffer a launch writes its error report into.
ERROR_BYTES = 16384
#: A scalar parameter's kind in a descriptor's signature -> its dtype.
SCALARS = {
    kind: np.dtype(name)
    for kind, name in (("i4", "int32"), ("i8", "int64"), ("u4", "uint32"), ("u8", "uint64"))
}
SCALARS.update({"f4": np.dtype("float32"), "f8": np.dtype("float64")})


class EmulationError(RuntimeError):
    """A kernel failed under the emulator: deadlock, `__trap`, bad launch or bad arguments."""


class Descriptor(ctypes.Structure):
    """`tdsl_emu_kernel`, the record a unit exports per kernel (`tdsl_emu_kernel_<entry>`)."""

    _fields_ = (
        ("name", ctypes.c_char_p),
        ("signature", ctypes.c_char_p),
        ("launch", ctypes.c_void_p),
        ("invoke", ctypes.c_void_p),
    )


#: A descriptor's `launch`: (descriptor, grid, block, shared bytes, arguments, order,
#: error buffer, its size) -> status, 0 when the launch ran.
LAUNCH = ctypes.CFUNCTYPE(
    ctypes.c_int,
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_longlong),
    ctypes.POINTER(ctypes.c_longlong),
    ctypes.c_longlong,
    ctypes.POINTER(ctypes.c_void_p),
    ctypes.c_int,
    ctypes.c_char_p,
    ctypes.c_longlong,
)


def dims(values: Sequence[int]) -> Any:
    """A grid or block shape of one to three extents as the three `long long`s a launch takes."""
    values = tuple(int(v) for v in values)
    return (ctypes.c_longlong * 3)(*(values + (1,) * (3 - len(values))))


def argument(entry: str, n: int, kind: str, value: Any) -> Any:
    """A ctypes object holding argument `n` as the kernel's parameter `kind` expects."""
    if kind == "p":
        if isinstance(value, np.ndarray):
            return ctypes.c_void_p(value.ctypes.data)
        if isinstance(value, int | np.integer) and not isinstance(value, bool):
            return ctypes.c_void_p(int(value))
        raise EmulationError(f"{entry}: argument {n} is a pointer; got {type(value).__name__}")
    dtype = SCALARS.get(kind)
    if dtype is None or np.ndim(value) != 0:
        raise EmulationError(f"{entry}: argument {n} ({kind}) must be a scalar")
    if isinstance(value, np.generic) and value.dtype != dtype:
        raise EmulationError(f"{entry}: argument {n} must be {np.dtype(dtype)}, got {value.dtype}")
    ctype = np.ctypeslib.as_ctypes_type(dtype)
    if np.issubdtype(dtype, np.floating):
        return ctype(float(value))
    limits = np.iinfo(dtype)
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise EmulationError(f"{entry}: argument {n} must be an integer, got {value!r}")
    if not limits.min <= int(value) <= limits.max:
        raise EmulationError(f"{entry}: argument {n} = {value} does not fit {np.dtype(dtype)}")
    return ctype(int(value))
