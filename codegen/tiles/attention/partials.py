"""Gradients of score parameters inside an attention kernel, as per-tile partial sums.

A score parameter (a relative-bias table `R[h, i - j + T - 1]`, ALiBi slopes `sl[h]`, a
learnable soft-cap or scale) gets a gradient nest that sums, over every (batch, head, query,
key) the scores visit, the score's cotangent times the score's derivative by the parameter.
The dK+dV kernel already computes everything that product needs on each `[keys x queries]`
tile (the scores' dots, `dO . V`, the exponential), so the gradient is computed there:

* the gradient nest's indices are matched to the kernel's (`partial_of`): the accesses of
  the tensors both read (`q[b, j + p - T + 1, h, d]` in `dR` against `q[b, i, h, d]` in the
  kernel) give a linear system whose unique, unimodular solution writes each of the
  gradient's free and reduced indices in the kernel's (`p = i - j + T - 1`); the nest's body,
  so rewritten, is the tile's contribution, its ranges and constraints a `where`;
* each program instance writes one partial per parameter element it reaches, once, into a
  partials array (`ParamPartial`): a parameter axis that is an outer index of the kernel
  (the head of `sl[h]`) comes from the grid; the others (`p`; with grouped-query heads the
  head too), flattened row-major into one local axis, are computed per tile: a window of
  consecutive positions per tile summed without scatter (Pallas' interpret mode drops
  repeated-index updates) and added to the instance's own block at its offset;
* the partials are summed after the kernel in a fixed order (no atomics): deterministic.

Nothing is per modifier: a nest matches when its indices map onto the kernel's one to one
and its domain (ranges, constraints, guard) lies inside the kernel's, checked here; any other
runs as its own tile program, as before.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.ir.affine import NotAffine, as_affine, holds_everywhere
from codegen.ir.extents import extent_values
from codegen.ir.nest import LoopNest, Reduce
from codegen.ir.source import expr_source
from codegen.tiles.attention.build import concrete
from codegen.tiles.attention.program import AttentionProgram
from codegen.tiles.hoist import hoist_nested

#: The widest window of consecutive parameter positions one tile reaches (past it, the
#: nest runs as its own tile program).
WIDEST_WINDOW = 512
#: The smallest window (Triton's slices are powers of two).
MIN_WINDOW = 16
#: The most partials one program instance writes (past it, the nest runs as its own tile
#: program): a table of every head's relative positions read by grouped-query heads, say.
LONGEST = 1 << 17


@dataclass(frozen=True)
class ParamPartial:
    """A score parameter's gradient computed as per-tile partial sums by an attention kernel
    (module docstring)."""

    #: The gradient's name (`dR`) and shape.
    output: str
    shape: tuple[int, ...]
    #: The contribution of one (row, loop value) point, in the kernel's indices: the gradient
    #: nest's body, its ranges and constraints a `where` around it.
    weight: sympy.Expr
    #: Per parameter axis: the kernel's outer index it is (from the grid), or None: an axis
    #: of the local one, at `local` (the axes not from the grid flattened row-major).
    outer: tuple[sympy.Symbol | None, ...]
    #: The position along the local axis in the kernel's indices (0: no local axis).
    local: sympy.Expr
    #: The local axis' extent (1: none) and the window of positions one tile reaches.
    extent: int
    window: int
    #: The parameter axes flattened into the local axis (row-major), their extents.
    local_shape: tuple[int, ...] = ()

    @property
    def length(self) -> int:
        """A program instance's partials: the local axis with a window either side, padded
        to a power of two."""
        return 1 << (self.extent + 2 * self.window - 1).bit_length()

    def describe(self, program: AttentionProgram) -> str:
        names = program.nest.operand_names
        outer = [str(s) for s in self.outer if s is not None]
        where = f"per ({', '.join(outer)}) from the grid, " if outer else ""
        local = (
            f"{self.extent} position(s) at {expr_source(self.local, names)} in windows of "
            f"{self.window} per tile"
            if self.extent > 1 or self.local != 0
            else "one value per program instance"
        )
        return (
            f"  {self.output}: partial sums of {expr_source(self.weight, names)} per program "
            f"instance ({where}{local}), written once, summed after the kernel in a fixed "
            "order (no atomics)"
        )


def partial_of(
    program: AttentionProgram, nest: LoopNest, shapes: Mapping[str, Sequence[int]]
) -> ParamPartial | None:
    """`nest` (a score parameter's gradient) as partial sums of the attention kernel
    `program` (a weighted kernel: dK+dV), or None when it does not map onto it."""
    if program.kind != "weighted" or nest.reduction != "sum" or nest.online:
        return None
    extents = extent_values(nest, shapes)
    gradient = hoist_nested(concrete(nest, extents))
    kernel = (*(a.index for a in program.outer), program.rows.index, program.loop.index)
    kernel = (*kernel, *(a.index for a in program.singles))
    accesses = _accesses(program)
    weight: sympy.Expr = sympy.Integer(0)
    found: tuple[sympy.Expr, ...] | None = None
    for term in gradient.terms:
        mapped = _mapped(gradient, term, kernel, accesses)
        if mapped is None:
            return None
        body, where, index, guard = mapped
        if found is not None and index != found:
            return None
        found = index
        if not _inside(program, where, guard == program.guard):
            return None
        box = _box(program, padded=True)
        kept = [c for c in where if not holds_everywhere(c, box)]
        weight += sympy.Piecewise((body, sympy.And(*(c >= 0 for c in kept))), (0, True))
    if found is None:
        return None
    weight = _shared_dots(weight, program)
    return _partial(program, nest.output, tuple(shapes[nest.output]), weight, found)


def _shared_dots(weight: sympy.Expr, program: AttentionProgram) -> sympy.Expr:
    """`weight` with each nested sum that is one of the kernel's dots but for the name of
    its index written as the dot's (the kernel computes it once per tile, as a dot)."""
    same = {}
    for node in weight.atoms(Reduce):
        for dot in program.dots:
            if node.xreplace({node.index: dot.node.index}) == dot.node:
                same[node] = dot.node
    return weight.xreplace(same)


def _bound(expr: sympy.Basic) -> set[sympy.Symbol]:
    return {r.index for r in sympy.sympify(expr).atoms(Reduce)}


def _accesses(program: AttentionProgram) -> dict[str, set[tuple]]:
    """The index tuples of each tensor the kernel's weights read (a nested sum's own index
    as None)."""
    exprs = [m.weight for m in program.members]
    found: dict[str, set[tuple]] = {}
    for expr in exprs:
        bound = _bound(expr)
        for access in sympy.sympify(expr).atoms(sympy.Indexed):
            key = tuple(None if x in bound else x for x in access.indices)
            found.setdefault(access.base.name, set()).add(key)
    return found


def _mapped(
    gradient: LoopNest, term, kernel: tuple[sympy.Symbol, ...], accesses: dict[str, set[tuple]]
) -> tuple[sympy.Expr, list[sympy.Expr], tuple[sympy.Expr, ...], sympy.Basic] | None:
    """(body, domain constraints, parameter position, guard) of one gradient term in the
    kernel's indices, or None when its indices do not map one to one onto the kernel's."""
    own = (*gradient.free_indices, *(r.index for r in term.reduced))
    if len(own) != len(kernel):
        return None
    fresh = {x: sympy.Dummy(x.name, integer=True) for x in own}
    body = term.body.xreplace(fresh)
    bound = _bound(body)
    equations = []
    for access in body.atoms(sympy.Indexed):
        seen = accesses.get(access.base.name)
        if seen is None:
            continue
        if len(seen) != 1:
            return None
        (theirs,) = seen
        for mine, their in zip(access.indices, theirs):
            if their is None or mine.free_symbols & bound:
                if (their is None) != bool(mine.free_symbols & bound):
                    return None
                continue
            equations.append(sympy.expand(mine - their))
    unknowns = list(fresh.values())
    solved = sympy.solve(equations, unknowns, dict=True)
    if len(solved) != 1 or set(solved[0]) != set(unknowns):
        return None
    solution = solved[0]
    if any(not (v.free_symbols <= set(kernel)) for v in solution.values()):
        return None
    try:
        for x in own:
            as_affine(solution[fresh[x]], kernel)
    except NotAffine:
        return None
    jacobian = sympy.Matrix([[sympy.diff(solution[fresh[x]], k) for k in kernel] for x in own])
    if abs(jacobian.det()) != 1:
        return None
    back = {x: solution[fresh[x]] for x in own}
    mapped = body.xreplace(solution)
    where = [sympy.expand(c.xreplace(back)) for c in term.constraints]
    for r in (*gradient.free, *term.reduced):
        where += [sympy.expand(back[r.index] - r.start), sympy.expand(r.stop - 1 - back[r.index])]
    index = tuple(sympy.expand(back[x]) for x in gradient.free_indices)
    guard = sympy.sympify(term.guard).xreplace(fresh).xreplace(solution)
    return mapped, where, index, guard


def _box(program: AttentionProgram, padded: bool) -> dict[sympy.Symbol, tuple[int, int]]:
    box = {}
    for axis in (*program.outer, program.rows, program.loop, *program.singles):
        size = axis.count * axis.tile if padded and axis.tile > 1 else axis.extent
        box[axis.index] = (axis.start, axis.start + size - 1)
    return box


def _inside(program: AttentionProgram, where: list[sympy.Expr], same_guard: bool) -> bool:
    """Whether the gradient's domain (`where >= 0`) lies inside the kernel's: every bound of
    the kernel's box and every constraint it keeps follows from one or two of `where`."""
    if not same_guard:
        return False
    box = _box(program, padded=False)
    needed = list(program.constraints)
    for index, (low, high) in box.items():
        needed += [index - low, high - index]
    known = [sympy.expand(c) for c in where]
    for condition in needed:
        condition = sympy.expand(condition)
        if not any(_slack(condition - a) for a in known) and not any(
            _slack(condition - a - b) for a in known for b in known
        ):
            return False
    return True


def _slack(expr: sympy.Expr) -> bool:
    """Whether `expr` is a constant at least 0."""
    expr = sympy.expand(expr)
    return bool(expr.is_number and expr >= 0)


def _partial(
    program: AttentionProgram,
    output: str,
    shape: tuple[int, ...],
    weight: sympy.Expr,
    index: tuple[sympy.Expr, ...],
) -> ParamPartial | None:
    outer = {a.index: a for a in program.outer}
    axes: list[sympy.Symbol | None] = []
    local: sympy.Expr = sympy.Integer(0)
    sizes: list[int] = []
    for position, size in zip(index, shape):
        axis = outer.get(position)
        if axis is not None and axis.start == 0 and axis.extent == size:
            axes.append(position)
            continue
        axes.append(None)  # the other axes flattened, row-major, into one local axis
        local, sizes = local * size + position, [*sizes, size]
    extent = math.prod(sizes)
    try:
        form = dict(as_affine(local, tuple(_box(program, padded=True))).coefficients)
    except NotAffine:
        return None
    span = 1 + sum(abs(form.get(a.index, 0)) * (a.tile - 1) for a in (program.rows, program.loop))
    window = max(MIN_WINDOW, 1 << (span - 1).bit_length())
    found = ParamPartial(
        output, shape, weight, tuple(axes), sympy.expand(local), extent, window, tuple(sizes)
    )
    if window > WIDEST_WINDOW or found.length > LONGEST:
        return None
    return found
