"""CPU benchmarks: tensordsl's C back end next to XLA (jnp / lax) and NumPy BLAS.

Run from the repository root:

    python -m benchmarks.run_cpu            # full sizes; rewrites benchmarks/RESULTS.md
    python -m benchmarks.run_cpu --quick    # small sizes, smoke run (< 60 s); writes nothing

What is measured, per case and implementation:

* forward: `jax.jit(f)(*inputs)`;
* forward+backward: `jax.jit(jax.value_and_grad(lambda *a: sum(f(*a) * ct), argnums=all))`
  with `ct` a fixed random cotangent of the output's shape;
* time: median of >= 9 repetitions after two warm-up calls (the first compiles the C kernels
  and the XLA program), each repetition `time.perf_counter()` around
  `jax.block_until_ready(...)`; implementations take turns in 3 rounds of short blocks
  (each block after one untimed call), so that load on this shared machine hits them alike;
* peak memory: one fresh subprocess per (case, implementation, mode), glibc's mmap threshold
  pinned at 64 KiB (`MALLOC_MMAP_THRESHOLD_`) so big buffers go back to the kernel when freed:
  build inputs, compile ahead of time, one warm-up call, reset the resident-set high-water
  mark (`/proc/self/clear_refs`), one call, report `VmHWM - VmRSS before the call` (includes
  the outputs). `--quick` measures memory for the pairwise-distance case only.

Before any timing, every tensordsl result (output and all gradients) is checked against the
jnp result with `np.allclose`; a mismatch or an exception is reported in the table as
"error: ..." and that implementation is not timed.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import (
    MIN_REPS,
    ROUNDS,
    child_env,
    close,
    machine,
    mib,
    peak_rss_growth,
    ratio,
    short,
    summary,
    time_rounds,
    verdict,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS_MD = ROOT / "benchmarks" / "RESULTS.md"
RESULTS_JSON = ROOT / "benchmarks" / "results" / "cpu.json"

OURS = "tensordsl C"
XLA = "XLA"
NUMPY = "numpy BLAS"

#: Targets from issue 4.
MATMUL_FWD_TARGET = 1.5  # ours / XLA, forward
BWD_TARGET = 2.5  # (fwd+bwd - fwd) / fwd, ours
MEMORY_OUTPUT_FACTOR = 8  # "O(output)": peak growth at most this many output sizes


# --------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    source: str  # tensordsl statement
    reduce: str | None
    shapes: tuple[tuple[int, ...], ...]
    reference: Callable[..., Any]  # jnp version, same inputs, same output
    xla_label: str
    numpy_fwd: Callable[..., Any] | None = None
    big_intermediate: int | None = None  # bytes of the i*j*k tensor a naive version makes


def _conv1d_lax(x: Any, w: Any) -> Any:
    # Y[o,i] = sum_{c,k} X[c,i+k] W[o,c,k]: a cross-correlation, which is what lax computes.
    y = jax.lax.conv_general_dilated(x[None], w, window_strides=(1,), padding="VALID")
    return y[0]


def _conv2d_lax(image: Any, kern: Any) -> Any:
    y = jax.lax.conv_general_dilated(image[None], kern, window_strides=(1, 1), padding="VALID")
    return y[0]


def _pairwise_jnp(w: Any, x: Any) -> Any:
    return ((w[:, :, None] - x[:, None, :]) ** 2).sum(0)


def cases(quick: bool) -> list[Case]:
    if quick:
        mm = (64, 128)
        dist_n, dist_k = 128, 8
        c1, n1, k1 = 8, 256, 3
        c2, hw = 4, 16
        rows = 256
    else:
        mm = (512, 1024)
        dist_n, dist_k = 2048, 64
        c1, n1, k1 = 64, 4096, 9
        c2, hw = 32, 128
        rows = 4096
    out: list[Case] = []
    for n in mm:
        out.append(
            Case(
                f"matmul {n}^3",
                "C[i,j] := A[i,k] * B[k,j]",
                None,
                ((n, n), (n, n)),
                lambda a, b: jnp.einsum("ik,kj->ij", a, b),
                "jnp.einsum",
                numpy_fwd=lambda a, b: a @ b,
            )
        )
    out.append(
        Case(
            f"pairwise sq. dist {dist_n}x{dist_n}, k={dist_k}",
            "D[i,j] := (W[k,i] - X[k,j])^2",
            None,
            ((dist_k, dist_n), (dist_k, dist_n)),
            _pairwise_jnp,
            "jnp broadcast+sum",
            big_intermediate=dist_k * dist_n * dist_n * 4,
        )
    )
    out.append(
        Case(
            f"conv1d c=o={c1}, N={n1}, K={k1}",
            "Y[o,i] := X[c,i+k] * W[o,c,k]",
            None,
            ((c1, n1), (c1, c1, k1)),
            _conv1d_lax,
            "lax.conv_general_dilated",
        )
    )
    out.append(
        Case(
            f"conv2d c=o={c2}, {hw}x{hw}, 3x3",
            "Y[o,y,x] := I[c,y+dy,x+dx] * K[o,c,dy,dx]",
            None,
            ((c2, hw, hw), (c2, c2, 3, 3)),
            _conv2d_lax,
            "lax.conv_general_dilated",
        )
    )
    out.append(
        Case(
            f"logsumexp rows {rows}x{rows}",
            "(logsumexp) L[i] := X[i,j]",
            None,
            ((rows, rows),),
            lambda x: jax.nn.logsumexp(x, axis=1),
            "jax.nn.logsumexp",
        )
    )
    out.append(
        Case(
            f"row max {rows}x{rows}",
            "(max) M[i] := X[i,j]",
            None,
            ((rows, rows),),
            lambda x: x.max(1),
            "X.max(1)",
        )
    )
    return out


def make_inputs(case: Case) -> tuple[list[Any], Any]:
    """Inputs and a cotangent, fixed by the case's name (same in every subprocess)."""
    seed = sum(ord(ch) for ch in case.name)
    rng = np.random.default_rng(seed)
    xs = [jnp.asarray(rng.standard_normal(s, dtype=np.float32)) for s in case.shapes]
    out_shape = jax.eval_shape(case.reference, *xs).shape
    ct = jnp.asarray(rng.standard_normal(out_shape, dtype=np.float32))
    return xs, ct


