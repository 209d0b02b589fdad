"""The lines of `explain` that show gradients computed together: on a back end that groups
them (`tensordsl.binding.grouped`), the gradients of several inputs that share their loops
run as one nest when `grad` asks for them together; one line per output of that nest.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> nest = lower(parse("Y[i] := exp(-(X[i,0] - Z[j,0])^2 - (X[i,1] - Z[j,1])^2) * B[j]")).nest
>>> for line in group_lines(nest, None, "c"):
...     print(line[:64])
gradients computed together when grad asks for several inputs (o
  dX, one nest summed over j (2 outputs):
    dX[i, 0] = sum_j dY[i]*(2*Z[j, 0] - 2*X[i, 0])*B[j]*exp(-(X[
    dX[i, 1] = sum_j dY[i]*(2*Z[j, 1] - 2*X[i, 1])*B[j]*exp(-(X[
  dZ and dB, one nest summed over i (3 outputs):
    dZ[j, 0] = sum_i dY[i]*(2*X[i, 0] - 2*Z[j, 0])*B[j]*exp(-(X[
    dZ[j, 1] = sum_i dY[i]*(2*X[i, 1] - 2*Z[j, 1])*B[j]*exp(-(X[
    dB[j] = sum_i dY[i]*exp(-(X[i, 0] - Z[j, 0])**2 - (X[i, 1] -
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy

from codegen.ir.extents import output_shape
from codegen.ir.nest import LoopNest, extent_symbol
from codegen.ir.reductions import REDUCTIONS
from codegen.ir.source import expr_source
from codegen.passes import grad, gradient_rules
from codegen.passes.group import Group, Member
from tensordsl.binding.grouped import groups_for
from tensordsl.errors import user_facing
from tensordsl.explain.facts import equal_extents
from tensordsl.explain.prologues import substitute
from tensordsl.explain.spelling import Spelling, gradient_lhs, label, spell

#: Extents given to tensors where `explain` has no shapes: distinct, so that only extents the
#: call's checks make equal are equal.
_FIRST_EXTENT = 1009


def group_lines(
    nest: LoopNest,
    shapes: Mapping[str, tuple[int, ...]] | None,
    backend: str,
    unread: frozenset[str] = frozenset(),
    spelled: Sequence[Spelling] = (),
    dtype: str = "float32",
) -> list[str]:
    """One block per group of gradients computed together; none where nothing groups
    (gathered operands shown as the accesses they stand for, `spelled`)."""
    if REDUCTIONS[nest.reduction].positional:
        return []
    with user_facing():
        gradients = [grad.gradient(nest, op.name) for op in nest.operands if op.name not in unread]
    known = _shapes(nest, gradients, shapes)
    nests = {g.nest.output: g.nest for g in gradients}
    groups = groups_for(nests, dict.fromkeys(nests, dtype), known, backend)
    if not groups:
        return []
    lines = ["gradients computed together when grad asks for several inputs (one nest each):"]
    aliases = {g.nest.output: g.wrt for g in gradients}
    for group in groups:
        lines += _group_lines(group, gradients, shapes, aliases, spelled)
    return lines


def _group_lines(group: Group, gradients, shapes, aliases, spelled) -> list[str]:
    outputs = list(dict.fromkeys(label(m.output, spelled) for m in group.members))
    summed = sorted({str(r.index) for t in group.nest.terms for r in t.reduced})
    over = f" summed over {', '.join(summed)}" if summed else ""
    head = f"  {' and '.join(outputs)}, one nest{over} ({len(group.members)} outputs):"
    cotangent = next(n for n, r in gradients[0].roles if r == gradient_rules.COTANGENT)
    lines = [head]
    for member in group.members:
        bodies = [spell(substitute(t.body, shapes, aliases), spelled) for t in member.nest.terms]
        sums = [
            "sum_" + ",".join(str(r.index) for r in t.reduced) + " " if t.reduced else ""
            for t in member.nest.terms
        ]
        text = " + ".join(f"{s}{body_source(b, cotangent)}" for s, b in zip(sums, bodies))
        lines.append(f"    {_label(member, spelled)} = {text}")
    return lines


def body_source(body: sympy.Expr, first: str | None, operands: tuple[str, ...] = ()) -> str:
    """The body, with the factor that reads tensor `first` (the cotangent) printed first;
    terms and factors in the order their operands first appear in the statement (`W - X`
    as written, not sympy's `-X + W`)."""
    if first is not None and isinstance(body, sympy.Mul):
        lead = [f for f in body.args if isinstance(f, sympy.Indexed) and f.base.name == first]
        if lead:
            rest = [f for f in body.args if f is not lead[0]]
            rest_expr = sympy.Mul(*rest)
            negative = not rest_expr.is_Add and rest_expr.could_extract_minus_sign()
            rest_expr = -rest_expr if negative else rest_expr
            rest_source = expr_source(rest_expr, operands, positive_first=True)
            if isinstance(rest_expr, sympy.Add):
                rest_source = f"({rest_source})"
            if not rest:
                return expr_source(lead[0])
            sign = "-" if negative else ""
            if rest_expr == 1:
                return f"{sign}{expr_source(lead[0])}"
            if rest_source.startswith("1/"):  # `dY[i]/n`, not `dY[i]*1/n`
                return f"{sign}{expr_source(lead[0])}/{rest_source[2:]}"
            return f"{sign}{expr_source(lead[0])}*{rest_source}"
    return expr_source(body, operands, positive_first=True)


def _label(member: Member, spelled: Sequence[Spelling] = ()) -> str:
    indices: list[sympy.Expr] = [r.index for r in member.nest.free]
    if member.axis is not None:
        indices.insert(member.axis, sympy.Integer(member.position))
    for s in spelled:
        if member.output == "d" + s.name:
            return gradient_lhs(s, indices)
    shown = ", ".join(str(i) for i in indices)
    return f"{member.output}[{shown}]" if indices else member.output


def _shapes(nest: LoopNest, gradients, shapes) -> dict[str, tuple[int, ...]]:
    """Every tensor's shape: the given ones, or distinct extents where none are given; a
    gradient has its input's shape, the cotangent the output's."""
    if shapes is None:
        same = equal_extents(nest)
        values: dict[sympy.Symbol, int] = {}
        known = {}
        for op in nest.operands:
            axes = []
            for axis in range(op.rank):
                symbol = extent_symbol(op.name, axis)
                symbol = same.get(symbol, symbol)
                axes.append(values.setdefault(symbol, _FIRST_EXTENT + 2 * len(values)))
            known[op.name] = tuple(axes)
    else:
        known = dict(shapes)
    known[nest.output] = output_shape(nest, known)
    for g in gradients:
        known[g.nest.output] = known[g.wrt]
        for name, role in g.roles:
            if role == gradient_rules.COTANGENT:
                known[name] = known[nest.output]
    return known
