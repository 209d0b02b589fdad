"""Elementwise nests of an exponential that XLA computes, fused with the work around them.

An elementwise nest (no reduction) is one memory-bound pass: a kernel reads its operands
and writes its output, and so would XLA. `exp` makes XLA's pass the better one, because
several gradient nests of one softmax recompute it from the same operands. A logsumexp's
gradient `dS[i,j] = dL[i] * exp(S[i,j] - L[i])` and the softmax-weighted sum's
`dS = exp(S - L) * sum_e dO*V` (an elementwise term of a matrix product, XLA's already:
`codegen.ir.contraction.xla_plan`) are two cotangents of the scores that JAX adds. With the
first a kernel, that is three passes (the kernel's, XLA's fused weights and product, the
add) and two exponentials per element; with both XLA's, its common-subexpression pass
computes `exp(S - L)` once and its fusion makes the three one pass, as jnp's softmax
gradient is.

A nest qualifies when it is a sum nest with no reduced index and no nested reduction, every
free index runs from 0, every access reads whole axes by distinct bare free indices (views
XLA fuses, no gather), and its body calls one of `FUSED_FUNCTIONS`. Other elementwise
nests (LayerNorm's, a ReLU, GELU's `tanh`) keep their kernel. `tanh` was tried: the GPT
block of single-statement kernels gained a little, its program version (GELU a statement of
the MLP program) lost more (benchmarks/RESULTS.md, `gptbwd`).

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> xla_elementwise(lower(parse("dS[i,j] := dL[i] * exp(S[i,j] - L[i])")).nest)
True
>>> xla_elementwise(lower(parse("Y[i,j] := 0.5 * X[i,j] * (1 + tanh(X[i,j]))")).nest)
False
>>> xla_elementwise(lower(parse("Y[i,j] := rsqrt(X[i,j])")).nest)
False
>>> xla_elementwise(lower(parse("Y[i] := exp(X[i+1])")).nest)
False
"""

from __future__ import annotations

import sympy

from codegen.ir.nest import LoopNest, Reduce

#: The sympy functions whose elementwise nests XLA computes (see the module docstring).
FUSED_FUNCTIONS: tuple[type[sympy.Function], ...] = (sympy.exp,)


def xla_elementwise(nest: LoopNest) -> bool:
    """Whether `nest` is an elementwise nest of one of `FUSED_FUNCTIONS` over plain accesses,
    which XLA evaluates fused with its neighbours (see the module docstring)."""
    if nest.reduction != "sum" or nest.online or not nest.terms:
        return False
    free = {r.index for r in nest.free}
    if any(r.start != 0 for r in nest.free):
        return False
    calls = False
    for term in nest.terms:
        if term.reduced or term.body.atoms(Reduce):
            return False
        for access in term.body.atoms(sympy.Indexed):
            axes = access.indices
            if len(set(axes)) != len(axes) or not all(a in free for a in axes):
                return False
        calls = calls or any(term.body.atoms(f) for f in FUSED_FUNCTIONS)
    return calls
