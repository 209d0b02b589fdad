"""GPT-style block: tensordsl kernels next to jax.numpy, forward and forward+backward.

Run from the repository root:

    python -m benchmarks.gpt_block            # full sizes; rewrites its RESULTS.md section
    python -m benchmarks.gpt_block --quick    # tiny sizes, smoke run (< 60 s); writes nothing

The block (benchmarks/layers.py): pre-LayerNorm, causal multi-head attention, GELU MLP,
float32, at (B=4, T=64, D=64, H=4) and (B=4, T=256, D=128, H=4). Per size and implementation:

* forward: `jax.jit(block)(params, x)`;
* forward+backward: `jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(params, x)` with
  `loss = sum(block(params, x) * ct)`, `ct` a fixed random cotangent: the gradient of every
  parameter and of the input;
* before any timing, our output, loss and every gradient are checked against jax.numpy's;
* times: medians, implementations in turns (benchmarks/common.py `time_rounds`);
* the row "tensordsl kernels, -fmath-errno" builds the same kernels with `-fmath-errno`
  appended to the compiler flags (what the flags were before `-fno-math-errno` became a base
  flag), timed in the same turns (not in --quick);
* first `jit(value_and_grad)` call of the small block, each in a fresh process: cold (empty
  `TENSORDSL_CACHE_DIR`), warm (a second process on that cache) and a 12-layer stack warm;
  both warm again with JAX's persistent compilation cache (`jax_compilation_cache_dir`,
  filled by an untimed process before); jax.numpy's first calls for comparison. --quick
  runs our warm ones only, on tiny sizes. The checkout's Python files are byte-compiled
  first (`compileall`), as an installed package is: a child that inherits
  `PYTHONDONTWRITEBYTECODE=1` would otherwise compile every module it imports from source,
  in every process (0.04-0.05 s of a warm first call under cProfile, 43 modules: the C back
  end is imported at the first kernel's call);
* the slowest nests of the largest block, each timed alone (`block_profile`, also
  `python -m benchmarks.profile_nests --gpt`), built optimised (--quick: unoptimised, as the
  test suite builds; a smoke run's figures are not read).
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import dataclasses
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import numpy as np

from benchmarks import layers
from benchmarks.common import (
    RESULTS_MD,
    ROOT,
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
    verdict,
    write_outputs,
)
from benchmarks.layers import BlockSize

NAME = "gpt_block"
JNP, OURS, PROGRAMS = "jax.numpy", "tensordsl kernels", "tensordsl programs"
MODES = ("fwd", "fwd+bwd")
ERRNO = "tensordsl kernels, -fmath-errno"
SIZES = (BlockSize(4, 64, 64, 4), BlockSize(4, 256, 128, 4))
QUICK_SIZES = (BlockSize(2, 16, 16, 2),)
STACK, QUICK_STACK = 12, 2
PROFILE_REPS = 5

#: Targets from issue 14 (the cold first call: issue 37's 3 s, with tiered builds).
WITHIN_JNP = 1.5
BWD_OVER_FWD = 3.0
COLD_S, WARM_S, STACK_WARM_S = 3.0, 1.0, 1.5


@contextlib.contextmanager
def extra_cflags(flags: str) -> Iterator[None]:
    """Append `flags` to `TENSORDSL_CFLAGS` while kernels are built (traced and lowered)."""
    old = os.environ.get("TENSORDSL_CFLAGS")
    os.environ["TENSORDSL_CFLAGS"] = f"{old or ''} {flags}".strip()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TENSORDSL_CFLAGS", None)
        else:
            os.environ["TENSORDSL_CFLAGS"] = old


def block_of(impl: str) -> Callable[..., Any]:
    return layers.IMPLEMENTATIONS[OURS if impl == ERRNO else impl]


def inputs(size: BlockSize, layers_count: int = 1) -> tuple[Any, Any, Any]:
    """Parameters (one dict, or a list for a stack), input and cotangent, fixed by the size."""
    rng = np.random.default_rng(size.batch * 1000 + size.seq + size.width + size.heads)
    params = [layers.init_params(size, rng) for _ in range(layers_count)]
    x = layers.init_input(size, rng)
    ct = rng.standard_normal(x.shape).astype(np.float32)
    return (params[0] if layers_count == 1 else params), x, ct


def jitted(block: Callable[..., Any], ct: Any) -> tuple[Any, Any]:
    # A new function object per call: each implementation gets its own trace and kernels.
    forward = jax.jit(lambda params, x: block(params, x))
    both = jax.jit(jax.value_and_grad(layers.loss_of(block, ct), argnums=(0, 1)))
    return forward, both


def _builds() -> int:
    from codegen.c.run import compiler

    return compiler.STATS["compiles"] + compiler.STATS["disk_hits"]


def check(impl: str, fns: tuple[Any, Any], args: list[Any], want: tuple[Any, Any]) -> dict:
    """Run both functions once (this builds the kernels) and compare with jax.numpy's results.

    Returns {"fwd": error, "fwd+bwd": error} for what failed, and "builds": kernels built.
    """
    failed: dict[str, Any] = {}
    before = _builds()
    with extra_cflags("-fmath-errno") if impl == ERRNO else contextlib.nullcontext():
        for mode, fn, expected, tol in zip(MODES, fns, want, (1e-4, 1e-3)):
            try:
                bad = mismatches(fn(*args), expected, tol)
                if bad:
                    failed[mode] = "error: differs from jax.numpy: " + ", ".join(bad[:3])
            except Exception as error:  # noqa: BLE001 - reported in the table
                failed[mode] = "error: " + short(error)
    failed["builds"] = _builds() - before
    return failed


def run_size(size: BlockSize, impls: tuple[str, ...], budget: float, settle: float) -> dict:
    params, x, ct = inputs(size)
    args = [jax.device_put(params), jax.device_put(x)]
    reference = jitted(layers.block_jnp, ct)
    want = (reference[0](*args), reference[1](*args))
    row: dict[str, Any] = {"size": str(size), "impls": {}, "builds": {}}
    fns, failed = {}, {}
    for impl in impls:
        pair = reference if impl == JNP else jitted(block_of(impl), ct)
        failed[impl] = check(impl, pair, args, want) if impl != JNP else {}
        row["builds"][impl] = failed[impl].pop("builds", 0)
        for mode, fn in zip(MODES, pair):
            if mode not in failed[impl]:
                fns[(impl, mode)] = fn
    times = time_rounds(fns, dict.fromkeys(impls, args), budget, settle)
    row["impls"] = by_implementation(times, failed, impls, MODES)
    return row


def block_profile(size: BlockSize, reps: int, build: str = "full") -> Any:
    """Every C nest of the block's forward and backward, timed alone
    (`tensordsl.explain.timing`), built optimised as users run them; `build="fast"`
    (`--quick`, a smoke run) unoptimised, as the test suite builds: the optimised builds
    took most of the smoke run's time, and its figures are not read."""
    from tensordsl.explain.nests import kernel_nests
    from tensordsl.explain.timing import profile_jaxpr

    params, x, ct = inputs(size)
    loss = layers.loss_of(layers.block_kernels, ct)
    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(params, x).jaxpr
    names = {
        nest: f"{name}/{role}"
        for name, kernel in layers.kernels("c").items()
        for role, nest in kernel_nests(kernel.nest).items()
    }
    return profile_jaxpr(jaxpr, names, reps=reps, dtype="float32", build=build)


