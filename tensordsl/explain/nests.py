"""Readable descriptions of a kernel's nests: the forward nest and every gradient nest.

>>> from tensordsl.frontend.lower import lower
>>> from tensordsl.frontend.parse import parse
>>> print(explain(lower(parse("Y[i] := X[i+k] * W[k]")).nest))
forward
  Y[i] = sum_k X[i + k]*W[k]
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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import sympy

from codegen import config
from codegen.ir.bounds import loop_bounds
from codegen.ir.ieee import IeeeAdd
from codegen.ir.nest import (
    LoopNest,
    Range,
    Term,
    output_source,
)
from codegen.ir.reductions import POSITION_DTYPE, REDUCTIONS
from codegen.ir.source import expr_source
from codegen.passes import grad, gradient_rules
from tensordsl.backends import table
from tensordsl.errors import OptionError, UnknownNameError, close_match, user_facing
from tensordsl.explain.facts import equal_extents, implied
from tensordsl.explain.groups import body_source as _body_source
from tensordsl.explain.groups import group_lines
from tensordsl.explain.prologues import prologue_lines, substitute
from tensordsl.explain.spelling import Spelling, gradient_lhs, spell
from tensordsl.explain.spelling import label as spelling_label
from tensordsl.explain.spelling import unread as unread_tables
from tensordsl.explain.summary import summary_lines


def _sum_prefix(nest: LoopNest, term: Term) -> str:
    if not term.reduced:
        return ""
    names = ",".join(r.index.name for r in term.reduced)
    op = {"sum": "sum", "logsumexp": "logsumexp"}.get(nest.reduction, nest.reduction)
    return f"{op}_{names} "


def _bound(expr: sympy.Expr, lowest: bool) -> str:
    text = expr_source(expr)
    return text.replace("Max(", "max(").replace("Min(", "min(")


def nest_lines(
    nest: LoopNest,
    *,
    first: str | None = None,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    aliases: Mapping[str, str] | None = None,
    operands: tuple[str, ...] = (),
    same: Mapping[sympy.Symbol, sympy.Symbol] | None = None,
    spelled: Sequence[Spelling] = (),
    lhs: str | None = None,
) -> list[str]:
    """The nest as `OUT[...] = reduce_r body` lines, with the bounds of every index.

    `operands`: the order terms and factors print in (the statement's inputs); `same`:
    extents a call's checks make equal (`facts.equal_extents`), so that a test they
    imply is left out; `spelled`: gathered operands shown as the accesses they stand for;
    `lhs`: the left-hand side in place of the output's, added to (`+=`)."""
    aliases = aliases or {}
    same = same or {}
    order = operands or nest.operand_names

    def show(expr: sympy.Basic) -> sympy.Basic:
        return spell(substitute(expr, shapes, aliases), spelled)

    assign = "=" if lhs is None else "+="
    lhs = output_source(nest) if lhs is None else lhs
    lines = []
    for n, term in enumerate(nest.terms):
        lead = f"{lhs} {assign} " if n == 0 else " " * len(lhs) + " " * len(assign) + "+ "
        body = show(term.body)
        text = _body_source(body, first, order)
        if term.reduced and isinstance(body, (sympy.Add, IeeeAdd)):
            text = f"({text})"  # `sum_j (X[i, j] + c[i])`: the whole sum is summed
        text = f"{_sum_prefix(nest, term)}{text}"
        if n > 0 and not term.reduced and text.startswith("-"):
            lead, text = lead[:-2] + "- ", text[1:]  # `- b[i]`, not `+ -b[i]`
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
        free = [Range(r.index, show(r.start), show(r.stop)) for r in nest.free]
        for test in bounds.free_tests:
            if implied(show(test), free, same):
                continue
            lines.append(f"{label}only where {expr_source(show(test))} >= 0")
        if term.guard is not sympy.true:
            lines.append(f"{label}only where {expr_source(show(term.guard))}")
    return lines


def explain(
    nest: LoopNest,
    *,
    shapes: Mapping[str, tuple[int, ...]] | None = None,
    gathered: Sequence[tuple[str, str]] = (),
    unread: frozenset[str] = frozenset(),
    backend: str | None = None,
    schedule: Any = None,
    spelled: Sequence[Spelling] = (),
    xla_dots: bool = True,
) -> str:
    """The forward nest and the gradient nest of every operand, with their bounds.

    Args:
        nest: a forward nest.
        shapes: optional shapes by tensor name; bounds are then shown as numbers.
        gathered: (table, the access as written) of each gathered operand.
        unread: operands the nest does not read (tables read only through gathers; those of
            `spelled` are found).
        backend: where given, a summary comes first: the nests, the back end, the schedule
            of each in words (`tensordsl.explain.summary`).
        schedule: the user's schedule of the forward nest, if any.
        spelled: the gathered operands (`spelling.spellings`): shown as the accesses they
            stand for, never by their internal names.
        xla_dots: the back end runs contractions as XLA's dot (`Backend.xla_dots`): each
            nest that would is followed by its prologues and its einsum.

    Returns:
        Several lines of text.
    """
    unread = unread | unread_tables(nest, spelled)
    summary = [] if backend is None else kernel_summary(nest, backend, schedule, unread, spelled)
    gathers = [
        f"gathered {access} before the nest (the gradient of {table}: a sum in index order on "
        "the CPU, a sorted segmented sum elsewhere)"
        for table, access in gathered
    ]
    groups = [] if backend is None else group_lines(nest, shapes, backend, unread, spelled)
    return "\n".join(
        [*summary, *gathers, _explain(nest, shapes, unread, spelled, xla_dots), *groups]
    )


def kernel_summary(
    nest: LoopNest,
    backend: str,
    schedule: Any = None,
    unread: frozenset[str] = frozenset(),
    spelled: Sequence[Spelling] = (),
) -> list[str]:
    """The summary lines of a kernel's nests (`summary.summary_lines`); none for the
    gradients of `unread` operands (read only through gathers: no nest runs for them)."""
    labels = {"forward": f"forward {nest.output}"}
    nests = {}
    for name, each in kernel_nests(nest).items():
        if name.startswith("grad_") and name[len("grad_") :] in unread:
            continue
        label = labels.get(name) or name.replace("aux_", "saved for gradients: ")
        label = spelling_label(label, spelled).replace("grad_", "gradient of ")
        nests[label] = each
    schedules = {f"forward {nest.output}": schedule} if schedule is not None else None
    return summary_lines(nests, backend, positions=frozenset(_positions(nest)), schedules=schedules)


def _explain(
    nest: LoopNest,
    shapes: Mapping[str, tuple[int, ...]] | None,
    unread: frozenset[str] = frozenset(),
    spelled: Sequence[Spelling] = (),
    xla_dots: bool = True,
) -> str:
    same = equal_extents(nest)
    order = (nest.output, *nest.operand_names)
    options: dict[str, Any] = {"shapes": shapes, "operands": order, "same": same}
    options["spelled"] = spelled
    by_name = {s.name: s for s in spelled}
    lines = ["forward"] + ["  " + line for line in nest_lines(nest, **options)]
    dots = prologue_lines if xla_dots else _no_dots
    lines += ["  " + line for line in dots(nest, shapes, spelled=spelled)]
    for role, aux in gradient_rules.auxiliary_nests(nest).items():
        lines.append(f"saved for the gradients ({role})")
        lines += ["  " + line for line in nest_lines(aux, **options)]
    if not differentiable(nest):
        return "\n".join([*lines, f"no gradient: {nest.output} is an integer position"])
    for op in nest.operands:
        if op.name in unread:
            continue
        with user_facing():
            gradient = grad.gradient(nest, op.name)
        cotangent = next(n for n, r in gradient.roles if r == gradient_rules.COTANGENT)
        aliases = {gradient.nest.output: op.name, cotangent: nest.output}
        gathered = by_name.get(op.name)
        lhs = None
        if gathered is None:
            lines.append(f"gradient of {op.name}")
        else:
            lines.append(
                f"gradient of {gathered.table} at {gathered.text}, each element added to "
                f"d{gathered.table} (in index order on the CPU, sorted elsewhere)"
            )
            lhs = gradient_lhs(gathered, (r.index for r in gradient.nest.free))
        lines += [
            "  " + line
            for line in nest_lines(
                gradient.nest, first=cotangent, aliases=aliases, lhs=lhs, **options
            )
        ]
        lines += ["  " + line for line in dots(gradient.nest, shapes, aliases, spelled)]
    return "\n".join(lines)


def _no_dots(*_: Any, **__: Any) -> list[str]:
    """`prologue_lines` for a back end that runs no contraction as XLA's dot."""
    return []


def differentiable(nest: LoopNest) -> bool:
    """Whether a nest has gradient nests: an argmax/argmin position has none."""
    return not REDUCTIONS[nest.reduction].positional


def kernel_nests(nest: LoopNest) -> dict[str, LoopNest]:
    """Every nest a kernel may run: "forward", the auxiliary nests, and "grad_<input>"."""
    nests = {"forward": nest}
    for role, aux in gradient_rules.auxiliary_nests(nest).items():
        nests[f"aux_{role}"] = aux
    for op in nest.operands if differentiable(nest) else ():
        with user_facing():
            nests[f"grad_{op.name}"] = grad.gradient(nest, op.name).nest
    return nests


def generated_sources(
    nest: LoopNest, target: str, dtype: str = "float32", spelled: Sequence[Spelling] = ()
) -> dict[str, str]:
    """The generated code of every nest of a kernel, for a back end that emits code, keyed
    as `profile` names them (the gradient of a gathered operand of `spelled` by its access).

    Every tensor is taken as `dtype`, except argmax/argmin positions (`POSITION_DTYPE`, as the
    JAX binding passes them).
    """
    emit = source_emitter(target)
    positions = _positions(nest)
    sources = {}
    for name, n in kernel_nests(nest).items():
        sources[spelling_label(name, spelled)] = emit(n, _dtypes(n, positions, dtype), role=name)
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
            start, stop = substitute(r.start, shapes, {}), substitute(r.stop, shapes, {})
            if start != r.start or stop != r.stop:
                text += f" = [{_bound(start, True)}, {_bound(stop, False)})"
        lines.append(f"{text}   {kind}")
    return lines


def schedule_lines(
    nest: LoopNest,
    *,
    dtype: str = "float32",
    forward: Any = None,
    spelled: Sequence[Spelling] = (),
) -> list[str]:
    """The schedule each target picks for every nest of a kernel (`forward`: the user's one),
    in words (generated code's header comment has the terse form, `describe()`); `spelled`:
    the gathered operands, whose gradient nests are named as written.

    >>> from tensordsl.frontend.lower import lower
    >>> from tensordsl.frontend.parse import parse
    >>> print("\\n".join(schedule_lines(lower(parse("y[i] := A[i,j] * x[j]")).nest)))
    forward
      c:    XLA's dot (jnp.einsum): no generated kernel
      cuda: XLA's dot (jnp.einsum, cuBLAS): no generated kernel
    grad_A
      c:    register tiles of 6 i x 32 j outputs (j in vector lanes), no reduction; threads ...
      cuda: one output element per thread, no reduction
    grad_x
    ...
    """
    c, cuda = table.BACKENDS["c"], table.BACKENDS["cuda"]
    assert c.scheduler is not None and cuda.scheduler is not None
    choose_cpu_schedule, choose_gpu_schedule = c.scheduler(), cuda.scheduler()
    positions = _positions(nest)
    lines = []
    for name, n in kernel_nests(nest).items():
        dtypes = _dtypes(n, positions, dtype)
        cpu = forward if name == "forward" and forward is not None else None
        cpu = cpu or choose_cpu_schedule(n, dtypes)
        lines.append(spelling_label(name, spelled))
        lines.append(f"  c:    {cpu.in_words()}")
        lines.append(f"  cuda: {choose_gpu_schedule(n, dtypes).in_words()}")
    return lines


def online_lines(
    nest: LoopNest, shapes: Mapping[str, Sequence[int]], spelled: Sequence[Spelling] = ()
) -> list[str]:
    """Each back end's one-pass kernel of `nest` for concrete shapes (every tensor it names),
    in its words (`Backend.one_pass_lines`: CUDA's tile and staging, grid, key tiles visited
    and skipped, score evaluations executed per useful one), gathered operands as written."""
    return [
        line
        for record in table.BACKENDS.values()
        if record.one_pass_lines is not None
        for line in record.one_pass_lines()(nest, shapes, spell=lambda e: spell(e, spelled))
    ]


def build_nests(
    nest: LoopNest,
    *,
    dtype: str = "float32",
    forward: Any = None,
    progress: Callable[[str], None] | None = None,
    cached: set[str] | None = None,
    spelled: Sequence[Spelling] = (),
) -> dict[str, float]:
    """Compile every C nest of a kernel now, as its first call and gradient would: optimised
    (the build a call loads once it is on disk), unoptimised under `TENSORDSL_BUILD=fast`,
    whose calls never load an optimised build (one built here would be compiled for nothing,
    and the call would compile its own).

    Args:
        nest: the forward nest.
        dtype: the dtype of every input (argmax/argmin positions are int32).
        forward: the forward nest's schedule, if the user chose one.
        progress: called with one line before and after each build.
        cached: gets the name of every nest loaded from a cache without compiling.
        spelled: the gathered operands, whose gradient nests `progress` names as written.

    Returns:
        Seconds spent on each nest, by name ("forward", "aux_...", "grad_<input>").
    """
    c = table.BACKENDS["c"]
    assert c.builder is not None and c.compiles is not None
    build, compiles = c.builder(), c.compiles

    mode = "fast" if config.build_mode() == "fast" else "full"
    positions = _positions(nest)
    nests = kernel_nests(nest)
    seconds = {}
    for n, (name, each) in enumerate(nests.items(), start=1):
        shown = spelling_label(name, spelled)
        if progress is not None:
            progress(f"[{n}/{len(nests)}] building {shown} ...")
        start, before = time.perf_counter(), compiles()
        schedule = forward if name == "forward" else None
        build(each, dtypes=_dtypes(each, positions, dtype), schedule=schedule, mode=mode)
        seconds[name] = time.perf_counter() - start
        loaded = compiles() == before
        if loaded and cached is not None:
            cached.add(name)
        if progress is not None:
            what = f"built {shown} in {seconds[name]:.2f} s"
            what = f"{shown} loaded from cache" if loaded else what
            progress(f"[{n}/{len(nests)}] {what}")
    return seconds


#: Targets with a static report of the kernels a call runs (`explain(..., target=)`).
REPORT_TARGETS = table.REPORT_TARGETS


def check_report_target(target: str, shapes: Any) -> None:
    """Raise unless `target` has a static report and `shapes` are given."""
    if target not in REPORT_TARGETS:
        raise UnknownNameError(
            f"no static report for target '{target}'",
            expected="one of " + ", ".join(REPORT_TARGETS),
            hint=close_match(str(target), REPORT_TARGETS),
        )
    if shapes is None:
        raise OptionError(
            f"a report for target '{target}' needs shapes",
            expected="the shape of every input (shapes={...}; --shapes on the command line)",
        )
