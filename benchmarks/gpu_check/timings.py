"""The timings phase of `benchmarks.gpu_check`: ours beside the best alternatives present.

Times are medians of CUDA-event times on a GPU (events recorded around a call after
`block_until_ready`), wall-clock medians under the emulator, after a warm-up call that
compiles. Each case (benchmarks/gpu_check/cases.py) is a row per implementation; one that
is missing or fails is a row saying why.
"""

from __future__ import annotations

import os
import pathlib
import statistics
import time
import traceback
from collections.abc import Callable
from typing import Any

import jax

from benchmarks.gpu_check import peaks_for, record, short
from benchmarks.gpu_check.cases import CASES, OURS, REFERENCE, SKIP_QUICK, torch_or_none


def timer(emulate: bool) -> Callable[[Callable[[], Any]], float]:
    """Median milliseconds of `fn()` (CUDA events on a GPU, wall clock otherwise)."""
    repeats, budget = (3, 2.0) if emulate else (10, 0.5)
    events = None
    if not emulate:
        try:
            import cupy

            events = cupy.cuda.Event
        except Exception:
            events = None

    def measure(fn: Callable[[], Any]) -> float:
        _wait(fn())  # compile, warm up
        times: list[float] = []
        spent = time.monotonic()
        while len(times) < repeats and (len(times) < 3 or time.monotonic() - spent < budget):
            if events is not None:
                start, stop = events(), events()
                start.record()
                _wait(fn())
                stop.record()
                stop.synchronize()
                times.append(float(cupy.cuda.get_elapsed_time(start, stop)))
            else:
                begin = time.perf_counter()
                _wait(fn())
                times.append((time.perf_counter() - begin) * 1e3)
        return statistics.median(times)

    return measure


def _wait(result: Any) -> None:
    for leaf in jax.tree.leaves(result):
        if hasattr(leaf, "block_until_ready"):
            leaf.block_until_ready()
        elif hasattr(leaf, "device") and "cuda" in str(getattr(leaf, "device", "")):
            import torch

            torch.cuda.synchronize()
            return


#: Largest difference from the jnp result, relative to its largest magnitude, per dtype (jnp
#: at HIGHEST where the case has it; TF32 or bf16 products and other summation orders).
TOLERANCE = {"float32": 2e-3, "bfloat16": 5e-2}


def _relative_error(got: Any, want: Any) -> float:
    import numpy as np

    worst = 0.0
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
        if b.size:
            scale = max(float(np.max(np.abs(b))), 1e-30)
            worst = max(worst, float(np.max(np.abs(a - b))) / scale)
    return worst


def check_values(fns: dict[str, Callable[[], Any]], dtype: str) -> tuple[str, str]:
    """("ok" or "wrong", "max rel err ...") of ours against a JAX implementation's result
    (jnp at HIGHEST where there is one), or ("ok", "") when there is none to compare with.
    Where the case has a float32 `REFERENCE` (low-precision cases), ours and jnp's own
    low-precision result are both measured against it, and ours passes within the tolerance
    or twice jnp's error, whichever is larger."""
    if REFERENCE in fns:
        want = fns[REFERENCE]()
        worst = _relative_error(fns[OURS](), want)
        theirs = next((k for k in fns if k not in (OURS, REFERENCE) and "jnp" in k), None)
        baseline = _relative_error(fns[theirs](), want) if theirs else 0.0
        allowed = max(TOLERANCE.get(dtype, 2e-3), 2 * baseline)
        status = "ok" if worst <= allowed else "wrong"
        return status, f"max rel err {worst:.1e} vs float32 ({theirs}: {baseline:.1e})"
    jax_impls = [k for k in fns if k != OURS and not k.startswith("torch")]
    theirs = "jnp (HIGHEST)" if "jnp (HIGHEST)" in fns else next(iter(jax_impls), None)
    if theirs is None:
        return "ok", ""
    worst = _relative_error(fns[OURS](), fns[theirs]())
    status = "ok" if worst <= TOLERANCE.get(dtype, 2e-3) else "wrong"
    return status, f"max rel err {worst:.1e} vs {theirs}"


def run_all(out: pathlib.Path, emulate: bool, quick: bool, only: tuple[str, ...] = ()) -> None:
    """Time every case (or those whose name contains one of `only`), one row per
    implementation."""
    device = jax.devices()[0]
    peaks = peaks_for(getattr(device, "device_kind", ""))
    measure = timer(emulate)
    torch_note = "not measured (no torch with CUDA)" if torch_or_none() is None else ""
    for case in CASES:
        name, mode = case.name, case.modes[0]
        if only and not any(part in name for part in only):
            continue
        if quick and not case.quick:
            record(out, "timings", name, "skipped", mode=mode, detail=SKIP_QUICK)
            continue
        # Read when each function is traced, which `measure` does first.
        os.environ["TENSORDSL_XLA_CONTRACTIONS"] = "1" if case.xla_contractions else "0"
        try:
            flops, traffic, dtype, fns, shape = case.make(emulate)
        except Exception as error:
            record(out, "timings", name, "failed", mode=mode, detail=short(error))
            traceback.print_exc()
            continue
        limit_s = max(flops / peaks[dtype], traffic / peaks["bandwidth"]) if peaks else None
        ours_ms = None
        try:
            verdict, checked = check_values(fns, dtype)
        except Exception as error:
            verdict, checked = "failed", short(error)
            traceback.print_exc()
        timed = [(impl, fn) for impl, fn in fns.items() if impl != REFERENCE]
        for impl, fn in timed[: 2 if quick else None]:
            try:
                ms = measure(fn)
            except Exception as error:
                record(
                    out,
                    "timings",
                    name,
                    "failed" if impl == OURS else "unavailable",
                    mode=mode,
                    impl=impl,
                    shape=shape,
                    detail=short(error),
                )
                traceback.print_exc()
                continue
            if impl == OURS:
                ours_ms = ms
            percent = 100 * limit_s * 1e3 / ms if limit_s else None
            record(
                out,
                "timings",
                name,
                verdict if impl == OURS else "ok",
                mode=mode,
                impl=impl,
                ms=ms,
                detail=checked if impl == OURS else "",
                ratio=ours_ms / ms if ours_ms else None,
                shape=shape,
                percent=percent,
                dtype=dtype,
                flops=flops,
                bytes=traffic,
            )
        if torch_note and not any(impl.startswith("torch") for impl in fns) and not emulate:
            record(out, "timings", name, "not measured", mode=mode, impl="torch", detail=torch_note)
        for impl, why in case.notes.items():
            record(out, "timings", name, "not measured", mode=mode, impl=impl, detail=why)
