"""A program's call: its statements fused for the call's shapes and run as one differentiable
function, or (`TENSORDSL_FUSE=0`) each statement in order as its own `nest_p`.

`tensordsl.program_kernel.ProgramKernel` checks a call's inputs, then `run_program` runs
them here: `compiled_statements` fuses the live statements for those shapes
(`codegen.passes.fusion`, cached per shapes and `fuse=` choices) and refuses what cannot run
(an empty recomputed range, a stored intermediate past the machine's memory);
`tensordsl.binding.program_grad.FusedProgram` runs the fused nests.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from codegen import config
from codegen.ir.extents import evaluate_int, extent_values
from codegen.ir.nest import LoopNest
from codegen.ir.program import Program, live_statements
from codegen.passes.fusion import Fused, fuse, nested_ranges
from codegen.passes.invariance import shift_invariant
from codegen.passes.online import pair
from codegen.passes.row_passes import row_passes
from tensordsl.backends.table import BACKENDS
from tensordsl.binding import primitive as jax_bind
from tensordsl.binding import private_jax
from tensordsl.binding.program_grad import FusedProgram
from tensordsl.errors import UnsupportedError, check_settings


def run_program(
    program: Program,
    values: Mapping[str, Any],
    *,
    backend: str,
    nograd: frozenset[str] = frozenset(),
    precision: Any = None,
    fuse: tuple[tuple[str, str], ...] = (),
) -> tuple[jax.Array, ...]:
    """Run the statements the outputs need, in order, each as its own `nest_p`.

    Args:
        program: the program.
        values: an array per input, by name (shapes already checked).
        backend: a key of `table.BACKENDS`.
        nograd: inputs that get no gradient.
        precision: of the contractions given to XLA's dot (`jax_bind.call_nest`).
        fuse: decisions forced by `fuse=`, (intermediate, "inline" or "store") pairs.

    Returns:
        The outputs, in `program.outputs` order.
    """
    check_settings()  # a bad TENSORDSL_* value fails here, not inside JAX's lowering
    known = dict(values)
    # A program differentiated twice (an HVP) runs each nest again as its tangent nest: the
    # cost model weighs what it recomputes by that (`codegen.passes.cost`).
    order = private_jax.derivative_order(list(known.values()))
    nests = compiled_statements(program, known, backend, fuse, order=order)
    shapes = program.concrete_shapes({op.name: np.shape(known[op.name]) for op in program.inputs})
    if (
        nests != live_statements(program)
        or shift_invariant(nests, outputs=program.outputs)
        or _shared_inputs(nests, values)
        or _softmax_in_float64(nests, values, shapes)
        or _row_passes(nests, program.outputs, shapes, backend)
    ):
        # Fused: one differentiable function whose input gradients are one nest each (and
        # no gradient nest for a statistic subtracted for stability). Also where statements
        # share an input: its gradient is then one nest, not one per statement and a sum;
        # and a float64 softmax-weighted sum: its gradient is then the whole softmax's; and
        # where its forward runs row statistics inside their reader (`row_passes`).
        names = tuple(known)
        fused = FusedProgram(nests, names, program.outputs, backend, nograd, precision, shapes)
        return fused.call(*(known[name] for name in names))
    for nest in nests:
        operands = [known[name] for name in nest.operand_names]
        known[nest.output] = jax_bind.call_nest(
            nest,
            operands,
            backend=backend,
            shapes={},
            out_dtype=jax_bind.output_dtype(nest, operands),
            nograd=nograd & set(nest.operand_names),
            precision=precision,
        )
    return tuple(known[name] for name in program.outputs)


def _softmax_in_float64(
    nests: Sequence[LoopNest], values: Mapping[str, Any], shapes: Mapping[str, Sequence[int]]
) -> bool:
    """Whether a float64 call (fused: not `TENSORDSL_FUSE=0`) runs a logsumexp and the
    softmax-weighted sum that reads it (attention with its scores stored): differentiated
    together (`FusedProgram._centred`), their gradient is exact where one key takes a row's
    whole weight, where each statement's own gives `dP - D`'s rounding residue. (`centred`
    takes exactly the pairs `pair` finds: asking `pair` builds no nest.)"""
    # Promoted as the nests' dtypes are: a Python scale (weak) leaves float32 inputs float32.
    if not config.fuse_programs() or jnp.result_type(*values.values()) != jnp.float64:
        return False
    lse = [n for n in nests if n.reduction == "logsumexp"]
    return any(
        pair(a, b, shapes) is not None for a in lse for b in nests if a.output in b.operand_names
    )


def _row_passes(
    nests: Sequence[LoopNest], outputs: Sequence[str], shapes: Mapping[str, Any], backend: str
) -> bool:
    """Whether the forward runs some of `nests` as passes over their reader's rows
    (`codegen.passes.row_passes`) on this back end."""
    if not config.fuse_programs() or not getattr(BACKENDS.get(backend), "row_passes", False):
        return False
    return row_passes(nests, outputs=outputs, shapes=shapes)[0] != tuple(nests)


def _shared_inputs(nests: Sequence[LoopNest], inputs: Mapping[str, Any]) -> bool:
    """Whether two of the nests read the same input (a value of `inputs`)."""
    seen: set[str] = set()
    for nest in nests:
        read = set(nest.operand_names) & set(inputs)
        if read & seen:
            return True
        seen |= read
    return False


def compiled_statements(
    program: Program,
    values: Mapping[str, Any],
    backend: str,
    fuse: tuple[tuple[str, str], ...] = (),
    *,
    order: int = 1,
) -> tuple[LoopNest, ...]:
    """The nests a call runs, in order: the live statements fused for these shapes
    (`codegen.passes.fusion`) on every back end, so that they all agree; as written (statements in
    order as separate kernels) where `TENSORDSL_FUSE=0`. `order`: how many times the call is
    differentiated (0 and 1 fuse alike).

    Raises:
        UnsupportedError: a recomputed intermediate reduces over an empty range (its masks were
            turned into loop bounds assuming it does not).
    """
    live = live_statements(program)
    if not config.fuse_programs():
        return live
    shapes = program.concrete_shapes({op.name: np.shape(values[op.name]) for op in program.inputs})
    beside = BACKENDS[backend].sums_beside if backend in BACKENDS else False
    fused = fuse_program(live, program.outputs, shapes, fuse, order=order, beside=beside)
    for nest in fused.stored:
        for nested in nested_ranges(nest):
            length = evaluate_int(nested.stop - nested.start, extent_values(nest, shapes))
            if length < 1:
                raise UnsupportedError(
                    f"statement '{nest.output}' recomputes a sum over the empty range of "
                    f"'{nested.index}' ({nested.start} to {nested.stop})",
                    expected="non-empty reduced ranges in a fused program, or TENSORDSL_FUSE=0",
                )
    _check_stored_sizes(program, fused.stored, shapes, values)
    return fused.stored


def _memory_bytes() -> int | None:
    """The machine's physical memory, where the OS says."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _check_stored_sizes(
    program: Program,
    stored: Sequence[LoopNest],
    shapes: Mapping[str, Sequence[int]],
    values: Mapping[str, Any],
) -> None:
    """Refuse a stored intermediate larger than the machine's memory before allocating it.

    Fusion recomputes only sums and logsumexps (`codegen.passes.fusion`); a max, min or prod
    intermediate larger than every input and output is stored (`(prod) S[i,j]` of
    200000 x 200000 asks for 320 GB), which would fail in the allocator, or worse.

    Raises:
        UnsupportedError: such an intermediate would not fit in memory.
    """
    memory = _memory_bytes()
    if memory is None:
        return
    itemsize = max(
        (np.dtype(getattr(v, "dtype", np.float64)).itemsize for v in values.values()), default=8
    )
    for nest in stored:
        if nest.output in program.outputs:
            continue
        count = math.prod(shapes[nest.output])
        if count * itemsize > memory:
            raise UnsupportedError(
                f"the program stores its intermediate '{nest.output}' ({nest.reduction}) of shape "
                f"{tuple(shapes[nest.output])}: {count * itemsize} bytes, more than this "
                f"machine's memory ({memory} bytes)",
                expected="a stored intermediate that fits in memory (only sums and logsumexps "
                "are recomputed inside their readers)",
                hint="reduce inside the statement that reads it, or split the computation",
            )


