"""The back ends: one runner per back-end name, and how "auto" picks one.

A runner executes a nest without differentiation: `runner(nest, operands, shapes, out dtype,
schedule or None, *, precision=None)`, where `shapes` covers every tensor the nest names and
`precision` is that of the contractions given to XLA's dot (`tensordsl.xla_dot`). The binding
(`tensordsl/jax_bind.py`, `tensordsl/partitioning.py`) traces it into `nest_p`'s lowering.
The compiled back ends are imported when first used, so `import tensordsl` starts no
compiler and never imports CuPy.

>>> BACKENDS
('auto', 'reference', 'c', 'cuda')
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from codegen.ir import LoopNest
from tensordsl import reference

Shapes = Mapping[str, tuple[int, ...]]
#: A runner executes a nest without differentiation:
#: (nest, operands, shapes, out dtype, schedule or None, *, precision=None).
Runner = Callable[..., jax.Array]


def run_reference(
    nest: LoopNest,
    operands: Sequence[jax.Array],
    shapes: Shapes,
    dtype: Any,
    schedule: Any = None,
    *,
    precision: Any = None,
) -> jax.Array:
    """The reference back end (jax.numpy, the test oracle) as a runner. It ignores
    `precision`: an oracle's sums run at `Precision.HIGHEST` (`reference._sum`)."""
    return reference.evaluate(nest, dict(zip(nest.operand_names, operands)), shapes, dtype)


def _run_c(
    nest: LoopNest,
    operands: Sequence[jax.Array],
    shapes: Shapes,
    dtype: Any,
    schedule: Any = None,
    *,
    precision: Any = None,
) -> jax.Array:
    from tensordsl.cpu import run_c

    return run_c(nest, operands, shapes, dtype, schedule, precision=precision)


def _run_cuda(
    nest: LoopNest,
    operands: Sequence[jax.Array],
    shapes: Shapes,
    dtype: Any,
    schedule: Any = None,
    *,
    precision: Any = None,
) -> jax.Array:
    from tensordsl.gpu import run_cuda

    return run_cuda(nest, operands, shapes, dtype, schedule=schedule, precision=precision)


RUNNERS: dict[str, Runner] = {"reference": run_reference, "c": _run_c, "cuda": _run_cuda}


def prefetch(
    backend: str, nest: LoopNest, operand_dtypes: Sequence[Any], dtype: Any, schedule: Any
) -> None:
    """Start building the kernel that `backend`'s runner will need for `nest`, in the
    background (the C back end; nothing for the others)."""
    if backend == "c":
        from tensordsl.cpu import prefetch_c

        prefetch_c(nest, operand_dtypes, dtype, schedule)


#: The back-end names a kernel accepts: "auto" or a key of RUNNERS.
BACKENDS = ("auto", *RUNNERS)


def resolve_backend(backend: str) -> str:
    """The runner for `backend`: itself, or for "auto" cuda on a CUDA GPU with CuPy, else c."""
    if backend != "auto":
        return backend
    if jax.default_backend() == "gpu" and importlib.util.find_spec("cupy") is not None:
        return "cuda"
    return "c"