def implementations(case: Case) -> dict[str, Callable[..., Any]]:
    """Forward functions (unjitted), tensordsl first; the kernel is built lazily."""
    import tensordsl as td

    kernel = td.kernel(case.source, backend="c", reduce=case.reduce)
    impls: dict[str, Callable[..., Any]] = {OURS: kernel, XLA: case.reference}
    return impls


def jitted(fwd: Callable[..., Any], ct: Any, n_inputs: int) -> tuple[Any, Any]:
    def loss(*args: Any) -> Any:
        return jnp.sum(fwd(*args) * ct)

    argnums = tuple(range(n_inputs))
    return jax.jit(fwd), jax.jit(jax.value_and_grad(loss, argnums=argnums))


# --------------------------------------------------------------------------- memory


def memory_child(case_name: str, impl: str, mode: str, quick: bool) -> dict[str, Any]:
    """Runs in a fresh subprocess: peak RSS growth of one call."""
    case = next(c for c in cases(quick) if c.name == case_name)
    xs, ct = make_inputs(case)
    if impl == NUMPY:
        assert case.numpy_fwd is not None
        np_args = [np.asarray(x) for x in xs]

        def call() -> Any:
            return case.numpy_fwd(*np_args)  # type: ignore[misc]

    else:
        fwd = implementations(case)[impl]
        f_fwd, f_both = jitted(fwd, ct, len(xs))
        fn = f_fwd if mode == "fwd" else f_both
        compiled = fn.lower(*xs).compile()

        def call() -> Any:
            return jax.block_until_ready(compiled(*xs))

    return {"peak_growth": peak_rss_growth(call)}


