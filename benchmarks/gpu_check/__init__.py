"""Everything a GPU can tell us in one command: run it first on any GPU machine.

    PYTHONPATH=. python -m benchmarks.gpu_check --out DIR          # on a GPU, no install
    python -m benchmarks.gpu_check --out DIR                       # after pip install -e .
    PYTHONPATH=. python -m benchmarks.gpu_check --emulate --out DIR   # CPU, CUDA emulator

Phases, each in a subprocess of its own with a time limit (a phase that fails or runs out of
time records that, and the next one still runs; rows a phase wrote before it stopped are kept):

* `machine`: GPU name, driver, CUDA, SM count, memory, JAX/CuPy/torch versions;
* `tests`: `tests/gpu` through pytest, launching through the JAX FFI handler, then the
  backend tests again through CuPy (`TENSORDSL_GPU_CALL=callback`);
* `corpus`: every corpus case, forward and every gradient, `cuda` against `reference`, and
  one case of more than 2^31 elements where memory allows;
* `timings`: medians of CUDA-event times (wall clock under the emulator), ours beside the
  alternatives present (jnp at default precision and HIGHEST, cuDNN attention, torch SDPA,
  torch eager), as a ratio and as % of the device's physical limit (`PEAKS`);
* `sweep`: candidate tiles, warps and stages of the pallas back end per kind of kernel,
  timed beside the cuda back end; the fastest of each kind as rows of the tuning table
  (`DIR/tuning-rows.json`, merged by `python -m benchmarks.gpu_check.sweep merge`;
  `benchmarks/gpu_check/sweep.py`).

`--emulate` runs the same phases at toy sizes on the CPU under the CUDA emulator
(`TENSORDSL_CUDA_EMULATE=1`); the suite runs it (tests/gpu/test_gpu_check.py) so that the
command cannot rot between GPU visits. Writes `RESULTS-GPU.md` and `results.json` to `--out`.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Any

ROOT = pathlib.Path(__file__).resolve().parents[2]
PHASES = ("machine", "tests", "corpus", "timings", "sweep")
#: Seconds per phase on a GPU: 8 minutes without the sweep, 10.5 with it.
LIMITS = {"machine": 40, "tests": 100, "corpus": 50, "timings": 290, "sweep": 150}
EMULATED_LIMITS = {"machine": 60, "tests": 240, "corpus": 300, "timings": 400, "sweep": 300}

#: Physical limits by device name (first key contained in the name wins): HBM bytes/s,
#: dense FLOP/s per dtype (float32: the SIMT FP32 peak, so TF32 runs can exceed 100%).
PEAKS: dict[str, dict[str, float]] = {
    "H100 PCIe": {"bandwidth": 2.0e12, "float32": 51.2e12, "bfloat16": 756e12},
    "H100": {"bandwidth": 3.35e12, "float32": 66.9e12, "bfloat16": 989e12},
    "H200": {"bandwidth": 4.8e12, "float32": 66.9e12, "bfloat16": 989e12},
}


def peaks_for(device: str) -> dict[str, float]:
    """The `PEAKS` row of a device name, or {} for an unknown device.

    >>> peaks_for("NVIDIA H100 80GB HBM3")["bandwidth"], peaks_for("cpu")
    (3350000000000.0, {})
    """
    return next((row for key, row in PEAKS.items() if key in device), {})


def short(error: BaseException) -> str:
    """One line: the error's type and the first line of its message."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def rows_path(out: pathlib.Path, phase: str) -> pathlib.Path:
    return out / f"rows-{phase}.jsonl"


def record(out: pathlib.Path, phase: str, case: str, status: str, **fields: Any) -> dict:
    """Append one row to the phase's file now (so a timeout later keeps it) and return it."""
    row = {"phase": phase, "case": case, "status": status, **fields}
    with rows_path(out, phase).open("a") as handle:
        handle.write(json.dumps(row, default=str) + "\n")
    where = "".join(f" {fields[k]}" for k in ("mode", "impl") if fields.get(k))
    print(f"[{phase}] {case}{where}: {status} {fields.get('detail', '')}".rstrip(), flush=True)
    return row


