"""Natural formulations: common layers written the way a new user writes them, against jnp.

Run from the repository root:

    python -m benchmarks.natural           # rewrites its RESULTS.md section (a few minutes)
    python -m benchmarks.natural --quick   # tiny sizes, smoke run; writes nothing

Each row is one layer, written directly in the language (a program of several statements, or
one statement), float32 on the C back end, next to the same layer in jax.numpy in the same
run: the forward and the forward+backward (`jax.value_and_grad` of `sum(out * ct)` with
respect to every float input), both under `jax.jit`, medians, implementations in turns
(benchmarks/common.py). A program also runs with `fuse=False` (every intermediate stored:
the statements as separate kernels), so that the fusion cost model's choice can be compared
with not fusing at all. "cold s": the first `jit(value_and_grad)` call in a fresh process
with an empty kernel cache (every kernel built). Every result is checked against jax.numpy
(relative to its largest magnitude) before it is timed. A row marked `hvp` times a
Hessian-vector product in place of the forward+backward: `jax.jvp` of the
`jax.value_and_grad` above (forward-over-reverse, as `docs/jax.md` shows), along a fixed
random tangent per float input.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import (
    RESULTS_MD,
    by_implementation,
    child_env,
    finish_run,
    header,
    markers,
    median_of,
    mismatches,
    ms,
    over,
    ratio,
    run_child,
    short,
    start_run,
    time_rounds,
    write_outputs,
)

NAME = "natural"
OURS, STORED, JNP = "tensordsl", "tensordsl fuse=False", "jax.numpy"
MODES = ("fwd", "fwd+bwd")
TOLERANCE = 2e-3

LAYERNORM = """
    mu[b] := X[b,f] / F
    var[b] := (X[b,f] - mu[b])^2 / F
    N[b,f] := (X[b,f] - mu[b]) * rsqrt(var[b] + eps)
    Y[b,f] := N[b,f] * g[f] + beta[f]
"""
ATTENTION_LAYER = """
    mu[t] := X[t,c] / C
    var[t] := (X[t,c] - mu[t])^2 / C
    N[t,c] := (X[t,c] - mu[t]) * rsqrt(var[t] + 1e-5) * g[c] + beta[c]
    Q[h,t,d] := N[t,c] * Wq[c,h,d]
    K[h,t,d] := N[t,c] * Wk[c,h,d]
    V[h,t,d] := N[t,c] * Wv[c,h,d]
    S[h,i,j] := Q[h,i,d] * K[h,j,d] * 0.125 + where(j <= i, 0, -inf)
    (logsumexp) L[h,i] := S[h,i,j]
    O[h,i,d] := exp(S[h,i,j] - L[h,i]) * V[h,j,d]
    Y[t,o] := O[h,t,d] * Wo[h,d,o]
"""
TRIPLET = """
    D[i,j] := (X[i,f] - X[j,f])^2
    (max) P[i] := D[i,j] * same[i,j]
    (min) N[i] := D[i,j] + 1000 * same[i,j]
    loss := relu(P[i] - N[i] + margin)
"""
SOFTMAX = """
    (max) M[i] := X[i,j]
    Z[i] := exp(X[i,j] - M[i])
    P[i,j] := exp(X[i,j] - M[i]) / Z[i]
"""
ATTENTION = """
    S[h,i,j] := Q[h,i,d] * K[h,j,d] * scale + where(j <= i, 0, -inf)
    (logsumexp) L[h,i] := S[h,i,j]
    O[h,i,e] := exp(S[h,i,j] - L[h,i]) * V[h,j,e]
"""
# Grouped-query attention as a user first writes it: the query heads split into groups `g` of
# `r` heads, each group reading its one key/value head
GQA = """
    S[b,g,r,i,j] := Q[b,g,r,i,d] * K[b,g,j,d] * scale + where(j <= i, 0, -inf)
    (logsumexp) L[b,g,r,i] := S[b,g,r,i,j]
    O[b,g,r,i,e] := exp(S[b,g,r,i,j] - L[b,g,r,i]) * V[b,g,j,e]
"""
# 10 iterations of Sinkhorn in the log domain, the potentials scaled by 1/epsilon: each
# statement a logsumexp over the other axis (u = la - A, v = lb - B inlined)
SINKHORN = "\n".join(
    ["(logsumexp) A1[i] := -cost[i,j] / epsilon"]
    + [
        line
        for k in range(1, 11)
        for line in (
            *([f"(logsumexp) A{k}[i] := lb[j] - B{k - 1}[j] - cost[i,j] / epsilon"] * (k > 1)),
            f"(logsumexp) B{k}[j] := la[i] - A{k}[i] - cost[i,j] / epsilon",
        )
    ]
    + ["V[j] := lb[j] - B10[j]"]
)
GRAPHSAGE = """
    H[n,d] := X[nbr[n,k], d] / K
    Z[n,o] := X[n,d] * Ws[d,o] + H[n,d] * Wn[d,o]
    Y[n,o] := relu(Z[n,o])
