"""The GPT decoder a user writes with tensordsl, against the same model in jax.numpy.

Run from the repository root:

    python -m benchmarks.gpt_model           # 2 layers, D 128, T 128; writes RESULTS.md
    python -m benchmarks.gpt_model --quick   # tiny sizes, smoke run; writes nothing

The model (notebook 04's, as a library function of a `Config`): token (a gather through the
token ids, `W[tok[b,t], d]`) and position embeddings, pre-norm blocks (LayerNorm, causal multi-head
attention, a GELU MLP written as one program), a lm_head tied to the token embedding and the mean
cross-entropy. Ours uses `tensordsl.nn` layers and programs on `backend`; jax.numpy's the same
layers in jnp (`jax.nn.dot_product_attention`, `optax`-free cross-entropy). Rows: the forward (the
logits) and the forward+backward (`jax.value_and_grad` of the loss with respect to every parameter),
both under `jax.jit`, medians, implementations in turns (benchmarks/common.py); the loss and
every gradient are checked against jax.numpy before anything is timed. On a GPU,
benchmarks/gpu_check times a decoder of GPT-2 small's shape (`GPT2_SMALL`).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import tensordsl as td
from benchmarks.common import (
    RESULTS_MD,
    by_implementation,
    finish_run,
    header,
    markers,
    median_of,
    mismatches,
    ms,
    over,
    ratio,
    start_run,
    time_rounds,
    write_outputs,
)

NAME = "gpt_model"
OURS, JNP = "tensordsl", "jax.numpy"
MODES = ("fwd", "fwd+bwd")
TOLERANCE = 2e-3
MLP = """
    H[n,u] := X[n,f] * W1[f,u]
    G[n,u] := H[n,u] + b1[u]
    Y[n,o] := 0.5 * G[n,u] * (1 + erf(G[n,u] * 0.7071067811865476)) * W2[u,o]
