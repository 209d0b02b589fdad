"""float32 math functions in generated C: libm, glibc's vector variants, an inline contender.

Run from the repository root:

    python -m benchmarks.vector_math          # its RESULTS.md section, results/vector_math.json
    python -m benchmarks.vector_math --quick  # small sizes, smoke run; writes nothing

Three implementations of each float32 function, compiled with the C back end's flags (which
have `-fno-math-errno`: GCC vectorises the calls only without errno):

* libm: the scalar calls (`expf`, ...), which a `#pragma omp simd` loop waits on lane by lane;
* libmvec: the same calls declared `omp declare simd` as generated C declares them
  (codegen/c/vecmath.py), so that GCC calls glibc's vector variants: what generated C uses;
* inline: branch-free C in benchmarks/inline_vecmath.h, inlined into the loop.

Loop: `y[i] = f(x[i])` under `#pragma omp simd` over 2^20 float32 inputs uniform on the
function's typical range, one thread; median and minimum of 31 calls, in ms. Error: the
maximum in ulps against float64 over tests/cpu/math_sweep.py's sweep (the tests' sweep).
Layers: `td.kernel(..., backend="c")` under `jax.jit`, 4096x4096 float32, forward and
forward+backward (`value_and_grad` of `sum(out * ct)`), timed in turns (common.time_rounds)
with the libmvec declarations switched off (`-UTDSL_LIBMVEC`: scalar libm calls, as before
them) and on, next to jax.numpy's version; outputs checked against jax.numpy first.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import pathlib
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import tensordsl as td
from benchmarks.common import (
    RESULTS_MD,
    by_implementation,
    finish_run,
    header,
    markers,
    mismatches,
    ms,
    start_run,
    time_rounds,
    write_outputs,
)
from codegen.c import vecmath
from codegen.c.run import compiler
from codegen.ir.functions import FUNCTIONS
from tests.cpu.math_sweep import reference, sweep_inputs, ulp_errors

NAME = "vector_math"
INLINE = pathlib.Path(__file__).resolve().parent / "inline_vecmath.h"

#: function -> its typical range (timing inputs)
RANGES = {
    "exp": (-80.0, 80.0),
    "expm1": (-10.0, 10.0),
    "log": (1e-3, 1e3),
    "log1p": (-0.9, 100.0),
    "tanh": (-6.0, 6.0),
    "sigmoid": (-20.0, 20.0),
    "softplus": (-20.0, 20.0),
    "erf": (-4.0, 4.0),
    "sin": (-100.0, 100.0),
    "cos": (-100.0, 100.0),
}
LOOP_IMPLEMENTATIONS = ("libm", "libmvec", "inline")

_COMPOSITES = """
static inline float sigmoid_(float x) {
    const float e = expf(-fabsf(x));
    return (x >= 0 ? 1.0F : e) / (1 + e);
}
static inline float softplus_(float x) { return (x > 0 ? x : 0.0F) + log1pf(expf(-fabsf(x))); }
"""


def loop_source(implementation: str) -> str:
    """C with `void run_<f>(const float *x, float *y, int64_t n)` for every function."""
    head = ["#include <math.h>", "#include <stdint.h>"]
    if implementation == "inline":
        head.append(INLINE.read_text())
        call = {name: f"vm_{name}(x[i])" for name in RANGES}
    else:
        if implementation == "libmvec":
            head.append(vecmath.declarations([n for n in RANGES if FUNCTIONS[n].libmvec]))
        head.append(_COMPOSITES)
        call = {name: f"{name}f(x[i])" for name in RANGES}
        call.update(sigmoid="sigmoid_(x[i])", softplus="softplus_(x[i])")
    loops = [
        f"void run_{name}(const float *restrict x, float *restrict y, int64_t n) {{\n"
        f"    #pragma omp simd\n    for (int64_t i = 0; i < n; ++i) y[i] = {call[name]};\n}}"
        for name in RANGES
    ]
    return "\n".join([*head, *loops, ""])


def load_loops(implementation: str) -> ctypes.CDLL:
    library = ctypes.CDLL(str(compiler.compile_c(loop_source(implementation))))
    for name in RANGES:
        function = getattr(library, f"run_{name}")
        function.restype = None
        function.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    return library


def time_loop(library: ctypes.CDLL, name: str, size: int, reps: int = 31) -> dict[str, float]:
    """Median and minimum ms of one loop over `size` inputs."""
    low, high = RANGES[name]
    x = np.random.default_rng(0).uniform(low, high, size).astype(np.float32)
    y = np.empty_like(x)
    run = getattr(library, f"run_{name}")
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        run(x.ctypes.data, y.ctypes.data, size)
        times.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(times), "min_ms": min(times)}


def max_error(library: ctypes.CDLL, name: str, count: int) -> float:
    """The largest error in ulps over the tests' sweep of `name` (`count` domain points)."""
    x = sweep_inputs(name, count)
    y = np.full_like(x, np.nan)
    getattr(library, f"run_{name}")(x.ctypes.data, y.ctypes.data, x.size)
    return float(np.max(ulp_errors(y, reference(name, x))))


def loop_rows(size: int, sweep: int) -> list[dict[str, Any]]:
    libraries = {kind: load_loops(kind) for kind in LOOP_IMPLEMENTATIONS}
    rows = []
    for name in RANGES:
        row: dict[str, Any] = {"function": name}
        for kind, library in libraries.items():
            row[kind] = {**time_loop(library, name, size), "ulps": max_error(library, name, sweep)}
        rows.append(row)
    return rows


