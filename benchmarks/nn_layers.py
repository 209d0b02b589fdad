"""tensordsl.nn layers next to the jax.numpy a user writes, forward and forward+backward.

Run from the repository root:

    python -m benchmarks.nn_layers            # small CPU sizes; rewrites its RESULTS.md section
    python -m benchmarks.nn_layers --quick    # tiny sizes, smoke run; writes nothing

float32, backend "c" for ours. One row per layer (`LAYERS`): the layer and a plain jnp
version (the one in tests/jax/test_nn.py), at one size each. forward: `jax.jit(layer)`;
forward+backward: `jax.jit(jax.value_and_grad(loss, argnums))` with
`loss = sum(layer(...) * ct)` and the gradient of every float input. Every output and
gradient of ours is checked against the jnp version before timing (relative 1e-3 of the
largest magnitude); medians, implementations in turns (benchmarks/common.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

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
    short,
    start_run,
    time_rounds,
    write_outputs,
)

NAME = "nn_layers"
OURS, JNP = "tensordsl.nn (C)", "jax.numpy"
MODES = ("fwd", "fwd+bwd")
TOLERANCE = 1e-3


@dataclasses.dataclass(frozen=True)
class Layer:
    """A layer: ours and jnp's, the shapes of its arguments, which are differentiated."""

    name: str
    size: str
    ours: Callable[..., Any]
    theirs: Callable[..., Any]
    shapes: tuple[tuple[int, ...], ...]
    wrt: tuple[int, ...]
    integers: dict[int, int] = dataclasses.field(default_factory=dict)  # arg -> upper bound


def _attention_jnp(q: Any, k: Any, v: Any, mask: Any = None, mod: Any = None) -> Any:
    s = jnp.einsum("bihd,bjhd->bhij", q, k) / math.sqrt(q.shape[-1])
    s = s if mod is None else mod(s)
    s = s if mask is None else jnp.where(mask, s, -jnp.inf)
    return jnp.einsum("bhij,bjhe->bihe", jax.nn.softmax(s, -1), v)


def _conv(x: Any, k: Any, spatial: int) -> Any:
    numbers = ("NWC", "WIO", "NWC") if spatial == 1 else ("NHWC", "HWIO", "NHWC")
    return jax.lax.conv_general_dilated(x, k, (1,) * spatial, "SAME", dimension_numbers=numbers)


def _layer_norm(x: Any, g: Any, b: Any) -> Any:
    mean = x.mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * g + b


def _cross_entropy(z: Any, y: Any) -> Any:
    return jax.nn.logsumexp(z, -1) - jnp.take_along_axis(z, y[:, None], 1)[:, 0]