def measure_memory(
    jobs: list[tuple[str, str, str]], quick: bool, workers: int
) -> dict[tuple[str, str, str], int | str]:
    """Each job in its own fresh Python; `workers` at a time (memory, not time, is measured)."""
    results: dict[tuple[str, str, str], int | str] = {}
    pending = list(jobs)
    running: list[tuple[tuple[str, str, str], subprocess.Popen[str]]] = []
    env = child_env()
    while pending or running:
        while pending and len(running) < workers:
            job = pending.pop(0)
            command = [sys.executable, "-m", "benchmarks.run_cpu"]
            command += ["--memory-child", json.dumps(job)]
            if quick:
                command.append("--quick")
            proc = subprocess.Popen(
                command,
                cwd=ROOT,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            running.append((job, proc))
        job, proc = running.pop(0)
        out, err = proc.communicate()
        if proc.returncode == 0 and out.strip():
            results[job] = int(json.loads(out.strip().splitlines()[-1])["peak_growth"])
        else:
            last = (err.strip().splitlines() or ["no output"])[-1]
            results[job] = f"error: {last[:120]}"
    return results


# --------------------------------------------------------------------------- one case


def run_case(case: Case, budget_s: float, settle_s: float) -> dict[str, Any]:
    xs, ct = make_inputs(case)
    ref_fwd, ref_both = jitted(case.reference, ct, len(xs))
    want_out = ref_fwd(*xs)
    want_val, want_grads = ref_both(*xs)
    row: dict[str, Any] = {"case": case.name, "xla_label": case.xla_label, "impls": {}}
    row["out_bytes"] = int(np.prod(want_out.shape)) * 4
    row["big_intermediate"] = case.big_intermediate

    fns: dict[tuple[str, str], Callable[..., Any]] = {}
    args: dict[str, list[Any]] = {}
    errors: dict[str, dict[str, str]] = {OURS: {}, XLA: {}}

    # tensordsl: check output and every gradient against jnp before timing.
    try:
        ours = implementations(case)[OURS]
        our_fwd, our_both = jitted(ours, ct, len(xs))
        got = our_fwd(*xs)
        ok, err = close(got, want_out, 1e-4)
        if ok:
            fns[(OURS, "fwd")] = our_fwd
        else:
            errors[OURS]["fwd"] = f"error: output differs from jnp (max rel err {err:.1e})"
    except Exception as error:  # noqa: BLE001 - reported in the table
        errors[OURS]["fwd"] = "error: " + short(error)
        our_both = None
    if our_both is not None and "fwd" not in errors[OURS]:
        try:
            got_val, got_grads = our_both(*xs)
            bad = []
            for name, g, w in zip(ours.inputs, got_grads, want_grads):
                ok, err = close(g, w, 1e-3)
                if not ok:
                    bad.append(f"d{name} (max rel err {err:.1e})")
            ok_val, err_val = close(got_val, want_val, 1e-3)
            if not ok_val:
                bad.append(f"loss (rel err {err_val:.1e})")
            if bad:
                errors[OURS]["fwd+bwd"] = "error: gradient differs from jax.grad: " + ", ".join(bad)
            else:
                fns[(OURS, "fwd+bwd")] = our_both
        except Exception as error:  # noqa: BLE001 - reported in the table
            errors[OURS]["fwd+bwd"] = "error: " + short(error)
    elif "fwd" in errors[OURS]:
        errors[OURS]["fwd+bwd"] = "not run (forward failed)"
    fns[(XLA, "fwd")] = ref_fwd
    fns[(XLA, "fwd+bwd")] = ref_both
    args[OURS] = args[XLA] = xs
    if case.numpy_fwd is not None:
        np_args = [np.asarray(x) for x in xs]
        ok, err = close(case.numpy_fwd(*np_args), want_out, 1e-4)
        assert ok, f"numpy reference disagrees with jnp ({err})"
        fns[(NUMPY, "fwd")] = case.numpy_fwd
        args[NUMPY] = np_args

    times = time_rounds(fns, args, budget_s, settle_s)
    impl_names = [OURS, XLA] + ([NUMPY] if case.numpy_fwd is not None else [])
    for impl in impl_names:
        entry: dict[str, Any] = {}
        for mode in ("fwd", "fwd+bwd"):
            if (impl, mode) in times:
                entry[mode] = summary(times[(impl, mode)])
            elif mode in errors.get(impl, {}):
                entry[mode] = {"error": errors[impl][mode]}
            else:
                entry[mode] = None  # not applicable (numpy has no backward)
        row["impls"][impl] = entry
    return row


# --------------------------------------------------------------------------- report


def _median(row: dict[str, Any], impl: str, mode: str) -> float | None:
    entry = row["impls"].get(impl, {}).get(mode)
    return entry["median_s"] if entry and "median_s" in entry else None


def _cell_time(entry: Any) -> str:
    if entry is None:
        return "n/a"
    if "error" in entry:
        return entry["error"]
    return f"{entry['median_s'] * 1e3:.2f}"


def bwd_ratio(row: dict[str, Any], impl: str) -> float | None:
    fwd, both = _median(row, impl, "fwd"), _median(row, impl, "fwd+bwd")
    if fwd is None or both is None:
        return None
    return (both - fwd) / fwd


def ours_over_xla(row: dict[str, Any], mode: str) -> float | None:
    ours, xla = _median(row, OURS, mode), _median(row, XLA, mode)
    if ours is None or xla is None:
        return None
    return ours / xla


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| case | implementation | fwd ms | fwd+bwd ms | bwd/fwd | ours/XLA fwd "
        "| ours/XLA fwd+bwd | peak RSS growth fwd MiB | peak RSS growth fwd+bwd MiB |\n"
        "|---|---|--:|--:|--:|--:|--:|--:|--:|"
    )
    lines = [head]
    for row in rows:
        for impl, entry in row["impls"].items():
            label = impl if impl != XLA else f"XLA ({row['xla_label']})"
            mem = row.get("memory", {}).get(impl, {})
            is_ours = impl == OURS
            lines.append(
                "| "
                + " | ".join(
                    [
                        row["case"],
                        label,
                        _cell_time(entry["fwd"]),
                        _cell_time(entry["fwd+bwd"]),
                        ratio(bwd_ratio(row, impl)),
                        ratio(ours_over_xla(row, "fwd")) if is_ours else "",
                        ratio(ours_over_xla(row, "fwd+bwd")) if is_ours else "",
                        mib(mem.get("fwd")),
                        mib(mem.get("fwd+bwd")),
                    ]
                )
                + " |"
            )
    return "\n".join(lines)


