"""The GPT block and the GPT-2 decoder of `benchmarks.gpu_check` in torch (eager, compiled).

The same computation as `layers.block_jnp` (pre-LayerNorm, causal attention through
`scaled_dot_product_attention`, tanh GELU) on the same parameters, flattened to a list of
tensors in `KEYS` order so that `torch.autograd.grad` can take all of them. torch is
imported by the functions only, never by this module.
"""

from __future__ import annotations

from typing import Any

from benchmarks import layers

KEYS = ("ln1_g", "ln1_b", "w_qkv", "w_out", "ln2_g", "ln2_b", "w_up", "c_up", "w_down", "c_down")


def block(p: dict[str, Any], x: Any) -> Any:
    """One block on (B, T, D) float tensors; `p` holds the `KEYS` tensors."""
    import torch
    from torch.nn import functional

    d = x.shape[-1]
    n = functional.layer_norm(x, (d,), p["ln1_g"], p["ln1_b"], layers.EPS)
    q, k, v = torch.einsum("btf,fshe->sbhte", n, p["w_qkv"])
    attended = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    y = x + torch.einsum("bhte,heo->bto", attended, p["w_out"])
    n = functional.layer_norm(y, (d,), p["ln2_g"], p["ln2_b"], layers.EPS)
    hidden = functional.gelu(n @ p["w_up"] + p["c_up"], approximate="tanh")
    return y + hidden @ p["w_down"] + p["c_down"]


def flat_block(*tensors: Any) -> Any:
    """`block` on the `KEYS` tensors, then x."""
    return block(dict(zip(KEYS, tensors[:-1], strict=True)), tensors[-1])


def flat_decoder(layers_count: int, tokens: Any) -> Any:
    """The decoder on (wte, wpe, g, b, then `KEYS` per layer): logits of `tokens`."""

    def run(*tensors: Any) -> Any:
        from torch.nn import functional

        wte, wpe, g, b = tensors[:4]
        x = wte[tokens] + wpe[None]
        for n in range(layers_count):
            start = 4 + n * len(KEYS)
            x = block(dict(zip(KEYS, tensors[start : start + len(KEYS)], strict=True)), x)
        return functional.layer_norm(x, (x.shape[-1],), g, b, layers.EPS) @ wte.T

    return run