@functools.lru_cache(maxsize=256)
def _fused(
    live: tuple[LoopNest, ...],
    outputs: tuple[str, ...],
    shapes: tuple,
    force: tuple,
    xla: bool,
    order: int,
    beside: bool = False,
) -> Fused:
    # `xla`: the decisions count a read inside a prologue of XLA's dot once per its points,
    # so they depend on whether contractions run as XLA's dot (`config.xla_contractions`).
    shaped, forced = dict(shapes), dict(force)
    return fuse(live, outputs=outputs, shapes=shaped, force=forced, order=order, beside=beside)


def fuse_program(
    live: tuple[LoopNest, ...],
    outputs: tuple[str, ...],
    shapes: Mapping[str, Sequence[int]],
    force: tuple[tuple[str, str], ...] = (),
    *,
    order: int = 1,
    beside: bool = False,
) -> Fused:
    """`codegen.passes.fusion.fuse` of the live statements, cached per shapes, `force`
    (the `fuse=` option, as sorted pairs), derivative `order` (below 1 counts as 1: a
    forward alone fuses as a forward+backward pass, so that both run the same nests) and
    `beside` (the back end's `sums_beside`)."""
    known = tuple(sorted((name, tuple(int(n) for n in shape)) for name, shape in shapes.items()))
    xla = config.xla_contractions()
    return _fused(live, outputs, known, force, xla, max(order, 1), beside)


def auto_backend(
    program: Program,
    shapes: Mapping[str, Sequence[int]],
    dtype: Any,
    force: tuple[tuple[str, str], ...] = (),
) -> Any:
    """What `backend="auto"` takes for a call of `program` on inputs of these shapes and
    `dtype` (`tensordsl.backends.table.auto_choice`, an `AutoChoice`): on a GPU, the back end
    the tuning table prefers for the nests the call runs (fused and paired for the shapes);
    c without a GPU (nothing is fused to decide it)."""
    from codegen.passes.online import pair_stored
    from tensordsl.backends import table

    def runs() -> list[tuple[LoopNest, list[Any]]]:
        concrete = program.concrete_shapes({op.name: shapes[op.name] for op in program.inputs})
        fused = fuse_program(live_statements(program), program.outputs, concrete, force)
        return [
            (nest, [jax.ShapeDtypeStruct(concrete[n], dtype) for n in nest.operand_names])
            for nest in pair_stored(fused.stored, concrete)
        ]

    return table.auto_choice(runs)
