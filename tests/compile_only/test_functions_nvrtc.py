"""Every scalar function of `codegen.ir.functions.FUNCTIONS`, the logical operators and `//`,
`%` compile with NVRTC in float32 and float64, forwards and in their gradient nests."""

from __future__ import annotations

import pytest

from codegen.cuda.emit import emit_cuda
from codegen.cuda.run import nvrtc
from codegen.ir.functions import FUNCTIONS
from codegen.passes import grad
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse

pytestmark = pytest.mark.skipif(
    not nvrtc.available(), reason='NVRTC unavailable: pip install "cupy-cuda13x[ctk]"'
)

STATEMENTS = [
    f"Y[i] := {name}({', '.join(['X[i,j]'] + ['W[j]'] * (spec.arity - 1))})"
    if name not in ("where", "polygamma")
    else "Y[i] := where(X[i,j] > 0, X[i,j], W[j])"
    if name == "where"
    else "Y[i] := polygamma(0, X[i,j]) * W[j]"  # C and CUDA evaluate orders 0 and 1
    for name, spec in sorted(FUNCTIONS.items())
] + [
    "Y[i] := X[i,j] * ((j <= i) & (X[i,j] > 0) | not (j != 2))",
    "Y[i] := X[i,j] * ((i - j) % 3) + X[i,j] // W[j] + X[i,j] % W[j] + i // 2",
    "Y[i] := atan(X[i,j], W[j])",
]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("statement", STATEMENTS)
def test_compiles_forwards_and_backwards(statement: str, dtype: str) -> None:
    nest = lower(parse(statement)).nest
    dtypes = {"X": dtype, "W": dtype, "Y": dtype}
    sources = [emit_cuda(nest, dtypes=dtypes)]
    for name in nest.operand_names:
        gradient = grad.gradient(nest, name).nest
        names = {gradient.output, *gradient.operand_names}
        sources.append(emit_cuda(gradient, dtypes=dict.fromkeys(names, dtype)))
    for source in sources:
        ptx = nvrtc.compile_source(source.text, arch="compute_80").ptx
        for kernel in source.passes:
            assert f".entry {kernel.entry}(" in ptx
