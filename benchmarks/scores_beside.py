"""Score parameters read beside attention's scores (a relative-bias table, ALiBi's learnt
slopes): forward+backward with the scores recomputed (the plan before, `fuse={"s_":
"inline"}`), as the cost model now fuses it on C (the scores stored, the parameter's
gradient summed from their cotangent), and jax.numpy.

Run from the repository root (prints a table; benchmarks/RESULTS.md's "relbias" section
quotes it by hand):

    python -m benchmarks.scores_beside            # B=1, T=256 and 512, H=4, E=32
    python -m benchmarks.scores_beside --quick    # tiny sizes, smoke run

float32, backend "c", not causal: `nn.attention`'s program (`attention_source`) with
`score_mod = S + R[h, i - j + T - 1]` (the row "attention score_mod R[h,i-j+T-1]" of
benchmarks/nn_layers.py) or `S + A[h] * (j - i)`, against jnp attention adding
`r[:, offset]` or `a[:, None, None] * (j - i)`. Gradients checked against jnp's before
timing; medians, implementations in turns (`benchmarks.common.time_rounds`).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import tensordsl as td
from benchmarks.common import mismatches, time_rounds
from tensordsl.nn.attention import attention_source

PLANS = ("recomputed (before)", "default (now)", "jax.numpy")
MODES = ("fwd", "fwd+bwd")
MODS = ("table", "alibi")
#: Relative to the largest magnitude. Not nn_layers' 1e-3: ALiBi's slope gradient at T=512,
#: `sum dS * (j - i)`, cancels to a few units of `dS`'s rounding (float32's `dP - D`, D from
#: the stored output, docs/nn.md): 5e-3 of its largest element now, 1e-2 recomputed as
#: before, 1e-4 jax.numpy's (against float64, measured on branch relbias).
TOLERANCE = 2e-2


def _functions(mod: str, batch: int, length: int) -> tuple[dict[str, Any], list[Any]]:
    """Each plan's forward, by name, and the arguments (q, k, v, r, cotangent)."""
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.standard_normal((batch, length, 4, 32)), jnp.float32) for _ in "qkv")
    r = jnp.asarray(rng.standard_normal((4, 2 * length - 1)), jnp.float32)
    positions = np.arange(length)
    if mod == "table":
        score = f"s_[b,h,i,j] + R[h, i - j + {length - 1}]"
        offset = positions[:, None] - positions[None, :] + length - 1
        modified = lambda s, r: s + r[:, offset]  # noqa: E731
    else:
        r = r[:, 0]
        score = "s_[b,h,i,j] + R[h] * (j - i)"
        distance = positions[None, :] - positions[:, None]
        modified = lambda s, r: s + r[:, None, None] * distance  # noqa: E731
    source = attention_source(score, None)
    scale = 1 / math.sqrt(32)

    def program(**options: Any) -> Any:
        kernel = td.program(source, backend="c", outputs=("out_",), **options)
        return lambda q, k, v, r: kernel(q_=q, k_=k, v_=v, R=r, scale_=scale)[0]

    def theirs(q: Any, k: Any, v: Any, r: Any) -> Any:
        s = modified(jnp.einsum("bihd,bjhd->bhij", q, k) * scale, r)
        return jnp.einsum("bhij,bjhe->bhie", jax.nn.softmax(s, -1), v)

    found = dict(zip(PLANS, (program(fuse={"s_": "inline"}), program(), theirs)))
    cotangent = jnp.asarray(rng.standard_normal((batch, 4, length, 32)), jnp.float32)
    return found, [q, k, v, r, cotangent]


def run(mod: str, batch: int, length: int, budget: float) -> dict[tuple[str, str], float]:
    """Median ms of each (plan, mode)."""
    plans, (*args, cotangent) = _functions(mod, batch, length)
    fns: dict[tuple[str, str], Callable[..., Any]] = {}
    for name, fn in plans.items():
        fns[name, "fwd"] = jax.jit(fn)
        loss = lambda *a, fn=fn: jnp.sum(fn(*a) * cotangent)  # noqa: E731
        fns[name, "fwd+bwd"] = jax.jit(jax.value_and_grad(loss, (0, 1, 2, 3)))
    want = fns["jax.numpy", "fwd+bwd"](*args)[1]
    for name in PLANS[:2]:
        for got, expected in zip(fns[name, "fwd+bwd"](*args)[1], want):
            assert not mismatches(got, expected, TOLERANCE), name
    times = time_rounds(fns, {name: args for name in PLANS}, budget, 0.05)
    return {key: statistics.median(t) * 1e3 for key, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    options = parser.parse_args(argv)
    sizes = ((1, 16),) if options.quick else ((1, 256), (1, 512))
    print(
        "| score_mod | B, T | mode | " + " | ".join(PLANS) + " | now / jnp | before / jnp | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for mod in MODS:
        for batch, length in sizes:
            before = os.getloadavg()[0]
            found = run(mod, batch, length, 0.5 if options.quick else 6.0)
            load = f"{before:.1f}-{os.getloadavg()[0]:.1f}"
            for mode in MODES:
                row = [found[name, mode] for name in PLANS]
                ratios = f"{row[1] / row[2]:.2f} | {row[0] / row[2]:.2f}"
                cells = " | ".join(f"{x:.2f}" for x in row)
                print(f"| {mod} | {batch}, {length} | {mode} | {cells} | {ratios} | {load} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