LAYERS = {
    "softmax row (logsumexp)": (
        "(logsumexp) L[i] := X[i,j]",
        lambda x: jax.nn.logsumexp(x, axis=1),
    ),
    "GELU (tanh)": (
        "Y[i,j] := 0.5*X[i,j]*(1+tanh(0.7978845608*(X[i,j]+0.044715*X[i,j]^3)))",
        lambda x: jax.nn.gelu(x, approximate=True),
    ),
    "sigmoid": ("Y[i,j] := sigmoid(X[i,j])", jax.nn.sigmoid),
}
LAYER_IMPLEMENTATIONS = {"libm": "-UTDSL_LIBMVEC", "libmvec": "", "XLA": None}
MODES = ("fwd", "fwd+bwd")


@contextlib.contextmanager
def cflags(flags: str) -> Iterator[None]:
    """`TENSORDSL_CFLAGS` with `flags` appended, inside the block."""
    before = os.environ.get("TENSORDSL_CFLAGS", "")
    os.environ["TENSORDSL_CFLAGS"] = f"{before} {flags}"
    try:
        yield
    finally:
        os.environ["TENSORDSL_CFLAGS"] = before


def _modes(f: Callable[[jax.Array], jax.Array], ct: jax.Array) -> dict[str, Callable[..., Any]]:
    backward = jax.value_and_grad(lambda v: jnp.sum(f(v) * ct))
    return {"fwd": jax.jit(f), "fwd+bwd": jax.jit(backward)}


def layer_row(label: str, x: jax.Array, budget_s: float, settle_s: float) -> dict[str, Any]:
    """Every implementation of one layer, built, checked against XLA, timed in turns."""
    source, jnp_version = LAYERS[label]
    shape = jax.eval_shape(jnp_version, x).shape
    ct = jnp.asarray(np.random.default_rng(1).standard_normal(shape), jnp.float32)
    want = {mode: fn(x) for mode, fn in _modes(jnp_version, ct).items()}
    fns, failures = {}, {}
    for impl, flags in LAYER_IMPLEMENTATIONS.items():
        f = jnp_version if flags is None else td.kernel(source, backend="c")
        with cflags(flags or ""):  # kernels build at the first (traced) call
            for mode, fn in _modes(f, ct).items():
                wrong = mismatches(fn(x), want[mode], 1e-4)
                if wrong:
                    failures.setdefault(impl, {})[mode] = "error: " + ", ".join(wrong)
                else:
                    fns[(impl, mode)] = fn
    times = time_rounds(fns, dict.fromkeys(LAYER_IMPLEMENTATIONS, [x]), budget_s, settle_s)
    return {"layer": label, **by_implementation(times, failures, LAYER_IMPLEMENTATIONS, MODES)}


def loop_table(rows: list[dict[str, Any]], size: int) -> str:
    lines = [
        f"`y[i] = f(x[i])` over {size} float32 inputs, one thread: median (min) ms; the",
        "largest error against float64 in ulps over the tests' sweep.",
        "",
        "| function | libm ms | libmvec ms | inline ms | libm ulps | libmvec ulps | inline ulps |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        cells = [
            f"{row[k]['median_ms']:.2f} ({row[k]['min_ms']:.2f})" for k in LOOP_IMPLEMENTATIONS
        ]
        cells += [f"{row[k]['ulps']:.2f}" for k in LOOP_IMPLEMENTATIONS]
        lines.append(f"| {row['function']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def layer_table(rows: list[dict[str, Any]], side: int) -> str:
    lines = [
        f"Layers on {side}x{side} float32 under `jax.jit`: median ms (C kernels with the",
        "libmvec declarations off and on, and jax.numpy's version).",
        "",
        "| layer | libm fwd | libmvec fwd | XLA fwd | libm fwd+bwd | libmvec fwd+bwd"
        " | XLA fwd+bwd |",
        "|---|--:|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        cells = [ms(row[impl][mode]) for mode in MODES for impl in LAYER_IMPLEMENTATIONS]
        lines.append(f"| {row['layer']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def section(loops: list[dict[str, Any]], layers: list[dict[str, Any]], info: dict) -> str:
    begin, end = markers(NAME)
    return "\n\n".join(
        [
            begin,
            "## float32 math functions",
            f"Generated by `python -m benchmarks.{NAME}` (benchmarks/{NAME}.py says what is "
            "measured).",
            header(info),
            loop_table(loops, info["size"]),
            layer_table(layers, info["side"]),
            end,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, smoke run")
    parser.add_argument("--out", help="Markdown file to write the section into")
    options = parser.parse_args(argv)
    size, sweep, side = (1 << 12, 2000, 64) if options.quick else (1 << 20, 1_000_000, 4096)
    budget, settle = (0.2, 0.0) if options.quick else (20.0, 0.3)
    info = start_run(size=size, side=side)
    loops = loop_rows(size, sweep)
    x = jnp.asarray(np.random.default_rng(0).standard_normal((side, side)), jnp.float32)
    layers = []
    for label in LAYERS:
        print(f"... {label}", file=sys.stderr, flush=True)
        layers.append(layer_row(label, x, budget, settle))
    finish_run(info)
    text = section(loops, layers, info)
    print(text)
    out = options.out or (None if options.quick else RESULTS_MD)
    write_outputs(out, NAME, text, {"machine": info, "loops": loops, "layers": layers})
    return 0


if __name__ == "__main__":
    sys.exit(main())
