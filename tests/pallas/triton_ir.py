"""The Triton kernels inside a module lowered for CUDA, as text: Pallas' Triton lowering
serialises each kernel (MLIR bytecode) into the `ir` field of its custom call's backend
config; JAX's own MLIR bindings, with the Triton dialect registered, print it back. Works on
JAX 0.10.2 and 0.12.1 (private modules: a test helper, never the package's code)."""

from __future__ import annotations

import re
from typing import Any

from tensordsl.backends.pallas.api import TRITON_CUSTOM_CALL


def triton_kernels(lowered: Any) -> list[str]:
    """The text of every Triton kernel of `lowered` (a `jax.stages.Lowered` for CUDA)."""
    from jax._src.lib.mlir import ir
    from jax._src.lib.triton import dialect as tt_dialect

    found: list[bytes] = []

    def walk(op: Any) -> None:
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    call = (
                        inner.attributes["call_target_name"]
                        if inner.name == ("stablehlo.custom_call")
                        else None
                    )
                    if call is not None and ir.StringAttr(call).value == TRITON_CUSTOM_CALL:
                        config = ir.DictAttr(inner.attributes["mhlo.backend_config"])
                        found.append(bytes(ir.StringAttr(config["ir"]).value_bytes))
                    walk(inner)

    walk(lowered.compiler_ir("stablehlo").operation)
    texts = []
    for code in found:
        with ir.Context() as context:
            tt_dialect.register_dialect(context)
            texts.append(str(ir.Module.parse(code)))
    return texts


def dot_precisions(lowered: Any) -> list[str]:
    """The input precision of every `tt.dot` of `lowered`'s Triton kernels ("ieee" where the
    attribute is absent: Triton's default)."""
    found = []
    for text in triton_kernels(lowered):
        for line in text.splitlines():
            if "tt.dot " in line:
                match = re.search(r"inputPrecision = (\w+)", line)
                found.append(match.group(1) if match else "ieee")
    return found
