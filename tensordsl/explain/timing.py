"""Time every nest of a kernel alone, on given shapes: which nest makes a backward pass slow.

The nests are the ones `jax.value_and_grad` of the kernel runs on the C back end (forward,
auxiliary nests, the gradient nest of every input), read off its jaxpr, so that every nest
gets exactly the operands, extents and schedule the JAX binding gives it. Each is compiled
(or taken from the cache) and called directly, outside JAX, on random inputs; a nest whose
schedule is "xla" (`codegen.ir.contraction.xla_plan`) is timed as the jitted XLA computation the
runner calls instead (its time includes JAX's dispatch). The time of a nest is the median (and the
fastest) of `reps` calls after one warm-up call.

>>> import tensordsl as td
>>> report = td.kernel("Y[i] := X[i+k] * W[k]").profile({"X": (10,), "W": (3,)}, reps=1)
>>> [t.name for t in report.timings]
['forward', 'grad_X', 'grad_W']
>>> print(report)  # doctest: +SKIP
timings (c, float32; 1 call of each nest alone on random inputs after a warm-up; share of ...)
  nest     median ms   best ms  share  schedule
  forward      0.014     0.012  16.7%  strategy=tile free=i reduced=k tile=-xi=1x32 parallel=yes
  grad_X       0.014     0.013  17.5%  strategy=tile free=p reduced=k tile=-xp=1x32 parallel=yes
  grad_W       0.049     0.048  65.8%  strategy=tile free=k reduced=i tile=-xk=1x32 parallel=yes
  total        0.077     0.073
"""

from __future__ import annotations

import contextlib
import ctypes
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from codegen.ir.nest import LoopNest
from codegen.ir.reductions import POSITION_DTYPE, REDUCTIONS
from tensordsl.backends import table
from tensordsl.errors import UnknownNameError
from tensordsl.explain.nests import kernel_nests
from tensordsl.explain.spelling import Spelling, label

PRIMITIVE = "tensordsl_nest"
#: A kernel's tangent term (`tensordsl.binding.primitive.tangent_p`), lowered as its tangent nest.
TANGENT = "tensordsl_tangent"


@dataclass(frozen=True)
class NestTiming:
    """One nest: its name ("forward", "aux_<role>", "grad_<input>"), schedule and times.

    `seconds` is the median of `reps` calls, `best` the fastest: on a busy machine a call
    may wait for a descheduled OpenMP thread, and `best` shows the nest's own cost.
    """

    name: str
    nest: LoopNest
    schedule: str
    seconds: float
    best: float
    reps: int


@dataclass(frozen=True)
class Profile:
    """The timings of every nest of a kernel, in the order `value_and_grad` runs them."""

    timings: tuple[NestTiming, ...]
    dtype: str

    @property
    def total(self) -> float:
        """The sum of the medians."""
        return sum(t.seconds for t in self.timings)

    @property
    def total_best(self) -> float:
        return sum(t.best for t in self.timings)

    def lines(self) -> list[str]:
        reps = self.timings[0].reps if self.timings else 0
        width = max([len("total")] + [len(t.name) for t in self.timings])
        lines = [
            f"timings (c, {self.dtype}; {reps} call{'s' * (reps != 1)} of each nest alone on "
            "random inputs after a warm-up; share of the best times)",
            f"  {'nest':<{width}} {'median ms':>10} {'best ms':>9}  share  schedule",
        ]
        for t in self.timings:
            share = t.best / self.total_best if self.total_best > 0 else 0.0
            lines.append(
                f"  {t.name:<{width}} {t.seconds * 1e3:10.3f} {t.best * 1e3:9.3f} {share:6.1%}  "
                f"{t.schedule}"
            )
        lines.append(f"  {'total':<{width}} {self.total * 1e3:10.3f} {self.total_best * 1e3:9.3f}")
        return lines

    def __str__(self) -> str:
        return "\n".join(self.lines())


