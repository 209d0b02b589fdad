"""The fusion cost model: recompute an intermediate where it is read, or store it.

For one intermediate `P` of a program and the statements that read it, `decide` counts, with
the call's extents, what each choice costs, in rough units (one arithmetic operation = 1, a
transcendental function = `FUNCTION_COST`, a byte through memory = `BYTE_COST`):

* inline: every evaluation of `P`'s value inside its readers (a read is evaluated once per
  iteration of the reader's loops outside it: its free loops and its reduced loops up to the
  innermost one it depends on, as `codegen.emit.staging` hoists it; once per point of its
  prologue's indices where XLA evaluates the factor that reads it before a dot,
  `codegen.ir.contraction.prologue_contraction`), forward and in the readers' gradient nests;
* store: `P` computed once, written, and read back by each reader and gradient nest.

Three rules come before the counts, because the counts cannot see what happens in the
backward pass:

* **Never recompute a reduction inside a loop that does not index it** (a reader
  `tanh(H[b,u] * W2[u,o])` would redo H's sum over f for every o; the gradient of a reader
  nonlinear in H, as the MLP's `tanh(H[b,u]) * W2[u,o]`, would redo it for every f): such an
  intermediate is stored ...
* **Never recompute a reduction whose gradient reads its value** (a logsumexp, a max, a
  product) where its input is differentiated: the gradient would redo it per element of
  the input (cross-entropy's `loss[n] := L[n] - P[n]` with `L` a logsumexp over classes).
* ... **unless storing it materialises something larger than every input and output that the
  forward computes once per element in one pass**: attention's `T x T` scores, read by the
  logsumexp and by the weighted sum that the one-pass strategy pairs with it
  (`codegen.passes.online`), stay recomputed, never stored (FlashAttention). A mixture of
  experts' hidden layer, also larger than every input, is stored: nothing pairs its readers,
  and its gradients would redo its sum per element.
* ... **unless no mask spares any score**, on the back ends asked to (`beside`: those that
  run stored scores as XLA's dots), up to `BESIDE_STORE_BYTES`: with no condition in the
  scores or their readers (cross-attention, an encoder's attention) the one pass computes
  every pair that XLA's dots compute, in a kernel about half their speed on the CPU; the
  scores are stored. A causal or windowed mask bounds the one pass's loops (about half the
  pairs for a causal mask), and keeps it.
* ... **unless an input is read beside it in every reader** (a relative-bias table,
  `s_[b,h,i,j] + R[h, i - j + T - 1]`: `codegen.passes.mirror.summed_through`), on the
  back ends asked to (`beside`: those whose attention kernels do not compute a score
  parameter's gradient themselves), up to `BESIDE_STORE_BYTES`: recomputed, that input's
  gradient nest would recompute every score and weight once more, each read once (no lane
  shares it); stored, it is a pass over the scores' cotangent, which the backward computes.

A program differentiated twice (`order` 2: an HVP, `jax.jvp` of `jax.grad`; a Hessian) runs
every nest of its forward+backward pass again as a tangent nest, which evaluates the
intermediate and its tangent (one more product per tensor it reads: the scores' tangent
`Q*tK + tQ*K` is twice their work): a recomputed intermediate is paid again in every
derivative order that reads it, a stored one is computed once per order. The estimates grow
by that factor per order, and the one-pass exception above then holds only where storing
would cost more by the counts, or more than `HIGHER_ORDER_STORE_BYTES` of memory: attention's
HVP stores its scores (five tangent nests would each recompute them and their tangent).

Decisions are `Decision` records; `explain` prints them with their estimates.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> b, f, u, o = (index_symbol(n) for n in "bfuo")
>>> X, W1, W2, H = (tensor_base(n) for n in ("X", "W1", "W2", "H"))
>>> rows = Range(b, 0, extent_symbol("X", 0))
>>> hidden = LoopNest("H", (rows, Range(u, 0, extent_symbol("W1", 1))),
...     (Term(X[b, f] * W1[f, u], (Range(f, 0, extent_symbol("X", 1)),)),),
...     (Operand("X", 2), Operand("W1", 2)))
>>> out = LoopNest("Y", (Range(b, 0, extent_symbol("H", 0)), Range(o, 0, extent_symbol("W2", 1))),
...     (Term(sympy.tanh(H[b, u]) * W2[u, o], (Range(u, 0, extent_symbol("H", 1)),)),),
...     (Operand("H", 2), Operand("W2", 2)))
>>> shapes = {"X": (8, 4), "W1": (4, 16), "W2": (16, 3), "H": (8, 16), "Y": (8, 3)}
>>> decision = decide(hidden, (out,), outputs=("Y",), shapes=shapes)
>>> decision.choice, decision.reason
('store', 'the gradients of Y would recompute its sum per element')
>>> import dataclasses
>>> inside = Term(sympy.tanh(H[b, u] * W2[u, o]), out.terms[0].reduced)
>>> inside = dataclasses.replace(out, terms=(inside,))
>>> decide(hidden, (inside,), outputs=("Y",), shapes=shapes).reason
"recomputing it would repeat its sum 3x inside Y's loop over o"
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.ir.contraction import Prologue, contraction, xla_contraction, xla_plan
from codegen.ir.nest import LoopNest, Reduce, Term, extent_symbol, scalar_symbol, tensor_base
from codegen.ir.reductions import REDUCTIONS
from codegen.passes.mirror import summed_through

#: The cost of a transcendental function (exp, tanh, erf, ...) against an addition.
FUNCTION_COST = 8
#: The cost of a byte written to or read from memory, against an addition.
BYTE_COST = 1.0
#: Bytes per element of a stored intermediate (float32).
ELEMENT_BYTES = 4
#: Reductions an intermediate may have and still be recomputed inside its readers (their
#: gradients through a nested reduction are derived; see `codegen.passes.grad`).
INLINE_REDUCTIONS = ("sum", "logsumexp")
#: The largest intermediate stored, instead of recomputed in one pass, when a program is
#: differentiated more than once (module docstring): past it, memory comes first.
HIGHER_ORDER_STORE_BYTES = 2**28
#: The largest intermediate stored for an input read beside it (module docstring).
BESIDE_STORE_BYTES = 2**24

Shapes = Mapping[str, Sequence[int]]


@dataclass(frozen=True)
class Decision:
    """What happens to one intermediate, why, and the estimates compared (None: a rule
    decided without them)."""

    name: str
    choice: str  # "inline" (recomputed where read) or "store"
    reason: str
    inline_cost: float | None = None
    store_cost: float | None = None

    def __str__(self) -> str:
        verb = "recomputed where read" if self.choice == "inline" else "stored"
        text = f"{self.name}: {verb} ({self.reason})"
        if self.inline_cost is not None and self.store_cost is not None:
            text += (
                f"; estimated cost inline {_units(self.inline_cost)}, "
                f"store {_units(self.store_cost)}"
            )
        return text


def _units(cost: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if cost >= scale:
            return f"{cost / scale:.3g}{suffix}"
    return f"{cost:.3g}"


def _extent(start: sympy.Expr, stop: sympy.Expr, extents: Mapping[sympy.Symbol, int]) -> int:
    """A range's length for these extents; a bound that names an outer index (a shifted or
    triangular range) counts at that index's value 0, as a rough estimate."""
    length = sympy.sympify(sympy.sympify(stop - start).xreplace(extents))
    if length.free_symbols:
        length = length.xreplace({s: 0 for s in length.free_symbols})
    try:
        return max(int(length), 1)
    except TypeError:
        return 1


