"""Gaussian-kernel matvec: tensordsl next to KeOps (CPU) and jax.numpy, forward and dX.

Run from the repository root:

    python -m benchmarks.gaussian            # N = 4000 and 20000; rewrites its RESULTS.md section
    python -m benchmarks.gaussian --quick    # N = 500, smoke run (< 60 s); writes nothing

    Y[i] = sum_j exp(-|X[i] - Z[j]|^2) B[j],   X: (N, 3), Z: (N, 3), B: (N,), float32

Written in tensordsl as one statement with the three coordinates spelled out (the sum over
the coordinates sits inside `exp`, which a single statement with a reduced index `d` cannot
say: the reduction applies to the whole body). Per N and implementation: the forward `Y`, and
the gradient of `sum(Y * ct)` with respect to X alone (`ct` a fixed random cotangent):

* tensordsl: `jax.jit(kernel)` and `jax.jit(jax.grad(loss, argnums=0))` (XLA drops the unused
  forward nest, so the gradient time is the gradient nest's);
* KeOps (pykeops, CPU, float32): `Genred("Exp(-SqDist(x,z))*b")` and
  `Genred("Grad(Exp(-SqDist(x,z))*b, x, e)")` on NumPy arrays; skipped, with the reason
  printed and in the table, when pykeops is missing or cannot compile here (it needs g++ and
  the Python headers; no CUDA);
* jax.numpy: the broadcast form, which stores N x N matrices; run only where they fit in
  `JNP_MEMORY_LIMIT` bytes.

Before timing, every result is checked against a float64 NumPy reference on `CHECK_ROWS`
rows (all rows in --quick). Times: medians, implementations in turns (benchmarks/common.py);
at N >= 10000 a call takes seconds and the median is of 3 repetitions (one per round).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import (
    MIN_REPS,
    RESULTS_MD,
    ROUNDS,
    by_implementation,
    close,
    finish_run,
    header,
    markers,
    median_of,
    ms,
    over,
    ratio,
    short,
    start_run,
    time_rounds,
    verdict,
    write_outputs,
)

NAME = "gaussian"
SOURCE = "Y[i] := exp(-((X[i,0]-Z[j,0])^2 + (X[i,1]-Z[j,1])^2 + (X[i,2]-Z[j,2])^2)) * B[j]"
OURS, KEOPS, JNP = "tensordsl C", "KeOps (CPU)", "jax.numpy"
SIZES, QUICK_SIZES = (4000, 20000), (500,)
CHECK_ROWS = 256
JNP_MEMORY_LIMIT = 2 * 2**30  # bytes: about four N x N float32 matrices
KEOPS_FORMULA = "Exp(-SqDist(x,z)) * b"
KEOPS_VARIABLES = ["x = Vi(3)", "z = Vj(3)", "b = Vj(1)"]

#: Targets from issue 14 (N = 20000).
FASTER_THAN_KEOPS = 4.0
GRAD_OVER_FWD = 2.5


def inputs(n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(n)
    return {
        "X": (0.5 * rng.standard_normal((n, 3))).astype(np.float32),
        "Z": (0.5 * rng.standard_normal((n, 3))).astype(np.float32),
        "B": rng.standard_normal(n).astype(np.float32),
        "ct": rng.standard_normal(n).astype(np.float32),
    }


def reference(data: dict[str, np.ndarray], rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Y and dX on `rows`, in float64 NumPy."""
    x, z = data["X"][rows].astype(np.float64), data["Z"].astype(np.float64)
    diff = x[:, None, :] - z[None, :, :]
    weight = np.exp(-(diff**2).sum(-1)) * data["B"].astype(np.float64)
    y = weight.sum(1)
    dx = -2 * data["ct"][rows, None] * (weight[:, :, None] * diff).sum(1)
    return y, dx


# --------------------------------------------------------------------------- implementations


def ours() -> tuple[Callable[..., Any], Callable[..., Any]]:
    import tensordsl as td

    kernel = td.kernel(SOURCE, backend="c")

    def loss(x: Any, z: Any, b: Any, ct: Any) -> Any:
        return jnp.sum(kernel(x, z, b) * ct)

    return jax.jit(lambda x, z, b, ct: kernel(x, z, b)), jax.jit(jax.grad(loss, argnums=0))