"""


@dataclasses.dataclass(frozen=True)
class Config:
    layers: int
    width: int
    heads: int
    seq: int
    batch: int
    vocab: int

    def __str__(self) -> str:
        return ", ".join(f"{f.name} {getattr(self, f.name)}" for f in dataclasses.fields(self))


CPU = Config(layers=2, width=128, heads=4, seq=128, batch=8, vocab=512)
QUICK = Config(layers=1, width=16, heads=2, seq=8, batch=2, vocab=11)
GPT2_SMALL = Config(layers=12, width=768, heads=12, seq=1024, batch=8, vocab=50257)


def init(c: Config, seed: int = 0) -> dict[str, Any]:
    """Parameters (float32, GPT-2's scales) as a pytree of numpy arrays."""
    rng = np.random.default_rng(seed)
    d = c.width

    def normal(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (scale * rng.standard_normal(shape)).astype(np.float32)

    def block() -> dict[str, np.ndarray]:
        ones, zeros = np.ones(d, np.float32), np.zeros(d, np.float32)
        return {
            "ln1_g": ones, "ln1_b": zeros, "ln2_g": ones, "ln2_b": zeros,
            "w_qkv": normal(d, 3 * d), "b_qkv": normal(3 * d),
            "w_o": normal(d, d), "b_o": normal(d),
            "w1": normal(d, 4 * d), "b1": normal(4 * d),
            "w2": normal(4 * d, d), "b2": normal(d),
        }  # fmt: skip

    return {
        "wte": normal(c.vocab, d),
        "wpe": normal(c.seq, d, scale=0.01),
        "blocks": [block() for _ in range(c.layers)],
        "lnf_g": np.ones(d, np.float32),
        "lnf_b": np.zeros(d, np.float32),
    }


def tokens_of(c: Config, seed: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """Random tokens and their next-token targets, (batch, seq) int32 each."""
    window = np.random.default_rng(seed).integers(0, c.vocab, (c.batch, c.seq + 1))
    return window[:, :-1].astype(np.int32), window[:, 1:].astype(np.int32)


def model_td(c: Config, backend: str = "auto") -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(logits(params, tokens), loss(params, tokens, targets)) written with tensordsl."""
    mlp = td.program(MLP, backend=backend)
    embed = td.kernel("E[b,t,d] := W[tok[b,t], d]", backend=backend)
    lm_head = td.kernel("Z[n,v] := X[n,d] * W[v,d]", backend=backend)
    nn = td.nn

    def block(p: dict[str, Any], x: Any) -> Any:
        b, t, d = x.shape
        h = nn.layer_norm(x, p["ln1_g"], p["ln1_b"], backend=backend)
        q, k, v = jnp.split(nn.dense(h, p["w_qkv"], p["b_qkv"], backend=backend), 3, axis=-1)
        heads = [a.reshape(b, t, c.heads, d // c.heads) for a in (q, k, v)]
        a = nn.attention(*heads, causal=True, backend=backend).reshape(b, t, d)
        x = x + nn.dense(a, p["w_o"], p["b_o"], backend=backend)
        h = nn.layer_norm(x, p["ln2_g"], p["ln2_b"], backend=backend).reshape(b * t, d)
        return x + (mlp(X=h, W1=p["w1"], b1=p["b1"], W2=p["w2"]) + p["b2"]).reshape(b, t, d)

    def logits(params: dict[str, Any], tokens: Any) -> Any:
        b, t = tokens.shape
        x = embed(W=params["wte"], tok=tokens) + params["wpe"][:t]
        for p in params["blocks"]:
            x = block(p, x)
        x = nn.layer_norm(x, params["lnf_g"], params["lnf_b"], backend=backend)
        return lm_head(X=x.reshape(b * t, -1), W=params["wte"]).reshape(b, t, -1)

    def loss(params: dict[str, Any], tokens: Any, targets: Any) -> Any:
        return nn.cross_entropy(logits(params, tokens), targets, backend=backend).mean()

    return logits, loss


def model_jnp(c: Config) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """The same model in jax.numpy."""

    def norm(x: Any, g: Any, b: Any) -> Any:
        mean = x.mean(-1, keepdims=True)
        return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b

    def block(p: dict[str, Any], x: Any) -> Any:
        b, t, d = x.shape
        q, k, v = jnp.split(norm(x, p["ln1_g"], p["ln1_b"]) @ p["w_qkv"] + p["b_qkv"], 3, -1)
        q, k, v = (a.reshape(b, t, c.heads, d // c.heads) for a in (q, k, v))
        a = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, d)
        x = x + a @ p["w_o"] + p["b_o"]
        h = norm(x, p["ln2_g"], p["ln2_b"]) @ p["w1"] + p["b1"]
        return x + jax.nn.gelu(h, approximate=False) @ p["w2"] + p["b2"]

    def logits(params: dict[str, Any], tokens: Any) -> Any:
        x = params["wte"][tokens] + params["wpe"][: tokens.shape[1]]
        for p in params["blocks"]:
            x = block(p, x)
        return norm(x, params["lnf_g"], params["lnf_b"]) @ params["wte"].T

    def loss(params: dict[str, Any], tokens: Any, targets: Any) -> Any:
        z = logits(params, tokens)
        picked = jnp.take_along_axis(z, targets[..., None], axis=-1)[..., 0]
        return (jax.nn.logsumexp(z, axis=-1) - picked).mean()

    return logits, loss


def functions(c: Config, backend: str = "auto") -> dict[str, tuple[Callable, Callable]]:
    """{implementation: (jit(logits), jit(value_and_grad(loss)))}."""
    models = {OURS: model_td(c, backend), JNP: model_jnp(c)}
    return {
        impl: (jax.jit(logits), jax.jit(jax.value_and_grad(loss)))
        for impl, (logits, loss) in models.items()
    }


def run(c: Config, budget: float, settle: float) -> dict[str, Any]:
    params = jax.tree.map(jnp.asarray, init(c))
    tokens, targets = (jnp.asarray(a) for a in tokens_of(c))
    fns = functions(c)
    want = fns[JNP][1](params, tokens, targets)
    failures = {
        mode: "; ".join(mismatches(got, ref, TOLERANCE))
        for mode, got, ref in (
            ("fwd", fns[OURS][0](params, tokens), fns[JNP][0](params, tokens)),
            ("fwd+bwd", fns[OURS][1](params, tokens, targets), want),
        )
    }
    timed = {
        (impl, mode): fn
        for impl, pair in fns.items()
        for mode, fn in zip(MODES, pair)
        if impl == JNP or not failures[mode]
    }
    args = {OURS: [params, tokens, targets], JNP: [params, tokens, targets]}
    wrapped = {
        key: (lambda p, t, y, fn=fn, mode=key[1]: fn(p, t) if mode == "fwd" else fn(p, t, y))
        for key, fn in timed.items()
    }
    times = time_rounds(wrapped, args, budget, settle)
    bad = {impl: {m: f"wrong: {failures[m]}" for m in MODES} for impl in (OURS, JNP)}
    return {"config": str(c), "impls": by_implementation(times, bad, (OURS, JNP), MODES)}


def table(row: dict[str, Any]) -> str:
    lines = ["| mode | tensordsl ms | jax.numpy ms | tensordsl / jax.numpy |", "|---|--:|--:|--:|"]
    for mode in MODES:
        ours, theirs = median_of(row, OURS, mode), median_of(row, JNP, mode)
        lines.append(
            f"| {mode} | {ms(row['impls'][OURS][mode])} | {ms(row['impls'][JNP][mode])} "
            f"| {ratio(over(ours, theirs))} |"
        )
    return "\n".join(lines)


def section(row: dict[str, Any], info: dict[str, Any]) -> str:
    begin, end = markers(NAME)
    return f"""{begin}
## The GPT decoder, as a user writes it, against jax.numpy (issue 25)

Generated by `python -m benchmarks.{NAME}` (benchmarks/{NAME}.py); the text between the
{NAME} markers is rewritten by that script.

{header(info)}

The decoder of notebook 04 ({row["config"]}), float32, tensordsl's layers on the C back end
beside the same model in jax.numpy, in the same run. "fwd": the logits; "fwd+bwd":
`jax.value_and_grad` of the mean cross-entropy with respect to every parameter. Medians in
milliseconds, implementations in turns; the loss and every gradient checked against
jax.numpy first (relative tolerance {TOLERANCE:g} of the largest magnitude).

{table(row)}

Raw numbers: `benchmarks/results/{NAME}.json`.
{end}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, smoke run")
    parser.add_argument("--out", help="Markdown file to write the section into")
    options = parser.parse_args(argv)
    info = start_run()
    budget, settle = (0.2, 0.01) if options.quick else (3.0, 0.1)
    row = run(QUICK if options.quick else CPU, budget, settle)
    finish_run(info)
    print(table(row))
    out = options.out or (None if options.quick else RESULTS_MD)
    write_outputs(out, NAME, section(row, info), {"machine": info, "row": row})
    return 0


if __name__ == "__main__":
    sys.exit(main())