def nest_equations(jaxpr: Any, primitives: tuple[str, ...] = (PRIMITIVE,)) -> list[Any]:
    """Every equation of `jaxpr` and of the jaxprs in its parameters whose primitive is one of
    `primitives` (nest equations), in order."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in primitives:
            found.append(eqn)
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                found.extend(nest_equations(inner, primitives))
    return found


def profile_nests(
    nest: LoopNest,
    shapes: Mapping[str, tuple[int, ...]],
    *,
    dtype: str = "float32",
    schedule: Any = None,
    nograd: frozenset[str] = frozenset(),
    reps: int = 7,
    seed: int = 0,
    spelled: Sequence[Spelling] = (),
) -> Profile:
    """Time every nest `jax.value_and_grad` of `nest` runs on the C back end, each alone.

    Args:
        nest: the forward nest.
        shapes: the shape of every input (checked by the caller).
        dtype: the dtype of every input, "float32" or "float64".
        schedule: the forward nest's schedule, if the user chose one.
        nograd: inputs without a gradient.
        reps: calls per nest after a warm-up call; the median is reported.
        seed: for the random inputs.
        spelled: gathered operands, whose gradient nests are named by the access
            (`grad_W[tok[i], d]`, `tensordsl.explain.spelling`).

    Returns:
        A `Profile`; `str()` of it is a table.
    """
    jaxpr = nest_jaxpr(nest, shapes, dtype=dtype, schedule=schedule, nograd=nograd)
    names = {each: label(name, spelled) for name, each in kernel_nests(nest).items()}
    return profile_jaxpr(jaxpr, names, reps=reps, seed=seed, dtype=dtype)


def nest_jaxpr(
    nest: LoopNest,
    shapes: Mapping[str, tuple[int, ...]],
    *,
    dtype: str = "float32",
    schedule: Any = None,
    nograd: frozenset[str] = frozenset(),
    backend: str | None = None,
    precision: Any = None,
) -> Any:
    """The jaxpr of `jax.value_and_grad` of the sum of `nest`'s output (`value_and_grad_jaxpr`)
    on `backend` (the profiled back end by default: the nests, gradient groups included,
    that a call on it runs), at the kernel's `precision`."""
    from tensordsl.binding.primitive import call_nest

    positional = REDUCTIONS[nest.reduction].positional

    def loss(*values: Any) -> Any:
        out = call_nest(
            nest,
            values,
            backend=backend or table.PROFILED.name,
            shapes={},
            out_dtype=POSITION_DTYPE if positional else dtype,
            nograd=nograd,
            schedule=schedule,
            precision=precision,
        )
        # an argmax has no gradient: its (integer) sum in a float loss, differentiated to 0
        return jnp.sum(out).astype(dtype)

    return value_and_grad_jaxpr(loss, nest.operand_names, shapes, dtype, nograd)


def skipped_inputs(
    dtype: str,
    inputs: Sequence[str],
    shapes: Mapping[str, Sequence[int]],
    wrt: str | Sequence[str] | None,
    source: str,
) -> frozenset[str]:
    """The inputs whose gradient a profile leaves out: with `wrt` None the scalars (shape
    `()`: a scale or an epsilon passed as a Python number, which `jax.grad` of a model does
    not differentiate, so its jitted computation never runs their gradient nests), else
    every input `wrt` does not name.

    >>> sorted(skipped_inputs("float32", ("X", "eps"), {"X": (3,), "eps": ()}, None, ""))
    ['eps']

    Raises:
        UnknownNameError: a dtype other than float32 and float64, or `wrt` naming no input.
    """
    if dtype not in ("float32", "float64"):
        raise UnknownNameError(
            f"unknown dtype '{dtype}' for profile", expected="float32 or float64"
        )
    if wrt is None:
        return frozenset(name for name in inputs if not tuple(shapes[name]))
    wrt = (wrt,) if isinstance(wrt, str) else tuple(wrt)
    for name in wrt:
        if name not in inputs:
            raise UnknownNameError(
                f"unknown input '{name}' in profile's wrt=", source, expected=", ".join(inputs)
            )
    return frozenset(inputs) - frozenset(wrt)


def value_and_grad_jaxpr(
    loss: Callable[..., Any],
    names: Sequence[str],
    shapes: Mapping[str, tuple[int, ...]],
    dtype: str,
    nograd: frozenset[str],
) -> Any:
    """The jaxpr of `jax.value_and_grad(loss)` with respect to every input not in `nograd`,
    for inputs `names` of these shapes, all of `dtype` (of `loss` alone when none is
    differentiated): its nest equations are the nests a forward+backward pass runs."""
    inputs = [jax.ShapeDtypeStruct(tuple(shapes[name]), dtype) for name in names]
    argnums = tuple(n for n, name in enumerate(names) if name not in nograd)
    traced = jax.value_and_grad(loss, argnums=argnums) if argnums else loss
    with jax.enable_x64(True) if dtype == "float64" else contextlib.nullcontext():
        return jax.make_jaxpr(traced)(*inputs).jaxpr