def _extents(nest: LoopNest, shapes: Shapes) -> dict[sympy.Symbol, int]:
    values = {}
    for name in nest.extent_tensors():
        for axis, n in enumerate(shapes.get(name, ())):
            values[extent_symbol(name, axis)] = int(n)
    return values


def operations(expr: sympy.Basic, extents: Mapping[sympy.Symbol, int]) -> float:
    """Arithmetic in one evaluation of `expr`, a nested reduction counted per iteration."""
    if isinstance(expr, Reduce):
        n = _extent(expr.start, expr.stop, extents)
        return n * (operations(expr.body, extents) + 1)
    if expr.is_Atom or isinstance(expr, sympy.Indexed):
        return 0
    own: float = 0
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        own = len(expr.args) - 1
    elif isinstance(expr, sympy.Pow):
        exponent = expr.args[1]
        own = 1 if exponent.is_Integer and abs(int(exponent)) <= 2 else FUNCTION_COST
    elif isinstance(expr, sympy.Function) and not isinstance(expr, (sympy.Max, sympy.Min)):
        own = FUNCTION_COST
    else:
        own = 1
    return own + sum(operations(a, extents) for a in expr.args)


def work(nest: LoopNest, shapes: Shapes) -> float:
    """The arithmetic of computing every element of `nest` once."""
    extents = _extents(nest, shapes)
    free = math.prod(_extent(r.start, r.stop, extents) for r in nest.free)
    total = 0.0
    for term in nest.terms:
        inner = math.prod(_extent(r.start, r.stop, extents) for r in term.reduced)
        total += free * inner * (operations(term.body, extents) + 1)
    return total


