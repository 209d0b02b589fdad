"""`td.kernel` for programs: several statements in one callable.

`td.kernel` gives a `ProgramKernel` for several statements (or `outputs=`). A call checks
the inputs' shapes against every statement, then `binding.programs.run_program` fuses the
statements for those shapes (`codegen.passes.fusion`: the cost model's choices) and runs the
fused nests as one differentiable function (`binding.program_grad.FusedProgram`); with
`TENSORDSL_FUSE=0`, each statement in order, every intermediate stored. Every nest is the
primitive of a one-statement kernel: `jit`, `grad` and `vmap` work on every back end.

>>> import numpy as np
>>> softmax = ProgramKernel('''
...     (max) M[i] := X[i,j]
...     Z[i] := exp(X[i,j] - M[i])
...     P[i,j] := exp(X[i,j] - M[i]) / Z[i]
... ''', backend="reference")
>>> softmax.inputs, softmax.outputs
(('X',), ('P',))
>>> np.round(softmax(np.log(np.array([[1.0, 3.0], [2.0, 2.0]]))), 3).tolist()
[[0.25, 0.75], [0.5, 0.5]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from codegen import config
from codegen.ir.nest import LoopNest
from codegen.ir.program import Program, live_statements
from codegen.passes.online import pair_stored, unpair
from codegen.passes.row_passes import row_passes
from codegen.recursion import deeply
from tensordsl import callables
from tensordsl.backends import table
from tensordsl.binding import gather
from tensordsl.binding.programs import auto_backend, fuse_program, run_program
from tensordsl.errors import UnsupportedError
from tensordsl.explain.spelling import Spelling, label, spellings
from tensordsl.frontend import arguments, ellipsis
from tensordsl.frontend.fusion_choices import fuse_option
from tensordsl.frontend.statements import (
    LoweredProgram,
    check_program_shapes,
    line_of,
    lower_program,
    stage_groups,
)
from tensordsl.stages import stages

__all__ = ["ProgramKernel"]


class ProgramKernel:
    """Statements run in order as one kernel; the outputs of earlier ones feed later ones.

    Args:
        source: statements separated by newlines or `;`, `#` comments.
        outputs: the statement outputs returned, as a tuple in this order; by default the
            last statement's output, returned as one array.
        reduce: the reduction of statements without a prefix ("sum" by default).
        ranges: an extent or `range` per index, for every statement that has the index.
        backend: "auto", "reference", "c" or "cuda", for every statement.
        nograd: inputs that never get a gradient.
        precision: of the contractions given to XLA's dot, for every statement (see
            `tensordsl.kernel.Kernel`).
        fuse: True (default): the cost model decides, per intermediate, whether it is
            recomputed where read or stored (`explain(shapes)` shows each decision); False:
            every intermediate stored; a dict forces some, `{"H": "store", "S": "inline"}`.

    Raises:
        TensorDSLError: a subclass naming the mistake, underlined in the program source.
    """

    def __init__(
        self,
        source: str,
        *,
        outputs: Sequence[str] | str | None = None,
        reduce: str | None = None,
        ranges: Mapping[str, int | range] | None = None,
        backend: str = "auto",
        nograd: tuple[str, ...] = (),
        schedule: Any = None,
        loop_order: tuple[str, ...] | None = None,
        precision: Any = None,
        fuse: bool | Mapping[str, str] = True,
    ):
        self.source_text = source = arguments.source_text(source)
        self._lowered: LoweredProgram = lower_program(
            source, outputs=outputs, reduce=reduce, ranges=arguments.extents(ranges, source)
        )
        self.backend = arguments.backend(backend, table.BACKEND_NAMES)
        self.nograd = arguments.nograd(nograd, self.inputs, source, of="program")
        self.precision = arguments.precision(precision)
        self.fuse = fuse_option(fuse, self._lowered, source)
        groups = stage_groups(self._lowered)
        self._stages = stages(self, groups, reduce, ranges) if len(groups) > 1 else ()
        if schedule is not None or loop_order is not None:
            raise UnsupportedError(
                "schedule= and loop_order= apply to kernels of one statement",
                expected="no schedule for a program (each statement uses the heuristic's)",
            )
        self.__signature__ = callables.signature(self.inputs)
        by_output = {nest.output: nest for nest in self.program.statements}
        self.__doc__ = callables.kernel_doc(
            "\n".join(line.strip() for line in source.strip().splitlines()),
            [(op.name, op.rank) for op in self.program.inputs if op.name in self.inputs],
            [by_output[name] for name in self.outputs],
            program=True,
        )

    def _key(self) -> tuple[Any, ...]:
        """What the program computes and returns, and how: equal keys, interchangeable."""
        return (self.program, self._lowered.returns_tuple, self.backend, self.nograd, self.fuse)

    def __eq__(self, other: object) -> bool:
        """Programs of the same statements (their nests), outputs and options are equal."""
        return type(other) is type(self) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def build(self, shapes: Mapping[str, Any], *, dtype: str | None = None) -> None:
        """Build every kernel a `jax.jit(jax.value_and_grad(...))` of a call needs, now (see
        `Kernel.build`): the fused nests for these shapes and their gradient nests.

        Raises:
            ShapeError, RangeError: as for a call with inputs of these shapes.
        """
        table, dtypes = callables.example_shapes(shapes, callables.check_dtype(dtype))
        gathers = [g for s in self._lowered.statements for g in s.gathers]
        dtypes = gather.index_dtypes(gathers, shapes, dtypes)
        arguments.bind(self.inputs, self.source_text, (), table)
        check_program_shapes(self._lowered, table)
        callables.warm_up(self, self.inputs, table, dtypes, self.nograd)

    @property
    def program(self) -> Program:
        """The program IR: every statement's nest, the inputs, outputs and shapes."""
        return self._lowered.program

    @property
    def spelled(self) -> tuple[Spelling, ...]:
        """Its gathered operands as written (`tensordsl.explain.spelling`)."""
        return spellings(self._lowered.statements)

    @property
    def inputs(self) -> tuple[str, ...]:
        """The names no statement defines, in order of first appearance (scalars included)."""
        gathered = self._lowered.gathered
        return tuple(n for n in self.program.input_names if n not in gathered)

    @property
    def outputs(self) -> tuple[str, ...]:
        return self.program.outputs

    def __repr__(self) -> str:
        return f"tensordsl.kernel({self.source_text!r}, outputs={self.outputs!r})"

    def __str__(self) -> str:
        return self.explain()

    def statement_text(self, n: int) -> str:
        """The source text of statement `n` (0-based)."""
        return self.source_text[slice(*self._lowered.statements[n].statement.span)]

    def explain(
        self, shapes: Mapping[str, tuple[int, ...]] | None = None, *, target: str | None = None
    ) -> str:
        """A summary (inputs, outputs, shapes; with `shapes`, what is recomputed or stored and
        the nests a call runs, with each schedule in words), then each statement's nests;
        with `shapes` (checked as a call checks them: bounds are then numbers), also the
        fused nests with their gradient nests. With `target` ("cuda" or "pallas"; needs
        `shapes`), also the static report of every kernel a call runs (`Kernel.explain`).
        """
        from tensordsl.explain.gpu_report import report_lines
        from tensordsl.explain.nests import check_report_target, explain

        if target is not None:
            check_report_target(target, shapes)
            assert shapes is not None
            text = self.explain(shapes)
            jaxpr = self._call_jaxpr(shapes, "float32", backend=target)
            spelled = self.spelled
            return "\n".join([text, *report_lines(target, jaxpr, spelled=spelled)])

        known = None if shapes is None else check_program_shapes(self._lowered, shapes)
        for low in self._lowered.statements if known is not None else ():
            known.update(gather.gathered_shapes(low, known))
        lines = self._summary()
        details: list[str] = []
        if known is None:
            lines.append(
                "nests: each statement's forward and gradient nests as written, below; "
                "explain(shapes) shows the fused nests a call runs, with their schedules"
            )
        else:
            head, details = self._fused_lines(known)
            lines += head
        dots = table.backend(self.backend).xla_dots  # "auto" resolved once, not per statement
        for n, low in enumerate(self._lowered.statements):
            start = low.statement.span[0]
            lines.append(
                f"statement {n + 1} (line {line_of(self.source_text, start)}): "
                + self.statement_text(n)
            )
            text = explain(low.nest, shapes=known, spelled=spellings(low), xla_dots=dots)
            lines += ["  " + line for line in text.split("\n")]
        return "\n".join([*lines, *details])

    def _fused_lines(self, known: Mapping[str, tuple[int, ...]]) -> tuple[list[str], list[str]]:
        """The summary of what a call with these shapes runs, and the fused nests' details."""
        from tensordsl.explain.nests import explain, online_lines
        from tensordsl.explain.summary import summary_lines

        live = live_statements(self.program)
        if not config.fuse_programs():
            return ["fused: no (TENSORDSL_FUSE=0): every statement runs as written"], []
        inputs = {op.name: known[op.name] for op in self.program.inputs}
        concrete = self.program.concrete_shapes(inputs)
        auto = (
            auto_backend(self.program, known, "float32", self.fuse)
            if self.backend == table.AUTO
            else None
        )
        record = table.backend(self.backend if auto is None else auto.backend)
        beside = record.sums_beside
        fused = fuse_program(live, self.program.outputs, concrete, self.fuse, beside=beside)
        stored = [nest.output for nest in fused.stored]
        lines = [
            f"fused for these shapes: {', '.join(stored)} computed by {len(stored)} nest(s); "
            + (
                f"{', '.join(fused.inlined)} recomputed where read, never stored"
                if fused.inlined
                else "every intermediate stored"
            )
        ]
        lines += ["  " + str(decision) for decision in fused.decisions]
        runs = pair_stored(fused.stored, concrete) if record.one_pass_rows else fused.stored
        forward = {f"forward {n.output}{'+' + n.online if n.online else ''}": n for n in runs}
        lines += summary_lines(forward, self.backend, auto=auto)
        outputs = self.program.outputs
        if record.row_passes and (rows := row_passes(runs, outputs=outputs, shapes=concrete))[1]:
            lines.append("forward alone (not differentiated): " + "; ".join(rows[1]))
            if rows[0] != tuple(runs):
                lines += summary_lines({f"forward {n.output}": n for n in rows[0]}, record.name)[1:]
        lines += [
            f"  ({nest.output}+{nest.online}: {nest.online} and {nest.output} {record.one_pass_as})"
            for nest in runs
            if nest.online
        ]
        lines.append(
            "backward: each fused statement's gradient nests (below); those of an input "
            "that several statements read run as one nest"
        )
        details = []
        for nest in fused.stored:
            details.append(f"fused statement {nest.output}")
            text = explain(nest, shapes=concrete, spelled=self.spelled, xla_dots=record.xla_dots)
            details += ["  " + line for line in text.split("\n")]
        for nest in runs:
            if nest.online:
                details.append(
                    f"one pass: {nest.online} and {nest.output} on the {record.name} back end "
                    f"{record.one_pass_as}"
                )
                spelled = self.spelled
                details += ["  " + line for line in online_lines(nest, concrete, spelled)]
        return lines, details

    def _summary(self) -> list[str]:
        program = self.program
        live = {nest.output for nest in live_statements(program)}
        lines = [
            f"program of {len(program.statements)} statements, run in order; intermediates "
            "are recomputed where read or stored, as a cost model decides for the call's "
            "shapes (explain(shapes) says which and why)",
            f"  inputs   {', '.join(self.inputs)}",
            f"  outputs  {', '.join(self.outputs)}",
        ]
        for name, shape in program.shapes:
            role = "output" if name in self.outputs else "intermediate"
            role = role if name in live else "unused (not run)"
            dims = ", ".join(str(n) for n in shape)
            lines.append(f"  {name}: shape ({dims}{',' * (len(shape) == 1)})   {role}")
        return lines

    def profile(
        self, shapes: Mapping[str, Any], *, dtype: str = "float32", reps: int = 7, wrt: Any = None
    ) -> Any:
        """Time every C nest a forward+backward call runs, each alone (see `Kernel.profile`,
        `wrt` too): the nests of the fused program for these shapes (the stored statements,
        their auxiliary nests and the gradient nest of every input `wrt` names), as a call
        runs them.

        Returns:
            A `tensordsl.explain.timing.Profile`; a stored statement's nest is named by its output
            (a one-pass nest by both, `O+L`), a gradient nest by the gradient's name (`dQ`).

        Raises:
            ShapeError, RangeError: as for a call with arrays of these shapes.
        """
        from tensordsl.explain.timing import profile_jaxpr

        jaxpr, spelled = (
            self._call_jaxpr(shapes, dtype, wrt=wrt),
            self.spelled,
        )
        return profile_jaxpr(jaxpr, reps=reps, dtype=dtype, spelled=spelled)

    def source(
        self, target: str = "c", shapes: Mapping[str, tuple[int, ...]] | None = None
    ) -> dict[str, str]:
        """Generated code (float32). Without `shapes`: every nest of every statement as
        written, `"<output>.<nest name>"` keys. With `shapes` (one per input): the nests a
        forward+backward call runs for them, fused, keyed by their output (`dQ`, ...; a
        one-pass nest `O+L` in C and CUDA, its two nests `L` and `O` elsewhere; a name run
        twice gets `.2`), in the order `jax.value_and_grad` runs them; a nest that runs as XLA's dot
        (`explain`) shows the kernel it falls back to. The keys are `profile`'s names (the
        gradient of a gathered operand by its access, `dW[tok[i], d]`).
        """
        from tensordsl.explain.nests import generated_sources, source_emitter
        from tensordsl.explain.timing import equation_dtypes, nest_equations

        if shapes is None:
            return {
                f"{low.nest.output}.{name}": text
                for low in self._lowered.statements
                for name, text in generated_sources(low.nest, target).items()
            }
        emit = source_emitter(target)
        record = table.BACKENDS[target]
        sources: dict[str, str] = {}
        spelled = self.spelled
        for eqn in nest_equations(self._call_jaxpr(shapes, "float32")):
            dtypes = equation_dtypes(eqn)
            nest = eqn.params["nest"]
            parts: tuple[LoopNest, ...] = (nest,)
            if nest.online and not record.one_pass_rows:  # it runs as its two nests
                parts = unpair(nest)
                dtypes[nest.online] = dtypes[nest.output]
            for part in parts:
                name = label(part.label, spelled)
                key, count = name, 1
                while key in sources:
                    count += 1
                    key = f"{name}.{count}"
                sources[key] = emit(part, dtypes, role="call")
        return sources

    def _call_jaxpr(self, shapes: Mapping[str, Any], dtype: str, backend: str = "", wrt=()) -> Any:
        """The jaxpr of `jax.value_and_grad` of a call on inputs of these shapes (`backend`,
        C by default; inputs of `dtype`) with respect to every input, or to those `profile`'s
        `wrt` asks for (`()`: every input): its nest equations are the nests a call runs."""
        if self._stages:
            raise UnsupportedError(
                "profile() and source(shapes=...) of a program that gathers from its own "
                "outputs are not supported yet",
                self.source_text,
                expected="a program that gathers from inputs only, or source() without shapes",
                hint="jax.jit(program).lower(...) shows what a call runs",
            )
        from tensordsl.explain.timing import skipped_inputs, value_and_grad_jaxpr

        shapes = check_program_shapes(self._lowered, shapes)  # `...` flattened
        skip = wrt != () and skipped_inputs(dtype, self.inputs, shapes, wrt, self.source_text)
        gathers = [s for s in self._lowered.statements if s.gathers]
        arrays = {n for s in gathers for g in s.gathers for n in g.arrays}

        def loss(*values: Any) -> Any:  # index arrays come as floats: their positions
            known = {
                n: v.astype(jnp.int32) if n in arrays else v for n, v in zip(self.inputs, values)
            }
            on = backend or table.PROFILED.name
            for statement in gathers:
                known.update(gather.gathered(statement, known, shapes, self.source_text, on))
            options = {"nograd": self.nograd, "fuse": self.fuse, "precision": self.precision}
            results = run_program(self.program, known, backend=on, **options)
            floats = [jnp.sum(r) for r in results if jnp.issubdtype(r.dtype, jnp.inexact)]
            return sum(floats, start=jnp.zeros((), dtype))  # an argmax alone: 0

        nograd = self.nograd | arrays | (skip or frozenset())
        return value_and_grad_jaxpr(loss, self.inputs, shapes, dtype, nograd)

    @deeply
    def __call__(self, /, *args: Any, **kwargs: Any) -> jax.Array | tuple[jax.Array, ...]:
        """Run the program: inputs all by position (in `k.inputs` order) or all by name;
        returns the last statement's output, or a tuple with `outputs=`.

        Raises:
            TypeError: (an `ArgumentCountError`) the wrong number of inputs, or a missing one.
            ShapeError, RangeError: ranks or extents that do not fit the statements.
        """
        given = arguments.bind(self.inputs, self.source_text, args, kwargs)
        if self._stages:
            known = dict(zip(self.inputs, given))
            for stage in self._stages:
                found = stage(*(known[name] for name in stage.inputs))
                known.update(zip(stage.outputs, found))
            results = tuple(known[name] for name in self.outputs)
            return results if self._lowered.returns_tuple else results[0]
        if self._lowered.gathered:
            given = [
                arguments.input_array(n, v, self.source_text) for n, v in zip(self.inputs, given)
            ]
            gathers = [g for s in self._lowered.statements for g in s.gathers]
            gather.check_index_dtypes(gathers, dict(zip(self.inputs, given)), self.source_text)
        values = arguments.computed_inputs(self.inputs, given, self.source_text)
        batched, lead = self._lowered.batched, ()
        if batched is not None:  # `...`: the leading axes flattened into one
            values, _, lead = ellipsis.flatten(batched, self.inputs, values, self.source_text)
        known = check_program_shapes(
            self._lowered, {name: np.shape(v) for name, v in zip(self.inputs, values)}
        )
        by_name = dict(zip(self.inputs, values))
        on = table.resolve_backend(self.backend)
        for statement in self._lowered.statements:
            if statement.gathers:
                found = gather.gathered(statement, by_name, known, self.source_text, on)
                by_name.update(found)
        dtype = jnp.result_type(*values) if values else jnp.float32  # auto's tuning rows
        results = run_program(
            self.program,
            by_name,
            backend=auto_backend(self.program, _shapes(by_name), dtype, self.fuse).backend
            if self.backend == table.AUTO
            else on,
            nograd=self.nograd,
            precision=self.precision,
            fuse=self.fuse,
        )
        if batched is not None:
            results = ellipsis.restore(batched, self.outputs, results, lead)
        return results if self._lowered.returns_tuple else results[0]


def _shapes(values: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(np.shape(v)) for name, v in values.items()}
