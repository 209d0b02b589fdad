"""Every CUDA nest of the corpus with operand values, run under the CUDA emulator.

An `Instance` is one nest (a corpus forward, an auxiliary nest such as a saved argmax, or a
gradient nest) with float64 operand values: the corpus inputs, the reference's auxiliary
results and a random cotangent, as `jax_bind` would pass them. `run` launches its CUDA
kernels (one per pass of the source, sharing its scratch space) for a dtype, schedule and
scheduling order through the emulator (outputs and scratch poisoned);
`expected` evaluates the nest with the reference back end in float64 on the same inputs
rounded to that dtype. `build_all` compiles many kernels in a few translation units first:
compiling dominates the emulator's cost.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import jax.numpy as jnp
import numpy as np

from codegen.cuda.emulator import emulate
from codegen.cuda.schedule import GpuSchedule
from codegen.ir.nest import LoopNest
from codegen.passes import grad, gradient_rules
from tensordsl.backends import cuda as gpu
from tensordsl.backends import reference
from tensordsl.errors import TensorDSLError
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.corpus import CORPUS_BY_NAME, Case, make_inputs

TOLERANCE = {"float32": 2e-4, "float64": 1e-10, "float16": 2e-2, "bfloat16": 5e-2}


@dataclass(frozen=True)
class Instance:
    """One nest and the values of its operands (float64, or int32 for integer ones)."""

    case: str
    role: str
    nest: LoopNest = dataclasses.field(repr=False)
    values: dict = dataclasses.field(repr=False, compare=False)
    shapes: dict = dataclasses.field(repr=False, compare=False)  # tensors named, not operands
    #: The corpus's hand-written float64 numpy reference (forward nests only).
    oracle: Callable[..., np.ndarray] | None = dataclasses.field(default=None, compare=False)

    @property
    def id(self) -> str:
        return f"{self.case}-{self.role}"

    def arrays(self, dtype: str) -> list[np.ndarray]:
        """The operands in `nest.operands` order: floats as `dtype`, integers as int32."""
        return [
            np.asarray(v, np.int32)
            if np.issubdtype(np.asarray(v).dtype, np.integer)
            else np.asarray(v, jnp.dtype(dtype))
            for v in (self.values[op.name] for op in self.nest.operands)
        ]

    def out_dtype(self, dtype: str) -> str:
        return "int32" if self.nest.reduction in ("argmax", "argmin") else dtype


def scaled(case: Case, factor: int) -> Case:
    """`case` with every axis of every input `factor` times longer (more blocks and tiles)."""
    args = {
        name: dataclasses.replace(arg, shape=tuple(n * factor for n in arg.shape))
        for name, arg in case.args.items()
    }
    return dataclasses.replace(case, args=args)


def instances(case: Case, seed: int = 3) -> tuple[Instance, ...]:
    """The forward, auxiliary and gradient nests of `case` with operand values."""
    nest = lower(parse(case.source), reduce=case.reduce, ranges=case.ranges).nest
    inputs = {n: np.asarray(v) for n, v in make_inputs(case, seed=seed).items()}
    shapes = {n: np.shape(v) for n, v in inputs.items()}
    found = [Instance(case.name, "forward", nest, inputs, {}, case.expected)]
    by_role: dict = {}
    for role, aux in gradient_rules.auxiliary_nests(nest).items():
        found.append(Instance(case.name, role, aux, inputs, {}))
        by_role[role] = np.asarray(reference.evaluate(aux, inputs, shapes))
    if not case.differentiable:
        return tuple(found)
    output = case.expected(**inputs)
    rng = np.random.default_rng(seed)
    by_role[gradient_rules.OUTPUT] = output
    sign = rng.choice([-1, 1], output.shape)
    by_role[gradient_rules.COTANGENT] = rng.uniform(0.5, 1.5, output.shape) * sign
    for op in nest.operands:
        if case.args[op.name].integer:
            continue
        try:
            gradient = grad.gradient(nest, op.name)
        except TensorDSLError:
            continue
        values = {n: inputs[n] if r == "input" else by_role[r] for n, r in gradient.roles}
        extents = dict(shapes)
        cotangent = next(n for n, r in gradient.roles if r == gradient_rules.COTANGENT)
        extents[cotangent] = extents[nest.output] = output.shape
        extents[gradient.nest.output] = shapes[op.name]
        named = {n: s for n, s in extents.items() if n not in values}
        found.append(Instance(case.name, f"grad_{op.name}", gradient.nest, values, named))
    return tuple(found)


@functools.cache
def corpus_instances(names: tuple[str, ...] | None = None, factor: int = 1) -> tuple[Instance, ...]:
    """`instances` of the named corpus cases (all when None), inputs `factor` times longer."""
    cases = [CORPUS_BY_NAME[n] for n in names] if names else list(CORPUS_BY_NAME.values())
    return tuple(i for c in cases for i in instances(scaled(c, factor) if factor > 1 else c))


def launch(inst: Instance, dtype: str, schedule: GpuSchedule | None = None) -> gpu.Launch:
    """The emitted kernel, parameters and grid of `inst` for `dtype` (as `run_cuda` does)."""
    return gpu.prepare(inst.nest, inst.arrays(dtype), inst.shapes, inst.out_dtype(dtype), schedule)


def _kernels(la: gpu.Launch) -> list[tuple[str, str]]:
    """(text, entry) of every kernel of the launch's source."""
    return [(la.source.text, p.entry) for p in la.source.passes]


