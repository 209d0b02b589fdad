"""Every nest the CUDA back end must compile: corpus forwards, gradient and auxiliary nests."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from codegen.ir.nest import LoopNest
from codegen.passes import grad, gradient_rules
from tensordsl.errors import TensorDSLError
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.corpus import CORPUS, Case


@dataclass(frozen=True)
class Named:
    """A nest with its corpus case and role ("forward", "grad_A", "argument", ...)."""

    case: str
    role: str
    nest: LoopNest
    integer: frozenset[str]

    @property
    def id(self) -> str:
        return f"{self.case}-{self.role}"


def forward(case: Case) -> LoopNest:
    return lower(parse(case.source), reduce=case.reduce, ranges=case.ranges).nest


def dtypes(named: Named, dtype: str = "float32") -> dict[str, str]:
    """`dtype` for floats, int32 for integer inputs and argmax/argmin outputs."""
    nest = named.nest
    found = {n: "int32" if n in named.integer else dtype for n in nest.operand_names}
    found[nest.output] = "int32" if nest.reduction in ("argmax", "argmin") else dtype
    return found


@functools.lru_cache(maxsize=1)
def all_nests() -> tuple[Named, ...]:
    found = []
    for case in CORPUS:
        nest = forward(case)
        integer = frozenset(n for n, a in case.args.items() if a.integer)
        found.append(Named(case.name, "forward", nest, integer))
        for role, aux in gradient_rules.auxiliary_nests(nest).items():
            found.append(Named(case.name, role, aux, integer))
        if not case.differentiable:
            continue
        for op in nest.operands:
            if op.name in integer:
                continue
            try:
                gradient = grad.gradient(nest, op.name)
            except TensorDSLError:
                continue
            roles = dict(gradient.roles)
            # The saved argmax/argmin position is int32 (jax_bind._auxiliaries); counts are floats.
            aux_int = {n for n, r in roles.items() if r == gradient_rules.ARGUMENT}
            found.append(
                Named(case.name, f"grad_{op.name}", gradient.nest, integer | frozenset(aux_int))
            )
    return tuple(found)