def layers(quick: bool) -> list[Layer]:
    from tensordsl import nn

    c = {"backend": "c"}
    n, d, t = (16, 32, 32) if quick else (512, 256, 256)
    vocab = 64 if quick else 8192
    offset = np.arange(t)[:, None] - np.arange(t)[None, :] + t - 1
    causal = np.tril(np.ones((t, t), bool))
    return [
        Layer(
            "dense",
            f"x {n}x{d}, w {d}x{d}, bias",
            lambda x, w, b: nn.dense(x, w, b, **c),
            lambda x, w, b: x @ w + b,
            ((n, d), (d, d), (d,)),
            (0, 1, 2),
        ),
        Layer(
            "layer_norm",
            f"x {n}x{d}",
            lambda x, g, b: nn.layer_norm(x, g, b, **c),
            _layer_norm,
            ((n, d), (d,), (d,)),
            (0, 1, 2),
        ),
        Layer(
            "rms_norm",
            f"x {n}x{d}",
            lambda x, g: nn.rms_norm(x, g, **c),
            lambda x, g: x * jax.lax.rsqrt((x**2).mean(-1, keepdims=True) + 1e-6) * g,
            ((n, d), (d,)),
            (0, 1),
        ),
        Layer(
            "embedding (gather)",
            f"ids {n}, table {vocab}x{d}",
            lambda ids, w: nn.embedding(ids, w),
            lambda ids, w: w[ids],
            ((n,), (vocab, d)),
            (1,),
            {0: vocab},
        ),
        Layer(
            "cross_entropy",
            f"logits {n}x{vocab // 8}",
            lambda z, y: nn.cross_entropy(z, y, **c),
            _cross_entropy,
            ((n, vocab // 8), (n,)),
            (0,),
            {1: vocab // 8},
        ),
        Layer(
            "conv1d same",
            f"x 8x{t}x32, k 5x32x32",
            lambda x, k: nn.conv1d(x, k, **c),
            lambda x, k: _conv(x, k, 1),
            ((8, t, 32), (5, 32, 32)),
            (0, 1),
        ),
        Layer(
            "conv2d same",
            "x 4x32x32x16, k 3x3x16x16" if not quick else "x 1x8x8x4",
            lambda x, k: nn.conv2d(x, k, **c),
            lambda x, k: _conv(x, k, 2),
            ((4, 32, 32, 16), (3, 3, 16, 16)) if not quick else ((1, 8, 8, 4), (3, 3, 4, 4)),
            (0, 1),
        ),
        Layer(
            "attention causal",
            f"B=1, T={t}, H=4, E=32",
            lambda q, k, v: nn.attention(q, k, v, causal=True, **c),
            lambda q, k, v: _attention_jnp(q, k, v, mask=causal),
            ((1, t, 4, 32),) * 3,
            (0, 1, 2),
        ),
        Layer(
            "attention score_mod R[h,i-j+T-1]",
            f"B=1, T={t}, H=4, E=32",
            lambda q, k, v, r: nn.attention(
                q, k, v, score_mod=f"S + R[h, i - j + {t - 1}]", mod_args={"R": r}, **c
            ),
            lambda q, k, v, r: _attention_jnp(q, k, v, mod=lambda s: s + r[:, offset]),
            ((1, t, 4, 32),) * 3 + ((4, 2 * t - 1),),
            (0, 1, 2, 3),
        ),
        Layer(
            "attention causal, grouped-query (8 query heads, 2 key/value heads)",
            f"B=1, T={t}, H=8, Hk=2, E=32",
            lambda q, k, v: nn.attention(q, k, v, causal=True, **c),
            lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True),
            ((1, t, 8, 32), (1, t, 2, 32), (1, t, 2, 32)),
            (0, 1, 2),
        ),
    ]


def _arguments(layer: Layer, rng: np.random.Generator) -> list[Any]:
    args = []
    for position, shape in enumerate(layer.shapes):
        if position in layer.integers:
            args.append(jnp.asarray(rng.integers(0, layer.integers[position], shape)))
        else:
            args.append(jnp.asarray(rng.standard_normal(shape), jnp.float32))
    return args


def _modes(layer: Layer, fn: Callable[..., Any], ct: Any) -> dict[str, Callable[..., Any]]:
    def loss(*args: Any) -> Any:
        return jnp.sum(fn(*args) * ct)

    return {"fwd": jax.jit(fn), "fwd+bwd": jax.jit(jax.value_and_grad(loss, layer.wrt))}


def run_layer(layer: Layer, budget: float, settle: float) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    args = _arguments(layer, rng)
    ct = jnp.asarray(rng.standard_normal(layer.theirs(*args).shape), jnp.float32)
    theirs = _modes(layer, layer.theirs, ct)
    fns = {(JNP, mode): f for mode, f in theirs.items()}
    failed: dict[str, dict[str, str]] = {OURS: {}, JNP: {}}
    for mode, fn in _modes(layer, layer.ours, ct).items():
        try:
            wrong = mismatches(fn(*args), theirs[mode](*args), TOLERANCE)
            if wrong:
                failed[OURS][mode] = "error: differs from jnp at " + ", ".join(wrong)
            else:
                fns[(OURS, mode)] = fn
        except Exception as error:  # noqa: BLE001 - reported in the table
            failed[OURS][mode] = "error: " + short(error)
    times = time_rounds(fns, {OURS: args, JNP: args}, budget, settle)
    impls = by_implementation(times, failed, (OURS, JNP), MODES)
    return {"layer": layer.name, "size": layer.size, "impls": impls}


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| layer | size | ours fwd ms | jnp fwd ms | ours/jnp | ours fwd+bwd ms "
        "| jnp fwd+bwd ms | ours/jnp |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        cells = [row["layer"], row["size"]]
        for mode in MODES:
            cells += [ms(row["impls"][OURS][mode]), ms(row["impls"][JNP][mode])]
            cells.append(ratio(over(median_of(row, OURS, mode), median_of(row, JNP, mode))))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def section(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    begin, end = markers(NAME)
    return f"""{begin}
## Ready layers, tensordsl.nn (issue 28)

Generated by `python -m benchmarks.{NAME}` (benchmarks/{NAME}.py); the text between the
{NAME} markers is rewritten by that script.

{header(info)}

float32, small CPU sizes; ours on the C back end, against the jax.numpy a user writes (jit).
fwd+bwd: `value_and_grad` of `sum(layer * ct)` w.r.t. every float input. Medians in
milliseconds, implementations in turns; every output and gradient of ours was checked against
jnp (rtol {TOLERANCE:g} of the largest magnitude) before timing. Our `embedding` is the
language's gather (`table[ids[...], d]`: a gather and a sorted segmented sum for its
gradient) against `jnp.take`. The attention rows store no T x T array on our side; jnp's
materialise the scores. The grouped-query row's jnp is `jax.nn.dot_product_attention(q, k, v,
is_causal=True)`, which takes K and V with fewer heads; ours reads each key/value head for its
group of query heads without copying it (docs/nn.md).

{table(rows)}
{end}
"""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes; writes nothing")
    parser.add_argument("--only", help="run the layers whose name contains this text")
    args = parser.parse_args(argv)
    info = start_run(quick=args.quick)
    rows = []
    for layer in layers(args.quick):
        if args.only and args.only not in layer.name:
            continue
        rows.append(run_layer(layer, budget=0.3 if args.quick else 1.5, settle=0.05))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    finish_run(info)
    print(table(rows))
    out = None if args.quick or args.only else RESULTS_MD
    write_outputs(out, NAME, section(rows, info), {"machine": info, "rows": rows})


if __name__ == "__main__":
    main()
