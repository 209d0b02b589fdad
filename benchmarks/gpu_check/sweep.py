"""The sweep phase of `benchmarks.gpu_check`: candidate tile settings of the pallas back end
per kind of kernel, timed, and the tuning table's rows they give (`codegen/tiles/tuning.py`).

For each case (a nest, its shapes on a GPU or under `--emulate`, a dtype) every candidate
`TuningRow` builds the case's tile program (`tile_program(..., tuned=row)`) and runs it
(`tensordsl.backends.pallas.run.run_program`); a result off the float64-checked jnp value by
more than the precision's tolerance is a failed row, never a winner. The same nest on the
`cuda` back end (as `auto` would run it today) is timed beside. The fastest candidate of
each key becomes a row of `DIR/tuning-rows.json`, in `tuning.json`'s format, rewritten after
each case (a timeout keeps what was found): "measured on <device>, <date>: ..." with the
back end `auto` should prefer, the faster of pallas and cuda.

Under `--emulate` (the CPU: Pallas' interpret mode, the CUDA emulator) the same code runs at
toy sizes as a dry run: its rows say "default: emulated dry run, not a measurement" and
prefer no back end, so they can never pass for GPU figures.

    python -m benchmarks.gpu_check.sweep merge DIR/tuning-rows.json   # into codegen/tiles

merges a GPU run's rows into the committed table (a row of the same key is replaced).
"""

from __future__ import annotations

import datetime
import json
import pathlib
import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.gpu_check import record, short


@dataclass(frozen=True)
class SweepCase:
    name: str
    source: str
    #: Shapes on a GPU and under the emulator, by input name.
    shapes: dict[str, tuple[int, ...]]
    toy_shapes: dict[str, tuple[int, ...]]
    #: The expected value from float64 inputs (NumPy).
    expected: Callable[..., Any]


def _logsumexp(x: Any) -> Any:
    peak = x.max(axis=1, keepdims=True)
    return (peak + np.log(np.exp(x - peak).sum(axis=1, keepdims=True)))[:, 0]


CASES = (
    SweepCase(
        "matmul",
        "C[i,j] := A[i,k] * B[k,j]",
        {"A": (2048, 2048), "B": (2048, 2048)},
        {"A": (64, 48), "B": (48, 40)},
        lambda a, b: a @ b,
    ),
    SweepCase(
        "causal scores",
        "S[i,j] := Q[i,d] * K[j,d] * (j <= i)",
        {"Q": (2048, 64), "K": (2048, 64)},
        {"Q": (64, 16), "K": (64, 16)},
        lambda q, k: np.tril(q @ k.T),
    ),
    SweepCase(
        "causal weighted sum",
        "O[i,e] := P[i,j] * V[j,e] * (j <= i)",
        {"P": (2048, 2048), "V": (2048, 64)},
        {"P": (64, 64), "V": (64, 16)},
        lambda p, v: np.tril(p) @ v,
    ),
    SweepCase(
        "row logsumexp",
        "(logsumexp) L[i] := X[i,j]",
        {"X": (4096, 8192)},
        {"X": (16, 600)},
        _logsumexp,
    ),
)
DTYPES = ("float32", "bfloat16")
#: Candidate (free tile, reduced tile, num_warps, num_stages) per kind; the default first.
CANDIDATES = {
    "dot": (
        (32, 32, 4, 2),
        (64, 32, 4, 3),
        (128, 32, 4, 3),
        (64, 64, 4, 3),
        (128, 64, 8, 3),
        (128, 32, 8, 4),
        (64, 32, 4, 4),
        (128, 128, 8, 2),
    ),
    "reduce": ((32, 16, 4, 2), (16, 64, 4, 2), (8, 256, 4, 2), (32, 128, 8, 3), (4, 1024, 8, 2)),
}
QUICK_CANDIDATES = 2
#: What an emulated run's rows say instead of a measurement.
DRY_RUN = "default: emulated dry run, not a measurement"


def candidates(key: Any, quick: bool) -> list[Any]:
    """The candidate rows of `key` (valid for `tuning.parse`), the default first."""
    from codegen.tiles import tuning

    found = []
    for free, reduced, warps, stages in CANDIDATES.get(key.kind, ())[
        : QUICK_CANDIDATES if quick else None
    ]:
        settings = {"free_tile": free, "reduced_tile": reduced}
        settings |= {"num_warps": warps, "num_stages": stages}
        found.append(tuning.TuningRow(key, **settings, backend=None, source="default: candidate"))
    return found


def phase_sweep(out: pathlib.Path, emulate: bool, quick: bool) -> None:
    """Time every case's candidates; write `tuning-rows.json` after each case."""
    import jax

    from benchmarks.gpu_check.timings import timer

    measure = timer(emulate)
    device = jax.devices()[0].device_kind
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    rows: list[dict[str, Any]] = []
    for case in CASES[:2] if quick else CASES:
        for dtype in DTYPES[:1] if quick else DTYPES:
            try:
                row = sweep_case(out, case, dtype, emulate, quick, measure)
            except Exception as error:  # a case that cannot run is a row, the next still runs
                record(out, "sweep", case.name, "failed", mode=dtype, detail=short(error))
                traceback.print_exc()
                continue
            if row is not None:
                best, pallas_ms, cuda_ms = row
                rows.append(finish_row(best, pallas_ms, cuda_ms, device, date, emulate))
                write_rows(out / "tuning-rows.json", rows)