def equation_dtypes(eqn: Any) -> dict[str, str]:
    """The dtype name of every operand and of the output of a nest equation."""
    nest: LoopNest = eqn.params["nest"]
    dtypes = {op.name: v.aval.dtype.name for op, v in zip(nest.operands, eqn.invars)}
    dtypes[nest.output] = eqn.outvars[0].aval.dtype.name
    return dtypes


def profile_jaxpr(
    jaxpr: Any,
    names: Mapping[LoopNest, str] | None = None,
    *,
    reps: int = 7,
    seed: int = 0,
    dtype: str = "",
    spelled: Sequence[Spelling] = (),
    build: str = "full",
) -> Profile:
    """Time every nest equation of `jaxpr` (e.g. of a whole model's `value_and_grad`) alone.

    Forward mode's tangent terms (`jax.jvp`; an HVP's second-order nests, `jax.jvp` of
    `jax.grad`) are timed as the tangent nests their lowering runs (named `tY` for `Y`).
    Equations that no output of `jaxpr` depends on are left out: the compiled computation
    does not run them (an HVP's first-order gradients, of which only the tangents are read).

    Args:
        jaxpr: from `jax.make_jaxpr(...)(...).jaxpr`.
        names: a name for each nest; others are named by their output (the gradient of a
            gathered operand of `spelled` by its access: `dW[tok[i], d]`).
        reps: calls per nest after a warm-up call; the median is reported.
        seed: for the random inputs.
        dtype: shown in the table's heading.
        build: how the kernels are built (`codegen.c.run.build.build_c`'s `mode`): "full",
            optimised, the kernels users' calls run after the first ones; "fast" only for a
            smoke run whose figures nobody reads (a benchmark script's `--quick` in the
            test suite), where optimised builds would be most of its time.

    Returns:
        A `Profile`, one timing per equation in order (a nest run twice appears twice).
    """
    rng = np.random.default_rng(seed)
    timings = tuple(
        _time_equation(nest, names or {}, reps, rng, spelled, build)
        for e in running_equations(jaxpr)
        for nest in _as_nest_equations(e)
    )
    return Profile(timings, dtype)


def running_equations(jaxpr: Any) -> list[Any]:
    """The nest equations and tangent terms of `jaxpr` (through nested `jit`s) that its
    compiled computation runs, in order: those an output depends on, a tangent term reading
    only what its tangent nest reads. XLA drops the others (a first-order gradient nest of an
    HVP whose tangent alone is read, though its tangent term takes it for a transposition
    that never comes); nests inside other higher-order primitives count as run."""
    from tensordsl.binding import private_jax

    def walk(jaxpr: Any, used: Sequence[bool]) -> tuple[list[Any], list[bool]]:
        live = {v for v, u in zip(jaxpr.outvars, used) if u and private_jax.is_variable(v)}
        chunks = []
        for eqn in reversed(jaxpr.eqns):
            wanted = [v in live for v in eqn.outvars]
            if not any(wanted) and not eqn.effects:
                continue
            if eqn.primitive.name in ("jit", "pjit"):
                found, reads = walk(eqn.params["jaxpr"].jaxpr, wanted)
            elif eqn.primitive.name == TANGENT:
                found, reads = [eqn], _tangent_reads(eqn)
            else:
                one = _OneEquation(eqns=(eqn,))
                found = nest_equations(one, (PRIMITIVE, TANGENT))
                reads = [True] * len(eqn.invars)
            chunks.append(found)
            live |= {v for v, r in zip(eqn.invars, reads) if r and private_jax.is_variable(v)}
        ins = [v in live for v in jaxpr.invars]
        return [e for chunk in reversed(chunks) for e in chunk], ins

    return walk(jaxpr, [True] * len(jaxpr.outvars))[0]


@dataclass(frozen=True)
class _OneEquation:
    """A jaxpr of one equation, for `nest_equations` (which looks into its parameters)."""

    eqns: tuple[Any, ...]


def _tangent_reads(eqn: Any) -> list[bool]:
    """Which arguments of a tangent term its lowering (its tangent nest) reads."""
    from tensordsl.binding import private_jax
    from tensordsl.binding.primitive import evaluate_tangent

    lowered = jax.make_jaxpr(lambda *args: evaluate_tangent(*args, **eqn.params))
    found = lowered(*(v.aval for v in eqn.invars)).jaxpr
    return private_jax.used_inputs(found, [True] * len(found.outvars))


