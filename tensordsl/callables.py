"""What makes a kernel look like a Python function: its signature, its docstring, a warm-up.

`Kernel` and `ProgramKernel` (tensordsl/kernel.py, tensordsl/program_kernel.py) set a
per-instance `__signature__` (`inspect.signature(k)` is `(W, X)`, so `help()`, IDEs and JAX's
error messages name the inputs) and `__doc__` generated from the statements, and their
`build(shapes)` traces `jax.jit(jax.value_and_grad(...))` of a call ahead of time, which
builds every forward and gradient nest that call needs.

>>> signature(("W", "X"))
<Signature (W, X)>
"""

from __future__ import annotations

import inspect
import keyword
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from codegen.ir.nest import LoopNest
from tensordsl.errors import InputError


def signature(inputs: Sequence[str]) -> inspect.Signature | None:
    """`(A, B, ...)`: one positional-or-keyword parameter per input; None when a name cannot
    be a Python parameter (then `inspect.signature` shows `__call__`'s)."""
    if not all(name.isidentifier() and not keyword.iskeyword(name) for name in inputs):
        return None
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return inspect.Signature([inspect.Parameter(name, kind) for name in inputs])


def _rank(rank: int) -> str:
    return "a scalar" if rank == 0 else f"a {rank}-d array"


def _result(nest: LoopNest) -> str:
    """`D: a 2-d array [i, j], the sum over k`."""
    free = [str(r.index) for r in nest.free]
    reduced: list[str] = []
    for term in nest.terms:
        reduced += [str(r.index) for r in term.reduced if str(r.index) not in reduced]
    text = f"{nest.output}: {_rank(len(free))}"
    if free:
        text += f" [{', '.join(free)}]"
    if reduced:
        text += f", the {nest.reduction} over {', '.join(reduced)} of the right-hand side"
    return text + "."


def statement_text(source: str, nest: LoopNest) -> str:
    """The statement as written, with its reduction in front when an option chose it."""
    text = source.strip()
    if nest.reduction != "sum" and not text.startswith("("):
        text = f"({nest.reduction}) {text}"
    return text


def kernel_doc(
    source: str, inputs: Sequence[tuple[str, int]], results: Sequence[LoopNest], *, program: bool
) -> str:
    """The docstring of a kernel: its source, how to call it, its inputs and its results."""
    names = ", ".join(name for name, _ in inputs)
    what = "program" if program else "kernel"
    lines = [
        source,
        "",
        f"A tensordsl {what}: call it as k({names}) on JAX or NumPy arrays,",
        "all by position or all by name; it works under jax.jit, jax.grad and jax.vmap.",
        "",
        "Args:",
        *(f"    {name}: {_rank(rank)}." for name, rank in inputs),
        "",
        "Returns:",
        *(f"    {_result(nest)}" for nest in results),
    ]
    return "\n".join(lines)


def example_shapes(
    shapes: Mapping[str, Any], dtype: str | None
) -> tuple[dict[str, tuple[int, ...]], dict[str, Any]]:
    """Shapes and dtypes from `shapes`: a tuple of extents, or an example array, per input.

    Dtypes are those a call computes in (`jax.dtypes.canonicalize_dtype`: float32 for a
    float64 example unless x64 is enabled). An input given by shape takes `dtype`, else the
    examples' common dtype, else float32.
    """
    table: dict[str, tuple[int, ...]] = {}
    dtypes: dict[str, Any] = {}
    for name, value in shapes.items():
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            table[name] = tuple(value.shape)
            dtypes[name] = jax.dtypes.canonicalize_dtype(value.dtype)
        else:
            table[name] = value
    default = dtype or (jnp.result_type(*dtypes.values()) if dtypes else "float32")
    default = jax.dtypes.canonicalize_dtype(default)
    for name in table:
        dtypes.setdefault(name, default)
    return table, dtypes


def warm_up(
    call: Callable[..., Any],
    inputs: Sequence[str],
    shapes: Mapping[str, tuple[int, ...]],
    dtypes: Mapping[str, Any],
    nograd: frozenset[str],
) -> None:
    """Trace and lower `jax.jit(jax.value_and_grad(sum of call's outputs))` for inputs of
    these shapes and dtypes: lowering builds every kernel the call and its gradients run."""
    specs = [jax.ShapeDtypeStruct(tuple(shapes[name]), dtypes[name]) for name in inputs]
    argnums = tuple(
        n
        for n, name in enumerate(inputs)
        if name not in nograd and jnp.issubdtype(dtypes[name], jnp.inexact)
    )

    def loss(*values: Any) -> Any:
        out = call(*values)
        outs = out if isinstance(out, tuple) else (out,)
        floats = [jnp.sum(o) for o in outs if jnp.issubdtype(o.dtype, jnp.inexact)]
        return sum(floats, start=jnp.zeros((), jnp.float32))  # an argmax alone: 0.0

    traced = jax.value_and_grad(loss, argnums=argnums) if argnums else loss
    from tensordsl.backends.c import optimised_builds  # no compiled back end at import

    with optimised_builds():  # ahead of time, so optimised (not tiered)
        jax.jit(traced).lower(*specs)


def check_dtype(dtype: str | None) -> str | None:
    """`dtype` for inputs given by shape: a float, int or bool dtype name, or None."""
    if dtype is None:
        return None
    try:
        return np.dtype(dtype).name
    except TypeError:
        raise InputError(
            f"build(dtype={dtype!r}) is not a dtype", expected="e.g. 'float32' or 'float64'"
        ) from None