def child_env(emulate: bool) -> dict[str, str]:
    """The environment of a phase: the checkout first on the path, the emulator if asked."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    if emulate:
        env["TENSORDSL_CUDA_EMULATE"] = "1"
        env.setdefault("JAX_PLATFORMS", "cpu")
    return env


def run_phase(phase: str, args: argparse.Namespace) -> dict[str, Any]:
    """Run one phase in a subprocess within its limit; a summary row of how it ended."""
    out = pathlib.Path(args.out)
    rows_path(out, phase).unlink(missing_ok=True)
    limit = (EMULATED_LIMITS if args.emulate else LIMITS)[phase] * args.time_scale
    command = [sys.executable, "-m", "benchmarks.gpu_check.phases", phase, "--out", str(out)]
    command += ["--emulate"] * args.emulate + ["--quick"] * args.quick
    started = time.monotonic()
    env = child_env(args.emulate)
    env["GPU_CHECK_CASES"] = args.cases
    if phase == "timings":  # torch allocates beside JAX there: JAX must not take 75% first
        env.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    code = run_boxed(command, env, out / f"log-{phase}.txt", limit)
    if code is None:
        status, detail = "timeout", f"stopped after {limit:.0f} s; see log-{phase}.txt"
    else:
        status = "ok" if code == 0 else "failed"
        detail = "" if code == 0 else f"exit status {code}; see log-{phase}.txt"
    seconds = round(time.monotonic() - started, 1)
    return {
        "phase": phase,
        "case": "(phase)",
        "status": status,
        "detail": detail,
        "seconds": seconds,
    }


def read_rows(out: pathlib.Path, phase: str) -> list[dict[str, Any]]:
    path = rows_path(out, phase)
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _cell(value: Any, digits: int = 3) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value).replace("|", "/").replace("\n", " ")


DEFAULT_COLUMNS = (("case", "case"), ("status", "status"), ("detail", "detail"))
COLUMNS = {
    "timings": (
        ("case", "case"),
        ("shape", "shape"),
        ("mode", "mode"),
        ("implementation", "impl"),
        ("status", "status"),
        ("ms", "ms"),
        ("ours/this", "ratio"),
        ("% limit", "percent"),
        ("detail", "detail"),
    )
}
COLUMNS["sweep"] = (
    ("case", "case"),
    ("dtype", "mode"),
    ("implementation", "impl"),
    ("status", "status"),
    ("ms", "ms"),
    ("detail", "detail"),
)
TIMINGS_LEGEND = (
    "ms: median (CUDA events on a GPU, wall clock under the emulator); ours/this: our time "
    "over this one's (above 1: ours is slower); % limit: the time the physical limit allows "
    "(the larger of FLOPs at the device's peak and HBM bytes at its bandwidth; blank for an "
    "unknown device) over this time."
)


def markdown(results: dict[str, Any]) -> str:
    """The human table: the machine, then one table per phase."""
    machine = results["machine"]
    lines = [
        f"# GPU check, {results['date']}"
        + (" (emulated, toy sizes)" if results["emulated"] else ""),
        "",
        f"Device: {machine.get('device', '?')}; command: `{results['command']}`",
        "",
        "## Phases",
        "",
        "| phase | status | seconds | detail |",
        "|---|---|---|---|",
    ]
    lines += [
        f"| {s['phase']} | {s['status']} | {s['seconds']} | {_cell(s['detail'])} |"
        for s in results["phases"]
    ]
    for phase in (s["phase"] for s in results["phases"]):
        rows = [r for r in results["rows"] if r["phase"] == phase]
        lines += ["", f"## {phase}", ""]
        if phase == "timings":
            lines += [TIMINGS_LEGEND, ""]
        if phase == "machine" and machine:
            lines += [f"- {key}: {_cell(value)}" for key, value in machine.items()] + [""]
        columns = COLUMNS.get(phase, DEFAULT_COLUMNS)
        lines += ["| " + " | ".join(title for title, _ in columns) + " |"]
        lines += ["|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_cell(r.get(key)) for _, key in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", required=True, help="folder for RESULTS-GPU.md, results.json")
    parser.add_argument("--emulate", action="store_true", help="toy sizes, CUDA emulator, CPU")
    parser.add_argument("--quick", action="store_true", help="fewer cases in every phase")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated subset")
    parser.add_argument("--time-scale", type=float, default=1.0, help="multiply phase limits")
    parser.add_argument(
        "--cases", default="", help="timings: only cases whose name contains one of these (a,b)"
    )
    args = parser.parse_args(argv)
    args.phases = tuple(p for p in args.phases.split(",") if p)
    unknown = sorted(set(args.phases) - set(PHASES))
    if unknown:
        parser.error(f"unknown phases {unknown}; expected some of {list(PHASES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summaries, rows = [], []
    for phase in args.phases:
        summaries.append(run_phase(phase, args))
        rows += read_rows(out, phase)
    machine = next((r for r in rows if r["phase"] == "machine" and r["case"] == "machine"), {})
    results = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "emulated": args.emulate,
        "command": " ".join(["python -m benchmarks.gpu_check", *(argv or sys.argv[1:])]),
        "machine": machine.get("info", {}),
        "phases": summaries,
        "rows": rows,
    }
    text = markdown(results)
    (out / "RESULTS-GPU.md").write_text(text)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(text)
    bad = [r for r in (*summaries, *rows) if r["status"] in ("failed", "timeout")]
    return 1 if bad else 0


def run_boxed(
    command: list[str], env: dict[str, str], log_path: pathlib.Path, limit: float
) -> int | None:
    """Run `command` from the checkout, its output into `log_path` as it runs; its exit
    status, or None when it ran past `limit` seconds (then it and every process it started
    are killed: it runs in a session of its own)."""
    with log_path.open("w") as log:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            return process.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return None
