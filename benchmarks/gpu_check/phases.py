"""The phases of `benchmarks.gpu_check`, one per subprocess: `python -m
benchmarks.gpu_check.phases PHASE --out DIR [--emulate] [--quick]`.

Each phase appends its rows to `DIR/rows-PHASE.jsonl` as it goes (`gpu_check.record`), so
a phase stopped by its time limit keeps what it had found. Every optional import (CuPy,
torch) is guarded: what is missing is a row that says so.
"""

from __future__ import annotations

import argparse
import functools
import os
import pathlib
import platform
import re
import subprocess
import sys
import time
import traceback
import xml.etree.ElementTree as ElementTree
from typing import Any

from benchmarks.gpu_check import record, run_boxed, short

#: Corpus cases under the emulator (each costs compiler time); on a GPU: the whole corpus.
EMULATED_CORPUS = ("matmul", "row_max", "logsumexp_rows", "conv1d_valid", "integer_mask")
QUICK_CORPUS = ("matmul", "logsumexp_rows")
#: The > 2^31-element case: float16 input and output, 2 x 4 GiB plus checks.
LARGE_ELEMENTS = 2**31 + 4099
LARGE_BYTES_NEEDED = 20 * 2**30
LARGE_LABEL = f"Y[i] := X[i] * 2, {LARGE_ELEMENTS} float16 elements (> 2^31)"


def _version(module: str) -> str:
    try:
        imported = __import__(module)
    except Exception as error:  # ImportError, or a broken install
        return f"not importable ({short(error)})"
    return str(getattr(imported, "__version__", "?"))


def _run(command: list[str]) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unavailable ({short(error)})"
    return (done.stdout or done.stderr).strip()


def gpu_info() -> dict[str, Any]:
    """What CuPy and JAX say about the first GPU ({} fields where they are absent)."""
    import jax

    info: dict[str, Any] = {"jax_backend": jax.default_backend()}
    device = jax.devices()[0]
    info["device"] = getattr(device, "device_kind", str(device))
    capability = getattr(device, "compute_capability", None)
    if capability is not None:
        info["compute_capability"] = str(capability)
    try:
        import cupy

        runtime = cupy.cuda.runtime
        info["cuda_runtime"] = runtime.runtimeGetVersion()
        info["cuda_driver"] = runtime.driverGetVersion()
        attributes = cupy.cuda.Device(0).attributes
        info["sm_count"] = attributes["MultiProcessorCount"]
        info["shared_per_block_optin"] = attributes.get("MaxSharedMemoryPerBlockOptin")
        free, total = runtime.memGetInfo()
        info["memory_free_gib"], info["memory_total_gib"] = free / 2**30, total / 2**30
        info["l2_bytes"] = attributes.get("L2CacheSize")
    except Exception as error:  # no CuPy, or no GPU
        info["cupy_gpu"] = f"unavailable ({short(error)})"
    return info


def phase_machine(out: pathlib.Path, emulate: bool, quick: bool) -> None:
    del quick
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "emulated": emulate,
        **{name: _version(name) for name in ("jax", "jaxlib", "numpy", "cupy", "torch")},
    }
    try:
        import torch

        info["torch_cuda"] = str(torch.version.cuda)
        info["torch_gpu"] = torch.cuda.is_available()
    except Exception as error:
        info["torch_cuda"] = f"unavailable ({short(error)})"
    info.update(gpu_info())
    info["nvidia_smi"] = _run(
        [
            "nvidia-smi",
            "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
            "--format=csv,noheader",
        ]
    )
    from codegen.cuda.emulator import emulate as emulator
    from codegen.cuda.run import launch as cuda_launch
    from codegen.cuda.run import nvrtc

    info["nvrtc"] = nvrtc.available() and str(nvrtc._nvrtc().getVersion())
    info["ffi_handler"] = cuda_launch.unavailable_reason() or "available"
    info["emulator"] = emulator.available()
    detail = f"{info['device']}, JAX {info['jax']}, CuPy {info['cupy']}, torch {info['torch']}"
    record(out, "machine", "machine", "ok", detail=detail, info=info)


# --------------------------------------------------------------------------- tests/gpu


def _test_name(node_id: str) -> str:
    """`module::test` of a pytest node id, as junit's classname and name give it."""
    path, _, rest = node_id.partition("::")
    return f"{pathlib.Path(path).stem}::{rest.split('::')[-1]}"