"""
# GPT-J's rotary embedding: pairs on a last axis of 2, the partner read as `X[..., 1-p]`
ROPE = "Y[b,t,h,f,p] := X[b,t,h,f,p] * C[t,f] + (2*p - 1) * X[b,t,h,f,1-p] * S[t,f]"
SQUEEZE_EXCITE = """
    z[n,c] := X[n,c,s] / S
    a[n,r] := z[n,c] * W1[c,r]
    E[n,c] := relu(a[n,r]) * W2[r,c]
    Y[n,c,s] := X[n,c,s] * sigmoid(E[n,c])
"""
# Chebyshev KAN layer: T_d(tanh x) = cos(d * acos(tanh x)), degrees from C's last axis
CHEBYKAN = "Y[b,o] := cos(d * acos(tanh(X[b,i]))) * C[i,o,d]"
GAUSSIAN = "Y[i] := exp(-((X[i,0]-Z[j,0])^2 + (X[i,1]-Z[j,1])^2 + (X[i,2]-Z[j,2])^2)) * B[j]"

# Zoo 3 (issue 37, item 5): layers users of Tullio, KeOps and einsum-heavy JAX code write
SWIGLU = """
    A[b,u] := X[b,f] * W1[f,u]
    G[b,u] := X[b,f] * W3[f,u]
    Y[b,o] := A[b,u] * sigmoid(A[b,u]) * G[b,u] * W2[u,o]
"""
GROUPNORM = """
    (mean) mu[n,g] := X[n,g,c,s]
    (mean) var[n,g] := (X[n,g,c,s] - mu[n,g])^2
    Y[n,g,c,s] := (X[n,g,c,s] - mu[n,g]) * rsqrt(var[n,g] + 1e-5) * w[g,c] + beta[g,c]
"""
CROSS_ATTENTION = """
    S[h,i,j] := Q[h,i,d] * K[h,j,d] * scale
    (logsumexp) L[h,i] := S[h,i,j]
    O[h,i,e] := exp(S[h,i,j] - L[h,i]) * V[h,j,e]
"""
MIXER = """
    H[b,u,c] := X[b,s,c] * W1[s,u]
    Y[b,t,c] := tanh(H[b,u,c]) * W2[u,t]
"""
# Primer's squared-ReLU attention: no softmax, the weights normalised by the key count
RELU2_ATTENTION = """
    S[h,i,j] := Q[h,i,d] * K[h,j,d] * scale
    O[h,i,e] := relu(S[h,i,j])^2 * V[h,j,e] / size(j)
"""
ROUTER = """
    R[t,e] := X[t,d] * Wr[d,e]
    (logsumexp) L[t] := R[t,e]
    P[t,e] := exp(R[t,e] - L[t])
    (topk 2) G[t,r] := P[t,e]
"""
SOFTMIN = """
    D[i,j] := (X[i,d] - Z[j,d])^2
    (logsumexp) Y[i] := -D[i,j] / tau
"""


BATCH_NORM = """
    mu[f] := X[b,f] / size(b)
    var[f] := (X[b,f] - mu[f])^2 / size(b)
    Y[b,f] := (X[b,f] - mu[f]) * rsqrt(var[f] + 1e-5) * g[f] + beta[f]