def keops() -> tuple[Callable[..., Any], Callable[..., Any]]:
    """KeOps' forward and dX reductions (raises when pykeops is missing or cannot compile)."""
    from pykeops.numpy import Genred

    forward = Genred(KEOPS_FORMULA, KEOPS_VARIABLES, reduction_op="Sum", axis=1)
    grad_x = Genred(
        f"Grad({KEOPS_FORMULA}, x, e)", [*KEOPS_VARIABLES, "e = Vi(1)"], reduction_op="Sum", axis=1
    )

    def fwd(x: Any, z: Any, b: Any, ct: Any) -> Any:
        return forward(x, z, b[:, None], backend="CPU")[:, 0]

    def grad(x: Any, z: Any, b: Any, ct: Any) -> Any:
        return grad_x(x, z, b[:, None], ct[:, None], backend="CPU")

    return fwd, grad


def jnp_version() -> tuple[Callable[..., Any], Callable[..., Any]]:
    def forward(x: Any, z: Any, b: Any) -> Any:
        return jnp.exp(-((x[:, None, :] - z[None, :, :]) ** 2).sum(-1)) @ b

    def loss(x: Any, z: Any, b: Any, ct: Any) -> Any:
        return jnp.sum(forward(x, z, b) * ct)

    return jax.jit(lambda x, z, b, ct: forward(x, z, b)), jax.jit(jax.grad(loss, argnums=0))


IMPLEMENTATIONS = {OURS: ours, KEOPS: keops, JNP: jnp_version}


def skip_reason(impl: str, n: int) -> str | None:
    if impl == JNP and 4 * n * n * 4 > JNP_MEMORY_LIMIT:
        return f"not run: four {n}x{n} float32 matrices exceed {JNP_MEMORY_LIMIT / 2**30:g} GiB"
    return None


# --------------------------------------------------------------------------- measuring


def check(fns: tuple[Any, Any], args: list[Any], want: tuple[Any, Any], rows: Any) -> dict:
    """Errors by mode ("fwd", "grad") where `fns` disagree with the float64 reference."""
    failed = {}
    for mode, fn, expected, tol in zip(("fwd", "grad"), fns, want, (1e-4, 1e-3)):
        try:
            ok, err = close(np.asarray(fn(*args))[rows], expected, tol)
            if not ok:
                failed[mode] = f"error: differs from float64 NumPy (max rel err {err:.1e})"
        except Exception as error:  # noqa: BLE001 - reported in the table
            failed[mode] = "error: " + short(error)
    return failed


def run_size(n: int, quick: bool, budget: float, settle: float) -> dict[str, Any]:
    data = inputs(n)
    rows = np.arange(n) if quick else np.random.default_rng(0).choice(n, CHECK_ROWS, False)
    want = reference(data, rows)
    row: dict[str, Any] = {"n": n, "impls": {}}
    fns, args, failed = {}, {}, {}
    for impl, make in IMPLEMENTATIONS.items():
        failed[impl] = dict.fromkeys(("fwd", "grad"), skip_reason(impl, n))
        if failed[impl]["fwd"] is not None:
            continue
        arrays = [data[k] for k in ("X", "Z", "B", "ct")]
        args[impl] = arrays if impl == KEOPS else [jax.device_put(a) for a in arrays]
        try:
            pair = make()
        except Exception as error:  # noqa: BLE001 - reported in the table
            print(f"{impl}: not run: {short(error)}", file=sys.stderr)
            failed[impl] = dict.fromkeys(("fwd", "grad"), "not run: " + short(error))
            continue
        failed[impl] = check(pair, args[impl], want, rows)
        fns.update({(impl, m): f for m, f in zip(("fwd", "grad"), pair) if m not in failed[impl]})
    # N = 20000 takes seconds a call: one repetition per round is enough for a median of 3.
    times = time_rounds(fns, args, budget, settle, min_reps=ROUNDS if n >= 10000 else MIN_REPS)
    row["impls"] = by_implementation(times, failed, IMPLEMENTATIONS, ("fwd", "grad"))
    return row


