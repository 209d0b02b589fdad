"""The static report of the CUDA kernels a call runs (`explain(shapes, target="cuda")`),
and the dispatch of `explain`'s reports by target.

Reads the nest equations of a forward+backward call's jaxpr (`tensordsl.timing`) and gives
each nest, with its shapes and dtypes, to `codegen.cuda.report`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from codegen.ir.nest import LoopNest
from tensordsl.backends import table
from tensordsl.timing import equation_dtypes, nest_equations


def report_lines(target: str, jaxpr: Any, names: Mapping[LoopNest, str] | None = None) -> list[str]:
    """The static report for `target` (`tensordsl.explain.REPORT_TARGETS`) of every nest
    equation of `jaxpr` (a forward+backward call's): CUDA's kernel report, or the pallas
    back end's tile programs (`tensordsl.backends.pallas.report`)."""
    if target == "pallas":
        from tensordsl.backends.pallas.report import tile_report_lines

        return tile_report_lines(jaxpr, names)
    return cuda_report_lines(jaxpr, names)


def cuda_report_lines(jaxpr: Any, names: Mapping[LoopNest, str] | None = None) -> list[str]:
    """The static CUDA report (`codegen.cuda.report`) of every nest equation of `jaxpr` (a
    forward+backward call's), with the heuristic's schedule for its shapes and dtypes."""
    from codegen.cuda.report import SMS, cuda_report
    from codegen.cuda.schedule import choose_gpu_schedule
    from codegen.ir.extents import output_shape
    from codegen.passes.online import unpair

    lines = [f"cuda kernels (static: grid on {SMS} SMs, per output element; sm_90 by NVRTC)"]
    for eqn in nest_equations(jaxpr):
        nest: LoopNest = eqn.params["nest"]
        dtypes = equation_dtypes(eqn)
        shapes = {**dict(eqn.params["extents"])}
        shapes.update({op.name: v.aval.shape for op, v in zip(nest.operands, eqn.invars)})
        parts: tuple[LoopNest, ...] = (nest,)
        if nest.online and not table.BACKENDS["cuda"].one_pass_rows:  # runs as two nests
            parts = unpair(nest)
            dtypes[nest.online] = dtypes[nest.output]
        for part in parts:
            schedule = choose_gpu_schedule(part, dtypes)
            label = (names or {}).get(part, part.label)
            if schedule.strategy == "xla":
                lines.append(f"{label}: {schedule.describe()}")
            else:
                report = cuda_report(part, dtypes, shapes)  # chosen without proven tests
                lines += [f"{label}: {report.lines()[0]}", *report.lines()[1:]]
            shapes[part.output] = output_shape(part, shapes)
    return lines