def reduces(nest: LoopNest) -> bool:
    """Whether any element of `nest` is a sum of several values (its own reduced indices, or
    a nested reduction it carries from an intermediate inlined into it)."""
    return any(t.reduced or t.body.atoms(Reduce) for t in nest.terms)


def _reads(nest: LoopNest, name: str, term: Term) -> list[sympy.Basic]:
    """The reads of `name` in a term of `nest` (a scalar's: its symbol)."""
    if nest.operand(name).is_scalar:
        return [scalar_symbol(name)] if term.body.has(scalar_symbol(name)) else []
    return [a for a in term.body.atoms(sympy.Indexed) if a.base == tensor_base(name)]


@dataclass(frozen=True)
class _Use:
    """One read of the intermediate in a reader: how often it is evaluated, and the loops
    around it that it does not depend on (name, extent)."""

    evaluations: int
    repeats: tuple[tuple[str, int], ...]


def _uses(reader: LoopNest, name: str, shapes: Shapes) -> list[_Use]:
    extents = _extents(reader, shapes)
    uses = []
    prologues = _prologues(reader)
    # A topk computes each row's k values in one loop: its rank (last free index) is no loop.
    free = reader.free[:-1] if REDUCTIONS[reader.reduction].selects else reader.free
    for term in reader.terms:
        for read in _reads(reader, name, term):
            depends = read.free_symbols
            positions = [n for n, r in enumerate(term.reduced) if r.index in depends]
            inner = positions[-1] + 1 if positions else 0  # hoisted out of deeper loops
            loops = (*free, *term.reduced[:inner])
            within = next((p for p in prologues.get(term, ()) if p.body.has(read)), None)
            if within is not None:  # evaluated once per point of the prologue's indices
                loops = tuple(r for r in (*free, *term.reduced) if r.index in within.indices)
            evaluations, repeats = 1, []
            for r in loops:
                n = _extent(r.start, r.stop, extents)
                evaluations *= n
                if r.index not in depends and n > 1:
                    repeats.append((r.index.name, n))
            uses.append(_Use(evaluations, tuple(repeats)))
    return uses


def _prologues(reader: LoopNest) -> dict[Term, tuple[Prologue, ...]]:
    """The prologues of each term of a reader that XLA computes as a dot after them
    (`codegen.ir.contraction.prologue_contraction`): what they read is evaluated once per
    point of their own indices, not once per iteration of the reader's loops."""
    if not xla_contraction(reader):
        return {}
    plan = xla_plan(reader)
    assert plan is not None
    found: dict[Term, tuple[Prologue, ...]] = {}
    for origin, dot in zip(plan.origins, plan.dots):  # a term split in groups: each one's
        if dot is not None and dot.prologues:
            term = reader.terms[origin]
            found[term] = (*found.get(term, ()), *dot.prologues)
    return found


def nonlinear_in(reader: LoopNest, name: str) -> bool:
    """Whether the reader's derivative with respect to `name` still reads `name` (its
    gradient nests then recompute the intermediate). An argmax/argmin has no gradient."""
    if REDUCTIONS[reader.reduction].positional:
        return False
    if reader.reduction != "sum" and not REDUCTIONS[reader.reduction].selects:
        return True  # a topk's gradient tests positions, as a sum's has no factor: below
    for term in reader.terms:
        reads = _reads(reader, name, term)
        stand_ins = {r: sympy.Dummy(f"v{n}") for n, r in enumerate(reads)}
        body = _differentiable(term.body.xreplace(stand_ins))
        for symbol in stand_ins.values():
            if sympy.diff(body, symbol).free_symbols & set(stand_ins.values()):
                return True
    return False


def _differentiable(body: sympy.Expr) -> sympy.Expr:
    """`body` with its nested reductions (a factored sum's `sum_d(X[i, d])`) replaced by
    what sympy can differentiate, for the questions above (does a derivative still read a
    value?): a sum by its body, being linear; any other reduction by an unknown function of
    its body, so its derivative reads every value the body reads."""
    if not body.has(Reduce):
        return body

    def stand_in(nested: Reduce) -> sympy.Expr:
        if nested.reduction == "sum":
            return nested.body
        return sympy.Function(f"{nested.reduction}_{nested.index}")(nested.body)

    return body.replace(lambda e: isinstance(e, Reduce), stand_in)


