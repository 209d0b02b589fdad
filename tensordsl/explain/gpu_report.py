"""The static report of the kernels a call runs on a back end that has one
(`explain(shapes, target="cuda")`, `target="pallas"`).

Reads the nest equations of a forward+backward call's jaxpr (`tensordsl.explain.timing`) and gives
each nest, with its shapes and dtypes, to the back end's `static_report` (`codegen.cuda.report`;
the pallas back end's tile programs, `tensordsl.backends.pallas.report`), with the spelling of
the gathered operands (`tensordsl.explain.spelling`): the report shows `W[tok[i], d]` and
`dW[tok[i], d]`, never the internal names the nests give them.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

from codegen.ir.nest import LoopNest
from tensordsl.backends import table
from tensordsl.explain.spelling import Spelling, label, spell
from tensordsl.explain.timing import PRIMITIVE, equation_dtypes, nest_equations

#: The primitive of a pair whose kernel computes score parameters' gradients too
#: (`tensordsl.binding.partials`).
PARTIALS = "tensordsl_partials"


def _partials_equation(eqn: Any) -> tuple[LoopNest, dict, dict, tuple]:
    """(the pair's nest, dtypes, shapes, the extras) of a partials equation."""
    pair = eqn.params["pair"]
    names = eqn.params["names"]
    dtypes = {n: v.aval.dtype.name for n, v in zip(names, eqn.invars)}
    dtypes[pair.nest.output] = eqn.outvars[0].aval.dtype.name
    shapes = dict(eqn.params["shapes"])
    shapes.update({n: v.aval.shape for n, v in zip(names, eqn.invars)})
    return pair.nest, dtypes, shapes, pair.extras


def report_lines(
    target: str,
    jaxpr: Any,
    names: Mapping[LoopNest, str] | None = None,
    spelled: Sequence[Spelling] = (),
) -> list[str]:
    """The static report of `target` (`Backend.static_report`; `table.REPORT_TARGETS`) of every
    nest equation of `jaxpr` (a forward+backward call's): each nest with its shapes and dtypes,
    scheduled by the back end's heuristic where it has one (CUDA's kernel figures; the pallas
    back end's tile programs); `spelled`: the gathered operands, shown as written."""
    from codegen.ir.extents import output_shape
    from codegen.passes.online import unpair

    backend = table.BACKENDS[target]
    assert backend.static_report is not None
    static = backend.static_report()
    choose = backend.scheduler() if backend.scheduler is not None else None
    lines = [static.title]
    spelling = functools.partial(spell, spelled=spelled)
    naming = functools.partial(label, spelled=spelled)
    for eqn in nest_equations(jaxpr, (PRIMITIVE, PARTIALS)):
        if eqn.primitive.name == PARTIALS:
            nest, dtypes, shapes, extras = _partials_equation(eqn)
            precision = eqn.params.get("precision")
            report = static.report(
                nest,
                dtypes,
                shapes,
                precision=precision,
                extras=extras,
                spell=spelling,
                name=naming,
            )
            title = (names or {}).get(nest) or naming(nest.label)
            lines += [f"{title}: {report.lines()[0]}", *report.lines()[1:]]
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
            title = (names or {}).get(part) or naming(part.label)
            shapes.setdefault(part.output, output_shape(part, shapes))
            if schedule is not None and schedule.strategy == "xla":
                lines.append(f"{title}: {schedule.describe()}")
            else:
                precision = eqn.params.get("precision")
                report = static.report(
                    part, dtypes, shapes, precision=precision, spell=spelling, name=naming
                )
                lines += [f"{title}: {report.lines()[0]}", *report.lines()[1:]]
    return lines