def slowest_nests(profile: Any, count: int = 10) -> str:
    """The `count` nests with the largest best time, as a Markdown table."""
    lines = [
        "| nest (kernel/role) | best ms | median ms | share of all nests | schedule |",
        "|---|--:|--:|--:|---|",
    ]
    total = profile.total_best
    for t in sorted(profile.timings, key=lambda t: -t.best)[:count]:
        lines.append(
            f"| {t.name} | {t.best * 1e3:.2f} | {t.seconds * 1e3:.2f} | {t.best / total:.1%} "
            f"| `{t.schedule}` |"
        )
    return "\n".join(lines)


# --------------------------------------------------------------------------- first calls


def compile_child(payload: dict[str, Any]) -> dict[str, Any]:
    """In a fresh process: seconds of the first (and second) jit(value_and_grad) call."""
    from codegen.c.run import compiler

    if payload.get("jax_cache"):
        # JAX's persistent compilation cache: XLA's compile of the traced program is read
        # back instead of redone (every entry kept, however quick its compile was).
        jax.config.update("jax_compilation_cache_dir", payload["jax_cache"])
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    size = BlockSize(*payload["size"])
    params, x, ct = inputs(size, payload["layers"])
    block = block_of(payload["impl"])
    model = block if payload["layers"] == 1 else layers.stack(block)
    fn = jax.jit(jax.value_and_grad(layers.loss_of(model, ct), argnums=(0, 1)))
    start = time.perf_counter()
    if payload["impl"] != JNP:
        layers.kernels("c")  # import tensordsl, parse and lower: the model's definition
    defined = time.perf_counter() - start
    seconds, cpu = [], []
    for _ in range(2):
        start, used = time.perf_counter(), _cpu_seconds()
        jax.block_until_ready(fn(params, x))
        seconds.append(time.perf_counter() - start)
        cpu.append([now - then for now, then in zip(_cpu_seconds(), used)])
    first = {"first_s": seconds[0], "first_cpu_s": cpu[0][0], "compiler_cpu_s": cpu[0][1]}
    return {"defined_s": defined, **first, "second_s": seconds[1], **compiler.STATS}


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user + system) of this process and of its finished children (compilers)."""
    own, children = (
        resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


#: The cold first call with `TENSORDSL_BUILD=full` (optimised builds only, as before tiers).
FULL_COLD = "cold (empty cache), TENSORDSL_BUILD=full"


def first_calls(quick: bool) -> list[dict[str, Any]]:
    """Cold, warm and stacked first calls, each in a fresh process, one after another."""
    size = QUICK_SIZES[0] if quick else SIZES[0]
    stack = QUICK_STACK if quick else STACK
    for package in ("tensordsl", "codegen", "benchmarks"):  # bytecode, as installed
        compileall.compile_dir(ROOT / package, quiet=1)
    cache = tempfile.mkdtemp(prefix="tensordsl-cold-")
    jax_cache = tempfile.mkdtemp(prefix="jax-compilation-cache-")
    # Cold with tiered builds (the default: unoptimised kernels first), then cold with
    # optimised builds only, each on an empty cache of its own.
    jobs = [] if quick else [(OURS, 1, "cold (empty cache)"), (OURS, 1, FULL_COLD)]
    jobs += [(OURS, 1, "warm (disk cache)"), (OURS, stack, "warm (disk cache)")]
    # Then with JAX's own persistent compilation cache, filled by an untimed first process.
    fill, with_jax = (
        "fills JAX's compilation cache",
        "warm (disk cache and JAX's compilation cache)",
    )
    jobs += [(OURS, 1, fill), (OURS, 1, with_jax), (OURS, stack, fill), (OURS, stack, with_jax)]
    jobs += [] if quick else [(JNP, 1, ""), (JNP, stack, "")]
    found = []
    for impl, count, cache_state in jobs:
        payload = {"impl": impl, "layers": count, "size": dataclasses.astuple(size)}
        filling = cache_state == fill
        if cache_state in (fill, with_jax):
            payload["jax_cache"] = jax_cache
        env = child_env({"TENSORDSL_CACHE_DIR": cache}) if not quick else child_env()
        if cache_state == FULL_COLD:
            fresh = tempfile.mkdtemp(prefix="tensordsl-cold-full-")
            env = child_env({"TENSORDSL_CACHE_DIR": fresh, "TENSORDSL_BUILD": "full"})
        argv = ["--compile-child", json.dumps(payload)]
        result = run_child(f"benchmarks.{NAME}", argv, env)
        if not filling:
            found.append({**payload, "size": str(size), "cache": cache_state, **result})
    return found


# --------------------------------------------------------------------------- report


def bwd_over_fwd(row: dict[str, Any], impl: str) -> float | None:
    fwd, both = median_of(row, impl, "fwd"), median_of(row, impl, "fwd+bwd")
    return None if fwd is None or both is None else (both - fwd) / fwd


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| block | implementation | fwd ms | fwd+bwd ms | bwd/fwd | /jnp fwd | /jnp fwd+bwd "
        "| kernels built |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        for impl, entry in row["impls"].items():
            ratios = [over(median_of(row, impl, m), median_of(row, JNP, m)) for m in MODES]
            cells = [row["size"], impl, ms(entry["fwd"]), ms(entry["fwd+bwd"])]
            cells += [ratio(bwd_over_fwd(row, impl))]
            cells += ["", ""] if impl == JNP else [ratio(ratios[0]), ratio(ratios[1])]
            cells += [str(row["builds"].get(impl, "")) if impl != JNP else ""]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def calls_table(calls: list[dict[str, Any]]) -> str:
    lines = [
        "| implementation | layers | kernel cache | kernels defined s | first call s "
        "| CPU s: Python, compilers | second call s | C compiles | disk-cache hits | shared |",
        "|---|--:|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for c in calls:
        cells = [c["impl"], str(c["layers"]), c["cache"] or "n/a"]
        if "error" in c:
            lines.append("| " + " | ".join([*cells, c["error"], *[""] * 6]) + " |")
            continue
        ours = c["impl"] != JNP
        cells.append(f"{c['defined_s']:.2f}" if ours and "defined_s" in c else "")
        cells.append(f"{c['first_s']:.2f}")
        cells.append(
            f"{c['first_cpu_s']:.1f}, {c['compiler_cpu_s']:.1f}" if "first_cpu_s" in c else ""
        )
        cells.append(f"{c['second_s']:.3f}")
        cells += [
            str(c.get(name, "")) if ours else "" for name in ("compiles", "disk_hits", "shared")
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(rows: list[dict[str, Any]], calls: list[dict[str, Any]]) -> str:
    out = []
    for row in rows:
        for impl in (OURS, PROGRAMS):
            if impl not in row["impls"]:
                continue
            for mode in MODES:
                r = over(median_of(row, impl, mode), median_of(row, JNP, mode))
                ok = None if r is None else r <= WITHIN_JNP
                out.append(
                    f"- {row['size']}, {impl}: {mode} within {WITHIN_JNP}x of jnp — "
                    f"{verdict(ok)} (ours/jnp = {ratio(r) or 'n/a'})"
                )
            r = bwd_over_fwd(row, impl)
            ok = None if r is None else r <= BWD_OVER_FWD
            out.append(
                f"- {row['size']}, {impl}: backward at most {BWD_OVER_FWD}x our forward — "
                f"{verdict(ok)} ((fwd+bwd - fwd) / fwd = {ratio(r) or 'n/a'})"
            )
    limits = {(1, "cold"): COLD_S, (1, "warm"): WARM_S, (STACK, "warm"): STACK_WARM_S}
    for c in calls:
        key = (c["layers"], c["cache"].split(" ")[0])
        if c["impl"] != OURS or key not in limits or c["cache"] == FULL_COLD:
            continue
        seconds = c.get("first_s")
        ok = None if seconds is None else seconds <= limits[key]
        got = "n/a" if seconds is None else f"{seconds:.2f} s"
        out.append(
            f"- first jit(value_and_grad), {c['layers']} layer(s), {c['cache']}: at most "
            f"{limits[key]:g} s — {verdict(ok)} ({got}{quiet_estimate(c)})"
        )
    return "\n".join(out)


def quiet_estimate(call: dict[str, Any]) -> str:
    """The first call's CPU time as an estimate for an idle machine: the Python process's
    CPU plus the compilers' shared by the cores (they run in parallel with the trace)."""
    if "first_cpu_s" not in call:
        return ""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    python, compilers = call["first_cpu_s"], call["compiler_cpu_s"]
    estimate = python + compilers / cores
    return (
        f"; CPU {python:.1f} s + compilers {compilers:.1f} s / {cores} cores = "
        f"{estimate:.1f} s on an idle machine, estimated"
    )