def sweep_case(
    out: pathlib.Path,
    case: SweepCase,
    dtype: str,
    emulate: bool,
    quick: bool,
    measure: Callable[[Callable[[], Any]], float],
) -> tuple[Any, float, float | None] | None:
    """Every candidate of one case and dtype: (the fastest, its ms, cuda's ms or None)."""
    import jax
    import jax.numpy as jnp

    import tensordsl as td
    from codegen.tiles.build import tile_program, tuning_key
    from codegen.tiles.precision import HALF, MODES
    from tensordsl.backends.pallas.run import run_program

    shapes = case.toy_shapes if emulate else case.shapes
    k = td.kernel(case.source, backend="pallas")
    rng = np.random.default_rng(0)
    by_name = {name: jnp.asarray(rng.normal(size=shapes[name]), dtype) for name in k.inputs}
    values = [by_name[name] for name in k.inputs]
    want = case.expected(*(np.asarray(v, np.float64) for v in values))
    nest = k.nest
    operands = [by_name[op.name] for op in nest.operands]
    all_shapes = {**shapes, nest.output: tuple(np.shape(want))}
    dtypes = {**{name: dtype for name in k.inputs}, nest.output: dtype}
    key = tuning_key(nest, all_shapes, dtypes)
    tolerance = HALF[dtype].tolerance if dtype in HALF else MODES["default"].tolerance
    label = f"{case.name} {_shape_text(shapes)}"
    best: tuple[float, Any] | None = None
    for row in candidates(key, quick):
        settings = (
            f"pallas free {row.free_tile} reduced {row.reduced_tile} "
            f"warps {row.num_warps} stages {row.num_stages}"
        )
        try:
            program = tile_program(nest, all_shapes, dtypes, tuned=row)
            run = jax.jit(lambda *v, p=program: run_program(p, v, dtype))
            error = _relative_error(run(*operands), want)
            if not error <= tolerance:
                raise AssertionError(f"relative error {error:.2e} > {tolerance:g}")
            ms = measure(lambda run=run: run(*operands))
        except Exception as error:
            record(out, "sweep", label, "failed", mode=dtype, impl=settings, detail=short(error))
            continue
        record(out, "sweep", label, "ok", mode=dtype, impl=settings, ms=ms, detail=key.describe())
        if best is None or ms < best[0]:
            best = (ms, row)
    if best is None:
        return None
    cuda_ms = _time_cuda(out, case, label, dtype, values, want, tolerance, measure)
    return best[1], best[0], cuda_ms


def _time_cuda(
    out: pathlib.Path,
    case: SweepCase,
    label: str,
    dtype: str,
    values: Sequence[Any],
    want: Any,
    tolerance: float,
    measure: Callable[[Callable[[], Any]], float],
) -> float | None:
    """The cuda back end on the same nest (as `auto` runs it without a row), or None."""
    import jax

    import tensordsl as td

    try:
        run = jax.jit(td.kernel(case.source, backend="cuda"))
        error = _relative_error(run(*values), want)
        if not error <= tolerance:
            raise AssertionError(f"relative error {error:.2e} > {tolerance:g}")
        ms = measure(lambda: run(*values))
    except Exception as error:
        record(out, "sweep", label, "failed", mode=dtype, impl="cuda", detail=short(error))
        return None
    record(out, "sweep", label, "ok", mode=dtype, impl="cuda", ms=ms)
    return ms


def finish_row(
    row: Any, pallas_ms: float, cuda_ms: float | None, device: str, date: str, emulate: bool
) -> dict[str, Any]:
    """The table row of a key's fastest candidate, in `tuning.json`'s format."""
    import dataclasses

    if emulate:
        return dataclasses.replace(row, backend=None, source=DRY_RUN).as_json()
    faster = None if cuda_ms is None else ("pallas" if pallas_ms < cuda_ms else "cuda")
    cuda = "cuda failed" if cuda_ms is None else f"cuda {cuda_ms:.4g} ms"
    source = f"measured on {device}, {date}: pallas {pallas_ms:.4g} ms, {cuda}"
    return dataclasses.replace(row, backend=faster, source=source).as_json()


def write_rows(path: pathlib.Path, rows: Sequence[dict[str, Any]]) -> None:
    """`rows` as a table in `tuning.json`'s format, checked by `tuning.parse` first."""
    from codegen.tiles import tuning

    table = {"format": tuning.FORMAT, "rows": list(rows)}
    tuning.parse(table)
    path.write_text(json.dumps(table, indent=1) + "\n")


def merge(found: pathlib.Path, into: pathlib.Path | None = None) -> int:
    """Merge the rows of a sweep's `tuning-rows.json` into the committed table (a row of the
    same key replaced); dry-run rows are refused. Returns the number of rows merged."""
    from codegen.tiles import tuning

    into = into or tuning.TABLE_PATH
    new = tuning.parse(json.loads(found.read_text()))
    if any(not row.measured for row in new.values()):
        raise ValueError(f"{found} holds rows that are no measurement (an emulated dry run?)")
    table = json.loads(into.read_text())
    rows = {**tuning.parse(table), **new}
    table["rows"] = [row.as_json() for row in rows.values()]
    tuning.parse(table)
    into.write_text(json.dumps(table, indent=1) + "\n")
    return len(new)


def _relative_error(got: Any, want: Any) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-30))


def _shape_text(shapes: dict[str, tuple[int, ...]]) -> str:
    return " ".join(f"{name}{'x'.join(map(str, shape))}" for name, shape in shapes.items())


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "merge":
        sys.exit("usage: python -m benchmarks.gpu_check.sweep merge DIR/tuning-rows.json")
    print(f"merged {merge(pathlib.Path(sys.argv[2]))} rows into codegen/tiles/tuning.json")
