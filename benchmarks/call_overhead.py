"""Per-call cost of a tiny tensordsl C kernel inside `jax.jit`, next to an XLA op.

Run from the repository root:

    python -m benchmarks.call_overhead            # rewrites the "Call overhead" section
    python -m benchmarks.call_overhead --quick    # short smoke run; writes nothing

Kernel: a 4x4 float32 matmul, `C[i,j] := A[i,k] * B[k,j]`, so that the work is negligible and
the time is the cost of calling it. Two programs, each under `jax.jit`:

* "1 call": one matmul per jitted call; the time includes JAX's Python dispatch;
* "chain of 100": 100 dependent matmuls (`x = x @ b`) in one jitted call; the time is divided
  by 100, so dispatch is amortised and what is left is the cost of one op inside XLA's
  executable.

Implementations: XLA (`jnp.dot`), tensordsl through `jax.ffi.ffi_call` to the handler
compiled with the kernel (`TENSORDSL_CPU_CALL=ffi`), and tensordsl through
`buffer_callback` + ctypes (`TENSORDSL_CPU_CALL=callback`). Each runs with the process
otherwise idle, then with one extra Python thread spinning in a pure-Python loop (it holds the
GIL whenever it can; `buffer_callback` needs the GIL for every call).

Times: `time.perf_counter()` around `jax.block_until_ready`, medians with quartiles over many
repetitions (a time budget per cell, at least `MIN_REPS`); implementations take turns in
`ROUNDS` rounds so that load on the shared machine hits them alike. Results were checked
against `jnp.dot` before timing, and the lowered program is checked to call the intended
custom call.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import tensordsl as td
from benchmarks.common import markers, write_section

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS_MD = ROOT / "benchmarks" / "RESULTS.md"
BEGIN, END = markers("call_overhead")

N = 4
CHAIN = 100
ROUNDS = 5
MIN_REPS = 15
MAX_REPS = 3000
IMPLS = ("XLA (jnp.dot)", "tensordsl C, ffi_call", "tensordsl C, buffer_callback")
CALL_MODE = {IMPLS[1]: "ffi", IMPLS[2]: "callback"}
PROGRAMS = ("1 call", f"chain of {CHAIN}")
COMPILE_REPEATS = 7


@contextmanager
def cpu_call(mode: str | None) -> Iterator[None]:
    """Set `TENSORDSL_CPU_CALL` while a program is traced."""
    old = os.environ.get("TENSORDSL_CPU_CALL")
    if mode is not None:
        os.environ["TENSORDSL_CPU_CALL"] = mode
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TENSORDSL_CPU_CALL", None)
        else:
            os.environ["TENSORDSL_CPU_CALL"] = old


def matmul_of(impl: str) -> Callable[[Any, Any], Any]:
    if impl == IMPLS[0]:
        return jnp.dot
    k = td.kernel("C[i,j] := A[i,k] * B[k,j]", backend="c")
    return lambda a, b: k(A=a, B=b)


def program(impl: str, name: str, a: np.ndarray, b: np.ndarray) -> Callable[[], Any]:
    """Compile `name` for `impl` ahead of time; return a no-argument call."""
    matmul = matmul_of(impl)
    steps = 1 if name == PROGRAMS[0] else CHAIN

    def f(x: Any, y: Any) -> Any:
        for _ in range(steps):
            x = matmul(x, y)
        return x

    with cpu_call(CALL_MODE.get(impl)):
        lowered = jax.jit(f).lower(a, b)
    text = lowered.as_text()
    callbacks = len(re.findall(r"custom_call @xla_buffer_python_cpu_callback", text))
    handlers = len(re.findall(r"custom_call @tdsl_", text))
    expected = {IMPLS[0]: (0, 0), IMPLS[1]: (0, steps), IMPLS[2]: (steps, 0)}[impl]
    if (callbacks, handlers) != expected:
        raise RuntimeError(f"{impl}: lowered to {callbacks} callbacks and {handlers} handlers")
    compiled = lowered.compile()
    want = a
    for _ in range(steps):
        want = want @ b
    # Inputs already on the device: the time is the call, not a host-to-device copy.
    on_device = jax.device_put(a), jax.device_put(b)
    got = np.asarray(compiled(*on_device))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{impl}, {name}")
    return lambda: jax.block_until_ready(compiled(*on_device))


class BusyThread:
    """A thread running a pure-Python loop until stopped."""

    def __init__(self) -> None:
        self._stop = threading.Event()
        self.spins = 0
        self._thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        count = 0
        while not self._stop.is_set():
            for _ in range(1000):
                count += 1
        self.spins = count

    def __enter__(self) -> BusyThread:
        self._start = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.seconds = time.perf_counter() - self._start


def time_cell(call: Callable[[], Any], budget_s: float) -> list[float]:
    """Seconds per call: at least `MIN_REPS // ROUNDS` calls, then until `budget_s` is spent."""
    call()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < MAX_REPS // ROUNDS and (
        len(times) < -(-MIN_REPS // ROUNDS) or time.perf_counter() < deadline
    ):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def measure(budget_s: float, info: dict[str, Any]) -> dict[tuple[str, str, str], list[float]]:
    """Seconds per jitted call for every (program, implementation, condition)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((N, N)).astype(np.float32)
    # An orthogonal b keeps the chain's values bounded, so the check is meaningful.
    b = np.linalg.qr(rng.standard_normal((N, N)))[0].astype(np.float32)
    calls = {(p, i): program(i, p, a, b) for p in PROGRAMS for i in IMPLS}
    found: dict[tuple[str, str, str], list[float]] = {}
    for condition in ("idle", "busy Python thread"):
        busy = BusyThread() if condition != "idle" else None
        with busy if busy is not None else _nothing():
            for _ in range(ROUNDS):
                for (p, i), call in calls.items():
                    found.setdefault((p, i, condition), []).extend(time_cell(call, budget_s))
        if busy is not None:
            info["busy_rate"] = busy.spins / busy.seconds
    return found