def _gradient_weight(reader: LoopNest, producer: LoopNest) -> int:
    """How many nests of a forward+backward pass evaluate the intermediate when it is
    recomputed inside `reader`: the forward, the gradient nest of each other tensor whose
    derivative reads it, and, when the reader is nonlinear in it, those of its own inputs."""
    name = producer.output
    weight = 1
    if REDUCTIONS[reader.reduction].positional:
        return weight  # a position has no gradient nests
    for op in reader.operands:
        if op.name == name or op.is_scalar:
            continue
        for term in reader.terms:
            mine = {r: sympy.Dummy() for r in _reads(reader, name, term)}
            theirs = {r: sympy.Dummy() for r in _reads(reader, op.name, term)}
            body = _differentiable(term.body.xreplace({**mine, **theirs}))
            if any(sympy.diff(body, q).free_symbols & set(mine.values()) for q in theirs.values()):
                weight += 1
                break
    if nonlinear_in(reader, name):
        weight += sum(1 for op in producer.operands if not op.is_scalar)
    return weight


def _gradient_reads_value(producer: LoopNest, readers: Sequence[LoopNest]) -> bool:
    """Whether the gradient of a reduction other than a sum (a logsumexp's `exp(X - L)`, a
    max's position, a product's `P / X`) reads the reduction's value, for an input that a
    reader's gradient reaches: inlined, that value is recomputed per element of the input
    (cross-entropy's `L[n] - P[n]` would redo the logsumexp for every class)."""
    if producer.reduction == "sum" or REDUCTIONS[producer.reduction].positional:
        return False
    if all(op.is_scalar for op in producer.operands):
        return False
    return any(not REDUCTIONS[r.reduction].positional for r in readers)


def _higher_order(
    producer: LoopNest, order: int, inline_cost: float, store_cost: float
) -> tuple[float, float]:
    """The estimates of a first-order pass, grown for a pass of derivative `order`. Each
    order runs every nest again as its tangent nest, which evaluates the intermediate and its
    tangent (one product more per tensor the intermediate reads: `1 + tensors` evaluations):
    recomputed, `2 + tensors` times the work of the order before; stored, the value and its
    tangent are each computed, written and read once, `1 + tensors` times."""
    higher = max(order - 1, 0)
    tensors = sum(1 for op in producer.operands if not op.is_scalar)
    return inline_cost * (2 + tensors) ** higher, store_cost * (1 + tensors) ** higher


def _store_at_higher_order(order: int, size: int, inline_cost: float, store_cost: float) -> bool:
    """Whether a program differentiated more than once stores an intermediate that the
    one-pass rule would recompute: cheaper by the counts, and no larger than
    `HIGHER_ORDER_STORE_BYTES`."""
    fits = size * ELEMENT_BYTES <= HIGHER_ORDER_STORE_BYTES
    return order > 1 and fits and store_cost < inline_cost


def _read_beside(
    producer: LoopNest, readers: Sequence[LoopNest], intermediates: Sequence[str]
) -> str | None:
    """An input (no operand of `producer`) that every reader reads only beside it, as
    `codegen.passes.mirror.summed_through` says; None where there is none."""
    names = {op.name for reader in readers for op in reader.operands if not op.is_scalar}
    names -= {producer.output, *producer.operand_names, *intermediates}
    return next((n for n in sorted(names) if summed_through(readers, n, producer.output)), None)


def _masked(producer: LoopNest, readers: Sequence[LoopNest]) -> bool:
    """Whether a condition (a `where`, a comparison, a guard or a loop bound) appears in
    `producer` or its readers: a mask the one-pass strategy uses to skip pairs."""
    return any(
        term.guard != sympy.true
        or term.constraints
        or term.body.has(sympy.Piecewise)
        or term.body.atoms(sympy.core.relational.Relational)
        for nest in (producer, *readers)
        for term in nest.terms
    )


def _largest_other(name: str, sizes: Mapping[str, int], intermediates: Sequence[str]) -> int:
    """The size of the largest input or output (intermediates are not compared)."""
    return max((n for key, n in sizes.items() if key not in (name, *intermediates)), default=0)


