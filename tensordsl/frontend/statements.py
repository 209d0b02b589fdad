"""Programs: a source of several statements, checked as a whole and lowered to a `Program`.

Statements are separated by newlines or `;`; `#` starts a comment that runs to the end of
the line. Each statement is parsed by `parse` in place (the text around it blanked), so every
span, and every error's caret, is an offset into the whole program source. A statement may
read the output of any statement before it; the names no statement defines are the inputs.
Each statement is lowered on its own (`lower`: its own reduction prefix, `reduce=` for those
without one, its own ranges); `codegen.ir.program.make_program` adds the output shapes in the
inputs' extents.

>>> low = lower_program('''
...     C[i] := X[i+k] * W[k]      # a correlation
...     D[i] := C[i+1] - C[i]
... ''')
>>> low.program.input_names, low.program.outputs, low.program.shape("D")
(('X', 'W'), ('D',), (-W.shape[0] + X.shape[0],))
>>> check_program_shapes(low, {"X": (10,), "W": (3,)})
{'X': (10,), 'W': (3,), 'C': (8,), 'D': (7,)}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from codegen.ir.extents import output_shape
from codegen.ir.program import Program, make_program
from tensordsl.errors import (
    ParseError,
    RangeError,
    ShapeError,
    TensorDSLError,
    UnknownNameError,
    close_match,
)
from tensordsl.frontend.ellipsis import (
    Batched,
    batch_shape,
    flat_shapes,
    leading_axes,
)
from tensordsl.frontend.lower import Lowered, check_reduction, lower
from tensordsl.frontend.parse import Span, Statement, parse
from tensordsl.frontend.shapes import check_shapes, concrete_shapes
from tensordsl.frontend.translate import Translation, translate

__all__ = [
    "LoweredProgram",
    "check_program_shapes",
    "is_program",
    "lower_program",
    "parse_program",
    "statement_spans",
]


@dataclass(frozen=True)
class LoweredProgram:
    """A lowered program plus what call-time checks need."""

    program: Program
    statements: tuple[Lowered, ...]  # one per statement, in order; sources are the program
    source: str
    returns_tuple: bool  # `outputs=` was given: results come back as a tuple
    batched: Batched | None = None  # where statements use `...` (frontend/ellipsis.py)

    @property
    def gathered(self) -> frozenset[str]:
        """The gathered operands of every statement (computed by the call, not given)."""
        return frozenset(n for s in self.statements for n in s.gathered)


def is_program(source: object) -> bool:
    """True for a source that is not one plain statement (several lines, `;` or `#`)."""
    if not isinstance(source, str):
        return False
    lines = [line for line in source.split("\n") if line.strip()]
    return len(lines) > 1 or ";" in source or "#" in source


def statement_spans(source: str) -> tuple[Span, ...]:
    """The `(start, stop)` offsets of every statement's text, comments and blanks left out.

    >>> statement_spans("A := x  # one\\nB := A; C := B")
    ((0, 6), (14, 20), (22, 28))
    """
    spans = []
    offset = 0
    for line in source.split("\n"):
        code = line.split("#", 1)[0]
        start = offset
        for piece in code.split(";"):
            text = piece.strip()
            if text:
                first = start + len(piece) - len(piece.lstrip())
                spans.append((first, first + len(text)))
            start += len(piece) + 1
        offset += len(line) + 1
    return tuple(spans)


def parse_program(source: str) -> tuple[Statement, ...]:
    """Parse every statement; spans are offsets into `source`, and so are errors' carets.

    Raises:
        ParseError: the program has no statement, or a statement does not parse.
    """
    spans = statement_spans(source)
    if not spans:
        raise ParseError(
            "the program has no statements",
            source,
            expected="at least one statement, such as 'Y[i] := X[i]'",
        )
    statements = []
    for start, stop in spans:
        try:
            statement = parse(" " * start + source[start:stop])
        except TensorDSLError as error:
            raise type(error)(
                error.what, source, error.span, expected=error.expected, hint=error.hint
            ) from None
        statements.append(replace(statement, source=source, span=(start, stop)))
    return tuple(statements)


def line_of(source: str, offset: int) -> int:
    """The 1-based line number of a character offset."""
    return source.count("\n", 0, offset) + 1


def _rank_text(rank: int) -> str:
    return "as a scalar" if rank == 0 else f"with {rank} ind{'ex' if rank == 1 else 'ices'}"


@dataclass
class _Names:
    """What the statements checked so far define and read, for the checks across statements."""

    source: str
    defined: dict[str, tuple[int, Statement]]  # name -> (rank, its statement)
    read: dict[str, tuple[int, Span]]  # input name -> (rank, first read)

    def where(self, span: Span) -> str:
        return f"line {line_of(self.source, span[0])}"

    def define(self, statement: Statement) -> None:
        name, span = statement.output, statement.output_span
        rank = len(statement.indices or ())
        if name in self.defined:
            raise UnknownNameError(
                f"'{name}' is defined twice: in {self.where(self.defined[name][1].span)} and here",
                self.source,
                span,
                expected="one statement per name; give this output a new name",
            )
        if name in self.read:
            read_rank, read_span = self.read[name]
            if read_rank == rank:
                raise UnknownNameError(
                    f"'{name}' is read before the statement that defines it ({self.where(span)})",
                    self.source,
                    read_span,
                    expected=f"the statement that defines '{name}' before every statement "
                    "that reads it",
                )
            raise UnknownNameError(
                f"'{name}' is an input of the program (read {_rank_text(read_rank)} in "
                f"{self.where(read_span)}) and cannot be defined by a statement",
                self.source,
                span,
                expected="a new name for this statement's output",
            )
        self.defined[name] = (rank, statement)

    def use(self, name: str, rank: int, span: Span) -> None:
        if name in self.defined:
            defined, statement = self.defined[name]
            if rank != defined:
                lhs = self.source[statement.span[0] : statement.span[1]].split(":=")[0].strip()
                raise ShapeError(
                    f"'{name}' is read {_rank_text(rank)} here but its statement "
                    f"({self.where(statement.span)}) defines it {_rank_text(defined)}",
                    self.source,
                    span,
                    expected=f"the rank of the definition '{lhs}'",
                )
            return
        before, first = self.read.setdefault(name, (rank, span))
        if before != rank:
            raise ShapeError(
                f"'{name}' is read {_rank_text(rank)} here but {_rank_text(before)} in "
                f"{self.where(first)}",
                self.source,
                span,
                expected=f"the same number of indices on every read of '{name}'",
            )


def _check_reduce(reduce: str | None, source: str) -> None:
    if reduce is not None:
        check_reduction(reduce, source)


def _statement_ranges(
    ranges: Mapping[str, int | range] | None, translations: Sequence[Translation], source: str
) -> list[dict[str, int | range]]:
    """`ranges=` split per statement: each statement gets the indices it has."""
    indices = [t.free + t.reduced for t in translations]
    every = sorted({name for names in indices for name in names})
    for name in ranges or {}:
        if name not in every:
            raise RangeError(
                f"ranges= names {name!r}, which is not an index of any statement",
                source,
                expected="one of " + (", ".join(every) or "no indices"),
                hint=close_match(str(name), every),
            )
    return [{k: v for k, v in (ranges or {}).items() if k in names} for names in indices]


def _outputs(outputs: object, program_defines: Sequence[str], names: _Names) -> tuple[str, ...]:
    """`outputs=` checked: statement outputs, each once; a str is one name."""
    if outputs is None:
        return (program_defines[-1],)
    expected = "statement outputs: " + ", ".join(program_defines)
    if not isinstance(outputs, str | tuple | list) or not outputs:
        raise UnknownNameError(
            f"outputs= is {outputs!r}", names.source, expected="a tuple of " + expected
        )
    chosen = (outputs,) if isinstance(outputs, str) else tuple(outputs)
    for n, name in enumerate(chosen):
        if not isinstance(name, str) or name not in program_defines:
            read = names.read.get(name) if isinstance(name, str) else None
            raise UnknownNameError(
                f"outputs= names {name!r}, which is "
                + ("an input of the program, " if read else "")
                + "not the output of a statement",
                names.source,
                read[1] if read else None,
                expected=expected,
                hint=close_match(str(name), program_defines),
            )
        if name in chosen[:n]:
            raise UnknownNameError(
                f"outputs= names '{name}' twice", names.source, expected="each result once"
            )
    return chosen


def lower_program(
    source: str,
    *,
    outputs: Sequence[str] | str | None = None,
    reduce: str | None = None,
    ranges: Mapping[str, int | range] | None = None,
) -> LoweredProgram:
    """Parse, check and lower a program.

    Args:
        source: statements separated by newlines or `;`, `#` comments.
        outputs: the statement outputs to return, in order (a tuple at call time); by
            default the last statement's output alone.
        reduce: the reduction of statements without a `(reduction)` prefix ("sum").
        ranges: an extent or a `range` per index, for every statement that has the index.

    Returns:
        A `LoweredProgram`: the `Program` and each statement's `Lowered`.

    Raises:
        TensorDSLError: a subclass naming the mistake, the caret in the program source: a
        name defined twice, read before its statement, an input redefined, an intermediate
        read with the wrong rank, `outputs=` naming no statement's output, an empty program,
        and every error of a single statement.
    """
    _check_reduce(reduce, source)
    statements = parse_program(source)
    names = _Names(source, {}, {})
    translations = []
    for statement in statements:
        translation = translate(statement, indices=tuple(ranges or ()))
        for name, rank in translation.operands:
            names.use(name, rank, translation.operand_spans[name])
        names.define(statement)
        translations.append(translation)
    chosen = _outputs(outputs, [s.output for s in statements], names)
    per_statement = _statement_ranges(ranges, translations, source)
    lowered = tuple(
        lower(s, reduce=None if s.reduction else reduce, ranges=r)
        for s, r in zip(statements, per_statement)
    )
    batched = leading_axes([low.statement for low in lowered], source)
    program = make_program([low.nest for low in lowered], outputs=chosen)
    return LoweredProgram(
        program, lowered, source, returns_tuple=outputs is not None, batched=batched
    )


def stage_groups(lowered: LoweredProgram) -> tuple[tuple[int, ...], ...]:
    """The statements split where one gathers from an earlier statement's output (its table
    or an index array is computed by the program): each group runs as a program of its own,
    in order, so that the gather reads a computed array. One group when there is none.

    >>> low = lower_program("Z[i,v] := 2 * X[i,v]; P[i] := Z[i, y[i]]; Q[i] := P[i] + 1")
    >>> stage_groups(low)
    ((0,), (1, 2))
    """
    groups: list[list[int]] = [[]]
    defined: set[str] = set()
    for n, statement in enumerate(lowered.statements):
        late = any(name in defined for g in statement.gathers for name in (g.table, *g.arrays))
        if late and groups[-1]:
            groups.append([])
        groups[-1].append(n)
        defined.add(statement.nest.output)
    return tuple(tuple(group) for group in groups)


def check_program_shapes(
    lowered: LoweredProgram, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, tuple[int, ...]]:
    """Check the inputs' shapes against every statement, in order, as separate kernels would.

    Args:
        lowered: from `lower_program`.
        shapes: the shape of every input by name.

    Returns:
        The shape of every input and every statement output (with `...`, as the call runs
        them: the leading axes flattened into one).

    Raises:
        ShapeError, RangeError: as `check_shapes`, the caret in the program source.
    """
    known = concrete_shapes(shapes, lowered.source)
    if lowered.batched is not None:  # `...`: the leading axes flattened into one
        lead = batch_shape(lowered.batched, known, lowered.source)
        known = flat_shapes(lowered.batched, known, lead)
    for statement in lowered.statements:
        check_shapes(statement, known)
        known[statement.nest.output] = output_shape(statement.nest, known)
    return known


def quoting(lowered: LoweredProgram, source: str) -> LoweredProgram:
    """`lowered` with `source` as its statements' source: a stage of a program run in stages
    (its text is the program's with the other statements blanked, same offsets), so that the
    checks a call makes quote the whole program, not blanks."""
    statements = tuple(
        replace(s, statement=replace(s.statement, source=source)) for s in lowered.statements
    )
    return replace(lowered, statements=statements, source=source)
