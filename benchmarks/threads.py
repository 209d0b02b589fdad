"""Small nests stay cheap under load: C kernels timed on an idle machine and beside a busy core.

Run from the repository root (2-core machine; other processes load it too, so `uptime` is
printed with the table):

    python -m benchmarks.threads            # every case, 41 calls each
    python -m benchmarks.threads --reps 15

Each case is one nest at one size: a trivial one (the 1-d convolution of docs/backends.md,
work worth microseconds), two mid-size ones (one below the work that starts a team, one
above) and a large one (a Gaussian kernel sum, with an `exp` per term). The "threads"
column is the team a call asks for when no other kernel runs and the machine is calm
(`codegen.c.threads.thread_count`). Each is timed three ways in the same run: the kernel
called directly (what `k.profile` and `tensordsl.explain.timing.profile_jaxpr` time), through
`jax.jit` (XLA's FFI, from XLA's own threads) and the same computation in jax.numpy, jitted.
Then again with a busy loop holding one core (a child process this script starts and ends),
and the large case once more with OpenMP limited to one thread (`omp_set_num_threads(1)` on
the calling thread, direct calls only), to show that it does use both cores. Figures are
medians in milliseconds; "cpu/wall" is the process's CPU time over the wall time of the
direct calls (near 2 when a kernel keeps both cores busy); "calm" is "yes" when, after the
direct calls, a late thread keeps kernels on one thread (`codegen.c.threads.CALM_NS`). This
script imports only the package, so the same file can time an older checkout
(`PYTHONPATH=<old tree> python benchmarks/threads.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import tensordsl as td

CONVOLUTION = "Y[i] := X[i + k] * W[k]"
GAUSSIAN = "K[i, j] := exp(-(X[i, d] - Z[j, d])**2)"


def _convolution_jnp(x: Any, w: Any) -> Any:
    return jnp.correlate(x, w, mode="valid")


def _gaussian_jnp(x: Any, z: Any) -> Any:
    return jnp.exp(-((x[:, None, :] - z[None, :, :]) ** 2)).sum(-1)


#: name, source, input shapes, jnp twin
CASES = (
    ("trivial conv1d 10000x30", CONVOLUTION, ((10000,), (30,)), _convolution_jnp),
    ("mid gaussian 256x256x3", GAUSSIAN, ((256, 3), (256, 3)), _gaussian_jnp),
    ("mid gaussian 512x512x3", GAUSSIAN, ((512, 3), (512, 3)), _gaussian_jnp),
    ("large gaussian 2048x2048x3", GAUSSIAN, ((2048, 3), (2048, 3)), _gaussian_jnp),
)


def _median_ms(call: Callable[[], Any], reps: int) -> float:
    return _timed(call, reps)[0]


def _timed(call: Callable[[], Any], reps: int) -> tuple[float, float]:
    """The median milliseconds of `reps` calls after a warm-up, and the process's CPU time
    over the wall time of them all (about the cores a direct call keeps busy)."""
    call()
    times = []
    cpu = time.process_time()
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3, (time.process_time() - cpu) / sum(times)


def _direct_call(kernel: Any, arrays: list[np.ndarray]) -> Callable[[], Any]:
    """The forward kernel called outside JAX, as `tensordsl.explain.timing` calls it."""
    from codegen.c.run.build import build_c
    from codegen.ir.nest import default_dtypes

    nest = kernel.nest
    compiled = build_c(nest, dtypes=default_dtypes(nest))
    out_shape = jax.eval_shape(kernel, *arrays).shape
    out = np.empty(out_shape, np.float32)
    full = compiled.all_extents([a.shape for a in arrays], out.shape, {})
    params = compiled.host_parameters(full)
    pointers = (ctypes.c_void_p * len(arrays))(*(a.ctypes.data for a in arrays))
    return lambda: compiled.function(out.ctypes.data, pointers, params.ctypes.data)


def _threads_chosen(kernel: Any, arrays: list[np.ndarray]) -> str:
    """The team size the kernel asks for on this machine (`codegen.c.threads`), where the
    checkout has that module."""
    try:
        from codegen.c import threads
    except ImportError:
        return "-"
    shapes = dict(zip(kernel.inputs, (a.shape for a in arrays), strict=True))
    shapes[kernel.nest.output] = jax.eval_shape(kernel, *arrays).shape
    return str(threads.thread_count(threads.nest_work(kernel.nest, shapes), os.cpu_count() or 1))


def _calm() -> str:
    """Whether kernels start no team now, a thread of a team having started late."""
    try:
        from codegen.c import threads
    except ImportError:
        return "-"
    return "yes" if threads.teams().calm_until > time.monotonic_ns() else "no"


@contextlib.contextmanager
def _busy_core() -> Iterator[None]:
    """A child process spinning on one core for the duration."""
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.5)
        yield
    finally:
        child.terminate()
        child.wait()


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """OpenMP limited to one thread on this (the calling) thread."""
    gomp = ctypes.CDLL("libgomp.so.1")
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(1)
    try:
        yield
    finally:
        gomp.omp_set_num_threads(before)


def _row(name: str, source: str, shapes: Any, twin: Any, reps: int, mode: str) -> str:
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    kernel = td.kernel(source, backend="c")
    jitted, reference = jax.jit(kernel), jax.jit(twin)
    np.testing.assert_allclose(
        np.asarray(jitted(*arrays)), np.asarray(reference(*arrays)), rtol=2e-4, atol=2e-4
    )
    direct = _direct_call(kernel, arrays)
    devices = [jax.device_put(a) for a in arrays]
    direct_ms, cores = _timed(direct, reps)
    calm = _calm()
    times = [
        direct_ms,
        _median_ms(lambda: jitted(*devices).block_until_ready(), reps),
        _median_ms(lambda: reference(*devices).block_until_ready(), reps),
    ]
    cells = " | ".join(f"{t:.3f}" for t in times)
    chosen = _threads_chosen(kernel, arrays)
    return f"| {name} | {mode} | {chosen} | {calm} | {cores:.2f} | {cells} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=41)
    args = parser.parse_args()
    threads = os.environ.get("OMP_NUM_THREADS")
    print(f"load before: {os.getloadavg()[0]:.2f}; OMP_NUM_THREADS={threads}")
    print("| case | other core | threads | calm | cpu/wall | direct ms | jit ms | jnp ms |")
    print("|---|---|---|---|---|---|---|---|")
    for mode, context in (("idle", contextlib.nullcontext), ("busy", _busy_core)):
        with context():
            for case in CASES:
                print(_row(*case, args.reps, mode), flush=True)
    name, source, shapes, twin = CASES[-1]
    with _one_thread():
        print(_row(name, source, shapes, twin, args.reps, "idle, 1 thread (direct only)"))
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
