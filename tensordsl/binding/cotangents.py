"""The fused backward's bookkeeping (`tensordsl.binding.program_grad`): cotangents added up by
name, and what the stored statements are to one another.

A stored intermediate's cotangent is the sum of what each of its readers gives it, and an
input's gradient the sum of its nests' and mirrors' parts: `Sums.add` starts a name's sum with
its first part (a name without one has a zero cotangent, JAX's symbolic zero, and runs
nothing). `StoredNames` is computed once per program: the names it stores, and how many of
its statements read each name (an intermediate read once gets its gradient where it is read);
`with_cotangents`, once per backward: the names that can have a cotangent.

>>> sums = Sums()
>>> sums.add("dL", 1.5)
>>> sums.add("dL", 2.0)
>>> sums
{'dL': 3.5}
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence, Set
from typing import Any

import sympy

from codegen.ir.nest import LoopNest, Operand, Term, scalar_symbol


class Sums(dict[str, Any]):
    """Values by name, each the sum of the parts added into it."""

    def add(self, name: str, value: Any) -> None:
        """Add `value` into `name`'s sum, which it starts where `name` has none yet."""
        self[name] = self[name] + value if name in self else value


@dataclasses.dataclass(frozen=True)
class StoredNames:
    """The stored statements' outputs, and for every name they read, how many of them read
    it (`readers`)."""

    outputs: frozenset[str]
    readers: Counter[str]

    @classmethod
    def of(cls, stored: Sequence[LoopNest]) -> StoredNames:
        """The names of a program's stored statements.

        >>> names = StoredNames.of(_attention())
        >>> sorted(names.outputs), names.readers["S"], names.readers["L"]
        (['L', 'O', 'S'], 2, 1)
        """
        readers = Counter(op.name for nest in stored for op in nest.operands)
        return cls(frozenset(nest.output for nest in stored), readers)


def with_cotangents(stored: Sequence[LoopNest], perturbed: Set[str]) -> set[str]:
    """The differentiated inputs and every stored value that depends on one of them (in
    program order): the names that can have a cotangent.

    >>> sorted(with_cotangents(_attention(), {"V"})), sorted(with_cotangents(_attention(), {"K"}))
    (['O', 'V'], ['K', 'L', 'O', 'S'])
    """
    found = set(perturbed)
    for nest in stored:
        if found & set(nest.operand_names):
            found.add(nest.output)
    return found


def _attention() -> tuple[LoopNest, ...]:
    """Attention's stored statements, as their names go (the doctests' example)."""

    def statement(output: str, *reads: str) -> LoopNest:
        body = sympy.Add(*(scalar_symbol(r) for r in reads))
        return LoopNest(output, (), (Term(body),), tuple(Operand(r, 0) for r in reads))

    return statement("S", "Q", "K"), statement("L", "S"), statement("O", "S", "L", "V")
