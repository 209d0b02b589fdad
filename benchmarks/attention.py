"""Causal attention: tensordsl kernels next to XLA's dot_product_attention, time and memory.

Run from the repository root:

    python -m benchmarks.attention            # T = 1024 timed, T = 4096 memory; writes RESULTS.md
    python -m benchmarks.attention --quick    # T = 128 timed, T = 256 memory (< 60 s); no writes

B=1, H=4, head width 64, float32, causal, scale 1/sqrt(64). Implementations (`IMPLEMENTATIONS`):

* XLA: `jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")` on
  (B, T, H, E) arrays, its layout;
* tensordsl kernels: three single-statement kernels as a user writes them today
  (benchmarks/layers.py `attention_kernels`): scores with the mask as `where(j <= i, ...)`,
  a logsumexp, the weighted sum; (B, H, T, E) arrays. The (B, H, T, T) scores are stored;
* tensordsl program: the same three statements as one kernel (benchmarks/layers.py
  `PROGRAMS["attention"]`, the mask as `-inf`): the scores are recomputed inside the
  logsumexp and the weighted sum and inside every gradient nest, never stored.

forward: `jax.jit(attention)`; forward+backward: `jax.jit(jax.value_and_grad(loss, (0, 1, 2)))`
with `loss = sum(attention(q, k, v) * ct)`. Every output and gradient of ours is checked
against XLA's before timing; medians, implementations in turns (benchmarks/common.py).

Peak memory: one fresh process per (implementation, mode) at the memory length, the method of
benchmarks/run_cpu.py (`peak_rss_growth` of one call, compiled ahead of time), next to the
size of one (B, H, T, T) float32 score matrix.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import layers
from benchmarks.common import (
    RESULTS_MD,
    by_implementation,
    finish_run,
    header,
    markers,
    median_of,
    mib,
    mismatches,
    ms,
    over,
    peak_rss_growth,
    ratio,
    run_child,
    short,
    start_run,
    time_rounds,
    verdict,
    write_outputs,
)

NAME = "attention"
XLA, OURS, PROGRAM = "XLA dot_product_attention", "tensordsl kernels", "tensordsl program"
MODES = ("fwd", "fwd+bwd")

#: Targets from issue 15.
WITHIN_XLA = 1.5
MEMORY_FRACTION = 0.25  # peak fwd+bwd memory below this many score matrices


@dataclasses.dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    seq: int
    width: int

    def __str__(self) -> str:
        return f"B={self.batch}, H={self.heads}, T={self.seq}, E={self.width}"

    @property
    def score_bytes(self) -> int:
        return self.batch * self.heads * self.seq * self.seq * 4


TIMED, MEMORY = Shape(1, 4, 1024, 64), Shape(1, 4, 4096, 64)
QUICK_TIMED, QUICK_MEMORY = Shape(1, 4, 128, 64), Shape(1, 4, 256, 64)


def xla_attention(q: Any, k: Any, v: Any) -> Any:
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


def kernel_attention(q: Any, k: Any, v: Any) -> Any:
    return layers.attention_kernels(q, k, v, layers.kernels("c"))


def program_attention(q: Any, k: Any, v: Any) -> Any:
    scale = np.float32(1 / np.sqrt(q.shape[-1]))
    return layers.programs("c")["attention"](Q=q, K=k, scale=scale, V=v)


#: name -> (attention function, whether it takes (B, H, T, E) rather than (B, T, H, E)).
IMPLEMENTATIONS: dict[str, tuple[Callable[..., Any], bool]] = {
    XLA: (xla_attention, False),
    OURS: (kernel_attention, True),
    PROGRAM: (program_attention, True),
}


def inputs(shape: Shape, heads_first: bool) -> tuple[list[Any], Any]:
    """q, k, v and the cotangent, fixed by the shape, in the implementation's layout."""
    rng = np.random.default_rng(shape.seq)
    dims = (shape.batch, shape.seq, shape.heads, shape.width)
    arrays = [rng.standard_normal(dims).astype(np.float32) for _ in range(4)]
    if heads_first:
        arrays = [np.ascontiguousarray(a.transpose(0, 2, 1, 3)) for a in arrays]
    return [jax.device_put(a) for a in arrays[:3]], jax.device_put(arrays[3])


