"""What every benchmark script shares: timing in turns, checks, peak memory, RESULTS.md sections.

Conventions (see benchmarks/run_cpu.py's docstring for the full story):

* time: medians of `time.perf_counter()` around `jax.block_until_ready(...)`, after warm-up
  calls; implementations take turns in `ROUNDS` rounds of short blocks (`time_rounds`);
* correctness before timing: `close` compares with a reference relative to its largest
  magnitude, and a mismatch is reported in the table instead of a time;
* peak memory: one fresh subprocess per cell, `peak_rss_growth` of one call;
* RESULTS.md: each script owns the text between `<!-- NAME: begin ... -->` and
  `<!-- NAME: end -->` (`write_section`); run_cpu.py rewrites the rest and keeps these.

>>> close(np.array([1.0, 2.0]), np.array([1.0, 2.0001]), 1e-3)[0]
True
"""

from __future__ import annotations

import datetime
import gc
import json
import math
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS_MD = ROOT / "benchmarks" / "RESULTS.md"
RESULTS_DIR = ROOT / "benchmarks" / "results"

MIN_REPS = 7
MAX_REPS = 48
ROUNDS = 3


# --------------------------------------------------------------------------- checking


def close(got: Any, want: Any, tol: float) -> tuple[bool, float]:
    """Whether `got` matches `want` within `tol` of want's largest magnitude; the error."""
    got, want = np.asarray(got, dtype=np.float64), np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return False, math.inf
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    err = float(np.max(np.abs(got - want))) / max(scale, 1e-30) if want.size else 0.0
    ok = bool(np.allclose(got, want, rtol=tol, atol=tol * max(scale, 1e-30)))
    return ok, err


def mismatches(got: Any, want: Any, tol: float) -> list[str]:
    """Leaves of two pytrees that differ (`close`), as 'path (max rel err ...)' strings."""
    found = []
    pairs = zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want))
    for (path, leaf), expected in pairs:
        ok, err = close(leaf, expected, tol)
        if not ok:
            found.append(f"{jax.tree_util.keystr(path)} (max rel err {err:.1e})")
    return found


def short(error: BaseException) -> str:
    """An exception on one line, fit for a Markdown table cell."""
    text = f"{type(error).__name__}: {error}".replace("\n", " ").replace("|", "/")
    return text if len(text) < 160 else text[:157] + "..."


# --------------------------------------------------------------------------- timing


def time_once(fn: Callable[..., Any], args: list[Any]) -> float:
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def wait_for_optimised() -> None:
    """Wait until the optimised builds of every C kernel built so far have taken over."""
    from codegen.c.run.build import wait_for_optimised as wait

    wait()


def time_rounds(
    fns: dict[tuple[str, str], Callable[..., Any]],
    args: dict[str, list[Any]],
    budget_s: float,
    settle_s: float,
    min_reps: int = MIN_REPS,
) -> dict[tuple[str, str], list[float]]:
    """Warm up each function twice (waiting in between for the optimised builds of tiered
    kernels to take over), then time them in ROUNDS rounds of short blocks.

    `fns` is keyed by (implementation, mode); `args[implementation]` are the arguments.
    Every function gets the same number of repetitions: `budget_s` over the time of one call
    of each, clamped to [min_reps, MAX_REPS], rounded up to a multiple of ROUNDS.
    Each block starts with untimed calls for `settle_s` seconds (at least one): right after
    XLA's thread pool has been busy, the OpenMP threads of the C kernels stall for ~10 ms a
    call for about 0.1 s on this 2-core machine, and OpenBLAS threads do likewise. The rounds
    spread slow drifts in machine load over all implementations alike.
    """
    estimate = 0.0
    for key, fn in fns.items():
        time_once(fn, args[key[0]])
    # Tiered builds (TENSORDSL_BUILD's default) answer first calls from unoptimised kernels:
    # the steady state users see once the optimised builds have taken over is what is timed.
    wait_for_optimised()
    for key, fn in fns.items():
        estimate += time_once(fn, args[key[0]])
    reps = int(min(MAX_REPS, max(min_reps, budget_s / max(estimate, 1e-9))))
    per_block = math.ceil(reps / ROUNDS)
    times: dict[tuple[str, str], list[float]] = {key: [] for key in fns}
    for _ in range(ROUNDS):
        for key, fn in fns.items():
            settle_until = time.perf_counter() + settle_s
            time_once(fn, args[key[0]])
            while time.perf_counter() < settle_until:
                time_once(fn, args[key[0]])
            for _ in range(per_block):
                times[key].append(time_once(fn, args[key[0]]))
    return times


