"""The static report of the kernels a call runs on a back end that has one
(`explain(shapes, target="cuda")`, `target="pallas"`).

Reads the nest equations of a forward+backward call's jaxpr (`tensordsl.explain.timing`) and gives
each nest, with its shapes and dtypes, to the back end's `static_report` (`codegen.cuda.report`;
the pallas back end's tile programs, `tensordsl.backends.pallas.report`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from codegen.ir.nest import LoopNest
from tensordsl.backends import table
from tensordsl.explain.timing import PRIMITIVE, equation_dtypes

#: The primitive of a pair whose kernel computes score parameters' gradients too
#: (`tensordsl.binding.partials`).
PARTIALS = "tensordsl_partials"


def _equations(jaxpr: Any) -> list[Any]:
    """Every nest and partials equation of `jaxpr` and of the jaxprs in its parameters, in
    order."""
    found = []
    for eqn in jaxpr.eqns:
        if eqn.primitive.name in (PRIMITIVE, PARTIALS):
            found.append(eqn)
        for value in eqn.params.values():
            inner = getattr(value, "jaxpr", value)
            if hasattr(inner, "eqns"):
                found.extend(_equations(inner))
    return found


def _partials_equation(eqn: Any) -> tuple[LoopNest, dict, dict, tuple]:
    """(the pair's nest, dtypes, shapes, the extras) of a partials equation."""
    pair = eqn.params["pair"]
    names = eqn.params["names"]
    dtypes = {n: v.aval.dtype.name for n, v in zip(names, eqn.invars)}
    dtypes[pair.nest.output] = eqn.outvars[0].aval.dtype.name
    shapes = dict(eqn.params["shapes"])
    shapes.update({n: v.aval.shape for n, v in zip(names, eqn.invars)})
    return pair.nest, dtypes, shapes, pair.extras


def report_lines(target: str, jaxpr: Any, names: Mapping[LoopNest, str] | None = None) -> list[str]:
    """The static report of `target` (`Backend.static_report`; `table.REPORT_TARGETS`) of every
    nest equation of `jaxpr` (a forward+backward call's): each nest with its shapes and dtypes,
    scheduled by the back end's heuristic where it has one (CUDA's kernel figures; the pallas
    back end's tile programs)."""
    from codegen.ir.extents import output_shape
    from codegen.passes.online import unpair

    backend = table.BACKENDS[target]
    assert backend.static_report is not None
    static = backend.static_report()
    choose = backend.scheduler() if backend.scheduler is not None else None
    lines = [static.title]
    for eqn in _equations(jaxpr):
        if eqn.primitive.name == PARTIALS:
            nest, dtypes, shapes, extras = _partials_equation(eqn)
            precision = eqn.params.get("precision")
            report = static.report(nest, dtypes, shapes, precision=precision, extras=extras)
            label = (names or {}).get(nest, nest.label)
            lines += [f"{label}: {report.lines()[0]}", *report.lines()[1:]]
            continue
        nest = eqn.params["nest"]
        dtypes = equation_dtypes(eqn)
        shapes = {**dict(eqn.params["extents"])}
        shapes.update({op.name: v.aval.shape for op, v in zip(nest.operands, eqn.invars)})
        parts: tuple[LoopNest, ...] = (nest,)
        if nest.online and not backend.one_pass_rows:  # runs as two nests
            parts = unpair(nest)
            dtypes[nest.online] = dtypes[nest.output]
        for part in parts:
            schedule = None if choose is None else choose(part, dtypes)
            label = (names or {}).get(part, part.label)
            shapes.setdefault(part.output, output_shape(part, shapes))
            if schedule is not None and schedule.strategy == "xla":
                lines.append(f"{label}: {schedule.describe()}")
            else:
                precision = eqn.params.get("precision")
                report = static.report(part, dtypes, shapes, precision=precision)
                lines += [f"{label}: {report.lines()[0]}", *report.lines()[1:]]
    return lines