def jitted(attention: Callable[..., Any], ct: Any) -> tuple[Any, Any]:
    def loss(q: Any, k: Any, v: Any) -> Any:
        return jnp.sum(attention(q, k, v) * ct)

    forward = jax.jit(lambda q, k, v: attention(q, k, v))
    return forward, jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2)))


def _to_xla_layout(result: Any) -> Any:
    """(B, H, T, E) arrays (any pytree of them) as (B, T, H, E); scalars unchanged."""
    return jax.tree.map(lambda a: a if a.ndim != 4 else jnp.swapaxes(a, 1, 2), result)


def run_timed(shape: Shape, budget: float, settle: float) -> dict[str, Any]:
    args, fns, failed = {}, {}, {}
    want = None
    for impl, (attention, heads_first) in IMPLEMENTATIONS.items():
        args[impl], ct = inputs(shape, heads_first)
        pair = jitted(attention, ct)
        failed[impl] = {}
        for mode, fn, tol in zip(MODES, pair, (1e-4, 1e-3)):
            try:
                got = fn(*args[impl])
                got = _to_xla_layout(got) if heads_first else got
                if impl == XLA:
                    want = {**(want or {}), mode: got}
                elif bad := mismatches(got, want[mode], tol):  # type: ignore[index]
                    failed[impl][mode] = "error: differs from XLA: " + ", ".join(bad)
            except Exception as error:  # noqa: BLE001 - reported in the table
                failed[impl][mode] = "error: " + short(error)
            if mode not in failed[impl]:
                fns[(impl, mode)] = fn
    times = time_rounds(fns, args, budget, settle)
    return {"shape": str(shape), "impls": by_implementation(times, failed, IMPLEMENTATIONS, MODES)}


def memory_child(impl: str, mode: str, shape: Shape) -> dict[str, Any]:
    """In a fresh process: peak RSS growth of one call of `impl` in `mode`."""
    attention, heads_first = IMPLEMENTATIONS[impl]
    args, ct = inputs(shape, heads_first)
    fn = jitted(attention, ct)[MODES.index(mode)]
    compiled = fn.lower(*args).compile()
    return {"peak_growth": peak_rss_growth(lambda: jax.block_until_ready(compiled(*args)))}


def run_memory(shape: Shape) -> dict[str, dict[str, Any]]:
    """Peak RSS growth by implementation and mode, one fresh process each, one at a time."""
    found: dict[str, dict[str, Any]] = {}
    for impl in IMPLEMENTATIONS:
        for mode in MODES:
            payload = json.dumps({"impl": impl, "mode": mode, "shape": dataclasses.astuple(shape)})
            result = run_child(f"benchmarks.{NAME}", ["--memory-child", payload])
            found.setdefault(impl, {})[mode] = result.get("peak_growth", result.get("error"))
    return found


# --------------------------------------------------------------------------- report