"""


def _batch_norm(X: Any, g: Any, beta: Any) -> Any:
    return (X - X.mean(0)) * jax.lax.rsqrt(X.var(0) + 1e-5) * g + beta


def _layernorm(x: Any, g: Any, b: Any, eps: float = 1e-5) -> Any:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * g + b


def _attention_layer(X, C, g, beta, Wq, Wk, Wv, Wo):
    n = _layernorm(X, g, beta)
    q, k, v = (jnp.einsum("tc,chd->htd", n, w) for w in (Wq, Wk, Wv))
    s = jnp.einsum("hid,hjd->hij", q, k) * 0.125
    t = X.shape[0]
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
    return jnp.einsum("htd,hdo->to", jnp.einsum("hij,hjd->hid", jax.nn.softmax(s, -1), v), Wo)


def _attention(Q, K, scale, V):
    s = jnp.einsum("hid,hjd->hij", Q, K) * scale
    t = Q.shape[1]
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
    return jnp.einsum("hij,hje->hie", jax.nn.softmax(s, -1), V)


def _gqa(Q, K, scale, V):
    s = jnp.einsum("bgrid,bgjd->bgrij", Q, K) * scale
    t = Q.shape[3]
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
    return jnp.einsum("bgrij,bgje->bgrie", jax.nn.softmax(s, -1), V)


def _triplet(X, same, margin):
    d = ((X[:, None, :] - X[None, :, :]) ** 2).sum(-1)
    hardest = (d * same).max(1) - (d + 1000 * same).min(1)
    return jax.nn.relu(hardest + margin).sum()


def _sinkhorn(cost, epsilon, la, lb):
    v = jnp.zeros_like(lb)
    for _ in range(10):
        u = la - jax.nn.logsumexp(v[None, :] - cost / epsilon, axis=1)
        v = lb - jax.nn.logsumexp(u[:, None] - cost / epsilon, axis=0)
    return v


def _graphsage(X, nbr, K, Ws, Wn):
    return jax.nn.relu(X @ Ws + X[nbr].sum(1) / K @ Wn)


def _rope(X, C, S):
    c, s = C[:, None, :], S[:, None, :]  # (t, f) -> (t, 1, f), broadcast over heads
    x0, x1 = X[..., 0], X[..., 1]
    return jnp.stack([x0 * c - x1 * s, x1 * c + x0 * s], axis=-1)


def _squeeze_excite(X, S, W1, W2):
    gate = jax.nn.sigmoid(jax.nn.relu(X.mean(-1) @ W1) @ W2)
    return X * gate[:, :, None]


def _chebykan(X, C):
    t = jnp.tanh(X)[..., None]
    degrees = jnp.arange(C.shape[-1], dtype=X.dtype)
    return jnp.einsum("bid,iod->bo", jnp.cos(degrees * jnp.arccos(t)), C)


def _groupnorm(X, w, beta):
    mean = X.mean((2, 3), keepdims=True)
    var = ((X - mean) ** 2).mean((2, 3), keepdims=True)
    return (X - mean) * jax.lax.rsqrt(var + 1e-5) * w[..., None] + beta[..., None]


def _cross_attention(Q, K, scale, V):
    s = jnp.einsum("hid,hjd->hij", Q, K) * scale
    return jnp.einsum("hij,hje->hie", jax.nn.softmax(s, -1), V)


def _relu2_attention(Q, K, scale, V):
    s = jax.nn.relu(jnp.einsum("hid,hjd->hij", Q, K) * scale)
    return jnp.einsum("hij,hje->hie", s**2, V) / K.shape[1]


def _depthwise(X, W):
    return jax.lax.conv_general_dilated(
        X, W[:, None, :], (1,), "VALID", feature_group_count=X.shape[1]
    )


def _masked_mean(X, lens):
    mask = jnp.arange(X.shape[1])[None, :] < lens[:, None]
    return jnp.where(mask[..., None], X, 0).sum(1) / lens[:, None]


def _conv(x, w):
    """`Y[o, i...] := X[c, i+k...] * W[o, c, k...]` as XLA's convolution."""
    return jax.lax.conv_general_dilated(x[None], w, (1,) * (w.ndim - 2), "VALID")[0]


@dataclasses.dataclass(frozen=True)
class Row:
    """A layer: its source, the jnp function, the inputs' shapes (full and quick); `hvp`:
    time a Hessian-vector product instead of the forward+backward."""

    name: str
    source: str
    jnp_fn: Callable[..., Any]
    shapes: dict[str, tuple[int, ...]]
    quick: dict[str, tuple[int, ...]]
    program: bool = True
    hvp: bool = False


