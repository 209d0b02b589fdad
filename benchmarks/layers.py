"""A GPT-style block, written with tensordsl kernels as a user would today, and in jax.numpy.

Pre-LayerNorm, causal multi-head attention, GELU MLP (tanh form), float32:

    y = x + attention(layer_norm_1(x)) @ Wo
    out = y + gelu(layer_norm_2(y) @ W1 + c1) @ W2 + c2

`IMPLEMENTATIONS` maps a name to a function `block(params, x)`; a later version (several
statements fused in one kernel) is added there, next to these two. `KERNELS` holds the
single-statement kernels, one statement each; residual sums stay in jax.numpy. The causal mask
is written with `where(j <= i, ...)` and a large negative score (the language has no `-inf`).

>>> import numpy as np
>>> size = BlockSize(batch=1, seq=4, width=8, heads=2)
>>> params, x = init_params(size, np.random.default_rng(0)), np.ones((1, 4, 8), np.float32)
>>> block_jnp(params, x).shape
(1, 4, 8)
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

#: Masked scores: exp(MASKED - max) is exactly 0 in float32.
MASKED = "-1e9"
EPS = 1e-5
GELU_C = 0.7978845608028654  # sqrt(2 / pi)

KERNELS = {
    "row_mean": "M[b,t] := X[b,t,f] / F",
    "row_variance": "V[b,t] := (X[b,t,f] - M[b,t])^2 / F",
    "normalise": "N[b,t,f] := (X[b,t,f] - M[b,t]) * rsqrt(V[b,t] + eps) * g[f] + beta[f]",
    "qkv_projection": "P[s,b,h,t,e] := N[b,t,f] * W[f,s,h,e]",
    "scores": f"S[b,h,i,j] := where(j <= i, Q[b,h,i,e] * K[b,h,j,e] * scale, {MASKED})",
    "logsumexp": "(logsumexp) L[b,h,i] := S[b,h,i,j]",
    "weighted_sum": "O[b,h,i,e] := where(j <= i, exp(S[b,h,i,j] - L[b,h,i]), 0) * V[b,h,j,e]",
    "out_projection": "Y[b,t,o] := A[b,h,t,e] * W[h,e,o]",
    "mlp_up": "H[b,t,u] := N[b,t,f] * W[f,u] + c[u] * (f == 0)",
    "gelu": (
        f"A[b,t,u] := 0.5 * H[b,t,u] * (1 + tanh({GELU_C} * (H[b,t,u] + 0.044715 * H[b,t,u]^3)))"
    ),
    "mlp_down": "Y[b,t,o] := A[b,t,u] * W[u,o] + c[o] * (u == 0)",
}


@dataclasses.dataclass(frozen=True)
class BlockSize:
    """Batch B, sequence T, model width D, heads H (head width D / H)."""

    batch: int
    seq: int
    width: int
    heads: int

    def __str__(self) -> str:
        return f"B={self.batch}, T={self.seq}, D={self.width}, H={self.heads}"

    @property
    def head_width(self) -> int:
        return self.width // self.heads


def init_params(size: BlockSize, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random float32 parameters (no zeros, no ones: LayerNorm gains near 1, biases near 0)."""
    d, h, e, u = size.width, size.heads, size.head_width, 4 * size.width

    def normal(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    return {
        "ln1_g": 1 + normal(d, scale=0.1),
        "ln1_b": normal(d, scale=0.1),
        "w_qkv": normal(d, 3, h, e, scale=1 / math.sqrt(d)),
        "w_out": normal(h, e, d, scale=1 / math.sqrt(d)),
        "ln2_g": 1 + normal(d, scale=0.1),
        "ln2_b": normal(d, scale=0.1),
        "w_up": normal(d, u, scale=1 / math.sqrt(d)),
        "c_up": normal(u, scale=0.1),
        "w_down": normal(u, d, scale=1 / math.sqrt(u)),
        "c_down": normal(d, scale=0.1),
    }


def init_input(size: BlockSize, rng: np.random.Generator) -> np.ndarray:
    return rng.standard_normal((size.batch, size.seq, size.width)).astype(np.float32)


# --------------------------------------------------------------------------- jax.numpy


def layer_norm_jnp(x: Any, g: Any, b: Any) -> Any:
    mean = x.mean(-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(variance + EPS) * g + b


def attention_jnp(q: Any, k: Any, v: Any) -> Any:
    """Causal softmax attention on (B, H, T, E) arrays, as jax.numpy users write it."""
    seq = q.shape[2]
    s = jnp.einsum("bhie,bhje->bhij", q, k) / math.sqrt(q.shape[-1])
    s = jnp.where(jnp.tril(jnp.ones((seq, seq), bool)), s, -jnp.inf)
    return jnp.einsum("bhij,bhje->bhie", jax.nn.softmax(s, axis=-1), v)


def block_jnp(params: dict[str, Any], x: Any) -> Any:
    n = layer_norm_jnp(x, params["ln1_g"], params["ln1_b"])
    q, k, v = jnp.einsum("btf,fshe->sbhte", n, params["w_qkv"])
    y = x + jnp.einsum("bhte,heo->bto", attention_jnp(q, k, v), params["w_out"])
    n = layer_norm_jnp(y, params["ln2_g"], params["ln2_b"])
    hidden = jax.nn.gelu(n @ params["w_up"] + params["c_up"], approximate=True)
    return y + hidden @ params["w_down"] + params["c_down"]


# --------------------------------------------------------------------------- tensordsl


@functools.lru_cache(maxsize=4)
def kernels(backend: str = "c") -> dict[str, Any]:
    """The block's kernels for `backend` (built once per back end; compiled on first call)."""
    import tensordsl as td

    return {name: td.kernel(source, backend=backend) for name, source in KERNELS.items()}


def _f32(value: float) -> np.float32:
    # A float32 scalar keeps the kernels in float32 even where jax_enable_x64 is on.
    return np.float32(value)


def layer_norm_kernels(x: Any, g: Any, b: Any, k: dict[str, Any]) -> Any:
    features = _f32(x.shape[-1])
    mean = k["row_mean"](X=x, F=features)
    variance = k["row_variance"](X=x, M=mean, F=features)
    return k["normalise"](X=x, M=mean, V=variance, eps=_f32(EPS), g=g, beta=b)


def attention_kernels(q: Any, k: Any, v: Any, ks: dict[str, Any]) -> Any:
    """Causal softmax attention on (B, H, T, E) arrays: scores, logsumexp, weighted sum."""
    s = ks["scores"](Q=q, K=k, scale=_f32(1 / math.sqrt(q.shape[-1])))
    return ks["weighted_sum"](S=s, L=ks["logsumexp"](S=s), V=v)


def block_kernels(params: dict[str, Any], x: Any, backend: str = "c") -> Any:
    k = kernels(backend)
    n = layer_norm_kernels(x, params["ln1_g"], params["ln1_b"], k)
    q, key, v = k["qkv_projection"](N=n, W=params["w_qkv"])
    y = x + k["out_projection"](A=attention_kernels(q, key, v, k), W=params["w_out"])
    n = layer_norm_kernels(y, params["ln2_g"], params["ln2_b"], k)
    hidden = k["gelu"](H=k["mlp_up"](N=n, W=params["w_up"], c=params["c_up"]))
    return y + k["mlp_down"](A=hidden, W=params["w_down"], c=params["c_down"])


#: The block as programs: LayerNorm, attention and the MLP are one kernel each (several
#: statements; see docs/language.md, "Programs"). The causal mask is `-inf`, and the scores
#: are recomputed inside the logsumexp and the weighted sum, never stored.
PROGRAMS = {
    "layer_norm": """
        M[b,t] := X[b,t,f] / F
        V[b,t] := (X[b,t,f] - M[b,t])^2 / F
        N[b,t,f] := (X[b,t,f] - M[b,t]) * rsqrt(V[b,t] + eps) * g[f] + beta[f]
    """,
    "attention": """
        S[b,h,i,j] := Q[b,h,i,e] * K[b,h,j,e] * scale + where(j <= i, 0, -inf)
        (logsumexp) L[b,h,i] := S[b,h,i,j]
        O[b,h,i,e] := exp(S[b,h,i,j] - L[b,h,i]) * V[b,h,j,e]
    """,
    "mlp": (
        "H[b,t,u] := N[b,t,f] * W1[f,u]\n"
        f"A[b,t,u] := 0.5 * (H[b,t,u] + c1[u]) * (1 + tanh({GELU_C} * ((H[b,t,u] + c1[u]) "
        "+ 0.044715 * (H[b,t,u] + c1[u])^3)))\n"
        "Y[b,t,o] := A[b,t,u] * W2[u,o]\n"
        "Z[b,t,o] := Y[b,t,o] + c2[o]"
    ),
}


@functools.lru_cache(maxsize=4)
def programs(backend: str = "c") -> dict[str, Any]:
    """The block's programs for `backend` (built once; compiled on first call)."""
    import tensordsl as td

    return {name: td.kernel(source, backend=backend) for name, source in PROGRAMS.items()}


def block_programs(params: dict[str, Any], x: Any, backend: str = "c") -> Any:
    k, p = kernels(backend), programs(backend)

    def layer_norm(x: Any, g: Any, b: Any) -> Any:
        return p["layer_norm"](X=x, F=_f32(x.shape[-1]), eps=_f32(EPS), g=g, beta=b)

    n = layer_norm(x, params["ln1_g"], params["ln1_b"])
    q, key, v = k["qkv_projection"](N=n, W=params["w_qkv"])
    scale = _f32(1 / math.sqrt(q.shape[-1]))
    attended = p["attention"](Q=q, K=key, scale=scale, V=v)
    y = x + k["out_projection"](A=attended, W=params["w_out"])
    n = layer_norm(y, params["ln2_g"], params["ln2_b"])
    w_up, c_up, w_down, c_down = (params[n] for n in ("w_up", "c_up", "w_down", "c_down"))
    return y + p["mlp"](N=n, W1=w_up, c1=c_up, W2=w_down, c2=c_down)


IMPLEMENTATIONS: dict[str, Callable[[dict[str, Any], Any], Any]] = {
    "jax.numpy": block_jnp,
    "tensordsl kernels": block_kernels,
    "tensordsl programs": block_programs,
}


def stack(block: Callable[[dict[str, Any], Any], Any]) -> Callable[[list[Any], Any], Any]:
    """`len(params)` blocks applied in turn, one parameter dict each."""

    def stacked(params: list[dict[str, Any]], x: Any) -> Any:
        for layer in params:
            x = block(layer, x)
        return x

    return stacked


def loss_of(block: Callable[..., Any], cotangent: Any) -> Callable[..., Any]:
    """The scalar `sum(block(params, x) * cotangent)`, differentiated w.r.t. params and x."""

    def loss(params: Any, x: Any) -> Any:
        return jnp.sum(block(params, x) * cotangent)

    return loss