def errno_effect(rows: list[dict[str, Any]]) -> str:
    lines = []
    for row in rows:
        if ERRNO not in row["impls"]:
            continue
        parts = []
        for mode in MODES:
            before, after = median_of(row, ERRNO, mode), median_of(row, OURS, mode)
            if before is not None and after is not None:
                parts.append(f"{mode} {before * 1e3:.3g} -> {after * 1e3:.3g} ms")
        lines.append(f"- {row['size']}: " + ", ".join(parts))
    return "\n".join(lines) or "- not measured in this run"


def section(
    rows: list[dict[str, Any]], calls: list[dict[str, Any]], nests: tuple[str, str], info: dict
) -> str:
    begin, end = markers(NAME)
    return f"""{begin}
## GPT-style block (issue 14)

Generated by `python -m benchmarks.{NAME}` (benchmarks/{NAME}.py; the block is in
benchmarks/layers.py); the text between the {NAME} markers is rewritten by that script.

{header(info)}

Pre-LayerNorm, causal multi-head attention, GELU (tanh) MLP, float32. tensordsl:
{len(layers.KERNELS)} single-statement kernels (LayerNorm mean, variance and normalisation, QKV
projection, scores with the causal mask as `where(j <= i, ...)`, logsumexp, weighted sum,
output projection, MLP up with bias, GELU, MLP down with bias; residual sums in jnp).
"tensordsl programs": LayerNorm, attention (scores, logsumexp, weighted sum; the scores
recomputed, never stored) and the MLP one program each (`layers.PROGRAMS`), the QKV and
output projections single-statement kernels. fwd+bwd is
`jax.value_and_grad` of `sum(block(params, x) * ct)` w.r.t. every parameter and `x`; bwd/fwd is
(fwd+bwd - fwd) / fwd. Medians of `time.perf_counter()` around `jax.block_until_ready`, every
function under `jax.jit`, implementations in turns (3 rounds); every output, loss and gradient
was checked against jax.numpy's (rtol 1e-4 forward, 1e-3 gradients, relative to the largest
magnitude) before it was timed. "kernels built": C kernels built by that row's first calls
(compiled or read from the disk cache; 0 where an earlier size built them: shapes are
run-time arguments). "-fmath-errno": the same kernels built with `-fmath-errno` after
the flags above, i.e. the flags before `-fno-math-errno` became a base flag.

{table(rows)}

Effect of `-fno-math-errno` (-fmath-errno -> -fno-math-errno, same run):
{errno_effect(rows)}

First `jax.jit(jax.value_and_grad(...))` call, block {calls[0]["size"] if calls else "n/a"}, each
line a fresh Python process run after the previous one; "cold": an empty
`TENSORDSL_CACHE_DIR` with tiered builds (the default: each kernel built unoptimised first,
its optimised build taking over in the background), "TENSORDSL_BUILD=full": optimised builds
only, waited for, on another empty cache; "warm": the next process on the first cache;
"and JAX's compilation cache": `jax_compilation_cache_dir` set too (JAX's own persistent
cache of compiled XLA programs, filled by an untimed process just before), so XLA's compile
of the traced program is read back: what is left is tracing. The first call includes
tracing, building the kernels, XLA's compilation and one run (the second call is one run);
jax.numpy's first call is given for scale. The checkout is byte-compiled before
(`compileall`), as an installed package is, so no process compiles Python source. "kernels
defined": importing tensordsl and creating the block's kernels (`td.kernel`: parse and
lower), timed before the first call, as a model defines its layers before calling them
(until 2026-11-22 it was part of the first call). "CPU s": CPU time (user + system) of
the first call in the Python process (all its threads) and in the compilers it ran. On this
shared machine the kernel schedules CPU time fairly between sessions (autogroup), so a loaded
machine gives this benchmark about the same CPU rate however many threads it runs: wall times
here show CPU time, not parallelism. "shared": kernels that took the library of a nest with
the same canonical form (`compiler.STATS`).

{calls_table(calls)}

### Slowest nests, {nests[0]}

Every C nest of the block's forward+backward timed alone (`python -m benchmarks.profile_nests
--gpt`, `tensordsl.explain.timing`): {PROFILE_REPS} calls each on random inputs, outside JAX; "best"
is the fastest call, "share" its part of the sum of all nests' best times (a nest run twice,
like LayerNorm's, is listed twice).

{nests[1]}

### Targets (issue 14)

{targets(rows, calls)}

Raw numbers: `benchmarks/results/{NAME}.json`.
{end}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, smoke run")
    parser.add_argument("--out", help="Markdown file to write the section into")
    parser.add_argument("--no-first-calls", action="store_true", help="skip the compile timing")
    parser.add_argument("--no-errno-row", action="store_true", help="skip -fmath-errno")
    parser.add_argument("--compile-child", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.compile_child:
        print(json.dumps(compile_child(json.loads(options.compile_child))))
        return 0
    info = start_run()
    errno = not (options.quick or options.no_errno_row)
    impls = (JNP, OURS, PROGRAMS, ERRNO) if errno else (JNP, OURS, PROGRAMS)
    budget, settle = (0.3, 0.02) if options.quick else (10.0, 0.3)
    rows = []
    for size in QUICK_SIZES if options.quick else SIZES:
        print(f"... {size}", file=sys.stderr, flush=True)
        rows.append(run_size(size, impls, budget, settle))
    print(table(rows))
    profiled = (QUICK_SIZES if options.quick else SIZES)[-1]
    profile = block_profile(profiled, PROFILE_REPS, "fast" if options.quick else "full")
    print(slowest_nests(profile))
    calls = [] if options.no_first_calls else first_calls(options.quick)
    print(calls_table(calls))
    finish_run(info)
    print(targets(rows, calls))
    nests = (str(profiled), slowest_nests(profile))
    per_nest = [(t.name, t.best, t.seconds, t.schedule) for t in profile.timings]
    data = {"machine": info, "rows": rows, "first_calls": calls}
    data["nests"] = {"size": str(profiled), "nests": per_nest}
    out = options.out or (None if options.quick else RESULTS_MD)
    write_outputs(out, NAME, section(rows, calls, nests, info), data)
    return 0


if __name__ == "__main__":
    sys.exit(main())