ROWS = (
    Row(
        "MLP",
        "H[b,u] := X[b,f] * W1[f,u]\nY[b,o] := tanh(H[b,u]) * W2[u,o]",
        lambda X, W1, W2: jnp.tanh(X @ W1) @ W2,
        {"X": (512, 128), "W1": (128, 512), "W2": (512, 128)},
        {"X": (6, 4), "W1": (4, 8), "W2": (8, 3)},
    ),
    Row(
        "attention sub-layer",
        ATTENTION_LAYER,
        _attention_layer,
        {
            "X": (256, 128),
            "C": (),
            "g": (128,),
            "beta": (128,),
            **{w: (128, 2, 64) for w in ("Wq", "Wk", "Wv")},
            "Wo": (2, 64, 128),
        },
        {
            "X": (6, 8),
            "C": (),
            "g": (8,),
            "beta": (8,),
            **{w: (8, 2, 4) for w in ("Wq", "Wk", "Wv")},
            "Wo": (2, 4, 8),
        },
    ),
    Row(
        "attention HVP",
        ATTENTION,
        _attention,
        {"Q": (2, 256, 64), "K": (2, 256, 64), "scale": (), "V": (2, 256, 64)},
        {"Q": (2, 6, 4), "K": (2, 6, 4), "scale": (), "V": (2, 6, 4)},
        hvp=True,
    ),
    Row(
        "grouped-query attention, 5-d program",
        GQA,
        _gqa,
        {"Q": (2, 2, 4, 256, 32), "K": (2, 2, 256, 32), "scale": (), "V": (2, 2, 256, 32)},
        {"Q": (1, 2, 2, 6, 4), "K": (1, 2, 6, 4), "scale": (), "V": (1, 2, 6, 4)},
    ),
    Row(
        "GELU inside the contraction",
        "Y[b,t,o] := 0.5*H[b,t,u]*(1+erf(H[b,t,u]*0.7071067811865476))*W2[u,o]",
        lambda H, W2: jax.nn.gelu(H, approximate=False) @ W2,
        {"H": (4, 64, 512), "W2": (512, 128)},
        {"H": (2, 3, 8), "W2": (8, 4)},
        program=False,
    ),
    Row(
        "LayerNorm",
        LAYERNORM,
        lambda X, F, eps, g, beta: _layernorm(X, g, beta, eps),
        {"X": (1024, 256), "F": (), "eps": (), "g": (256,), "beta": (256,)},
        {"X": (4, 8), "F": (), "eps": (), "g": (8,), "beta": (8,)},
    ),
    Row(
        "Gaussian kernel (dX, dZ, dB)",
        GAUSSIAN,
        lambda X, Z, B: jnp.exp(-((X[:, None] - Z[None]) ** 2).sum(-1)) @ B,
        {"X": (2000, 3), "Z": (2000, 3), "B": (2000,)},
        {"X": (9, 3), "Z": (7, 3), "B": (7,)},
        program=False,
    ),
    Row(
        "conv1d",
        "Y[o,i] := X[c,i+k] * W[o,c,k]",
        _conv,
        {"X": (32, 1026), "W": (32, 32, 3)},
        {"X": (3, 10), "W": (2, 3, 3)},
        program=False,
    ),
    Row(
        "conv2d, output width 32",
        "Y[o,y,x] := X[c,y+p,x+q] * W[o,c,p,q]",
        _conv,
        {"X": (16, 34, 34), "W": (16, 16, 3, 3)},
        {"X": (2, 6, 6), "W": (3, 2, 3, 3)},
        program=False,
    ),
    Row(
        "conv2d, output width 30",
        "Y[o,y,x] := X[c,y+p,x+q] * W[o,c,p,q]",
        _conv,
        {"X": (16, 32, 32), "W": (16, 16, 3, 3)},
        {"X": (2, 7, 7), "W": (3, 2, 3, 3)},
        program=False,
    ),
    Row(
        "mixture of experts",
        "H[b,e,o] := X[b,f] * W[e,f,o]\nY[b,o] := G[b,e] * tanh(H[b,e,o])",
        lambda X, W, G: jnp.einsum("be,beo->bo", G, jnp.tanh(jnp.einsum("bf,efo->beo", X, W))),
        {"X": (256, 64), "W": (8, 64, 64), "G": (256, 8)},
        {"X": (12, 3), "W": (2, 3, 4), "G": (12, 2)},
    ),
    Row(
        "triplet loss",
        TRIPLET,
        _triplet,
        {"X": (256, 32), "same": (256, 256), "margin": ()},
        {"X": (6, 3), "same": (6, 6), "margin": ()},
    ),
    Row(
        "softmax",
        SOFTMAX,
        lambda X: jax.nn.softmax(X, -1),
        {"X": (512, 512)},
        {"X": (4, 6)},
    ),
    Row(
        "RMSNorm",
        "ms[b] := X[b,f]^2 / F; Y[b,f] := X[b,f] * rsqrt(ms[b] + eps) * g[f]",
        lambda X, F, eps, g: X * jax.lax.rsqrt((X**2).mean(-1, keepdims=True) + eps) * g,
        {"X": (1024, 512), "F": (), "eps": (), "g": (512,)},
        {"X": (3, 5), "F": (), "eps": (), "g": (5,)},
    ),
    Row(
        "Sinkhorn, log domain, 10 iterations",
        SINKHORN,
        _sinkhorn,
        {"cost": (512, 512), "epsilon": (), "la": (512,), "lb": (512,)},
        {"cost": (6, 5), "epsilon": (), "la": (6,), "lb": (5,)},
    ),
    Row(
        "GraphSAGE, mean of 16 neighbours",
        GRAPHSAGE,
        _graphsage,
        {"X": (4096, 64), "nbr": (4096, 16), "K": (), "Ws": (64, 64), "Wn": (64, 64)},
        {"X": (10, 4), "nbr": (10, 3), "K": (), "Ws": (4, 5), "Wn": (4, 5)},
    ),
    Row(
        "RoPE, GPT-J interleaved pairs",
        ROPE,
        _rope,
        {"X": (4, 256, 8, 32, 2), "C": (256, 32), "S": (256, 32)},
        {"X": (2, 3, 2, 4, 2), "C": (3, 4), "S": (3, 4)},
        program=False,
    ),
    Row(
        "squeeze-and-excite",
        SQUEEZE_EXCITE,
        _squeeze_excite,
        {"X": (16, 64, 1024), "S": (), "W1": (64, 16), "W2": (16, 64)},
        {"X": (2, 4, 6), "S": (), "W1": (4, 2), "W2": (2, 4)},
    ),
    Row(
        "ChebyKAN, degree 7, one statement",
        CHEBYKAN,
        _chebykan,
        {"X": (512, 64), "C": (64, 64, 8)},
        {"X": (5, 3), "C": (3, 4, 3)},
        program=False,
    ),
    # Zoo 3 (issue 37, item 5)
    Row(
        "SwiGLU MLP",
        SWIGLU,
        lambda X, W1, W3, W2: (jax.nn.silu(X @ W1) * (X @ W3)) @ W2,
        {"X": (512, 128), "W1": (128, 384), "W3": (128, 384), "W2": (384, 128)},
        {"X": (6, 4), "W1": (4, 8), "W3": (4, 8), "W2": (8, 3)},
    ),
    Row(
        "GroupNorm, 8 groups",
        GROUPNORM,
        _groupnorm,
        {"X": (16, 8, 8, 256), "w": (8, 8), "beta": (8, 8)},
        {"X": (2, 2, 3, 5), "w": (2, 3), "beta": (2, 3)},
    ),
    Row(
        "depthwise conv1d",
        "Y[b,c,i] := X[b,c,i+k] * W[c,k]",
        _depthwise,
        {"X": (16, 64, 258), "W": (64, 3)},
        {"X": (2, 3, 10), "W": (3, 3)},
        program=False,
    ),
    Row(
        "cross-attention, 128 queries, 384 keys",
        CROSS_ATTENTION,
        _cross_attention,
        {"Q": (4, 128, 32), "K": (4, 384, 32), "scale": (), "V": (4, 384, 32)},
        {"Q": (2, 5, 4), "K": (2, 7, 4), "scale": (), "V": (2, 7, 4)},
    ),
    Row(
        "bilinear form x W y",
        "Y[b,o] := X[b,i] * W[o,i,j] * Z[b,j]",
        lambda X, W, Z: jnp.einsum("bi,oij,bj->bo", X, W, Z),
        {"X": (256, 64), "W": (32, 64, 64), "Z": (256, 64)},
        {"X": (5, 3), "W": (2, 3, 4), "Z": (5, 4)},
        program=False,
    ),
    Row(
        "MLP-Mixer token mixing",
        MIXER,
        lambda X, W1, W2: jnp.einsum("buc,ut->btc", jnp.tanh(jnp.einsum("bsc,su->buc", X, W1)), W2),
        {"X": (16, 64, 128), "W1": (64, 128), "W2": (128, 64)},
        {"X": (2, 5, 3), "W1": (5, 4), "W2": (4, 5)},
    ),
    Row(
        "squared-ReLU attention, no softmax",
        RELU2_ATTENTION,
        _relu2_attention,
        {"Q": (4, 256, 32), "K": (4, 256, 32), "scale": (), "V": (4, 256, 32)},
        {"Q": (2, 5, 4), "K": (2, 6, 4), "scale": (), "V": (2, 6, 4)},
    ),
    Row(
        "top-2 router",
        ROUTER,
        lambda X, Wr: jax.lax.top_k(jax.nn.softmax(X @ Wr, -1), 2)[0],
        {"X": (2048, 128), "Wr": (128, 16)},
        {"X": (7, 4), "Wr": (4, 5)},
    ),
    Row(
        "soft-min over squared distances (KeOps)",
        SOFTMIN,
        lambda X, Z, tau: jax.nn.logsumexp(-((X[:, None] - Z[None]) ** 2).sum(-1) / tau, 1),
        {"X": (2000, 3), "Z": (2000, 3), "tau": ()},
        {"X": (9, 3), "Z": (7, 3), "tau": ()},
    ),
    Row(
        "masked mean pooling with lengths",
        "Y[b,c] := X[b,t,c] * (t < lens[b]) / lens[b]",
        _masked_mean,
        {"X": (32, 256, 128), "lens": (32,)},
        {"X": (3, 5, 4), "lens": (3,)},
        program=False,
    ),
    Row(
        "BatchNorm, training statistics",
        BATCH_NORM,
        _batch_norm,
        {"X": (256, 1024), "g": (1024,), "beta": (1024,)},
        {"X": (5, 7), "g": (7,), "beta": (7,)},
    ),
    Row(
        "Mish activation",
        "Y[b,f] := X[b,f] * tanh(log(1 + exp(X[b,f])))",
        lambda X: X * jnp.tanh(jnp.log1p(jnp.exp(X))),
        {"X": (256, 1024)},
        {"X": (3, 5)},
        program=False,
    ),
    Row(
        "cross-entropy with integer labels",
        "(logsumexp) L[n] := Z[n,c]\nloss := L[n] - Z[n, labels[n]]",
        lambda Z, labels: (
            jax.nn.logsumexp(Z, 1) - jnp.take_along_axis(Z, labels[:, None], 1)[:, 0]
        ).sum(),
        {"Z": (4096, 512), "labels": (4096,)},
        {"Z": (6, 5), "labels": (6,)},
    ),
    Row(
        "embedding bag, mean of 32 tokens",
        "Y[b,d] := E[tok[b,s], d] / size(s)",
        lambda E, tok: E[tok].mean(1),
        {"E": (8192, 128), "tok": (256, 32)},
        {"E": (9, 4), "tok": (3, 5)},
        program=False,
    ),
    Row(
        "strided conv1d, stride 2",
        "Y[o,i] := X[c,2i+k] * W[o,c,k]",
        lambda X, W: jax.lax.conv_general_dilated(X[None], W, (2,), "VALID")[0],
        {"X": (64, 2048), "W": (64, 64, 3)},
        {"X": (3, 11), "W": (2, 3, 3)},
        program=False,
    ),
)
#: Inputs that are not differentiated: a mask, index arrays, sequence lengths, labels
CONSTANT = ("same", "nbr", "lens", "labels", "tok")
ROWS_BY_NAME = {row.name: row for row in ROWS}


