"""`td.kernel`: the user-facing object for one index expression."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from codegen.ir.nest import LoopNest
from codegen.ir.reductions import REDUCTIONS
from codegen.recursion import deeply
from tensordsl import callables
from tensordsl.backends import table
from tensordsl.binding import gather
from tensordsl.binding import primitive as jax_bind
from tensordsl.errors import (
    UnsupportedError,
)
from tensordsl.explain.spelling import Spelling, label, spellings
from tensordsl.frontend import arguments, ellipsis
from tensordsl.frontend.lower import Lowered, lower
from tensordsl.frontend.one_hot import pick_text
from tensordsl.frontend.parse import parse
from tensordsl.frontend.shapes import check_shapes
from tensordsl.frontend.statements import is_program
from tensordsl.options import check_options, forward_schedule, initial_value, no_init
from tensordsl.program_kernel import ProgramKernel


class Kernel:
    """An index expression, parsed and checked, callable on JAX or NumPy arrays.

    Args:
        source: one statement, e.g. `"C[i,j] := A[i,k] * B[k,j]"`.
        reduce: the reduction over indices not on the left: "sum" (default), "max",
            "min", "prod" or "logsumexp".
        ranges: an extent (`{"k": 3}`) or an explicit `range` per index.
        backend: "auto" (default: on a CUDA GPU, pallas where the tuning table prefers it
            for the nest's kind, else cuda with CuPy; c elsewhere), "reference", "c",
            "cuda" or "pallas".
        nograd: inputs that never get a gradient: one name or a tuple of names.
        schedule: a `codegen.c.schedule.Schedule` for the forward nest on the C back end (the
            CUDA back end and all gradient nests use their heuristics).
        loop_order: index names, outermost first, for the forward nest on the C back end.
        precision: of the kernel's matrix products (and their gradients'), as `jnp.einsum`
            takes it: None (default: jnp's default, `jax.default_matmul_precision`),
            "default", "high", "highest" or a `jax.lax.Precision`. The pallas back end's
            tile dots and the contractions the c and cuda back ends give to XLA's dot follow
            it (TF32 on a GPU for "default" and "high"); their generated kernels and the
            reference back end (the test oracle) compute in exact float32 whatever it says.
        init: Tullio's starting value of the reduction, a real number: the result is
            `init` combined with the reduction (`init + sum`, `max(init, max)`, ...), so it
            is also the value of an empty reduction; gradients follow.

    Raises:
        TensorDSLError: a subclass naming the mistake in the source or an option.

    >>> import numpy as np
    >>> k = kernel("C[i,j] := A[i,k] * B[k,j]", backend="reference")
    >>> k.inputs, k.output
    (('A', 'B'), 'C')
    >>> k(np.eye(2), np.arange(4.0).reshape(2, 2)).tolist()
    [[0.0, 1.0], [2.0, 3.0]]
    """

    def __init__(
        self,
        source: str,
        *,
        reduce: str | None = None,
        ranges: Mapping[str, int | range] | None = None,
        backend: str = "auto",
        nograd: str | tuple[str, ...] | None = (),
        schedule: Any = None,
        loop_order: str | tuple[str, ...] | None = None,
        precision: Any = None,
        init: float | None = None,
    ):
        self.source_text = source = arguments.source_text(source)
        extents = arguments.extents(ranges, source)
        self._lowered: Lowered = lower(parse(source), reduce=reduce, ranges=extents)
        self.backend = arguments.backend(backend, table.BACKEND_NAMES)
        self.nograd = arguments.nograd(nograd, self.inputs, source, of="kernel")
        self.schedule = forward_schedule(self.nest, schedule, loop_order, source, self.backend)
        self.precision = arguments.precision(precision)
        self.init = initial_value(init, self.nest, source)
        self._batched = ellipsis.leading_axes([self._lowered.statement], source)
        self._checked: set[tuple[tuple[str, tuple[int, ...]], ...]] = set()
        self.__signature__ = callables.signature(self.inputs)
        self.__doc__ = callables.kernel_doc(
            callables.statement_text(source, self.nest),
            [(op.name, op.rank) for op in self.nest.operands if op.name in self.inputs],
            [self.nest],
            program=False,
        )

    def _key(self) -> tuple[Any, ...]:
        """What a kernel computes and how: equal keys, interchangeable kernels."""
        return (self.nest, self.backend, self.nograd, self.schedule, self.init)

    def __eq__(self, other: object) -> bool:
        """Kernels of the same canonical statement (its nest) and options are equal, so a
        kernel kept as a static field (Equinox, Flax) does not retrace per instance."""
        return type(other) is type(self) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def nest(self) -> LoopNest:
        """The forward loop nest."""
        return self._lowered.nest

    @property
    def inputs(self) -> tuple[str, ...]:
        """Input names in order of first appearance in the body."""
        return self._lowered.inputs

    @property
    def output(self) -> str:
        return self.nest.output

    @property
    def spelled(self) -> tuple[Spelling, ...]:
        """Its gathered operands as written (`tensordsl.explain.spelling`)."""
        return spellings(self._lowered)

    def __repr__(self) -> str:
        return f"tensordsl.kernel({self.source_text!r})"

    def __str__(self) -> str:
        return self.explain()

    def explain(
        self,
        shapes: Mapping[str, tuple[int, ...]] | None = None,
        *,
        target: str | None = None,
        summary: bool = True,
    ) -> str:
        """A summary (the nests, the back end, each schedule in words), then the forward
        nest and every gradient nest, with their ranges, readable.

        `shapes` (one per input) are checked as a call checks its inputs' shapes;
        `summary=False` leaves the summary out (the CLI shows the schedules of both targets).
        With `target="cuda"` (needs `shapes`), also the static report of every CUDA kernel a
        forward+backward call runs: grid, block, how lanes read memory, FMAs and bytes per
        output element against the minimum, registers (docs/backends.md); with
        `target="pallas"`, the tile program of each (grid, tiles, dots, bounds).
        """
        from tensordsl.explain.gpu_report import report_lines
        from tensordsl.explain.nests import check_report_target, explain, kernel_nests
        from tensordsl.explain.timing import nest_jaxpr

        low = self._lowered
        if target is not None:
            check_report_target(target, shapes)
        if shapes is not None:
            shapes = self.check_shapes(shapes)
            shapes = {**shapes, **gather.gathered_shapes(low, shapes)}
        src = low.statement.source
        gathered = [
            (g.table, pick_text(low.statement, g) if g.masked else src[g.span[0] : g.span[1]])
            for g in low.gathers
        ]
        spelled = spellings(low)
        schedule = self.schedule if table.backend(self.backend).takes_schedule else None
        text = explain(
            self.nest,
            shapes=shapes,
            gathered=gathered,
            unread=low.unread,
            backend=self.backend if summary else None,
            schedule=schedule,
            spelled=spelled,
            xla_dots=table.backend(self.backend, self.nest).xla_dots,
        )
        if target is None or shapes is None:
            return text
        names = {each: label(name, spelled) for name, each in kernel_nests(self.nest).items()}
        jaxpr = nest_jaxpr(self.nest, shapes, backend=target, precision=self.precision)
        return "\n".join([text, *report_lines(target, jaxpr, names, spelled)])

    def check_shapes(self, shapes: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        """`shapes` as int tuples, checked as a call would check its inputs' shapes."""
        table = arguments.shape_table(shapes, self.source_text)
        arguments.unknown_names(table, self.inputs, self.source_text)
        if self._batched is not None:
            lead = ellipsis.batch_shape(self._batched, table, self.source_text)
            table = ellipsis.flat_shapes(self._batched, table, lead)
        check_shapes(self._lowered, table)
        return table

    def source(self, target: str = "c") -> dict[str, str]:
        """Generated code for every nest, as a dict from nest name to source text."""
        from tensordsl.explain.nests import generated_sources

        return generated_sources(self.nest, target, spelled=spellings(self._lowered))

    def profile(
        self, shapes: Mapping[str, Any], *, dtype: str = "float32", reps: int = 7, wrt: Any = None
    ) -> Any:
        """Time every C nest a forward+backward pass runs, each alone, on these input shapes.

        Args:
            shapes: the shape of every input by name (a scalar's shape is `()`).
            dtype: "float32" (default) or "float64", for every input.
            reps: calls per nest after a warm-up; the median is reported.
            wrt: the inputs differentiated, as in the jitted computation profiled; None:
                every input but the scalars (shape `()`, most often Python numbers).

        Returns:
            A `tensordsl.explain.timing.Profile`: `.timings` (name, schedule, seconds per
            nest) and a table as `str()`. See docs/backends.md, "Which nest is slow".

        Raises:
            ShapeError, RangeError: as for a call with arrays of these shapes.
        """
        from tensordsl.explain.timing import profile_nests, skipped_inputs

        checked = self.check_shapes(shapes)
        skipped = skipped_inputs(dtype, self.inputs, checked, wrt, self.source_text)
        return profile_nests(
            self.nest,
            {**checked, **gather.gathered_shapes(self._lowered, checked)},
            dtype=dtype,
            schedule=self.schedule,
            nograd=self.nograd | self._lowered.unread | skipped,
            reps=reps,
            spelled=spellings(self._lowered),
        )

    def build(self, shapes: Mapping[str, Any], *, dtype: str | None = None) -> None:
        """Build every kernel a `jax.jit(jax.value_and_grad(...))` of a call needs, now.

        A first call otherwise builds them while it is traced (seconds per kernel when the
        disk cache does not have them); call this at start-up to pay that cost up front.

        Args:
            shapes: for every input, its shape (a tuple; a scalar's is `()`) or an example
                array, whose dtype is used.
            dtype: the dtype of the inputs given by shape (default: the example arrays'
                common dtype, else float32), as a call computes in it (float32 for
                float64 unless x64 is enabled).

        Raises:
            ShapeError, RangeError: as for a call with inputs of these shapes.
        """
        table, dtypes = callables.example_shapes(shapes, callables.check_dtype(dtype))
        dtypes = gather.index_dtypes(self._lowered.gathers, shapes, dtypes)
        arguments.bind(self.inputs, self.source_text, (), table)
        table = self.check_shapes(table)
        callables.warm_up(self, self.inputs, table, dtypes, self.nograd)

    @deeply
    def __call__(self, /, *args: Any, **kwargs: Any) -> jax.Array:
        """Run the kernel: inputs all by position (in `k.inputs` order) or all by name.

        Works on JAX and NumPy arrays and Python numbers, under `jit`, `grad` and `vmap`.

        Raises:
            TypeError: (an `ArgumentCountError`) the wrong number of inputs, or a missing one.
            ShapeError, RangeError: ranks or extents that do not fit the statement.
        """
        given = arguments.bind(self.inputs, self.source_text, args, kwargs)
        values = arguments.narrowed_weak_floats(
            [arguments.input_array(n, v, self.source_text) for n, v in zip(self.inputs, given)]
        )
        shapes = {name: tuple(np.shape(v)) for name, v in zip(self.inputs, values)}
        lead: tuple[int, ...] = ()
        if self._batched is not None:  # `...`: the leading axes flattened into one
            lead = ellipsis.batch_shape(self._batched, shapes, self.source_text)
            flat = ellipsis.flat_shapes(self._batched, shapes, lead)
            values = [
                v.reshape(flat[n]) if flat[n] != shapes[n] else v
                for n, v in zip(self.inputs, values)
            ]
            shapes = flat
        checked = tuple(shapes.items())
        if checked not in self._checked:  # shapes already checked pass again: skip the work
            check_shapes(self._lowered, shapes)
            self._checked.add(checked)
        out_dtype = jax_bind.output_dtype(self.nest, values)
        if self._lowered.gathers:
            gather.check_index_dtypes(
                self._lowered.gathers, dict(zip(self.inputs, values)), self.source_text
            )
        # Read by every back end alike: bool, int8, uint32, ... as int32, int64 or float.
        computed = [arguments.computed_dtype(v.dtype) for v in values]
        values = [v if d == v.dtype else v.astype(d) for v, d in zip(values, computed)]
        nograd = self.nograd
        copied = None
        if self._lowered.gathers:
            backend = table.resolve_backend(self.backend)
            values = _with_gathered(self._lowered, values, shapes, backend)
            nograd = nograd | self._lowered.unread
            copied = self._lowered.copied_gather
        record = table.backend(self.backend, self.nest, values)
        if copied is not None:  # the gather is the result: no nest to run
            out = values[self.nest.operand_names.index(copied)].astype(out_dtype)
        else:
            out = jax_bind.call_nest(
                self.nest,
                values,
                backend=record.name,
                shapes={},
                out_dtype=out_dtype,
                nograd=nograd,
                schedule=self.schedule if record.takes_schedule else None,
                precision=self.precision,
            )
        if self.init is not None:
            combine = REDUCTIONS[self.nest.reduction].init_combine
            assert combine is not None  # `initial_value` refuses init= for the others
            out = getattr(jnp, combine)(jnp.asarray(self.init, out.dtype), out)
        if self._batched is not None and self._batched.output:
            out = out.reshape((*lead, *out.shape[1:]))
        return out


def _with_gathered(
    lowered: Lowered, values: list[Any], shapes: Mapping[str, Any], backend: str
) -> list[Any]:
    """The nest's operands: the call's arrays and the operands gathered from them (for the
    nest on `backend`)."""
    by_name = dict(zip(lowered.inputs, values))
    source = lowered.statement.source
    by_name.update(gather.gathered(lowered, by_name, shapes, source, backend))
    return [by_name[name] for name in lowered.nest.operand_names]


@deeply
def kernel(source: str, **options: Any) -> Kernel | ProgramKernel:
    """Parse and check an index expression; nothing is compiled until the first call.

    See `Kernel` for the options. A source of several statements (or `outputs=`) gives a
    `tensordsl.program_kernel.ProgramKernel`.
    """
    check_options(options, "td.kernel")
    if is_program(source) or "outputs" in options:
        no_init(options, source)
        return ProgramKernel(source, **options)
    if "fuse" in options:
        raise UnsupportedError(
            "fuse= applies to programs of several statements",
            source,
            expected="td.program(...) for a program of one statement, or no fuse=",
        )
    return Kernel(source, **options)


def program(source: str, **options: Any) -> ProgramKernel:
    """Parse and check a program, even of one statement (`td.kernel` gives a `Kernel` for one
    plain statement); nothing is compiled until the first call. See `ProgramKernel` for the
    options.

    >>> import numpy as np
    >>> softmax = program("(max) M[i] := X[i,j]; P[i,j] := exp(X[i,j] - M[i])", backend="reference")
    >>> softmax.outputs
    ('P',)
    >>> softmax(np.zeros((1, 2))).tolist()
    [[1.0, 1.0]]
    """
    check_options(options, "td.program")
    no_init(options, source)
    return ProgramKernel(source, **options)
