"""A stored intermediate read with some of an input's indices, only in a fixed combination
with it (Sinkhorn's `-A[i] - C[i,j]/eps`), takes its gradient as the input's part summed, so
that each statement's weights are computed in one gradient nest, not two
(codegen/passes/spread.py, tensordsl/binding/summed.py, tensordsl/binding/program_grad.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy

import tensordsl as td
from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol
from codegen.ir.nest import tensor_base as base
from codegen.passes.spread import spread
from tests.backends import NEEDS_C_COMPILER
from tests.cpu.test_log_domain import sinkhorn_reference, sinkhorn_source

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

i, j, k = index_symbol("i"), index_symbol("j"), index_symbol("k")
A, C, la, D = base("A"), base("C"), base("la"), base("D")
eps = sympy.Symbol("eps", real=True)


def _nest(body, guard=sympy.true, terms=1, reduction="logsumexp"):
    free = (Range(j, 0, extent_symbol("C", 1)),)
    reduced = (Range(i, 0, extent_symbol("C", 0)),)
    operands = (Operand("la", 1), Operand("A", 1), Operand("C", 2), Operand("eps", 0))
    made = tuple(Term(body, reduced, guard=guard) for _ in range(terms))
    return LoopNest("B", free, made, operands, reduction=reduction)


@pytest.mark.parametrize(
    ("body", "ratio"),
    [
        (la[i] - A[i] - C[i, j] / eps, eps),  # Sinkhorn
        (2 * A[i] + C[i, j], 2),
        (sympy.exp(A[i] - 3 * C[i, j]), sympy.Rational(-1, 3)),
        (A[i] * C[i, j], None),  # no fixed combination
        (la[i] * (A[i] - C[i, j]), -1),  # the factor reads neither
        (A[i] - C[i, j] * la[i], None),  # the ratio reads a tensor
        (A[i] - C[i, j] + A[i] ** 2, None),  # A read twice
        (A[i] - C[i, i], None),  # C not at every index of the nest
        (A[i] - C[i + 1, j], None),
        (A[i] - C[j, i], -1),  # in any order
        (A[j] - C[i, j], -1),
    ],
)
def test_spread_ratio(body, ratio):
    found = spread(_nest(body), "C", "A")
    assert (found.ratio if found else None) == ratio


def test_what_spread_refuses():
    assert spread(_nest(A[i] - C[i, j], guard=sympy.Gt(A[i], 0)), "C", "A") is None
    assert spread(_nest(A[i] - C[i, j], terms=2, reduction="sum"), "C", "A") is None
    # the same indices: the input mirrors the intermediate instead (codegen.passes.mirror)
    free = (Range(i, 0, extent_symbol("D", 0)),)
    same = LoopNest("Y", free, (Term(D[i] - A[i]),), (Operand("D", 1), Operand("A", 1)))
    assert spread(same, "D", "A") is None


def test_the_axes_summed_and_the_order_kept():
    """`A[k,i]` against `C[i,j,k]`: sum C's part over j, then (i, k) transposed to (k, i)."""
    free = (Range(i, 0, extent_symbol("C", 0)),)
    reduced = (Range(j, 0, extent_symbol("C", 1)), Range(k, 0, extent_symbol("C", 2)))
    body = A[k, i] - C[i, j, k]
    nest = LoopNest("Y", free, (Term(body, reduced),), (Operand("A", 2), Operand("C", 3)))
    found = spread(nest, "C", "A")
    assert (found.ratio, found.summed, found.order) == (-1, (1,), (1, 0))


@NEEDS_C_COMPILER
def test_sinkhorn_computes_each_statements_weights_once_in_the_backward():
    """No gradient nest of a potential: each statement's weights `exp(f - Y)` in one nest,
    its part of the cost's gradient, summed for the potential it reads."""
    program = td.program(sinkhorn_source(3), backend="c")
    shapes = {"cost": (7, 5), "epsilon": (), "la": (7,), "lb": (5,)}
    names = [t.name for t in program.profile(shapes, reps=1).timings]
    assert names.count("dcost") == 6  # A1's part alone, the other five each its own
    assert not {"dA1", "dA2", "dA3", "dB1", "dB2"} & set(names)
    # each part's extents folded for the call: no test of `j < lb.shape[0]` (lb's extent
    # and the cost's agree) and so no padded copy of the cost in the nest
    sources = program.source("c", shapes)
    parts = [text for name, text in sources.items() if name.startswith("dcost")]
    assert len(parts) == 6
    for text in parts:
        assert "<=" not in text.splitlines()[1] and "malloc" not in text


