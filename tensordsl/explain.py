"""Readable descriptions of a kernel's nests: the forward nest and every gradient nest.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> print(explain(lower(parse("Y[i] := X[i+k] * W[k]")).nest))
forward
  Y[i] = sum_k W[k]*X[i + k]
    i in [0, X.shape[0] - W.shape[0] + 1)
    k in [0, W.shape[0])
gradient of X
  dX[p] = sum_k dY[p - k]*W[k]
    p in [0, X.shape[0])
    k in [max(0, p + W.shape[0] - X.shape[0]), min(W.shape[0], p + 1))
gradient of W
  dW[k] = sum_i dY[i]*X[i + k]
    k in [0, W.shape[0])
    i in [0, X.shape[0] - W.shape[0] + 1)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

import sympy

from codegen.ir.bounds import loop_bounds
from codegen.ir.contraction import xla_contraction, xla_plan
from codegen.ir.nest import LoopNest, Range, Term, extent_of, extent_symbol, output_source
from codegen.ir.reductions import POSITION_DTYPE, REDUCTIONS
from codegen.ir.source import expr_source
from codegen.passes import grad, gradient_rules
from tensordsl.backends import table
from tensordsl.errors import UnknownNameError, close_match, user_facing


def _body_source(body: sympy.Expr, first: str | None) -> str:
    """The body, with the factor that reads tensor `first` (the cotangent) printed first."""
    if first is not None and isinstance(body, sympy.Mul):
        lead = [f for f in body.args if isinstance(f, sympy.Indexed) and f.base.name == first]
        if lead:
            rest = [f for f in body.args if f is not lead[0]]
            rest_expr = sympy.Mul(*rest)
            rest_source = expr_source(rest_expr)
            if isinstance(rest_expr, sympy.Add):
                rest_source = f"({rest_source})"
            return f"{expr_source(lead[0])}*{rest_source}" if rest else expr_source(lead[0])
    return expr_source(body)


def _sum_prefix(nest: LoopNest, term: Term) -> str:
    if not term.reduced:
        return ""
    names = ",".join(r.index.name for r in term.reduced)
    op = {"sum": "sum", "logsumexp": "logsumexp"}.get(nest.reduction, nest.reduction)
    return f"{op}_{names} "


def _bound(expr: sympy.Expr, lowest: bool) -> str:
    text = expr_source(expr)
    return text.replace("Max(", "max(").replace("Min(", "min(")


def _substitute(
    expr: sympy.Basic, shapes: Mapping[str, tuple[int, ...]] | None, aliases: Mapping[str, str]
) -> sympy.Basic:
    mapping = {}
    for s in expr.free_symbols:
        found = extent_of(s)
        if found is None:
            continue
        name = aliases.get(found[0], found[0])
        if shapes is not None and name in shapes:
            mapping[s] = sympy.Integer(shapes[name][found[1]])
        elif name != found[0]:
            mapping[s] = extent_symbol(name, found[1])
    return expr.xreplace(mapping)


def nest_lines(
    nest: LoopNest,
    *,
    first: str | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> list[str]:
    """The nest as `OUT[...] = reduce_r body` lines, with the bounds of every index."""
    aliases = aliases or {}

    def show(expr: sympy.Basic) -> sympy.Basic:
        return _substitute(expr, shapes, aliases)

    lhs = output_source(nest)
    lines = []
    for n, term in enumerate(nest.terms):
        lead = f"{lhs} = " if n == 0 else " " * len(lhs) + " + "
        text = f"{_sum_prefix(nest, term)}{_body_source(show(term.body), first)}"
        # Parentheses show where each reduction ends: `(sum_i W*X) + c[o]` adds c once.
        lines.append(f"{lead}({text})" if term.reduced and len(nest.terms) > 1 else lead + text)
    ranges: list[Range] = list(nest.free)
    for r in ranges:
        lines.append(
            f"  {r.index} in [{_bound(show(r.start), True)}, {_bound(show(r.stop), False)})"
        )
    for n, term in enumerate(nest.terms):
        bounds = loop_bounds(term, term.reduced_indices)
        label = f"  (term {n + 1}) " if len(nest.terms) > 1 else "  "
        for r in term.reduced:
            start, stop = show(bounds.starts[r.index]), show(bounds.stops[r.index])
            lines.append(f"{label}{r.index} in [{_bound(start, True)}, {_bound(stop, False)})")
        for test in bounds.free_tests:
            lines.append(f"{label}only where {expr_source(show(test))} >= 0")
        if term.guard is not sympy.true:
            lines.append(f"{label}only where {expr_source(show(term.guard))}")
    return lines


def explain(nest: LoopNest, *, shapes: Mapping[str, tuple[int, ...]] | None = None) -> str:
    """The forward nest and the gradient nest of every operand, with their bounds.

    Args:
        nest: a forward nest.
        shapes: optional shapes by tensor name; bounds are then shown as numbers.

    Returns:
        Several lines of text.
    """
    lines = ["forward"] + ["  " + line for line in nest_lines(nest, shapes=shapes)]
    lines += ["  " + line for line in prologue_lines(nest, shapes)]
    for role, aux in gradient_rules.auxiliary_nests(nest).items():
        lines.append(f"saved for the gradients ({role})")
        lines += ["  " + line for line in nest_lines(aux, shapes=shapes)]
    for op in nest.operands:
        with user_facing():
            gradient = grad.gradient(nest, op.name)
        cotangent = next(n for n, r in gradient.roles if r == gradient_rules.COTANGENT)
        aliases = {gradient.nest.output: op.name, cotangent: nest.output}
        lines.append(f"gradient of {op.name}")
        lines += [
            "  " + line
            for line in nest_lines(gradient.nest, first=cotangent, shapes=shapes, aliases=aliases)
        ]
        lines += ["  " + line for line in prologue_lines(gradient.nest, shapes, aliases)]
    return "\n".join(lines)


def prologue_lines(
    nest: LoopNest,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> list[str]:
    """How XLA computes a nest whose elementwise factors are evaluated apart before its dot
    (`codegen.ir.contraction.prologue_contraction`); nothing for other nests.

    >>> from tensordsl.frontend.lower import lower
    >>> from tensordsl.frontend.parse import parse
    >>> nest = lower(parse("Y[b,o] := tanh(H[b,u]) * W[u,o]")).nest
    >>> print("\\n".join(prologue_lines(nest, {"H": (8, 32), "W": (32, 4)})))
    prologue 1: tanh(H[b, u]) evaluated once per (b, u): 256 times, not 1024 (per (b, o, u))
    then XLA's dot: einsum 'cb,ac->ab' of W, prologue 1
    """
    if not xla_contraction(nest):
        return []
    plan = xla_plan(nest)
    assert plan is not None
    lines = []
    for term, dot in zip(plan.terms, plan.dots):
        if dot is None or not dot.prologues:
            continue
        loops = {r.index: r for r in (*nest.free, *term.reduced)}
        every = ", ".join(str(i) for i in loops)
        for n, prologue in enumerate(dot.prologues, start=1):
            each = ", ".join(str(i) for i in prologue.indices)
            text = f"prologue {n}: {expr_source(prologue.body)} evaluated once per ({each})"
            few = _points([loops[i] for i in prologue.indices], shapes, aliases)
            many = _points(list(loops.values()), shapes, aliases)
            if few is not None and many is not None:
                text += f": {few} times, not {many} (per ({every}))"
            else:
                text += f", not per ({every})"
            lines.append(text)
        inputs = [nest.operands[n].name for n in dot.tensors]
        inputs += [f"prologue {n + 1}" for n in range(len(dot.prologues))]
        lines.append(f"then XLA's dot: einsum '{dot.subscripts}' of {', '.join(inputs)}")
    return lines


def _points(
    ranges: list[Range],
    shapes: Mapping[str, tuple[int, ...]] | None,
    aliases: Mapping[str, str] | None,
) -> int | None:
    """The number of points of these ranges for the shapes, or None without them."""
    if shapes is None:
        return None
    count = 1
    for r in ranges:
        length = _substitute(r.stop - r.start, shapes, aliases or {})
        if not length.is_Integer:
            return None
        count *= max(int(length), 0)
    return count


def kernel_nests(nest: LoopNest) -> dict[str, LoopNest]:
    """Every nest a kernel may run: "forward", the auxiliary nests, and "grad_<input>"."""
    nests = {"forward": nest}
    for role, aux in gradient_rules.auxiliary_nests(nest).items():
        nests[f"aux_{role}"] = aux
    for op in nest.operands:
        with user_facing():
            nests[f"grad_{op.name}"] = grad.gradient(nest, op.name).nest
    return nests


def generated_sources(nest: LoopNest, target: str, dtype: str = "float32") -> dict[str, str]:
    """The generated code of every nest of a kernel, for a back end that emits code.

    Every tensor is taken as `dtype`, except argmax/argmin positions (`POSITION_DTYPE`, as the
    JAX binding passes them).
    """
    emit = source_emitter(target)
    positions = _positions(nest)
    sources = {}
    for name, n in kernel_nests(nest).items():
        sources[name] = emit(n, _dtypes(n, positions, dtype), role=name)
    return sources


def source_emitter(target: str) -> Any:
    """`emit(nest, dtypes, role=...)` -> the generated code of `nest` for a back end that
    emits code (`table.CODE_TARGETS`).

    Raises:
        UnknownNameError: `target` is not such a back end.
    """
    record = table.BACKENDS.get(target) if isinstance(target, str) else None
    if record is None or record.source_emitter is None:
        raise UnknownNameError(
            f"unknown target '{target}'",
            expected="one of " + ", ".join(table.CODE_TARGETS),
            hint=close_match(target, table.CODE_TARGETS),
        )
    return record.source_emitter()


def _dtypes(nest: LoopNest, positions: set[str], dtype: str) -> dict[str, str]:
    """The dtype of every tensor of `nest` as the JAX binding passes them."""
    dtypes = {t: (POSITION_DTYPE if t in positions else dtype) for t in nest.operand_names}
    dtypes[nest.output] = POSITION_DTYPE if nest.output in positions else dtype
    return dtypes


def _positions(nest: LoopNest) -> set[str]:
    auxiliary = gradient_rules.auxiliary_nests(nest).values()
    return {a.output for a in auxiliary if REDUCTIONS[a.reduction].positional}


def range_lines(nest: LoopNest, shapes: Mapping[str, tuple[int, ...]] | None = None) -> list[str]:
    """The inferred range of every index of the forward nest, with numbers when shapes are given.

    >>> from tensordsl.frontend.lower import lower
    >>> from tensordsl.frontend.parse import parse
    >>> nest = lower(parse("Y[i] := X[i+k] * W[k]")).nest
    >>> print("\\n".join(range_lines(nest, {"X": (10,), "W": (3,)})))
    i in [0, X.shape[0] - W.shape[0] + 1) = [0, 8)   free
    k in [0, W.shape[0]) = [0, 3)   reduced
    """
    rows: list[tuple[Range, str]] = [(r, "free") for r in nest.free]
    seen = {r.index for r in nest.free}
    for term in nest.terms:
        for r in term.reduced:
            if r.index not in seen:
                seen.add(r.index)
                rows.append((r, "reduced"))
    lines = []
    for r, kind in rows:
        text = f"{r.index} in [{_bound(r.start, True)}, {_bound(r.stop, False)})"
        if shapes is not None:
            start, stop = _substitute(r.start, shapes, {}), _substitute(r.stop, shapes, {})
            if start != r.start or stop != r.stop:
                text += f" = [{_bound(start, True)}, {_bound(stop, False)})"
        lines.append(f"{text}   {kind}")
    return lines


def schedule_lines(nest: LoopNest, *, dtype: str = "float32", forward: Any = None) -> list[str]:
    """The schedule each target picks for every nest of a kernel (`forward`: the user's one).

    >>> from tensordsl.frontend.lower import lower
    >>> from tensordsl.frontend.parse import parse
    >>> print("\\n".join(schedule_lines(lower(parse("y[i] := A[i,j] * x[j]")).nest)))
    forward
      c:    strategy=...
      cuda: strategy=...
    grad_A
      c:    strategy=...
      cuda: strategy=...
    grad_x
    ...
    """
    from codegen.c.schedule import choose_cpu_schedule
    from codegen.cuda.schedule import choose_gpu_schedule

    positions = _positions(nest)
    lines = []
    for name, n in kernel_nests(nest).items():
        dtypes = _dtypes(n, positions, dtype)
        cpu = forward if name == "forward" and forward is not None else None
        cpu = cpu or choose_cpu_schedule(n, dtypes)
        lines.append(name)
        lines.append(f"  c:    {cpu.describe()}")
        lines.append(f"  cuda: {choose_gpu_schedule(n, dtypes).describe()}")
    return lines


def build_nests(
    nest: LoopNest,
    *,
    dtype: str = "float32",
    forward: Any = None,
    progress: Callable[[str], None] | None = None,
    cached: set[str] | None = None,
) -> dict[str, float]:
    """Compile every C nest of a kernel now, as its first call and gradient would.

    Args:
        nest: the forward nest.
        dtype: the dtype of every input (argmax/argmin positions are int32).
        forward: the forward nest's schedule, if the user chose one.
        progress: called with one line before and after each build.
        cached: gets the name of every nest loaded from a cache without compiling.

    Returns:
        Seconds spent on each nest, by name ("forward", "aux_...", "grad_<input>").
    """
    from codegen.c.build import build_c
    from codegen.c.compiler import STATS

    positions = _positions(nest)
    nests = kernel_nests(nest)
    seconds = {}
    for n, (name, each) in enumerate(nests.items(), start=1):
        if progress is not None:
            progress(f"[{n}/{len(nests)}] building {name} ...")
        start, compiles = time.perf_counter(), STATS["compiles"]
        schedule = forward if name == "forward" else None
        build_c(each, dtypes=_dtypes(each, positions, dtype), schedule=schedule)
        seconds[name] = time.perf_counter() - start
        loaded = STATS["compiles"] == compiles
        if loaded and cached is not None:
            cached.add(name)
        if progress is not None:
            what = f"built {name} in {seconds[name]:.2f} s"
            what = f"{name} loaded from cache" if loaded else what
            progress(f"[{n}/{len(nests)}] {what}")
    return seconds
