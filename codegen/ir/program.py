"""The program IR: several loop nests that run in order, each reading earlier outputs.

A `Program` is what `td.kernel` makes of a source with several statements. Statement `n`
is the loop nest `statements[n]`; its output may be read by any later statement (an
*intermediate*), and `outputs` names the results. The semantics are those of the statements
run in order as separate kernels. Each statement's nest is lowered on its own, so its ranges
name the extents of the intermediates it reads (`S.shape[3]`); `shapes` gives the shape of
every statement's output as expressions of the *inputs'* extents only, which is what a pass
that inlines or fuses statements needs. Passes are functions `Program -> Program`.

>>> from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
>>> from codegen.ir.nest import tensor_base
>>> i, k = index_symbol("i"), index_symbol("k")
>>> X, W, C = (tensor_base(n) for n in "XWC")
>>> conv = LoopNest("C", (Range(i, 0, extent_symbol("X", 0) - extent_symbol("W", 0) + 1),),
...                 (Term(X[i + k] * W[k], (Range(k, 0, extent_symbol("W", 0)),)),),
...                 (Operand("X", 1), Operand("W", 1)))
>>> diff = LoopNest("D", (Range(i, 0, extent_symbol("C", 0) - 1),),
...                 (Term(C[i + 1] - C[i]),), (Operand("C", 1),))
>>> program = make_program((conv, diff), outputs=("D",))
>>> program.inputs
(Operand(name='X', rank=1), Operand(name='W', rank=1))
>>> program.shape("D")
(-W.shape[0] + X.shape[0],)
>>> program.intermediates
('C',)
>>> program.concrete_shapes({"X": (10,), "W": (3,)})
{'X': (10,), 'W': (3,), 'C': (8,), 'D': (7,)}
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import sympy

from codegen.ir.extents import output_shape
from codegen.ir.nest import LoopNest, Operand, extent_of

__all__ = ["Program", "live_statements", "make_program"]

Shape = tuple[sympy.Expr, ...]


@dataclass(frozen=True)
class Program:
    """Loop nests run in order; hashable, so it can be a cache key or a JAX parameter.

    Attributes:
        statements: one nest per statement, in source order; each output is defined once.
        inputs: the operands no statement defines, in order of first appearance (scalars
            are rank 0).
        outputs: the names returned, in the order returned (statement outputs).
        shapes: `(name, shape)` for every statement's output, in statement order; each
            shape is a tuple of expressions of the inputs' extents (`X.shape[0] - 2`).
    """

    statements: tuple[LoopNest, ...]
    inputs: tuple[Operand, ...]
    outputs: tuple[str, ...]
    shapes: tuple[tuple[str, Shape], ...]

    def __post_init__(self) -> None:
        defined = self.defined
        assert len(set(defined)) == len(defined), "a name is defined twice"
        assert set(self.outputs) <= set(defined), "an output is not defined"
        assert not set(defined) & set(self.input_names), "an input is defined"

    @property
    def defined(self) -> tuple[str, ...]:
        """The statements' output names, in order."""
        return tuple(nest.output for nest in self.statements)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(op.name for op in self.inputs)

    @property
    def intermediates(self) -> tuple[str, ...]:
        """Statement outputs that are not results of the program."""
        return tuple(name for name in self.defined if name not in self.outputs)

    def statement(self, name: str) -> LoopNest:
        """The nest that defines `name`."""
        return self.statements[self.defined.index(name)]

    def shape(self, name: str) -> Shape:
        """The shape of statement output `name`, in the inputs' extents."""
        return dict(self.shapes)[name]

    def consumers(self, name: str) -> tuple[LoopNest, ...]:
        """The statements that read `name`."""
        return tuple(nest for nest in self.statements if name in nest.operand_names)

    def in_input_extents(self, expr: sympy.Expr) -> sympy.Expr:
        """`expr` with every extent of a statement output replaced by the inputs' extents."""
        return _in_input_extents(expr, dict(self.shapes))

    def concrete_shapes(self, input_shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple]:
        """The shape of every input (as given) and every statement output, by name."""
        shapes = {op.name: tuple(int(n) for n in input_shapes[op.name]) for op in self.inputs}
        for nest in self.statements:
            shapes[nest.output] = output_shape(nest, shapes)
        return shapes

    def __str__(self) -> str:
        return "\n".join(str(nest) for nest in self.statements)


def _in_input_extents(expr: sympy.Expr, shapes: Mapping[str, Shape]) -> sympy.Expr:
    mapping = {}
    for symbol in sympy.sympify(expr).free_symbols:
        found = extent_of(symbol)
        if found is not None and found[0] in shapes:
            mapping[symbol] = shapes[found[0]][found[1]]
    return sympy.sympify(expr).xreplace(mapping)


def make_program(statements: Sequence[LoopNest], *, outputs: Sequence[str]) -> Program:
    """A `Program` of `statements` (checked by the front end), with inputs and shapes found.

    Args:
        statements: the nests in order; a nest may read the outputs of those before it.
        outputs: the statement outputs the program returns, in order.

    Returns:
        The `Program`; each output shape is `stop - start` of the nest's free ranges, in the
        inputs' extents.
    """
    defined: set[str] = set()
    inputs: dict[str, Operand] = {}
    shapes: dict[str, Shape] = {}
    for nest in statements:
        for op in nest.operands:
            if op.name not in defined:
                inputs.setdefault(op.name, op)
        shape = tuple(sympy.simplify(r.stop - r.start) for r in nest.free)
        shapes[nest.output] = tuple(_in_input_extents(n, shapes) for n in shape)
        defined.add(nest.output)
    return Program(tuple(statements), tuple(inputs.values()), tuple(outputs), tuple(shapes.items()))


def live_statements(program: Program) -> tuple[LoopNest, ...]:
    """The statements the outputs depend on, in order (the others need not run).

    >>> from codegen.ir.nest import LoopNest, Operand, Term, tensor_base
    >>> a = LoopNest("A", (), (Term(tensor_base("X")[0]),), (Operand("X", 1),))
    >>> b = LoopNest("B", (), (Term(tensor_base("X")[1]),), (Operand("X", 1),))
    >>> [n.output for n in live_statements(make_program((a, b), outputs=("B",)))]
    ['B']
    """
    needed = set(program.outputs)
    live = []
    for nest in reversed(program.statements):
        if nest.output in needed:
            live.append(nest)
            needed |= set(nest.operand_names)
    return tuple(reversed(live))