def _grads(fn, wrt, values, ct):
    return jax.grad(lambda *d: jnp.sum(fn(**dict(values, **dict(zip(wrt, d)))) * ct), range(3))(
        *(values[n] for n in wrt)
    )


SCALED = """
    (logsumexp) A[k,i] := X[k,i,j] * C[i,j,k]
    (logsumexp) Y[i] := s * A[k,i] - C[i,j,k] + w[j]
"""


def _scaled_reference(X, C, s, w):
    a = jax.nn.logsumexp(X * jnp.transpose(C, (2, 0, 1)), axis=2)
    return jax.nn.logsumexp(s * a.T[:, None, :] - C + w[None, :, None], axis=(1, 2))


@NEEDS_C_COMPILER
def test_a_ratio_of_a_scalar_input_and_a_transposed_sum_run_no_gradient_nest_of_A():
    """`A[k,i]` read against `C[i,j,k]` times a scalar: A's gradient from `Y` is `-s` times
    C's part, summed over j and transposed; no nest of its own."""
    program = td.program(SCALED, backend="c")
    shapes = {"X": (4, 6, 5), "C": (6, 5, 4), "s": (), "w": (5,)}
    names = [t.name for t in program.profile(shapes, reps=1).timings]
    assert "dA" not in names and names.count("dC") == 2  # from A's statement, from Y's


@NEEDS_C_COMPILER
@pytest.mark.parametrize("backend", ["c", "reference"])
@pytest.mark.parametrize("wrt", [("X", "C", "w"), ("X", "C", "s")])
def test_the_summed_gradient_against_float64_jax_numpy(backend, wrt):
    rng = np.random.default_rng(3)
    values = {
        "X": rng.standard_normal((4, 6, 5)),
        "C": rng.standard_normal((6, 5, 4)),
        "s": np.float64(0.7),
        "w": rng.standard_normal(5),
    }
    ct = rng.standard_normal(6)
    program = td.program(SCALED, backend=backend)
    with jax.enable_x64(True):
        found = _grads(program, wrt, values, ct)
        want = _grads(_scaled_reference, wrt, values, ct)
    for got, expected in zip(found, want, strict=True):
        np.testing.assert_allclose(np.asarray(got), np.asarray(expected), rtol=1e-10, atol=1e-12)


@NEEDS_C_COMPILER
def test_the_summed_gradient_is_differentiated_again():
    """A Hessian-vector product in the cost through the summed gradients (jvp of grad)."""
    rng = np.random.default_rng(13)
    cost = 4 * np.square(rng.standard_normal((5, 4)))
    la, lb, ct = rng.standard_normal(5), rng.standard_normal(4), rng.standard_normal(4)
    tangent = rng.standard_normal((5, 4))
    program = td.program(sinkhorn_source(2), backend="c")

    def hvp(fn):
        grad = jax.grad(lambda c: jnp.sum(fn(c, 0.5, la, lb) * ct))
        return jax.jvp(grad, (cost,), (tangent,))[1]

    with jax.enable_x64(True):
        found = hvp(lambda c, e, a, b: program(cost=c, epsilon=e, la=a, lb=b))
        want = hvp(lambda c, e, a, b: sinkhorn_reference(c, e, a, b, 2))
    np.testing.assert_allclose(np.asarray(found), np.asarray(want), rtol=1e-9, atol=1e-12)


@NEEDS_C_COMPILER
def test_the_summed_gradient_under_vmap():
    """A batch of costs: each part and its sum batched, as one nest each."""
    rng = np.random.default_rng(17)
    cost = 4 * np.square(rng.standard_normal((3, 6, 5)))
    la, lb, ct = rng.standard_normal(6), rng.standard_normal(5), rng.standard_normal(5)
    program = td.program(sinkhorn_source(2), backend="c")

    def batched(fn):
        return jax.vmap(jax.grad(lambda c: jnp.sum(fn(c, 0.5, la, lb) * ct)))(cost)

    with jax.enable_x64(True):
        found = batched(lambda c, e, a, b: program(cost=c, epsilon=e, la=a, lb=b))
        want = batched(lambda c, e, a, b: sinkhorn_reference(c, e, a, b, 2))
    np.testing.assert_allclose(np.asarray(found), np.asarray(want), rtol=1e-10, atol=1e-12)