def build_all(launches: Iterable[gpu.Launch]) -> None:
    """Compile every launch's kernels, many per compiler call, two calls at once."""
    emulate.build([k for la in launches for k in _kernels(la)], per_unit=60, jobs=2)


def run(inst: Instance, la: gpu.Launch, dtype: str, order: str = "forward") -> np.ndarray:
    """Launch `la` under the emulator on the instance's operands; the output, poisoned first.
    Returns the output."""
    return run_arrays(la, inst.arrays(dtype), order, inst.id)


def run_arrays(
    la: gpu.Launch, arrays: Sequence[np.ndarray], order: str = "forward", what: str = ""
) -> np.ndarray:
    """Launch `la`'s kernels in order under the emulator on `arrays`; the output.

    Each operand, the output and the scratch space sit between `MARGIN` poisoned elements:
    a read outside an operand that reaches the result gives NaN, a write outside the output
    or the scratch space fails here. The output and the scratch space start poisoned.
    """
    out_dtype = la.result.dtype
    out, out_buffer = _guarded(np.full(la.result.shape, _poison_value(out_dtype), out_dtype))
    scratch, scratch_buffer = _guarded(np.full(la.workspace, 0xFF, np.uint8))
    operands = [_guarded(a)[0] for a in arrays]
    kernels = dict(zip([e for _, e in _kernels(la)], emulate.build(_kernels(la)), strict=True))
    params = [np.int64(p) for p in la.params]
    arguments = (out, *operands, *([scratch] if la.workspace else []), *params)
    for entry, grid in la.passes:
        kernels[entry](grid, la.source.block, arguments, order=order, shared_mem=la.source.shared)
    for name, buffer in (("output", out_buffer), ("scratch space", scratch_buffer)):
        margins = np.concatenate([buffer[:MARGIN], buffer[-MARGIN:]])
        assert _is_poison(margins).all(), f"{what}: the kernel wrote outside its {name}"
    return out


MARGIN = 64


def _poison_value(dtype: np.dtype) -> object:
    if np.issubdtype(dtype, np.unsignedinteger):
        return np.iinfo(dtype).max  # all bits set, like -1
    return -1 if np.issubdtype(dtype, np.integer) else np.nan


def _is_poison(values: np.ndarray) -> np.ndarray:
    if np.issubdtype(values.dtype, np.integer):
        return values == _poison_value(values.dtype)
    return np.isnan(np.asarray(values, np.float64))


def _guarded(array: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A poisoned copy of `array` inside a buffer with `MARGIN` poison on each side."""
    buffer = np.full(array.size + 2 * MARGIN, _poison_value(array.dtype), array.dtype)
    view = buffer[MARGIN : MARGIN + array.size].reshape(array.shape)
    view[...] = array
    return view, buffer


def expected(inst: Instance, dtype: str) -> np.ndarray:
    """The float64 reference of the nest on the operands rounded to `dtype`: the corpus's
    numpy reference for a forward nest, else the reference back end (one XLA compile)."""
    rounded = {
        op.name: a if np.issubdtype(a.dtype, np.integer) else np.asarray(a, np.float64)
        for op, a in zip(inst.nest.operands, inst.arrays(dtype), strict=True)  # bfloat16 too
    }
    if inst.oracle is not None:
        return np.asarray(inst.oracle(**rounded), np.float64)
    shapes = {**inst.shapes, **{n: np.shape(v) for n, v in rounded.items()}}
    dtype_out = "int32" if inst.out_dtype(dtype) == "int32" else jnp.float64
    return np.asarray(reference.evaluate(inst.nest, rounded, shapes, dtype_out))


def assert_close(got: np.ndarray, want: np.ndarray, dtype: str, what: str = "") -> None:
    """Exact for integers; else within `TOLERANCE[dtype]` of the largest magnitude."""
    if np.issubdtype(want.dtype, np.integer):
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    got64, want64 = np.asarray(got, np.float64), np.asarray(want, np.float64)
    scale = max(1.0, float(np.max(np.abs(want64), initial=0.0)))
    tol = TOLERANCE[dtype]
    np.testing.assert_allclose(got64, want64, rtol=tol, atol=tol * scale, err_msg=what)


def check(inst: Instance, dtype: str, schedules: Sequence[GpuSchedule | None], orders) -> None:
    """Every schedule and order of `inst` in `dtype` against the reference."""
    want = expected(inst, dtype)
    for schedule in schedules:
        la = launch(inst, dtype, schedule)
        for order in orders:
            got = run(inst, la, dtype, order)
            what = f"{inst.id} {dtype} {la.source.schedule.describe()} order={order}"
            assert_close(got, want, dtype, what)
