"""The static report of the CUDA kernels a call runs (`explain(shapes, target="cuda")`).

Reads the nest equations of a forward+backward call's jaxpr (`tensordsl.explain.timing`) and gives
each nest, with its shapes and dtypes, to `codegen.cuda.report`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from codegen.ir.nest import LoopNest
from tensordsl.backends import table
from tensordsl.explain.timing import equation_dtypes, nest_equations


def cuda_report_lines(jaxpr: Any, names: Mapping[LoopNest, str] | None = None) -> list[str]:
    """The static CUDA report (`Backend.static_report`) of every nest equation of `jaxpr` (a
    forward+backward call's), with the heuristic's schedule for its shapes and dtypes."""
    from codegen.ir.extents import output_shape
    from codegen.passes.online import unpair

    cuda = table.BACKENDS["cuda"]
    assert cuda.static_report is not None and cuda.scheduler is not None
    static, choose_gpu_schedule = cuda.static_report(), cuda.scheduler()
    lines = [static.title]
    for eqn in nest_equations(jaxpr):
        nest: LoopNest = eqn.params["nest"]
        dtypes = equation_dtypes(eqn)
        shapes = {**dict(eqn.params["extents"])}
        shapes.update({op.name: v.aval.shape for op, v in zip(nest.operands, eqn.invars)})
        parts: tuple[LoopNest, ...] = (nest,)
        if nest.online and not cuda.one_pass_rows:  # runs as two nests
            parts = unpair(nest)
            dtypes[nest.online] = dtypes[nest.output]
        for part in parts:
            schedule = choose_gpu_schedule(part, dtypes)
            label = (names or {}).get(part, part.label)
            if schedule.strategy == "xla":
                lines.append(f"{label}: {schedule.describe()}")
            else:
                report = static.report(part, dtypes, shapes)  # chosen without proven tests
                lines += [f"{label}: {report.lines()[0]}", *report.lines()[1:]]
            shapes[part.output] = output_shape(part, shapes)
    return lines
