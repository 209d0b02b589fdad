"""The compiler's own errors: what a pass cannot do, without the user's source.

`codegen/` knows nests, not the text they came from, so a pass raises `Unsupported` with one
line saying what it cannot do; the user-facing layer (`tensordsl.errors.user_facing`) turns
it into a `tensordsl.UnsupportedError` that underlines the statement.

>>> error = Unsupported("no gradient for the reduction 'median'")
>>> isinstance(error, NotImplementedError), error.what
(True, "no gradient for the reduction 'median'")
"""

from __future__ import annotations


class CodegenError(Exception):
    """Base of the errors a pass raises about a nest it was given (not a bug of its own)."""

    def __init__(self, what: str, *, expected: str | None = None, hint: str | None = None):
        super().__init__(what)
        self.what = what
        self.expected = expected
        self.hint = hint

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild, (type(self), self.what, self.expected, self.hint))


def _rebuild(
    cls: type[CodegenError], what: str, expected: str | None, hint: str | None
) -> CodegenError:
    return cls(what, expected=expected, hint=hint)


class Unsupported(CodegenError, NotImplementedError):
    """A valid nest that a pass does not handle (yet)."""


class SettingError(CodegenError, ValueError):
    """A `TENSORDSL_*` variable whose value cannot be used: `what` names it and its value
    (`tensordsl.errors.user_facing` turns it into a `tensordsl.SettingError`)."""

    def __str__(self) -> str:
        lines = [self.what]
        if self.expected:
            lines.append(f"expected {self.expected}")
        if self.hint:
            lines.append(f"hint: {self.hint}")
        return "\n".join(lines)
