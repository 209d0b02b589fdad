"""A kernel's shared arrays declared in one place: static `__shared__` arrays up to
`STATIC_SHARED_LIMIT` bytes in all, else views of the block's dynamic shared memory, whose
size the emitter records (`CudaEmitter.dynamic_shared`) for the launch to opt in to (the
FFI handler and the CuPy callback do past 48 KB). The online strategy's 64-row tile with
both operands of the score staged needs about 60 KB (`codegen.cuda.attention.online`).

An array is `(name, C type, shape)`; `idx_t` takes the schedule's index type.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from codegen.cuda.dialect import CudaEmitter
from codegen.emit.emitter import Lines

#: Bytes of static shared memory a block may declare; more needs dynamic shared memory and
#: the opt-in attribute (cudaFuncAttributeMaxDynamicSharedMemorySize), set at launch.
STATIC_SHARED_LIMIT = 48 * 1024

Array = tuple[str, str, tuple[int, ...]]


def element_bytes(ctype: str, index_type: str) -> int:
    """Bytes of an array's element.

    >>> element_bytes("idx_t", "int64"), element_bytes("float", "int32")
    (8, 4)
    """
    index = 8 if index_type == "int64" else 4
    return {"double": 8, "float": 4, "int": 4, "unsigned": 4, "idx_t": index}[ctype]


def sizes(arrays: Sequence[Array], index_type: str) -> list[int]:
    """Bytes of each array."""
    return [element_bytes(t, index_type) * math.prod(shape) for _, t, shape in arrays]


def widest_first(arrays: Sequence[Array], index_type: str) -> tuple[Array, ...]:
    """`arrays` in the order that starts each at a multiple of its element's size."""
    return tuple(sorted(arrays, key=lambda a: -element_bytes(a[1], index_type)))


def declare(e: CudaEmitter, arrays: Sequence[Array]) -> Lines:
    """The declarations of `arrays` (in order; `widest_first` keeps them aligned): static,
    or past the limit views of dynamic shared memory, recorded on `e`."""
    found = sizes(arrays, e.schedule.index_type)
    if sum(found) <= STATIC_SHARED_LIMIT:
        return [f"__shared__ {t} {name}{_dims(shape)};" for name, t, shape in arrays]
    e.dynamic_shared = sum(found)
    lines = [f"extern __shared__ __align__(16) unsigned char smem_[];  /* {sum(found)} bytes */"]
    offset = 0
    for (name, t, shape), size in zip(arrays, found, strict=True):
        inner = _dims(shape[1:])
        pointer, cast = (
            (f"(*const {name}){inner}", f"(*){inner}") if inner else (f"*const {name}", "*")
        )
        lines.append(f"{t} {pointer} = reinterpret_cast<{t} {cast}>(smem_ + {offset});")
        offset += size
    return lines


def _dims(shape: tuple[int, ...]) -> str:
    return "".join(f"[{n}]" for n in shape)
