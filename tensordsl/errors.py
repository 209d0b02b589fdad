"""The errors a user sees, and how their messages are laid out.

Every mistake in user input raises a `TensorDSLError` subclass (also a `ValueError`, or a
`NotImplementedError` for valid input that is not supported). Every message has the layout of
`format_error`: what is wrong on one line; the source, with a caret (or tildes) under the
offending text; `expected ...`, what was expected; and `hint: ...`, a close match where one
exists. The goldens in `tests/golden/errors` pin the wording.

>>> print(format_error("unknown function 'expp'", "Y[i] := expp(X[i])", (8, 12),
...                    expected="a function such as exp or log", hint=close_match("expp", ["exp"])))
unknown function 'expp'
  Y[i] := expp(X[i])
          ~~~~
expected a function such as exp or log
hint: did you mean 'exp'?
"""

from __future__ import annotations

import contextlib
import difflib
from collections.abc import Iterable, Iterator

from codegen import config
from codegen.errors import SettingError as CodegenSettingError
from codegen.errors import Unsupported


def close_match(word: str, candidates: Iterable[str]) -> str | None:
    """A `did you mean 'x'?` hint for the candidate closest to `word`, if any is close."""
    if not isinstance(word, str):
        return None  # what the user passed may be of any type
    found = difflib.get_close_matches(word, sorted(set(candidates)), n=1, cutoff=0.6)
    return f"did you mean '{found[0]}'?" if found else None


def _underline(source: str, span: tuple[int, int]) -> list[str]:
    """The source line holding `span`, and a caret or tildes under the span."""
    start = max(0, min(span[0], len(source)))
    line_start = source.rfind("\n", 0, start) + 1
    line_end = source.find("\n", start)
    line_end = len(source) if line_end < 0 else line_end
    line = source[line_start:line_end]
    stop = max(start + 1, min(span[1], line_end))
    width = stop - start
    # Keep tabs so that the marker lines up with the text above it.
    pad = "".join(c if c == "\t" else " " for c in line[: start - line_start])
    marker = "^" if width == 1 else "~" * width
    return [f"  {line}", f"  {pad}{marker}"]


def _source_lines(source: str) -> list[str]:
    """Every line of the source (a program has several), without blank lines around them."""
    lines = source.split("\n")
    text = [n for n, line in enumerate(lines) if line.strip()]
    return lines[text[0] : text[-1] + 1] if text else lines[:1]


def format_error(
    what: str,
    source: str | None = None,
    span: tuple[int, int] | None = None,
    expected: str | None = None,
    hint: str | None = None,
) -> str:
    """Lay out an error message: what, the underlined source, what was expected, a hint.

    Args:
        what: one line saying what is wrong.
        source: the statement, shown under the first line.
        span: `(start, stop)` character offsets of the offending text in `source`.
        expected: what was expected, shown as `expected ...`.
        hint: a suggestion, shown as `hint: ...`.

    Returns:
        The message, several lines without a trailing newline.

    >>> print(format_error("unexpected '}'", "A[i}", (3, 4), expected="',' or ']'"))
    unexpected '}'
      A[i}
         ^
    expected ',' or ']'
    """
    lines = [what]
    if source is not None:
        if span is None:
            lines.extend(f"  {line}" for line in _source_lines(source))
        else:
            lines.extend(_underline(source, span))
    if expected:
        lines.append(f"expected {expected}")
    if hint:
        lines.append(f"hint: {hint}")
    return "\n".join(lines)


class _Worded(Exception):
    """A message in `format_error`'s layout; `.source` and `.span` locate what it is about."""

    def __init__(
        self,
        what: str,
        source: str | None = None,
        span: tuple[int, int] | None = None,
        *,
        expected: str | None = None,
        hint: str | None = None,
    ) -> None:
        super().__init__(format_error(what, source, span, expected, hint))
        self.what = what
        self.source = source
        self.span = span
        self.expected = expected
        self.hint = hint


class TensorDSLError(_Worded):
    """Base of every error caused by user input; `.source` and `.span` locate it."""

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.what, self.source, self.span, self.expected, self.hint))


def _rebuild(
    cls: type[TensorDSLError],
    what: str,
    source: str | None,
    span: tuple[int, int] | None,
    expected: str | None,
    hint: str | None,
) -> TensorDSLError:
    return cls(what, source, span, expected=expected, hint=hint)


class ParseError(TensorDSLError, ValueError):
    """The source is not a statement of the language."""


class UnknownNameError(TensorDSLError, ValueError):
    """An unknown function, or a name used in two incompatible roles."""


class IndexExpressionError(TensorDSLError, ValueError):
    """An index expression that is not affine with integer coefficients, or a bad left side."""


class RangeError(TensorDSLError, ValueError):
    """An index without a range, extents that disagree, an empty range, a read out of bounds."""


class ShapeError(TensorDSLError, ValueError):
    """The wrong rank or number of arguments."""


class ArgumentCountError(ShapeError, TypeError):
    """A call with the wrong number of inputs, a missing one, or inputs given both by position
    and by name: a `TypeError`, as for a Python function (and a `ShapeError`, as before)."""


class InputError(TensorDSLError, ValueError):
    """An input of a call that is not an array of real numbers (None, a string, ragged)."""


class ReductionError(TensorDSLError, ValueError):
    """A reduction that does not exist."""


class ExpressionError(TensorDSLError, ValueError):
    """A value that is not a finite real number (`1/0`, `sqrt(-1)`, `1e999`)."""


class ScheduleError(TensorDSLError, ValueError):
    """A schedule or loop order that does not fit the kernel's nest."""


class OptionError(TensorDSLError, ValueError):
    """An option of a ready layer (`tensordsl.nn`) that has no meaning: a padding, a stride."""


class SettingError(TensorDSLError, ValueError):
    """A `TENSORDSL_*` environment variable whose value cannot be used."""


class UnsupportedError(TensorDSLError, NotImplementedError):
    """Valid input that tensordsl does not handle (yet)."""


class TensorDSLWarning(_Worded, UserWarning):
    """Base of the warnings about user input: the message has `format_error`'s layout."""


class IndexNameWarning(TensorDSLWarning):
    """A statement's index names look like a typo (`A[i,k] * B[kk,j]`)."""


@contextlib.contextmanager
def user_facing(source: str | None = None) -> Iterator[None]:
    """Turn the compiler's `codegen.errors.Unsupported` into an `UnsupportedError` that shows
    `source` (passes know nests, not the text they came from), and its `SettingError` into
    ours.

    >>> with user_facing("Y[i] := X[i]"):  # doctest: +ELLIPSIS
    ...     raise Unsupported("no gradient for the reduction 'median'")
    Traceback (most recent call last):
    ...
    tensordsl.errors.UnsupportedError: no gradient for the reduction 'median'
      Y[i] := X[i]
    """
    try:
        yield
    except Unsupported as error:
        raise UnsupportedError(
            error.what, source, expected=error.expected, hint=error.hint
        ) from None
    except CodegenSettingError as error:
        raise SettingError(error.what, expected=error.expected, hint=error.hint) from None


def check_settings() -> None:
    """Every `TENSORDSL_*` setting read (`codegen.config.check_settings`): a bad value is a
    `SettingError` when a kernel is called, before JAX traces or lowers anything.

    Raises:
        SettingError: the first setting whose value cannot be used.
    """
    with user_facing():
        config.check_settings()
