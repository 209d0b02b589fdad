"""Time every C nest a kernel's forward+backward runs, one by one, outside JAX.

Run from the repository root:

    python -m benchmarks.profile_nests                 # the run_cpu cases, full sizes
    python -m benchmarks.profile_nests --quick         # small sizes
    python -m benchmarks.profile_nests --case conv2d   # cases whose name contains "conv2d"

The nests are read off the jaxpr of `jax.value_and_grad` (every `nest_p` equation, with its
static extents and operand shapes), compiled with the C back end and called directly with
random NumPy inputs; each figure is the median of `--reps` calls in milliseconds. This is a
diagnostic for finding the slow gradient nest, not a results table: run_cpu.py is that.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import tensordsl as td
from benchmarks.run_cpu import cases, make_inputs
from codegen.build import build_c


def nest_equations(jaxpr: Any) -> list[Any]:
    """Every `nest_p` equation of `jaxpr` and of the jaxprs in its parameters, in order."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "tensordsl_nest":
            found.append(eqn)
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                found.extend(nest_equations(inner))
    return found


def time_call(function: Any, reps: int, *args: Any) -> float:
    """Median milliseconds of `function(*args)` over `reps` calls after one warm-up."""
    function(*args)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        function(*args)
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def profile(source: str, reduce: str | None, inputs: list[Any], ct: Any, reps: int) -> None:
    kernel = td.kernel(source, backend="c", reduce=reduce)

    def loss(*args: Any) -> Any:
        return jnp.sum(kernel(*args) * ct)

    closed = jax.make_jaxpr(jax.value_and_grad(loss, argnums=tuple(range(len(inputs)))))(*inputs)
    rng = np.random.default_rng(0)
    for eqn in nest_equations(closed.jaxpr):
        nest = eqn.params["nest"]
        dtypes = {op.name: v.aval.dtype.name for op, v in zip(nest.operands, eqn.invars)}
        out = eqn.outvars[0].aval
        dtypes[nest.output] = out.dtype.name
        compiled = build_c(nest, dtypes=dtypes, schedule=eqn.params.get("schedule"))
        operands = []
        for v in eqn.invars:
            aval = v.aval
            if np.issubdtype(aval.dtype, np.integer):
                operands.append(np.zeros(aval.shape, aval.dtype))
            else:
                operands.append(rng.standard_normal(aval.shape).astype(aval.dtype))
        target = np.empty(out.shape, out.dtype)
        extents = dict(eqn.params["extents"])
        ms = time_call(compiled, reps, target, operands, extents)
        print(f"  {ms:9.3f} ms  {nest}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--case", default="")
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    for case in cases(args.quick):
        if args.case not in case.name:
            continue
        print(case.name)
        inputs, ct = make_inputs(case)
        profile(case.source, case.reduce, inputs, ct, args.reps)


if __name__ == "__main__":
    main()
