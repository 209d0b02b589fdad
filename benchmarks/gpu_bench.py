"""GPU benchmarks: the cuda back end against XLA (float32), forward and forward+backward.

Median of CUDA-event timings (cupy.cuda.Event on the current stream) after warm-up. Prints a
table and appends it to benchmarks/RESULTS.md with the GPU name and the date. Needs a GPU.
Pure contractions run as generated kernels here (`TENSORDSL_XLA_CONTRACTIONS=0`, unless set
otherwise): by default the cuda back end gives them to XLA's dot, which would be XLA timed
against itself.
"""

from __future__ import annotations

import datetime
import os
import pathlib
import statistics

import jax
import jax.numpy as jnp
import numpy as np

import tensordsl as td

RESULTS = pathlib.Path(__file__).parent / "RESULTS.md"
HI = jax.lax.Precision.HIGHEST
CASES = [
    (
        "matmul 4096^3",
        "C[i,j] := A[i,k] * B[k,j]",
        "sum",
        [(4096, 4096), (4096, 4096)],
        lambda A, B: jnp.einsum("ik,kj->ij", A, B, precision=HI),
    ),
    (
        "pairwise 16384^2 k=64",
        "D[i,j] := (X[i,k] - Y[j,k])^2",
        "sum",
        [(16384, 64), (16384, 64)],
        lambda X, Y: jnp.sum((X[:, None, :] - Y[None, :, :]) ** 2, axis=-1),
    ),
    (
        "conv2d 64->64 3x3 on 128^2",
        "Y[o,y,x] := I[c,y+dy,x+dx] * K[o,c,dy,dx]",
        "sum",
        [(64, 130, 130), (64, 64, 3, 3)],
        lambda I, K: jax.lax.conv_general_dilated(I[None], K, (1, 1), "VALID", precision=HI)[0],
    ),
    (
        "logsumexp rows 8192x8192",
        "L[i] := X[i,j]",
        "logsumexp",
        [(8192, 8192)],
        lambda X: jax.nn.logsumexp(X, axis=1),
    ),
    ("row max 8192x8192", "M[i] := X[i,j]", "max", [(8192, 8192)], lambda X: jnp.max(X, axis=1)),
    ("full sum 2^26 (split)", "s := X[i]", "sum", [(2**26,)], jnp.sum),
    (
        "full logsumexp 8192x8192 (split)",
        "s := X[i,j]",
        "logsumexp",
        [(8192, 8192)],
        jax.nn.logsumexp,
    ),
]


def timed(function, *args, warmup: int = 3, repeats: int = 15) -> float:
    """Median milliseconds of `function(*args)` measured with CUDA events."""
    import cupy

    for _ in range(warmup):
        jax.block_until_ready(function(*args))
    times = []
    for _ in range(repeats):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        jax.block_until_ready(args)
        start.record()
        jax.block_until_ready(function(*args))
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    return statistics.median(times)


def main() -> None:
    os.environ.setdefault("TENSORDSL_XLA_CONTRACTIONS", "0")  # our matmul kernel, not XLA's
    rng = np.random.default_rng(0)
    rows = [
        "| kernel | ours fwd ms | XLA fwd ms | ours fwd+bwd ms | XLA fwd+bwd ms |",
        "|---|---|---|---|---|",
    ]
    for name, source, reduce, shapes, xla in CASES:
        args = [jnp.asarray(rng.standard_normal(s), jnp.float32) for s in shapes]
        k = td.kernel(source, reduce=reduce, backend="cuda")
        argnums = tuple(range(len(args)))
        ours_f = jax.jit(k)
        xla_f = jax.jit(xla)
        ours_b = jax.jit(jax.grad(lambda *a, k=k: jnp.sum(k(*a)), argnums=argnums))
        xla_b = jax.jit(jax.grad(lambda *a, xla=xla: jnp.sum(xla(*a)), argnums=argnums))
        figures = [timed(f, *args) for f in (ours_f, xla_f, ours_b, xla_b)]
        rows.append(f"| {name} | " + " | ".join(f"{t:.3f}" for t in figures) + " |")
        print(rows[-1], flush=True)
    gpu = jax.devices()[0].device_kind
    table = "\n".join([f"### GPU: {gpu}, {datetime.date.today()} (float32, median)", "", *rows])
    print(table)
    with RESULTS.open("a") as handle:
        handle.write("\n" + table + "\n")


if __name__ == "__main__":
    main()
