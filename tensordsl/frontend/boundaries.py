"""Tullio's boundary forms inside an index: `mod(e)`, `clamp(e)` and `pad(e, p)`.

Each is the whole index expression of one axis of a read, `e` affine as anywhere else:

* `A[mod(i + j)]` wraps `i + j` into `[0, n)` (a floor modulo, so `mod(-1)` is `n - 1`);
* `A[clamp(i - 2)]` clamps it into `[0, n)`;
* `A[pad(i + j - 1, p)]` lets it run `p` past each end and reads zero there;
  `pad(e, low, high)` pads the two ends differently, and `pad(e)` reads zero anywhere
  outside the array.

Ranges follow Tullio's rule: an axis read through `mod`, `clamp` or `pad(e)` constrains no
index (such an index takes its range from elsewhere, or from `ranges=`); `pad(e, p)` allows
`e` to run over `[-p, n + p)`. The read becomes `Wrap(e, n)`, `Clamp(e, n)` or, for `pad`, a
`Padded(e, n)` read (inside the array) under the mask `0 <= e < n` (zero elsewhere); see
`codegen/ir/functions.py`.

>>> from tensordsl.frontend.parse import parse
>>> boundary_form(parse("Y[i] := A[pad(i - 1, 1, 2)]").body.indices[0], "")[1]
Boundary(kind='pad', low=1, high=2)
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy

from codegen.ir.functions import Clamp, Padded, Wrap
from tensordsl.errors import IndexExpressionError
from tensordsl.frontend.parse import Call, Expr, Number, Unary

#: The boundary forms, by the name a user writes.
BOUNDARY_FORMS = ("mod", "clamp", "pad")
_USAGE = "'mod(e)', 'clamp(e)', 'pad(e, p)' or 'pad(e, low, high)' as a whole index, e affine"


@dataclass(frozen=True)
class Boundary:
    """How one axis of a read treats an index expression that leaves the axis."""

    kind: str  # "mod", "clamp" or "pad"
    low: int | None = None  # pad: how far below 0 the expression may run (None: any)
    high: int | None = None  # pad: how far past the last position

    @property
    def widths(self) -> tuple[int, int] | None:
        """`(low, high)`: how far the index expression may leave the axis at each end for
        range inference and the call-time checks; None when it constrains nothing."""
        if self.kind == "pad" and self.low is not None and self.high is not None:
            return self.low, self.high
        return None

    def index(self, expr: sympy.Expr, extent: sympy.Expr) -> sympy.Expr:
        """The index the read uses: always inside `[0, extent)`."""
        form = {"mod": Wrap, "clamp": Clamp, "pad": Padded}[self.kind]
        return form(expr, extent)

    def mask(self, expr: sympy.Expr, extent: sympy.Expr) -> sympy.Basic:
        """Where the read counts (pad: inside the array; elsewhere it reads zero)."""
        if self.kind != "pad":
            return sympy.true
        return sympy.And(expr >= 0, expr < extent)


def boundary_form(node: Expr, source: str) -> tuple[Expr, Boundary | None]:
    """The index expression inside a boundary form and the form, or `(node, None)`.

    Raises:
        IndexExpressionError: a form with the wrong arguments, or nested in another.
    """
    if not isinstance(node, Call) or node.name not in BOUNDARY_FORMS:
        return node, None
    arity = (1, 3) if node.name == "pad" else (1, 1)
    if not arity[0] <= len(node.args) <= arity[1]:
        hint = None
        if node.name == "mod" and len(node.args) == 2:
            hint = "mod wraps into the axis it indexes; Tullio's 'mod(i, 1:10)' has no form here"
        raise IndexExpressionError(
            f"'{node.name}' takes {_count(arity)} here, got {len(node.args)}",
            source,
            node.span,
            expected=_USAGE,
            hint=hint,
        )
    inner, *widths = node.args
    if isinstance(inner, Call) and inner.name in BOUNDARY_FORMS:
        raise IndexExpressionError(
            f"'{inner.name}' inside '{node.name}': boundary forms do not nest",
            source,
            inner.span,
            expected=_USAGE,
        )
    if node.name != "pad":
        return inner, Boundary(node.name)
    if not widths:
        return inner, Boundary("pad")
    low = _width(widths[0], source)
    high = _width(widths[1], source) if len(widths) > 1 else low
    return inner, Boundary("pad", low, high)


def _count(arity: tuple[int, int]) -> str:
    low, high = arity
    return "1 argument" if high == 1 else f"{low} to {high} arguments"


def _width(node: Expr, source: str) -> int:
    if isinstance(node, Number) and node.text.isdigit():
        return int(node.text)
    negative = isinstance(node, Unary) and node.op == "-"
    raise IndexExpressionError(
        f"the padding '{source[node.span[0] : node.span[1]]}' is not "
        + ("at least 0" if negative else "an integer literal"),
        source,
        node.span,
        expected="a width of 0 or more written as a number, as in 'pad(i + j - 1, 1)'",
    )