def table(row: dict[str, Any], memory: dict[str, Any], memory_shape: Shape) -> str:
    t = memory_shape.seq
    lines = [
        f"| implementation | fwd ms | fwd+bwd ms | bwd/fwd | ours/XLA fwd | ours/XLA fwd+bwd "
        f"| peak fwd MiB, T={t} | peak fwd+bwd MiB, T={t} | fwd+bwd peak / score matrix |",
        "|---|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for impl, entry in row["impls"].items():
        fwd, both = median_of(row, impl, "fwd"), median_of(row, impl, "fwd+bwd")
        cells = [impl, ms(entry["fwd"]), ms(entry["fwd+bwd"])]
        cells.append(ratio(None if fwd is None or both is None else (both - fwd) / fwd))
        for mode in MODES:
            r = over(median_of(row, impl, mode), median_of(row, XLA, mode))
            cells.append(ratio(r) if impl != XLA else "")
        peak = memory.get(impl, {})
        cells += [mib(peak.get("fwd")), mib(peak.get("fwd+bwd"))]
        both_peak = peak.get("fwd+bwd")
        share = both_peak / memory_shape.score_bytes if isinstance(both_peak, int) else None
        cells.append(ratio(share))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(row: dict[str, Any], memory: dict[str, Any], memory_shape: Shape) -> str:
    """The issue's targets, for the one-kernel program (the kernels' figures are above)."""
    out = []
    for mode in MODES:
        r = over(median_of(row, PROGRAM, mode), median_of(row, XLA, mode))
        ok = None if r is None else r <= WITHIN_XLA
        out.append(
            f"- {row['shape']}: {mode} within {WITHIN_XLA}x of XLA — {verdict(ok)} "
            f"(program/XLA = {ratio(r) or 'n/a'})"
        )
    peak = memory.get(PROGRAM, {}).get("fwd+bwd")
    limit = MEMORY_FRACTION * memory_shape.score_bytes
    ok = None if not isinstance(peak, int) else peak < limit
    out.append(
        f"- T={memory_shape.seq}: fwd+bwd peak memory below a quarter of one score matrix "
        f"({mib(limit)} MiB) — {verdict(ok)} (program {mib(peak)} MiB)"
    )
    return "\n".join(out)


def section(row: dict, memory: dict, memory_shape: Shape, info: dict[str, Any]) -> str:
    begin, end = markers(NAME)
    return f"""{begin}
## Causal attention (issue 15)

Generated by `python -m benchmarks.{NAME}` (benchmarks/{NAME}.py); the text between the
{NAME} markers is rewritten by that script.

{header(info)}

{row["shape"]}, float32, causal, scale 1/sqrt(E). XLA: `jax.nn.dot_product_attention(...,
is_causal=True, implementation="xla")`. tensordsl: three single-statement kernels as a user
writes them today (`{layers.KERNELS["scores"]}`;
`{layers.KERNELS["logsumexp"]}`;
`{layers.KERNELS["weighted_sum"]}`), which store the (B, H, T, T) scores, and the same
attention as one program (three statements, the mask as `-inf`), which recomputes the scores
inside the logsumexp, the weighted sum and every gradient nest and never stores them. fwd+bwd:
`jax.value_and_grad` of `sum(out * ct)` w.r.t. q, k and v; bwd/fwd is (fwd+bwd - fwd) / fwd.
Medians in milliseconds, implementations in turns (3 rounds), after checking our output and
gradients against XLA's (rtol 1e-4 forward, 1e-3 gradients, relative to the largest
magnitude). Peak memory: one fresh process per cell at {memory_shape} (one score matrix:
{mib(memory_shape.score_bytes)} MiB), the RSS growth of one call after a warm-up call, as in the
CPU benchmarks (includes the outputs and gradients, not the inputs).

{table(row, memory, memory_shape)}

### Targets (issue 15), for the program

{targets(row, memory, memory_shape)}

Raw numbers: `benchmarks/results/{NAME}.json`.
{end}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short sequences, smoke run")
    parser.add_argument("--out", help="Markdown file to write the section into")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory columns")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.memory_child:
        job = json.loads(options.memory_child)
        print(json.dumps(memory_child(job["impl"], job["mode"], Shape(*job["shape"]))))
        return 0
    info = start_run()
    timed, memory_shape = (QUICK_TIMED, QUICK_MEMORY) if options.quick else (TIMED, MEMORY)
    budget, settle = (0.3, 0.02) if options.quick else (10.0, 0.3)
    print(f"... {timed}", file=sys.stderr, flush=True)
    row = run_timed(timed, budget, settle)
    memory = {} if options.no_memory else run_memory(memory_shape)
    finish_run(info)
    print(table(row, memory, memory_shape))
    print(targets(row, memory, memory_shape))
    data = {"machine": info, "timed": row, "memory": memory, "memory_shape": str(memory_shape)}
    out = options.out or (None if options.quick else RESULTS_MD)
    write_outputs(out, NAME, section(row, memory, memory_shape, info), data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
