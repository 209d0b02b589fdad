"""The CUDA dialect of the emitter: what differs from C, stated as class attributes.

The strategies (`codegen.cuda.reductions.simple`, `codegen.cuda.staged.tiles`) emit through a
`CudaEmitter`; `codegen.cuda.emit` assembles the kernel.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy

from codegen.cuda.geometry import GpuGeometry
from codegen.emit.emitter import Emitter, Lines
from codegen.emit.printer import CPrinter
from codegen.ir.functions import CeilDiv
from codegen.ir.nest import Range

STORAGE = {
    "float32": "float",
    "float64": "double",
    "float16": "__half",
    "bfloat16": "__nv_bfloat16",
    "int32": "int",
    "int64": "long long",
}


class CudaPrinter(CPrinter):
    """The C printer with CUDA spellings: device helpers, `idx_t` index arithmetic."""

    int_type = "idx_t"
    inline = "static __device__ __forceinline__"
    vector_math = False  # CUDA's own math functions


class CudaEmitter(Emitter[GpuGeometry]):
    """The C emitter with CUDA types, printer and half-precision intrinsics."""

    printer_class = CudaPrinter
    index_type = "idx_t"
    position_type = "long long"
    simd_sum_pragma = ""  # OpenMP means nothing to NVRTC
    storage = STORAGE
    half_to_float = {"float16": "__half2float", "bfloat16": "__bfloat162float"}
    float_to_half = {"float16": "__float2half_rn", "bfloat16": "__float2bfloat16_rn"}
    #: Bytes of scratch space the kernels of the source share (an expression of extents);
    #: 0: none. A strategy asks for it with `scratch`.
    workspace: sympy.Expr = sympy.Integer(0)
    #: Bytes of dynamic shared memory per block (a tile past the static limit); 0: none.
    dynamic_shared: int = 0
    #: A thread's chain is short (a block's threads, then the blocks, combine as a tree).
    double_sum_strategies: tuple[str, ...] = ()

    def scratch(self, size: sympy.Expr) -> str:
        """Ask for `size` bytes of scratch space (an expression of extents), passed to every
        kernel of the source after the operands; the C name of its pointer."""
        self.workspace = size
        return "ws_"

    def free_range(self, name: str) -> Range:
        return next(r for r in self.nest.free if r.index.name == name)

    def length(self, name: str) -> str:
        """The number of values of free index `name`, as a C expression."""
        r = self.free_range(name)
        return self.idx(sympy.Max(r.stop - r.start, 0))

    def decode(self, flat: str, names: Sequence[str], tiles: Mapping[str, int]) -> Lines:
        """Declare the free indices `names` from the flat counter (the last varies fastest)."""
        lines = [f"idx_t q_ = {flat};"]
        for pos, name in enumerate(reversed(names)):
            r = self.free_range(name)
            sym = self.printer.index(r.index)
            size = self.length(name)
            if name in tiles:
                size = f"tdsl_ceildiv({size}, {tiles[name]})"
            digit = "q_" if pos == len(names) - 1 else f"q_ % {size}"
            scale = f"*{tiles[name]}" if name in tiles else ""
            var = self.tile_name("o", r.index) if name in tiles else sym
            lines.append(f"const idx_t {var} = {self.idx(r.start)} + ({digit}){scale};")
            if pos != len(names) - 1:
                lines.append(f"q_ /= {size};")
        return lines

    def count(self, names: Sequence[str], tiles: Mapping[str, int]) -> sympy.Expr:
        """The number of (tiled) points over `names`, as an expression of extents."""
        total = sympy.Integer(1)
        for name in names:
            r = self.free_range(name)
            size = sympy.Max(r.stop - r.start, 0)
            total *= CeilDiv(size, tiles[name]) if name in tiles else size
        return total