# --------------------------------------------------------------------------- report


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| N | implementation | fwd ms | grad X ms | grad/fwd | ours/KeOps fwd | ours/KeOps grad |",
        "|--:|---|--:|--:|--:|--:|--:|",
    ]
    for row in rows:
        for impl, entry in row["impls"].items():
            cells = [str(row["n"]), impl, ms(entry["fwd"]), ms(entry["grad"])]
            cells.append(ratio(over(median_of(row, impl, "grad"), median_of(row, impl, "fwd"))))
            for mode in ("fwd", "grad"):
                r = over(median_of(row, OURS, mode), median_of(row, KEOPS, mode))
                cells.append(ratio(r) if impl == OURS else "")
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def targets(rows: list[dict[str, Any]]) -> str:
    out = []
    for row in rows:
        if row["n"] != SIZES[-1]:
            continue
        r = over(median_of(row, KEOPS, "fwd"), median_of(row, OURS, "fwd"))
        ok = None if r is None else r >= FASTER_THAN_KEOPS
        out.append(
            f"- N={row['n']}: forward at least {FASTER_THAN_KEOPS:g}x faster than KeOps — "
            f"{verdict(ok)} (KeOps/ours = {ratio(r) or 'n/a'})"
        )
        r = over(median_of(row, OURS, "grad"), median_of(row, OURS, "fwd"))
        ok = None if r is None else r <= GRAD_OVER_FWD
        out.append(
            f"- N={row['n']}: gradient at most {GRAD_OVER_FWD:g}x our forward — {verdict(ok)} "
            f"(grad/fwd = {ratio(r) or 'n/a'})"
        )
    return "\n".join(out) or "- not measured (N=20000 not run)"


def keops_version() -> str:
    try:
        import keopscore.config
        import pykeops

        flags = " ".join(f for f in keopscore.config.cpp_flags.split() if not f.startswith("-I"))
        return f"pykeops {pykeops.__version__}, CPU code built with `g++ {flags}`"
    except Exception as error:  # noqa: BLE001 - informational only
        return f"pykeops missing ({short(error)})"


def section(rows: list[dict[str, Any]], info: dict[str, Any]) -> str:
    begin, end = markers(NAME)
    return f"""{begin}
## Gaussian-kernel matvec (issue 14)

Generated by `python -m benchmarks.{NAME}` (benchmarks/{NAME}.py); the text between the
{NAME} markers is rewritten by that script.

{header(info, "; " + info["keops"])}

`{SOURCE}`, D = 3, float32, N points X and N centres Z. "grad X": the gradient of
`sum(Y * ct)` with respect to X alone (tensordsl: `jax.grad`, the gradient nest; KeOps:
`Grad(Exp(-SqDist(x,z))*b, x, e)` with `e = ct`). Medians in milliseconds, implementations in
turns (3 rounds; >= 9 repetitions, 3 at N >= 10000; see the JSON); every result was checked
against float64 NumPy on {CHECK_ROWS} random rows (rtol 1e-4 forward, 1e-3 gradient, relative
to the largest magnitude) before it was timed. jax.numpy stores N x N matrices and is run
only where four of them fit in {JNP_MEMORY_LIMIT / 2**30:g} GiB. No generic-D form: with `d`
reduced, `Y[i] := exp(-(X[i,d]-Z[j,d])^2) * B[j]` is the sum over j and d of one-coordinate
exponentials, not this kernel (the reduction applies to the whole body, and one statement has
one reduction), so the three coordinates are spelled out.

{table(rows)}

### Targets (issue 14)

{targets(rows)}

Raw numbers: `benchmarks/results/{NAME}.json`.
{end}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 500, smoke run")
    parser.add_argument("--out", help="Markdown file to write the section into")
    options = parser.parse_args(argv)
    info = start_run(keops=keops_version())
    budget, settle = (0.3, 0.02) if options.quick else (10.0, 0.3)
    rows = []
    for n in QUICK_SIZES if options.quick else SIZES:
        print(f"... N={n}", file=sys.stderr, flush=True)
        rows.append(run_size(n, options.quick, budget, settle))
    finish_run(info)
    print(table(rows))
    print(targets(rows))
    out = options.out or (None if options.quick else RESULTS_MD)
    write_outputs(out, NAME, section(rows, info), {"machine": info, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