def _as_nest_equations(eqn: Any) -> list[Any]:
    """A tangent term as the nest equation its lowering runs (its tangent nest, none where
    it reads no perturbed input); a nest equation as it is."""
    if eqn.primitive.name != TANGENT:
        return [eqn]
    from tensordsl.binding.primitive import evaluate_tangent

    lowered = jax.make_jaxpr(lambda *args: evaluate_tangent(*args, **eqn.params))
    return nest_equations(lowered(*(v.aval for v in eqn.invars)).jaxpr)


def _time_equation(
    eqn: Any,
    names: Mapping[LoopNest, str],
    reps: int,
    rng: np.random.Generator,
    spelled: Sequence[Spelling] = (),
    build: str = "full",
) -> NestTiming:
    """Time one nest as the C runner runs it: XLA for the "xla" strategy where the
    plan fits the shapes, else the generated kernel (tensordsl/backends/c.py `run_c`)."""
    assert table.PROFILED.scheduler is not None
    choose_cpu_schedule = table.PROFILED.scheduler()

    nest: LoopNest = eqn.params["nest"]
    out_aval = eqn.outvars[0].aval
    dtypes = equation_dtypes(eqn)
    schedule = eqn.params.get("schedule") or choose_cpu_schedule(nest, dtypes)
    operands = [_random(v.aval.shape, v.aval.dtype, rng) for v in eqn.invars]
    out = np.empty(out_aval.shape, out_aval.dtype)
    extents = dict(eqn.params["extents"])
    call = _xla_call(nest, operands, out, extents) if schedule.strategy == "xla" else None
    if call is None:
        if schedule.strategy == "xla":
            schedule = choose_cpu_schedule(nest, dtypes, kernel=True)
        call = _kernel_call(nest, dtypes, schedule, out, operands, extents, build)
    times = _seconds(call, reps)
    name = names.get(nest, label(nest.label, spelled))
    return NestTiming(
        name, nest, schedule.describe(), statistics.median(times), min(times), len(times)
    )


def _xla_call(
    nest: LoopNest, operands: list[np.ndarray], out: np.ndarray, extents: dict
) -> Callable[[], Any] | None:
    """The nest as the jitted XLA computation of its plan, or None where it does not fit."""
    from tensordsl.backends.xla_dot import run_xla

    shapes = {**extents, nest.output: out.shape}
    shapes.update({op.name: a.shape for op, a in zip(nest.operands, operands)})
    arrays = [jax.device_put(a) for a in operands]
    if run_xla(nest, arrays, shapes, out.dtype, minor_contraction=True) is None:
        return None
    jitted = jax.jit(
        lambda *values: run_xla(nest, values, shapes, out.dtype, minor_contraction=True)
    )
    return lambda: jax.block_until_ready(jitted(*arrays))


def _kernel_call(
    nest: LoopNest,
    dtypes: dict[str, str],
    schedule: Any,
    out: np.ndarray,
    operands: list[np.ndarray],
    extents: dict,
    build: str = "full",
) -> Callable[[], None]:
    """The compiled kernel as a no-argument call, its parameters computed once."""
    assert table.PROFILED.builder is not None
    compiled = table.PROFILED.builder()(nest, dtypes=dtypes, schedule=schedule, mode=build)
    full = compiled.all_extents([a.shape for a in operands], out.shape, extents)
    params = compiled.host_parameters(full)
    pointers = (ctypes.c_void_p * max(len(operands), 1))(*(a.ctypes.data for a in operands))
    return lambda: compiled.function(out.ctypes.data, pointers, params.ctypes.data)


def _random(shape: Sequence[int], dtype: Any, rng: np.random.Generator) -> np.ndarray:
    """Standard normal floats; zeros for integers (saved argmax positions stay in range)."""
    if np.issubdtype(dtype, np.integer):
        return np.zeros(shape, dtype)
    # np.require, not np.ascontiguousarray: that makes a scalar an array of one element
    return np.require(rng.standard_normal(shape).astype(dtype), requirements="C")


def _seconds(call: Callable[[], None], reps: int) -> list[float]:
    """Seconds of `reps` calls (at least one) after a warm-up call."""
    call()
    times = []
    for _ in range(max(1, reps)):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times