def _pytest(
    out: pathlib.Path, key: str, label: str, args: list[str], env: dict, limit: float
) -> None:
    """Run pytest on `args` within `limit` seconds; one row for the run and one per failing
    test (files named by `key`). Verbose output goes to a file as it runs, so a run stopped
    by the limit still counts what finished."""
    xml_path, log_path = out / f"junit-{key}.xml", out / f"pytest-{key}.txt"
    command = [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "-o", "addopts="]
    command += [f"--junitxml={xml_path}", *args]
    started = time.monotonic()
    code = run_boxed(command, env, log_path, limit)
    seconds = round(time.monotonic() - started, 1)
    outcomes = re.findall(
        # `path::test PASSED` serially; `[gw3] [ 10%] PASSED path::test` under xdist.
        r"^(?:(\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)"
        r"|\[gw\d+\] \[ *\d+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (\S+::\S+))",
        log_path.read_text(errors="replace"),
        re.M,
    )
    outcomes = [(a or d, b or c) for a, b, c, d in outcomes]
    counts = {kind: sum(1 for _, k in outcomes if k == kind) for kind in ("PASSED", "SKIPPED")}
    failing = {_test_name(name): "" for name, kind in outcomes if kind in ("FAILED", "ERROR")}
    if code is not None and xml_path.exists():  # the messages of the failures
        for case in ElementTree.parse(xml_path).getroot().iter("testcase"):
            for bad in (*case.findall("failure"), *case.findall("error")):
                name = f"{(case.get('classname') or '').split('.')[-1]}::{case.get('name')}"
                failing[name] = (bad.get("message") or "")[:300]
    status = "timeout" if code is None else "ok" if code == 0 else "failed"
    ended = f"stopped after {limit:.0f} s" if code is None else f"exit {code}"
    detail = (
        f"{counts['PASSED']} passed, {len(failing)} failed, {counts['SKIPPED']} skipped "
        f"in {seconds} s ({ended})"
    )
    record(out, "tests", label, status, detail=detail, counts=counts)
    for name, message in failing.items():
        record(out, "tests", f"{label}: {name}", "failed", detail=message)


#: tests/gpu files that run the CUDA emulator only, also on a GPU machine.
EMULATOR_ONLY = (
    "test_gpu_check",
    "test_emulator",
    "test_emulator_counts",
    "test_emulated_nests",
    "test_large_indices",
)


def phase_tests(out: pathlib.Path, emulate: bool, quick: bool) -> None:
    """tests/gpu through the FFI handler, then the backend tests through CuPy."""
    env = dict(os.environ)
    # Never the check from inside itself, nor the emulator-only files (CPU minutes).
    ignore = [f"--ignore=tests/gpu/{name}.py" for name in EMULATOR_ONLY] + ["-m", "not slow"]
    if emulate:  # a sample: the whole folder takes many minutes of compiling here
        ffi_args = ["tests/gpu/test_cuda_launch.py", "-x"] + (["-k", "poison"] if quick else [])
        callback_args = ["tests/gpu/test_cuda_backend.py", "-k", "forward and matmul and float32"]
    else:
        # Twelve workers share the GPU (none preallocates): compiling is the CPU-bound part
        # (16 cores on the machines lent so far).
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
        ffi_args = ["tests/gpu", "-n", "12", *ignore]
        callback_args = ["tests/gpu/test_cuda_backend.py", "-n", "12"]
    scale = 2.0 if emulate else 1.0
    _pytest(
        out,
        "ffi",
        "tests/gpu (JAX FFI)",
        ffi_args,
        {**env, "TENSORDSL_GPU_CALL": "ffi"},
        60 * scale,
    )
    _pytest(
        out,
        "callback",
        "test_cuda_backend (CuPy callback)",
        callback_args,
        {**env, "TENSORDSL_GPU_CALL": "callback"},
        35 * scale,
    )


# --------------------------------------------------------------------------- corpus


def _close(got: Any, want: Any, dtype: str) -> tuple[bool, float]:
    import numpy as np

    from tests.gpu.emulated import TOLERANCE

    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.max(np.abs(want64), initial=0.0)))
    error = float(np.max(np.abs(got64 - want64), initial=0.0)) / scale
    return bool(np.all(np.isfinite(got64) == np.isfinite(want64))) and (
        error <= TOLERANCE[dtype] * 2
    ), error


def _corpus_case(out: pathlib.Path, name: str) -> None:
    import jax
    import jax.numpy as jnp

    from tensordsl.binding import primitive as jax_bind
    from tests.compile_only.nests import forward
    from tests.corpus import CORPUS_BY_NAME, make_inputs

    case = CORPUS_BY_NAME[name]
    nest = forward(case)
    values = make_inputs(case, seed=3)

    def operands(dtype: str) -> list[Any]:
        return [
            jnp.asarray(v, jnp.int32 if case.args[n].integer else dtype) for n, v in values.items()
        ]

    def call(backend: str, args: list[Any], dtype: str) -> Any:
        return jax_bind.call_nest(nest, args, backend=backend, shapes={}, out_dtype=dtype)

    for dtype in ("float32", "float64"):
        args = operands(dtype)
        check(
            out,
            f"{name} forward {dtype}",
            dtype,
            lambda a=args, d=dtype: call("cuda", a, d),
            lambda a=args, d=dtype: call("reference", a, d),
        )
    if not case.differentiable:
        return
    args = operands("float64")
    for index, arg_name in enumerate(values):
        if case.args[arg_name].integer:
            continue

        def gradient(backend: str, index: int = index) -> Any:
            def loss(x: Any) -> Any:
                y = call(backend, [*args[:index], x, *args[index + 1 :]], "float64")
                return jnp.sum(y * jnp.cos(jnp.arange(y.size, dtype=y.dtype)).reshape(y.shape))

            return jax.grad(loss)(args[index])

        check(
            out,
            f"{name} grad {arg_name}",
            "float64",
            functools.partial(gradient, "cuda"),
            functools.partial(gradient, "reference"),
        )