def summary(times: list[float]) -> dict[str, float | int]:
    """Median and quartiles (seconds) and the number of repetitions."""
    ts = sorted(times)
    return {
        "median_s": statistics.median(ts),
        "p25_s": ts[len(ts) // 4],
        "p75_s": ts[(3 * len(ts)) // 4],
        "reps": len(ts),
    }


def by_implementation(
    times: dict[tuple[str, str], list[float]],
    failures: dict[str, dict[str, Any]],
    impls: Any,
    modes: tuple[str, ...],
) -> dict[str, dict[str, dict[str, Any]]]:
    """{impl: {mode: summary or {"error": ...}}}: the timed cells, else why they were not."""
    return {
        impl: {
            mode: summary(times[(impl, mode)])
            if (impl, mode) in times
            else {"error": failures[impl][mode]}
            for mode in modes
        }
        for impl in impls
    }


def ms(entry: dict[str, Any] | None) -> str:
    """A table cell: the median in milliseconds, an error, or n/a."""
    if entry is None:
        return "n/a"
    if "error" in entry:
        return entry["error"]
    value = entry["median_s"] * 1e3
    return f"{value:.2f}" if value < 1000 else f"{value:.0f}"


# --------------------------------------------------------------------------- memory


def _proc_status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, rest = line.split(":", 1)
                values[key] = int(rest.split()[0]) * 1024
    return values


def peak_rss_growth(call: Callable[[], Any]) -> int:
    """Bytes the resident set grew during one `call()` after a warm-up call (Linux only)."""
    call()  # warm-up: first-run allocations (thread pools, caches) are not the kernel's
    gc.collect()
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")  # reset VmHWM to the current RSS
    before = _proc_status()["VmRSS"]
    result = call()
    peak = _proc_status()["VmHWM"]
    del result
    return max(peak - before, 0)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a measuring subprocess: this checkout first on the path, glibc's
    mmap threshold pinned at 64 KiB so that big buffers go back to the kernel when freed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    env.update(extra or {})
    return env


def run_child(module: str, argv: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `python -m module *argv` in a fresh process; its last stdout line, parsed as JSON.

    Returns `{"error": ...}` (the last line of stderr) when the child fails.
    """
    done = subprocess.run(
        [sys.executable, "-m", module, *argv],
        cwd=ROOT,
        env=env or child_env(),
        text=True,
        capture_output=True,
        check=False,
    )
    if done.returncode == 0 and done.stdout.strip():
        return json.loads(done.stdout.strip().splitlines()[-1])
    last = (done.stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"error: {last[:160]}"}


def median_of(row: dict[str, Any], impl: str, mode: str) -> float | None:
    """The median seconds of one cell of a row (`by_implementation`), None if not timed."""
    return row["impls"].get(impl, {}).get(mode, {}).get("median_s")


def over(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a / b


def ratio(value: float | None) -> str:
    if value is None:
        return ""
    return f"{value:.2f}" if abs(value) >= 0.1 else f"{value:.2g}"


def verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("**met**" if ok else "**missed**")


def mib(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, str):
        return value
    return f"{value / 2**20:.1f}"


# --------------------------------------------------------------------------- RESULTS.md


def machine() -> dict[str, Any]:
    """The CPU model and count (`lscpu`), versions, the C compiler and its flags."""
    model, cpus = platform.processor() or "unknown", str(os.cpu_count())
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        for line in text.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name":
                model = value.strip()
            elif key.strip() == "CPU(s)":
                cpus = value.strip()
    except OSError:
        pass
    info: dict[str, Any] = {"model": model, "cpus": cpus, "jax": jax.__version__}
    info["numpy"] = np.__version__
    info["python"] = platform.python_version()
    try:
        from codegen import config
        from codegen.c.run import compiler

        info["cc"] = compiler.compiler_version(config.c_compiler())
        info["cflags"] = " ".join(compiler.compile_flags())
    except Exception as error:  # noqa: BLE001 - informational only
        info["cc"] = f"unknown ({short(error)})"
    return info


def start_run(**extra: Any) -> dict[str, Any]:
    """`machine()`, the load average and the date at the start of a run, and `extra`."""
    info = {**machine(), **extra, "load_before": os.getloadavg(), "start": time.perf_counter()}
    info["date"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    return info


def finish_run(info: dict[str, Any]) -> None:
    """Add the load average at the end and the run's wall time to `info`."""
    info["load_after"] = os.getloadavg()
    info["wall_s"] = time.perf_counter() - info.pop("start")


def header(info: dict[str, Any], also: str = "") -> str:
    """The Markdown lines every section starts with: machine, load, date, versions, flags."""
    machine_line = f"- Machine: {info['model']}, {info['cpus']} CPU(s) (`lscpu`)"
    return f"""{machine_line}; **shared with other work**.
- Load average (1, 5, 15 min): {load_line(info["load_before"], info["load_after"])}.
- Date: {info["date"]}; total run time {info["wall_s"]:.0f} s.
- jax {info["jax"]}, numpy {info["numpy"]}{also}; C compiler: {info.get("cc", "?")},
  flags `{info.get("cflags", "?")}`."""


def write_outputs(out: Any, name: str, text: str, data: dict[str, Any]) -> None:
    """Write `name`'s section into `out` and, when `out` is RESULTS.md, results/<name>.json."""
    if out is None:
        return
    write_section(pathlib.Path(out), name, text)
    if pathlib.Path(out) == RESULTS_MD:
        write_json(name, data)
    print(f"\nwrote the {name} section of {out}", file=sys.stderr)


def markers(name: str) -> tuple[str, str]:
    begin = f"<!-- {name}: begin (python -m benchmarks.{name} rewrites this) -->"
    return begin, f"<!-- {name}: end -->"


def write_section(path: pathlib.Path, name: str, text: str) -> None:
    """Replace the text between `name`'s markers in `path` (append it when they are missing).

    `text` starts with the begin marker and ends with the end marker (`markers(name)`).
    """
    begin, end = markers(name)
    old = path.read_text() if path.exists() else ""
    start, stop = old.find(begin), old.find(end)
    if start >= 0 and stop > start:
        new = old[:start] + text.rstrip("\n") + old[stop + len(end) :]
    else:
        new = old.rstrip("\n") + ("\n\n" if old else "") + text.rstrip("\n") + "\n"
    path.write_text(new)


def write_json(name: str, data: Any) -> pathlib.Path:
    path = RESULTS_DIR / f"{name}.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return path


def load_line(before: tuple[float, ...], after: tuple[float, ...]) -> str:
    text = ", ".join(f"{v:.2f}" for v in before)
    return f"{text} at start, {', '.join(f'{v:.2f}' for v in after)} at end"