def decide(
    producer: LoopNest,
    readers: Sequence[LoopNest],
    *,
    outputs: Sequence[str],
    shapes: Shapes,
    paired: Sequence[str] = (),
    intermediates: Sequence[str] = (),
    order: int = 1,
    beside: bool = False,
) -> Decision:
    """Recompute `producer` inside its `readers`, or store it (module docstring).

    Args:
        producer: the intermediate's nest (earlier decisions applied).
        readers: the later statements that read it.
        outputs: the program's outputs (always stored).
        shapes: the shape of every input and every statement's output, for this call.
        paired: readers whose reads cost nothing once recomputed, because the one-pass
            strategy computes them together with another reader (attention's weighted sum).
        intermediates: the program's other intermediates (not compared for size).
        order: how many times the call is differentiated (1: a forward+backward pass; 2:
            an HVP or a Hessian, each nest run again as its tangent nest).
        beside: the back end runs stored scores as XLA's dots (C, reference): store an
            intermediate that the one-pass rule would recompute where an input is read
            beside it in every reader (a relative-bias table), or where no mask spares any
            of it (module docstring).

    Returns:
        A `Decision`.
    """
    name = producer.output
    if name in outputs:
        return Decision(name, "store", "an output of the program")
    dots = [r.output for r in readers if contraction(r) is not None]
    if dots:
        return Decision(name, "store", f"read by the pure contraction {dots[0]} (XLA's dot)")
    if contraction(producer) is not None and not all(reduces(r) for r in readers):
        return Decision(name, "store", "a pure contraction read elementwise: it stays XLA's dot")
    if len(producer.terms) > 1 and producer.reduction != "sum":
        return Decision(name, "store", f"several terms of a {producer.reduction}")
    if producer.reduction not in INLINE_REDUCTIONS and any(t.reduced for t in producer.terms):
        return Decision(
            name, "store", f"a {producer.reduction}: recomputing it where read is not derived"
        )
    sizes = {key: math.prod(shape) for key, shape in shapes.items()}
    size = sizes[name]
    per_element = work(producer, shapes) / max(size, 1)
    inline_cost = 0.0
    reads = 0
    repeats: list[tuple[str, str, int]] = []  # (reader, loop, extent)
    for reader in readers:
        weight = _gradient_weight(reader, producer)
        for use in _uses(reader, name, shapes):
            reads += weight
            if reader.output in paired:
                continue  # computed once, with the other reader, in one pass
            inline_cost += weight * use.evaluations * per_element
            repeats += [(reader.output, loop, n) for loop, n in use.repeats]
    # Stored: computed once, written, read by each nest above; its cotangent written and read.
    store_cost = per_element * size + BYTE_COST * ELEMENT_BYTES * size * (3 + reads)
    inline_cost, store_cost = _higher_order(producer, order, inline_cost, store_cost)
    if reduces(producer):
        if repeats:
            where, loop, n = repeats[0]
            why = f"recomputing it would repeat its sum {n}x inside {where}'s loop over {loop}"
            return Decision(name, "store", why, inline_cost, store_cost)
        backward = [r.output for r in readers if nonlinear_in(r, name)]
        if backward:
            if paired and size > _largest_other(name, sizes, intermediates):
                if _store_at_higher_order(order, size, inline_cost, store_cost):
                    times = "twice" if order == 2 else f"{order} times"
                    why = (
                        f"larger than every input and output, but differentiated {times}: "
                        "every tangent nest would recompute it and its tangent"
                    )
                    return Decision(name, "store", why, inline_cost, store_cost)
                table = _read_beside(producer, readers, intermediates) if beside else None
                if table and size * ELEMENT_BYTES <= BESIDE_STORE_BYTES:
                    why = (
                        f"larger than every input and output, but {table} is read beside it: "
                        f"stored, {table}'s gradient sums its cotangent, not a nest of its own "
                        "that recomputes it"
                    )
                    return Decision(name, "store", why, inline_cost, store_cost)
                fits = size * ELEMENT_BYTES <= BESIDE_STORE_BYTES
                if beside and fits and not _masked(producer, readers):
                    why = (
                        "larger than every input and output, but no mask spares any of its "
                        "elements: stored, its sums run as XLA's dots"
                    )
                    return Decision(name, "store", why, inline_cost, store_cost)
                why = (
                    "larger than every input and output, read by a logsumexp and the weighted "
                    f"sum {paired[0]} (in one pass where their rows share an order): never "
                    "materialised"
                )
                return Decision(name, "inline", why, inline_cost, store_cost)
            why = f"the gradients of {backward[0]} would recompute its sum per element"
            return Decision(name, "store", why, inline_cost, store_cost)
        if _gradient_reads_value(producer, readers):
            why = (
                f"the gradient of its {producer.reduction} reads its value: recomputed, it would "
                "be repeated for every element of its input"
            )
            return Decision(name, "store", why, inline_cost, store_cost)
    choice = "inline" if inline_cost <= store_cost else "store"
    why = "cheaper to recompute" if choice == "inline" else "cheaper to store"
    return Decision(name, choice, why, inline_cost, store_cost)