def inputs(row: Row, shapes: dict[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """float32 inputs, never all zeros or ones; scalars as the layer means them."""
    rng = np.random.default_rng(len(row.name))
    found = {}
    for name, shape in shapes.items():
        found[name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
    scalars = {
        "F": shapes.get("X", (1,))[-1],
        "C": shapes.get("X", (1,))[-1],
        "eps": 1e-5,
        "margin": 0.3,
        "scale": 0.125,
        "epsilon": 0.01,  # Sinkhorn: most exp arguments far below -87
        "tau": 0.1,  # soft-min: a temperature
    }
    if "W1" in shapes and "S" in shapes:  # squeeze-and-excite: the pooled length
        scalars["S"] = shapes["X"][-1]
    if "nbr" in shapes:  # GraphSAGE's neighbour count (attention's K is a tensor)
        scalars["K"] = shapes["nbr"][-1]
    for name, value in scalars.items():
        if name in found and not shapes[name]:  # RoPE's and ChebyKAN's C are tensors
            found[name] = np.float32(value)
    if "same" in found:
        labels = rng.integers(0, 4, size=shapes["same"][0])
        found["same"] = (labels[:, None] == labels[None, :]).astype(np.float32)
    if "cost" in found:  # squared distances
        found["cost"] = 4 * np.square(found["cost"])
    if "lens" in found:  # sequence lengths, 1 to T, as floats
        t = shapes["X"][1]
        found["lens"] = rng.integers(1, t + 1, shapes["lens"]).astype(np.float32)
    if "nbr" in found:  # neighbour lists, with repeats
        found["nbr"] = rng.integers(0, shapes["X"][0], shapes["nbr"]).astype(np.int32)
    if "labels" in found:  # a class per row
        found["labels"] = rng.integers(0, shapes["Z"][1], shapes["labels"]).astype(np.int32)
    if "tok" in found:  # token ids, with repeats
        found["tok"] = rng.integers(0, shapes["E"][0], shapes["tok"]).astype(np.int32)
    return found


def functions(row: Row, impl: str) -> tuple[Callable[..., Any], Callable[..., Any], tuple]:
    """(forward, forward+backward, input names) of one implementation, jitted."""
    import tensordsl as td

    if impl == JNP:
        fn = row.jnp_fn
        names = tuple(row.shapes)
    else:
        options = {"fuse": False} if impl == STORED else {}
        k = (
            td.program(row.source, backend="c", **options)
            if row.program
            else td.kernel(row.source, backend="c")
        )
        fn, names = k, k.inputs
    floats = tuple(n for n, shape in row.shapes.items() if shape and n not in CONSTANT)

    def loss(*values: Any) -> Any:
        *values, ct = values
        return jnp.sum(fn(*values) * ct)

    argnums = tuple(names.index(n) for n in floats)
    value_and_grad = jax.value_and_grad(loss, argnums=argnums)
    if not row.hvp:
        return jax.jit(fn), jax.jit(value_and_grad), names

    def hvp(*values: Any) -> Any:
        """(loss, the Hessian of the loss times the tangents): value_and_grad's structure."""

        def at(*primals: Any) -> Any:
            full = list(values)
            for n, primal in zip(argnums, primals, strict=True):
                full[n] = primal
            return value_and_grad(*full)

        primals = tuple(values[n] for n in argnums)
        tangents = tuple(
            np.random.default_rng(7 + k).standard_normal(p.shape).astype(np.float32)
            for k, p in enumerate(primals)
        )
        (value, _), (_, products) = jax.jvp(at, primals, tangents)
        return value, products

    return jax.jit(fn), jax.jit(hvp), names


def check(row: Row, shapes: dict, impl: str, made: tuple, want: tuple) -> dict[str, str]:
    """The modes whose results differ from jax.numpy's (or fail), with the reason."""
    forward, both, names = made
    data = inputs(row, shapes)
    args = [data[n] for n in names]
    failed = {}
    for mode, fn, call_args, expected in zip(
        MODES, (forward, both), (args, [*args, want[2]]), want[:2]
    ):
        try:
            bad = mismatches(fn(*call_args), expected, TOLERANCE)
            if bad:
                failed[mode] = "error: differs from jax.numpy: " + ", ".join(bad)[:120]
        except Exception as error:  # noqa: BLE001 - reported in the table
            failed[mode] = "error: " + short(error)
    return failed


def run_row(row: Row, quick: bool, budget: float, settle: float) -> dict[str, Any]:
    shapes = row.quick if quick else row.shapes
    data = inputs(row, shapes)
    impls = (OURS, STORED, JNP) if row.program else (OURS, JNP)
    made = {impl: functions(row, impl) for impl in impls}
    jnp_args = [data[n] for n in made[JNP][2]]
    out = np.asarray(made[JNP][0](*jnp_args))
    ct = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    value, grads = made[JNP][1](*jnp_args, ct)
    by_name = dict(zip([n for n in made[JNP][2] if shapes[n] and n not in CONSTANT], grads))
    fns, args, failed = {}, {}, {}
    for impl in impls:
        names = made[impl][2]
        want = (out, (value, tuple(by_name[n] for n in names if n in by_name)), ct)
        failed[impl] = check(row, shapes, impl, made[impl], want)
        args[impl] = [*(data[n] for n in names), ct]
        forward = made[impl][0]
        fns[(impl, "fwd")] = lambda *a, f=forward: f(*a[:-1])
        fns[(impl, "fwd+bwd")] = made[impl][1]
        for mode in failed[impl]:
            del fns[(impl, mode)]
    times = time_rounds(fns, args, budget, settle)
    return {
        "name": row.name,
        "shapes": {n: list(s) for n, s in shapes.items()},
        "impls": by_implementation(times, failed, impls, MODES),
        "decisions": decisions(row, shapes),
    }


def decisions(row: Row, shapes: dict) -> str:
    """What the cost model chose for a program at these shapes, in a few words."""
    if not row.program:
        return ""
    import tensordsl as td
    from codegen.ir.program import live_statements
    from tensordsl.backends.table import BACKENDS
    from tensordsl.binding.programs import fuse_program

    k = td.program(row.source)
    if any(op.name not in shapes for op in k.program.inputs):
        return ""  # gathered operands (GraphSAGE's `X[nbr[n,k], d]`): shaped by the call
    fused = fuse_program(  # an HVP is differentiated twice: fused for that
        live_statements(k.program),
        k.program.outputs,
        k.program.concrete_shapes(shapes),
        order=2 if row.hvp else 1,
        beside=BACKENDS["c"].sums_beside,  # as the C back end fuses
    )
    stored = [d.name for d in fused.decisions if d.choice == "store"]
    inlined = [d.name for d in fused.decisions if d.choice == "inline"]
    parts = [f"{', '.join(inlined)} recomputed"] if inlined else []
    parts += [f"{', '.join(stored)} stored"] if stored else []
    return "; ".join(parts)


def cold_child(name: str, quick: bool) -> dict[str, Any]:
    """Seconds of the first `jit(value_and_grad)` call of a row (run in a fresh process with
    an empty kernel cache by `cold`)."""
    import time

    row = ROWS_BY_NAME[name]
    shapes = row.quick if quick else row.shapes
    data = inputs(row, shapes)
    _, both, names = functions(row, OURS)
    out_shape = jax.eval_shape(functions(row, OURS)[0], *(data[n] for n in names)).shape
    ct = np.ones(out_shape, np.float32) * np.float32(0.5)
    start = time.perf_counter()
    jax.block_until_ready(both(*(data[n] for n in names), ct))
    return {"cold_s": time.perf_counter() - start}


def cold(name: str, quick: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as cache:
        env = child_env({"TENSORDSL_CACHE_DIR": cache})
        return run_child("benchmarks.natural", ["--cold-child", name] + ["--quick"] * quick, env)


# --------------------------------------------------------------------------- report


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| layer | fwd ms | jnp fwd ms | fwd ratio | fwd+bwd ms | jnp fwd+bwd ms | "
        "fwd+bwd ratio | fuse=False fwd / fwd+bwd ms | cold s | fusion |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for row in rows:
        impls = row["impls"]
        stored = impls.get(STORED)
        cold_s = row.get("cold", {})
        cells = [
            row["name"],
            ms(impls[OURS]["fwd"]),
            ms(impls[JNP]["fwd"]),
            ratio(over(median_of(row, OURS, "fwd"), median_of(row, JNP, "fwd"))),
            ms(impls[OURS]["fwd+bwd"]),
            ms(impls[JNP]["fwd+bwd"]),
            ratio(over(median_of(row, OURS, "fwd+bwd"), median_of(row, JNP, "fwd+bwd"))),
            f"{ms(stored['fwd'])} / {ms(stored['fwd+bwd'])}" if stored else "",
            f"{cold_s['cold_s']:.1f}" if "cold_s" in cold_s else cold_s.get("error", "n/a"),
            row["decisions"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sizes(rows: list[dict[str, Any]]) -> str:
    return "\n".join(
        f"- {row['name']}: "
        + ", ".join(f"{n} {tuple(s) if s else 'scalar'}" for n, s in row["shapes"].items())
        for row in rows
    )


def section(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    begin, end = markers(NAME)
    return f"""{begin}
## Natural formulations against jax.numpy (issue 26)

Generated by `python -m benchmarks.{NAME}` (benchmarks/{NAME}.py); the text between the
{NAME} markers is rewritten by that script.

{header(info)}

Each layer written directly (a program of several statements, or one statement), float32, C
back end, `jax.jit`; jax.numpy in the same run. "fwd+bwd": `jax.value_and_grad` of
`sum(out * ct)` with respect to every float input; in the "attention HVP" row, the Hessian-vector
product of that loss instead (`jax.jvp` of its `jax.value_and_grad`, the program from
`docs/language.md`), and "cold s" its first call. Ratios are tensordsl / jax.numpy (below 1:
faster). "fuse=False": the program with every intermediate stored, as separate kernels.
"cold s": the first `jit(value_and_grad)` call in a fresh process with an empty kernel
cache. "fusion": what the cost model chose for these shapes. Medians in milliseconds,
implementations in turns; every result checked against jax.numpy first (relative tolerance
{TOLERANCE:g} of the largest magnitude). The machine is shared and was loaded (see the load
average): ratios are steadier than absolute times.

{table(rows)}

Target (issue 26): no row above 1.5x jax.numpy, forward or forward+backward; the attention
HVP at most 3x jax.numpy and built cold in at most 30 s. In: elementwise
prologues around contractions (MLP, GELU: `tanh(H[b,u]) * W2[u,o]` evaluates tanh once per
`(b, u)`, then XLA's dot), multi-output gradient nests on C (the Gaussian kernel's dX, dZ
and dB in two nests), whole tested tiles for conv2d's input gradient, one gradient nest per
input read by several stored statements (RMSNorm), `-O2` for large sources (the attention
sub-layer's cold build), long tile cases as functions of their own (the HVP's
second-order nests), gradient nests that read what a stored statement holds (softmax's
backward reads P: `dX = dP*P + dZ*P*Z`, no exponential), whole elementwise tiles stored
untested, edge tiles of shifted reads from a zero-padded copy with lane masks (conv's input
gradient: no test per lane), thread teams by the size of the work (a small nest runs on one
thread and never waits for a busy core), idle OpenMP threads that spin about 2 ms before
they sleep (the next kernel finds its team awake: section "Waiting"), softmax's forward as one
kernel of row passes (its exp once per element: section "row_passes"). Not yet, and the rows
that show it: conv1d and conv2d above the issue's 1.2x forward+backward in some runs (the
30-wide forward runs in 8-lane tiles, the weight gradient in the dot strategy). The attention
HVP is fused for a call differentiated twice (its scores stored: every tangent nest would
recompute them and their tangent), its tangent nests' sums of matrix products run as XLA's
dots in the form XLA's CPU dot runs fast, and the first-order gradients it does not read
are not computed (sections "attention HVP" and "hvp_dce").

Issue 37's rows (target: 1.5x jax.numpy, forward and forward+backward): Sinkhorn (an inline
exp with no slow path, the cost gradient's row reads outside its where: section "Issue 37:
Sinkhorn"), GraphSAGE (the gather's transpose one scatter-add on the CPU), GPT-J RoPE (its
last axis of 2, read as `X[..., 1-p]`, unrolled with the feature axis in vector lanes: the
unroll strategy), ChebyKAN in one statement (the X gradient's inner sums over `o` in lane
arrays of 8 degrees), grouped-query attention as a 5-d program (query heads `r` in groups
`g`, each group reading its key/value head; `tensordsl.nn.attention` takes fewer key/value
heads too: benchmarks/nn_layers.py). Until 2026-12-06 Sinkhorn measured 2.5x / 5.6x and GraphSAGE's
fwd+bwd 3.4x on a quiet machine (load 1.3-1.9); until 2026-12-07 Sinkhorn 1.7x / 1.7x (its
logsumexps counted without their exp ran on one thread; the backward computed each
statement's weights twice: section "sink_fwd"); the table above is after those fixes.
Squeeze-and-excite: its fwd+bwd varied from run to run (1.0x-2.1x) because its kernels'
thread teams waited for a second thread that found no free core, in about half the calls on
a loaded machine, and the back-off caught only waits of 10 ms (section "Issue 37:
squeeze-and-excite"); the forward's nests now stream their rows. Two rules that keep small
kernels on one thread after a team that did not pay were tried and not kept: each made
conv2d's and RoPE's fwd+bwd 1.3-1.6x slower (section "Teams: two rules tried, none kept").

The ten rows from "SwiGLU MLP" on are a third zoo (issue 37, branch zoo3): cross-attention
with no mask stores its scores on the C back end (its one pass computed every pair XLA's
dots compute, about half as fast), and relu's condition on the value it keeps is no guard
(squared-ReLU attention's sum stays XLA's dot); the top-2 router's forward+backward (its
values and positions in two passes) is left open (section "a third zoo of natural layers");
its gradient nests now vectorise. The five rows from "BatchNorm" on are a fourth zoo
(section "Issue 37: a router's gradient, column statistics and a call after exp"):
BatchNorm's column sums and a call after exp (Mish) were fixed; the stride-2 conv1d is a
known cliff (the gradient of a strided read, docs/performance.md).

Sizes:

{sizes(rows)}

Raw numbers: `benchmarks/results/{NAME}.json`.
{end}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, smoke run")
    parser.add_argument("--out", help="Markdown file to write the section into")
    parser.add_argument("--no-cold", action="store_true", help="skip the cold-build children")
    parser.add_argument(
        "--only", nargs="*", help="run only these rows (by name); writes nothing without --out"
    )
    parser.add_argument("--cold-child", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.cold_child:
        import json

        print(json.dumps(cold_child(options.cold_child, options.quick)))
        return 0
    info = start_run()
    budget, settle = (0.2, 0.01) if options.quick else (1.5, 0.1)
    rows = []
    for row in ROWS:
        if options.only and row.name not in options.only:
            continue
        print(f"... {row.name}", file=sys.stderr, flush=True)
        found = run_row(row, options.quick, budget, settle)
        if not options.no_cold:
            found["cold"] = cold(row.name, options.quick)
        rows.append(found)
    finish_run(info)
    print(table(rows))
    # A partial run (--only) prints its rows; it never replaces the whole table with them.
    out = options.out or (None if options.quick or options.only else RESULTS_MD)
    write_outputs(out, NAME, section(rows, info), {"machine": info, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