def targets(rows: list[dict[str, Any]]) -> str:
    out = []
    # 1. matmul forward within 1.5x of XLA
    for row in rows:
        if row["case"].startswith("matmul"):
            r = ours_over_xla(row, "fwd")
            ok = None if r is None else r <= MATMUL_FWD_TARGET
            out.append(
                f"- {row['case']}: forward within {MATMUL_FWD_TARGET}x of XLA — {verdict(ok)} "
                f"(ours/XLA = {ratio(r) or 'n/a'})"
            )
    # 2. backward at most 2.5x our forward, every case
    met, missed = [], []
    for row in rows:
        r = bwd_ratio(row, OURS)
        text = f"{row['case']} {ratio(r) or 'n/a'}"
        (met if r is not None and r <= BWD_TARGET else missed).append(text)
    out.append(
        f"- backward at most {BWD_TARGET}x our forward ((fwd+bwd - fwd) / fwd): "
        f"met for {len(met)} of {len(rows)} cases"
        + (f"; met: {', '.join(met)}" if met else "")
        + (f"; **missed**: {', '.join(missed)}" if missed else "")
    )
    # 3. pairwise distances faster than jnp, memory O(output)
    for row in rows:
        if not row["case"].startswith("pairwise"):
            continue
        for mode in ("fwd", "fwd+bwd"):
            r = ours_over_xla(row, mode)
            ok = None if r is None else r < 1.0
            out.append(
                f"- {row['case']}: {mode} faster than the jnp version — {verdict(ok)} "
                f"(ours/XLA = {ratio(r) or 'n/a'})"
            )
        mem = row.get("memory", {})
        limit = MEMORY_OUTPUT_FACTOR * row["out_bytes"]
        for mode in ("fwd", "fwd+bwd"):
            ours = mem.get(OURS, {}).get(mode)
            xla = mem.get(XLA, {}).get(mode)
            ok = None if not isinstance(ours, int) else ours <= limit
            out.append(
                f"- {row['case']}: {mode} peak memory O(output), read as at most "
                f"{MEMORY_OUTPUT_FACTOR}x the output ({mib(limit)} MiB; the i*j*k tensor is "
                f"{mib(row['big_intermediate'])} MiB) — {verdict(ok)} "
                f"(ours {mib(ours)} MiB, jnp {mib(xla)} MiB)"
            )
    return "\n".join(out)