def compile_times(repeats: int) -> tuple[float, float]:
    """Median seconds to compile the matmul kernel alone and with its FFI handler."""
    from codegen import config
    from codegen.c.emit import emit_c
    from codegen.c.run import compiler, ffi

    nest = td.kernel("C[i,j] := A[i,k] * B[k,j]").nest
    dtypes = {"A": "float32", "B": "float32", "C": "float32"}
    source = emit_c(nest, dtypes=dtypes)
    folder = ffi.include_dir()
    if folder is None:
        return math.nan, math.nan
    handler = ffi.handler_source(source.entry, ["float32"] * 2, "float32", len(source.parameters))
    texts = {
        "alone": (source.text, ()),
        "handler": (source.text + "\n" + handler, (f"-I{folder}",)),
    }
    found: dict[str, list[float]] = {"alone": [], "handler": []}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            for name, (text, extra) in texts.items():
                path = pathlib.Path(tmp) / f"{name}.c"
                path.write_text(text)
                command = [config.c_compiler(), *compiler.compile_flags(), *extra, str(path)]
                start = time.perf_counter()
                subprocess.run([*command, "-o", f"{path}.so", "-lm"], check=True)
                found[name].append(time.perf_counter() - start)
    return statistics.median(found["alone"]), statistics.median(found["handler"])


@contextmanager
def _nothing() -> Iterator[None]:
    yield


def _quartiles(times: list[float], per: int) -> tuple[float, float, float]:
    q1, med, q3 = statistics.quantiles(times, n=4)
    return q1 / per * 1e6, statistics.median(times) / per * 1e6, q3 / per * 1e6


def _us(value: float) -> str:
    return f"{value:.1f}" if value < 1000 else f"{value:.0f}"


def table(found: dict[tuple[str, str, str], list[float]]) -> str:
    head = (
        "| program | implementation | idle µs/op | busy thread µs/op | busy/idle "
        "| ours/XLA idle | ours/XLA busy | reps idle, busy |\n"
        "|---|---|--:|--:|--:|--:|--:|--:|"
    )
    rows = [head]
    for p in PROGRAMS:
        per = 1 if p == PROGRAMS[0] else CHAIN
        xla_idle = _quartiles(found[(p, IMPLS[0], "idle")], per)[1]
        xla_busy = _quartiles(found[(p, IMPLS[0], "busy Python thread")], per)[1]
        for i in IMPLS:
            idle = _quartiles(found[(p, i, "idle")], per)
            busy = _quartiles(found[(p, i, "busy Python thread")], per)
            ratios = (
                ("", "")
                if i == IMPLS[0]
                else (
                    f"{idle[1] / xla_idle:.1f}",
                    f"{busy[1] / xla_busy:.1f}",
                )
            )
            reps = f"{len(found[(p, i, 'idle')])}, {len(found[(p, i, 'busy Python thread')])}"
            rows.append(
                f"| {p} | {i} | {_us(idle[1])} ({_us(idle[0])}–{_us(idle[2])}) "
                f"| {_us(busy[1])} ({_us(busy[0])}–{_us(busy[2])}) | {busy[1] / idle[1]:.1f} "
                f"| {ratios[0]} | {ratios[1]} | {reps} |"
            )
    return "\n".join(rows)