def check(out: pathlib.Path, label: str, dtype: str, got: Any, want: Any) -> None:
    """One corpus row: `got()` against `want()`; an exception is a failure with its reason."""
    try:
        ok, error = _close(got(), want(), dtype)
    except Exception as error:
        record(out, "corpus", label, "failed", detail=short(error))
        traceback.print_exc()
        return
    record(out, "corpus", label, "ok" if ok else "failed", detail=f"max error {error:.2g}")


def _jax_free_bytes() -> float:
    """Bytes JAX's allocator can still hand out on the first device (0 when unknown)."""
    import jax

    stats = jax.devices()[0].memory_stats() or {}
    return float(stats.get("bytes_limit", 0) - stats.get("bytes_in_use", 0))


def large_case(out: pathlib.Path, emulate: bool) -> None:
    """`Y[i] := X[i] * 2` over more than 2^31 float16 elements, checked whole on the device."""
    label = LARGE_LABEL
    if emulate:
        record(
            out,
            "corpus",
            label,
            "skipped",
            detail="emulated: toy sizes (minutes on the CPU; tests/gpu/test_large_indices.py)",
        )
        return
    free = _jax_free_bytes()
    if free < LARGE_BYTES_NEEDED:
        record(
            out,
            "corpus",
            label,
            "skipped",
            detail=f"{free / 2**30:.1f} GiB free, {LARGE_BYTES_NEEDED / 2**30:.0f} needed",
        )
        return
    import jax
    import jax.numpy as jnp

    import tensordsl as td

    def run() -> tuple[bool, str]:
        # Jitted, so that XLA fuses the int64 iota and the comparison (no 16 GiB temporaries).
        count = LARGE_ELEMENTS
        x = jax.jit(lambda: (jnp.arange(count, dtype=jnp.int64) % 1021).astype(jnp.float16))()
        y = td.kernel("Y[i] := X[i] * 2", backend="cuda")(X=x)
        wrong = int(jax.jit(lambda x, y: jnp.sum(y != x * 2))(x, y))
        return wrong == 0, f"{wrong} wrong elements; last {float(y[-1])}"

    try:
        ok, detail = run()
    except Exception as error:
        record(out, "corpus", label, "failed", detail=short(error))
        return
    record(out, "corpus", label, "ok" if ok else "failed", detail=detail)


def phase_corpus(out: pathlib.Path, emulate: bool, quick: bool) -> None:
    import jax

    jax.config.update("jax_enable_x64", True)
    os.environ["TENSORDSL_POISON_OUTPUTS"] = "1"
    os.environ["TENSORDSL_XLA_CONTRACTIONS"] = "0"  # the generated kernels, not XLA's dot
    from tests.corpus import CORPUS

    names = QUICK_CORPUS if quick else EMULATED_CORPUS if emulate else [c.name for c in CORPUS]
    large_case(out, emulate)  # first: the corpus may run out of time
    if emulate:
        _build_emulated(names)
    for name in names:
        try:
            _corpus_case(out, name)
        except Exception as error:
            record(out, "corpus", name, "failed", detail=short(error))
            traceback.print_exc()


def _build_emulated(names: tuple[str, ...] | list[str]) -> None:
    """Compile the cases' kernels many per compiler call first (as the emulated tests do)."""
    from tests.gpu import emulated

    launches = []
    for inst in emulated.corpus_instances(tuple(names)):
        dtypes = ("float32", "float64") if inst.role == "forward" else ("float64",)
        launches += [emulated.launch(inst, dtype) for dtype in dtypes]
    emulated.build_all(launches)


def phase_timings(out: pathlib.Path, emulate: bool, quick: bool) -> None:
    from benchmarks.gpu_check import timings as gpu_check_timings

    only = tuple(filter(None, os.environ.get("GPU_CHECK_CASES", "").split(",")))
    gpu_check_timings.run_all(out, emulate, quick, only)


def phase_sweep(out: pathlib.Path, emulate: bool, quick: bool) -> None:
    from benchmarks.gpu_check import sweep

    sweep.phase_sweep(out, emulate, quick)


PHASE_FUNCTIONS = {
    "machine": phase_machine,
    "tests": phase_tests,
    "corpus": phase_corpus,
    "timings": phase_timings,
    "sweep": phase_sweep,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check.phases")
    parser.add_argument("phase", choices=sorted(PHASE_FUNCTIONS))
    parser.add_argument("--out", required=True)
    parser.add_argument("--emulate", action="store_true")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    PHASE_FUNCTIONS[args.phase](pathlib.Path(args.out), args.emulate, args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
