"""A compiled loop nest: the entry point of a loaded shared object and its host function.

`codegen.c.run.build.build_c` returns one; the runners call it through XLA
(tensordsl/backends/c.py) or directly (`compiled(out, operands, extents)`,
tensordsl/explain/timing.py).
"""

from __future__ import annotations

import ctypes
import hashlib
import pathlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codegen.ir.host import HostFunction
from codegen.ir.nest import LoopNest


@dataclass(frozen=True)
class CompiledNest:
    """A compiled nest: call it with the output, the operands and the extents."""

    nest: LoopNest
    #: the nest's own entry name (`codegen.emit.signature.entry_name`), as k.source shows it
    name: str
    entry: str  # the entry point in `library`: the canonical form's, maybe another nest's
    library: pathlib.Path
    function: Callable[..., None] = field(repr=False)
    host: HostFunction = field(repr=False)
    #: The XLA FFI handler in the same library (a ctypes function), or None without one.
    ffi_handler: Any = field(default=None, repr=False, compare=False)
    #: Why the handler is missing when it did not build (warned about once per process).
    warning: str | None = field(default=None, repr=False, compare=False)

    @property
    def ffi_target(self) -> str:
        """A name for the FFI handler unique to the loaded library: the nest's entry name and
        a digest of the library's path (its file name is the digest of its content; two cache
        folders give two loaded copies, and XLA refuses one name for two handler addresses;
        nests sharing one library register one address under two names)."""
        digest = hashlib.sha256(str(self.library).encode()).hexdigest()[:16]
        return f"{self.name}_{digest}"

    def all_extents(
        self,
        operand_shapes: Sequence[Sequence[int]],
        out_shape: Sequence[int],
        extents: Mapping[str, Sequence[int]],
    ) -> dict[str, Sequence[int]]:
        """The shape of every tensor the nest names: operands, output and `extents`."""
        names = self.nest.operand_names
        if len(operand_shapes) != len(names):
            raise ValueError(f"expected {len(names)} operands {names}, got {len(operand_shapes)}")
        full: dict[str, Sequence[int]] = dict(zip(names, operand_shapes, strict=True))
        full[self.nest.output] = out_shape
        full.update(extents)
        return full

    def host_parameters(self, extents: Mapping[str, Sequence[int]]) -> np.ndarray:
        """The int64 `params` array for one call."""
        try:
            return self.host(extents)
        except (KeyError, IndexError) as error:
            raise ValueError(
                f"extents {dict(extents)} miss {error} for {self.nest.output}"
            ) from None

    def __call__(
        self,
        out: np.ndarray,
        operands: Sequence[np.ndarray],
        extents: Mapping[str, Sequence[int]],
    ) -> None:
        """Compute the nest into `out` (C-contiguous, fully written); operands are read only."""
        full = self.all_extents([np.shape(a) for a in operands], out.shape, extents)
        for array in (out, *operands):
            if not array.flags.c_contiguous:
                raise ValueError("operands and output must be C-contiguous")
        params = self.host_parameters(full)
        pointers = (ctypes.c_void_p * max(len(operands), 1))(*(a.ctypes.data for a in operands))
        self.function(out.ctypes.data, pointers, params.ctypes.data)
