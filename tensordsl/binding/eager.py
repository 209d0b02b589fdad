"""`nest_p` called outside any trace (an eager call): the kernel run directly, no XLA program.

JAX runs a primitive called on concrete arrays by compiling a jit of it, once per shapes and
parameters: the first eager call of `D[i,j] := (W[k,i] - X[k,j])^2` at a new shape took 12-14
ms, then about 100 us a call (2026-12-07, kernel cached, load 3.5 on 2 cores). A back end
with an eager runner (`Backend.eager`: the C back end calls its compiled kernel on NumPy
views of the operands) runs the first `DIRECT_CALLS` calls of each signature directly
instead: 1 ms for that first call, about 290 us for each later one. So a function called a
few times eagerly (a test, a notebook cell, `jax.grad` without `jit`) compiles no XLA program
for its nests, and a signature called more often than that goes to JAX's dispatch, whose
per-call cost is lower once compiled.

The direct call is taken only where every operand is a concrete array on one CPU device (or a
NumPy array or Python number), and not under `jax.debug_nans`/`jax.debug_infs` (JAX's
dispatch checks the output then). The kernel, its schedule and its output are the ones the
traced call would use: the same bits.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from tensordsl.backends.table import BACKENDS
from tensordsl.binding.partitioning import runs_as_two_nests, tensor_shapes

#: Eager calls of one signature (nest, parameters, operand shapes and dtypes) run directly;
#: the next ones go through JAX's dispatch (compiled once).
DIRECT_CALLS = 8

_CALLS: collections.Counter = collections.Counter()
_LOCK = threading.Lock()


def run_directly(operands: Sequence[Any], params: dict[str, Any]) -> jax.Array | None:
    """The output of `nest_p` on concrete `operands`, computed by the back end's eager runner;
    None where JAX's dispatch should run it (see the module's docstring)."""
    record = BACKENDS[params["backend"]]
    if record.eager is None or not all(_on_one_cpu(v) for v in operands):
        return None
    if jax.config.jax_debug_nans or jax.config.jax_debug_infs:
        return None
    dtypes = [jax.typeof(v).dtype for v in operands]
    signature = (tuple(params.items()), tuple(np.shape(v) for v in operands), tuple(dtypes))
    with _LOCK:
        _CALLS[signature] += 1
        if _CALLS[signature] > DIRECT_CALLS:
            return None
    nest = params["nest"]
    shapes = tensor_shapes(nest, operands, params["extents"])
    if runs_as_two_nests(nest, shapes, record):
        return None  # two nests and a packing: JAX's dispatch compiles them as one program
    arrays = [np.asarray(v, dtype=d) for v, d in zip(operands, dtypes)]
    out = record.eager(nest, arrays, shapes, params["out_dtype"], params["schedule"])
    return None if out is None else jax.device_put(out, _device_of(operands))


def _on_one_cpu(value: Any) -> bool:
    if not isinstance(value, jax.Array):
        return isinstance(value, (np.ndarray, np.generic, int, float, bool))
    devices = value.sharding.device_set
    return len(devices) == 1 and next(iter(devices)).platform == "cpu"


def _device_of(operands: Sequence[Any]) -> Any:
    """The device of the first JAX array operand; None (JAX's default device) for none."""
    arrays = (v for v in operands if isinstance(v, jax.Array))
    return next((next(iter(v.sharding.device_set)) for v in arrays), None)
