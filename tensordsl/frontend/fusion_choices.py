"""The `fuse=` option of a program: the fusion decisions a user forces.

`True` (the default) leaves every decision to the cost model (`codegen.passes.cost`); `False`
stores every intermediate; a dict forces some, `{"H": "store", "S": "inline"}`. Checked when
the program is made: the names must be intermediates, the choices "inline" or "store", and
only what can be recomputed (`codegen.passes.fusion.inlinable`) may be forced inline.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from codegen.passes.fusion import CHOICES, inlinable
from tensordsl.errors import InputError, UnknownNameError, UnsupportedError, close_match
from tensordsl.frontend.statements import LoweredProgram

__all__ = ["fuse_option"]


def fuse_option(value: Any, lowered: LoweredProgram, source: str) -> tuple[tuple[str, str], ...]:
    """`fuse=` as sorted (intermediate, "inline" or "store") pairs; False stores them all."""
    program = lowered.program
    by_name = {nest.output: (n, nest) for n, nest in enumerate(program.statements)}
    intermediates = [n for n in by_name if n not in program.outputs]
    if value is True or value is None:
        return ()
    if value is False:
        return tuple(sorted((name, "store") for name in intermediates))
    if not isinstance(value, Mapping):
        raise InputError(
            f"fuse= must be True, False or a dict, got {type(value).__name__}",
            source,
            expected='as in fuse={"H": "store"} (or "inline") for an intermediate H',
        )
    for name, choice in value.items():
        if name not in by_name or name in program.outputs:
            what = (
                "an output (always stored)"
                if name in program.outputs
                else ("an input" if name in program.input_names else "not a statement")
            )
            raise UnknownNameError(
                f"fuse= names '{name}', which is {what}",
                source,
                expected="an intermediate: " + (", ".join(intermediates) or "(none)"),
                hint=close_match(str(name), intermediates),
            )
        n, nest = by_name[name]
        span = lowered.statements[n].statement.span
        if choice not in CHOICES:
            raise InputError(
                f"fuse= says {choice!r} for '{name}'",
                source,
                span,
                expected='"inline" (recomputed where read) or "store"',
                hint=close_match(str(choice), CHOICES),
            )
        if choice == "inline" and not inlinable(nest):
            raise UnsupportedError(
                f"'{name}' cannot be recomputed where read: it is a {nest.reduction} "
                + ("of several terms" if len(nest.terms) > 1 else "reduction"),
                source,
                span,
                expected=f'a sum or logsumexp of one term, or fuse={{"{name}": "store"}}',
            )
    return tuple(sorted((str(k), str(v)) for k, v in value.items()))