def compile_line(info: dict[str, Any]) -> str:
    alone, handler = info["compile_s"]
    return (
        f"Compile time of the matmul kernel's C (median of {info['compile_repeats']}, same flags): "
        f"{alone:.2f} s alone, {handler:.2f} s with its FFI handler appended "
        f"(+{(handler - alone) * 1e3:.0f} ms)."
    )


def machine() -> str:
    model = platform.processor() or "unknown"
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        model = next(
            (
                v.strip()
                for k, _, v in (x.partition(":") for x in text.splitlines())
                if k.strip() == "Model name"
            ),
            model,
        )
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} CPU(s)"


def section(found: dict[tuple[str, str, str], list[float]], info: dict[str, Any]) -> str:
    load = ", ".join(f"{v:.2f}" for v in info["load_before"])
    load_after = ", ".join(f"{v:.2f}" for v in info["load_after"])
    return f"""{BEGIN}
## Call overhead

Generated by `python -m benchmarks.call_overhead` (benchmarks/call_overhead.py); the text
between the call_overhead markers is rewritten by that script, the rest of this file is not.

- Machine: {info["machine"]} (`lscpu`); shared with other work.
- Load average (1, 5, 15 min): {load} at start, {load_after} at end.
- Date: {info["date"]}; total run time {info["wall_s"]:.0f} s.
- jax {jax.__version__}, numpy {np.__version__}, Python {platform.python_version()};
  `sys.getswitchinterval()` = {sys.getswitchinterval() * 1e3:g} ms.

A 4x4 float32 matmul inside `jax.jit`. "1 call": one op per jitted call, time per call
(includes JAX's dispatch from Python). "chain of {CHAIN}": {CHAIN} dependent ops in one jitted
call, time per call / {CHAIN} (dispatch amortised: the cost of one op inside the executable).
"busy thread": one more Python thread spinning in a pure-Python loop meanwhile. Medians in
microseconds per op, quartiles in brackets; inputs are device arrays (no host copy);
`time.perf_counter()` around `jax.block_until_ready` of the ahead-of-time compiled program;
the implementations take turns in {ROUNDS} rounds. Every result was
checked against NumPy, and every lowered program was checked to call the intended custom call
(`ffi_call`: the XLA FFI handler compiled with the kernel, no Python per call;
`buffer_callback`: a Python callback calling the kernel with ctypes, needs the GIL per call).

{table(found)}

The busy thread ran {info["busy_rate"] / 1e6:.1f} million loop iterations per second meanwhile.
{compile_line(info)}

Reading the table: inside an executable, an `ffi_call` op runs the C kernel with no Python
in between, so the busy thread does not touch it; a `buffer_callback` op enters Python for
every call and so waits for the GIL whenever the busy thread holds it. Slow outliers in the
XLA rows with the busy thread (upper quartile) are jitted calls that took about one
`sys.getswitchinterval()` longer, consistent with the calling thread waiting to take the GIL
back after `block_until_ready` released it; that wait can be in any row. The machine has two
cores shared with other work: see the load average.

The C path uses `ffi_call` by default (`TENSORDSL_CPU_CALL=ffi`); `TENSORDSL_CPU_CALL=callback`
selects `buffer_callback`, which is also used for a kernel whose FFI handler did not build.
{END}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short smoke run, writes nothing")
    parser.add_argument("--budget", type=float, help="seconds per cell and round")
    options = parser.parse_args(argv)
    start = time.perf_counter()
    info: dict[str, Any] = {"machine": machine(), "load_before": os.getloadavg()}
    info["date"] = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    found = measure(options.budget or (0.05 if options.quick else 1.5), info)
    info["compile_repeats"] = 1 if options.quick else COMPILE_REPEATS
    info["compile_s"] = compile_times(info["compile_repeats"])
    info["load_after"] = os.getloadavg()
    info["wall_s"] = time.perf_counter() - start
    print(table(found))
    print(compile_line(info))
    if not options.quick:
        write_section(RESULTS_MD, "call_overhead", section(found, info))
        print(f"\nwrote the call-overhead section of {RESULTS_MD}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
