"""An input read only in a difference with a stored intermediate (Sinkhorn's marginals:
`la[i] - A[i]` inside each potential's logsumexp) takes that intermediate's gradient, negated,
instead of a gradient nest that computes the statement's weights once more
(codegen/passes/mirror.py, tensordsl/binding/program_grad.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy

import tensordsl as td
from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
from codegen.ir.nest import tensor_base as base
from codegen.passes.mirror import mirror_sign
from tests.backends import NEEDS_C_COMPILER
from tests.cpu.test_log_domain import sinkhorn_reference, sinkhorn_source

i, j = index_symbol("i"), index_symbol("j")
la, A, C = base("la"), base("A"), base("C")


def _nest(*bodies, guard=sympy.true):
    free = (Range(j, 0, extent_symbol("C", 1)),)
    reduced = (Range(i, 0, extent_symbol("C", 0)),)
    terms = tuple(Term(b, reduced, guard=guard) for b in bodies)
    operands = (Operand("la", 1), Operand("A", 1), Operand("C", 2))
    return LoopNest("B", free, terms, operands, reduction="logsumexp" if len(terms) == 1 else "sum")


@pytest.mark.parametrize(
    ("bodies", "expected"),
    [
        ((la[i] - A[i] - C[i, j],), -1),
        ((sympy.exp(A[i] - la[i]) * C[i, j],), -1),  # inside a function: still a difference
        ((la[i] + A[i] + C[i, j],), 1),
        ((la[i] - A[i], C[i, j]), -1),  # a term that reads neither
        ((la[i] - A[i], la[i] + A[i]), None),  # the two terms disagree
        ((la[i] * A[i],), None),
        ((la[i] - A[j],), None),  # other indices
        ((la[i] - A[i] + la[j],), None),  # read twice
        ((la[i] - C[i, j],), None),  # the partner not read
        ((C[i, j],), None),  # neither read anywhere
    ],
)
def test_mirror_sign(bodies, expected):
    assert mirror_sign(_nest(*bodies), "la", "A") == expected


def test_a_guard_that_reads_the_input_is_no_mirror():
    assert mirror_sign(_nest(la[i] - A[i], guard=sympy.Gt(la[i], 0)), "la", "A") is None


@NEEDS_C_COMPILER
@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize(("n", "m"), [(7, 5), (33, 40)])
def test_sinkhorn_marginals_take_the_potentials_gradients(n, m):
    rng = np.random.default_rng(n)
    cost = 4 * np.square(rng.standard_normal((n, m)))
    la, lb, ct = rng.standard_normal(n), rng.standard_normal(m), rng.standard_normal(m)
    program = td.program(sinkhorn_source(3), backend="c")
    shapes = {"cost": (n, m), "epsilon": (), "la": (n,), "lb": (m,)}
    names = [t.name for t in program.profile(shapes, dtype="float64", reps=1).timings]
    assert "dcost" in names and "dB3" in names  # B3's from V's nest, lb mirroring it
    assert "dla" not in names and "dlb" not in names  # no nest of their own
    with jax.enable_x64(True):
        found = jax.grad(
            lambda c, a, b: jnp.sum(program(cost=c, epsilon=0.5, la=a, lb=b) * ct), (0, 1, 2)
        )(cost, la, lb)
        want = jax.grad(
            lambda c, a, b: jnp.sum(sinkhorn_reference(c, 0.5, a, b, 3) * ct), (0, 1, 2)
        )(cost, la, lb)
    for got, expected in zip(found, want, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-10, atol=1e-12)


@NEEDS_C_COMPILER
@pytest.mark.usefixtures("poisoned_outputs")
def test_an_input_also_read_otherwise_adds_both_gradients():
    """`la` mirrors `A` in `B` and is read again, in a product, by `D`: its gradient is `B`'s
    part (minus `A`'s gradient from `B`) plus `D`'s nest."""
    source = """
        (logsumexp) A[i] := -C[i,j]
        (logsumexp) B[j] := la[i] - A[i] - C[i,j]
        D[i] := la[i] * A[i]
        Y[j] := B[j] + D[j]
    """
    rng = np.random.default_rng(5)
    c, a, ct = rng.standard_normal((6, 6)), rng.standard_normal(6), rng.standard_normal(6)

    def reference(c, a):
        first = jax.nn.logsumexp(-c, axis=1)
        second = jax.nn.logsumexp(a[:, None] - first[:, None] - c, axis=0)
        return second + a * first

    program = td.program(source, backend="c")
    with jax.enable_x64(True):
        found = jax.grad(lambda c, a: jnp.sum(program(C=c, la=a) * ct), (0, 1))(c, a)
        want = jax.grad(lambda c, a: jnp.sum(reference(c, a) * ct), (0, 1))(c, a)
    for got, expected in zip(found, want, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-10, atol=1e-12)


@NEEDS_C_COMPILER
@pytest.mark.usefixtures("poisoned_outputs")
def test_the_mirrored_gradient_is_differentiated_again():
    """A Hessian-vector product through the marginals' mirrored gradients (jvp of grad)."""
    rng = np.random.default_rng(11)
    cost = 4 * np.square(rng.standard_normal((5, 4)))
    la, lb, ct = rng.standard_normal(5), rng.standard_normal(4), rng.standard_normal(4)
    tangent = rng.standard_normal(5)
    program = td.program(sinkhorn_source(2), backend="c")

    def hvp(fn):
        grad = jax.grad(lambda a: jnp.sum(fn(cost, 0.5, a, lb) * ct))
        return jax.jvp(grad, (la,), (tangent,))[1]

    with jax.enable_x64(True):
        found = hvp(lambda c, e, a, b: program(cost=c, epsilon=e, la=a, lb=b))
        want = hvp(lambda c, e, a, b: sinkhorn_reference(c, e, a, b, 2))
    np.testing.assert_allclose(np.asarray(found), np.asarray(want), rtol=1e-9, atol=1e-12)