def write_results(
    path: pathlib.Path, rows: list[dict[str, Any]], info: dict[str, Any], command: str
) -> None:
    load = info["load_before"], info["load_after"]
    text = f"""# CPU benchmarks

Generated by `{command}` (benchmarks/run_cpu.py); do not edit by hand.

- Machine: {info["model"]}, {info["cpus"]} CPU(s) (`lscpu`); shared with other work.
- Load average (1, 5, 15 min): {", ".join(f"{v:.2f}" for v in load[0])} at start,
  {", ".join(f"{v:.2f}" for v in load[1])} at end.
- Date: {info["date"]}; total run time {info["wall_s"]:.0f} s.
- jax {info["jax"]}, numpy {info["numpy"]}, Python {info["python"]};
  C compiler: {info.get("cc", "?")}, flags `{info.get("cflags", "?")}`.

Times are medians in milliseconds over >= {ROUNDS * math.ceil(MIN_REPS / ROUNDS)} repetitions
after two warm-up calls,
`time.perf_counter()` around `jax.block_until_ready`, every function under `jax.jit`;
implementations take turns in {ROUNDS} rounds of short blocks, each block after one untimed
call. fwd+bwd is `jax.value_and_grad` of
`sum(out * ct)` (fixed random cotangent `ct`) with respect to all inputs. bwd/fwd is
(fwd+bwd - fwd) / fwd. numpy BLAS is `A @ B` on NumPy arrays (forward only). Every tensordsl
output and gradient was checked against the jnp one (`np.allclose`, rtol 1e-4 forward,
1e-3 gradients, relative to the largest magnitude) before it was timed.

Peak RSS growth: one fresh Python process per cell, with `MALLOC_MMAP_THRESHOLD_=65536` so
that large buffers are fresh mappings returned on free; inputs built, the function compiled
ahead of time and called once, then the resident-set high-water mark is reset
(`/proc/self/clear_refs`) and one more call is run; the figure is `VmHWM` after minus `VmRSS`
before, so it includes the outputs (and gradients) but not the inputs. Allocator reuse can
hide small temporaries (< 64 KiB).

{table(rows)}

## Targets (issue 4)

{targets(rows)}

The machine is shared: other jobs kept both cores partly busy (see the load average). The
C kernels run OpenMP with 2 threads on 2 cores, so a descheduled worker stalls a whole
parallel region for a scheduler tick (~4 ms); times that sit at multiples of 4 ms are that,
and the quartiles in the JSON show the spread. XLA's small ops and NumPy suffer less.

Raw numbers (medians, quartiles, repetitions): `benchmarks/results/cpu.json`.
"""
    path.write_text(text + _kept_sections(path))


def _kept_sections(path: pathlib.Path) -> str:
    """Sections other scripts own (between `<!-- NAME: begin ... -->` and `<!-- NAME: end -->`
    markers, e.g. benchmarks/call_overhead.py's), carried over from the file being replaced."""
    if not path.exists():
        return ""
    found = re.finditer(r"\n<!-- (\w+): begin.*?<!-- \1: end -->\n", path.read_text(), re.S)
    return "".join(match.group(0) for match in found)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, smoke run")
    parser.add_argument("--out", type=pathlib.Path, help="Markdown file to write")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory column")
    parser.add_argument("--memory-child", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)

    if options.memory_child:
        case_name, impl, mode = json.loads(options.memory_child)
        print(json.dumps(memory_child(case_name, impl, mode, options.quick)))
        return 0

    start = time.perf_counter()
    info = machine()
    info["load_before"] = os.getloadavg()
    info["date"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    budget = 0.4 if options.quick else 12.0
    rows = []
    for case in cases(options.quick):
        print(f"... {case.name}", file=sys.stderr, flush=True)
        rows.append(run_case(case, budget, 0.05 if options.quick else 0.3))

    if not options.no_memory:
        jobs = []
        for row in rows:
            for impl, entry in row["impls"].items():
                for mode in ("fwd", "fwd+bwd"):
                    if options.quick and not row["case"].startswith("pairwise"):
                        continue
                    if entry[mode] is not None and "median_s" in entry[mode]:
                        jobs.append((row["case"], impl, mode))
        print(f"... peak memory ({len(jobs)} subprocesses)", file=sys.stderr, flush=True)
        memory = measure_memory(jobs, options.quick, workers=max(1, os.cpu_count() or 1))
        for (case_name, impl, mode), value in memory.items():
            row = next(r for r in rows if r["case"] == case_name)
            row.setdefault("memory", {}).setdefault(impl, {})[mode] = value

    info["load_after"] = os.getloadavg()
    info["wall_s"] = time.perf_counter() - start
    print(table(rows))
    print()
    print(targets(rows))
    out = options.out if options.out else (None if options.quick else RESULTS_MD)
    if out is not None:
        command = "python -m benchmarks.run_cpu" + (" --quick" if options.quick else "")
        write_results(out, rows, info, command)
        if out == RESULTS_MD:
            RESULTS_JSON.parent.mkdir(exist_ok=True)
            serial = [
                {**r, "memory": {i: dict(m) for i, m in r.get("memory", {}).items()}} for r in rows
            ]
            RESULTS_JSON.write_text(json.dumps({"machine": info, "rows": serial}, indent=1) + "\n")
        print(f"\nwrote {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
