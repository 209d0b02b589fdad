"""Each gradient nest, run on the reference back end, equals jax.vjp of the reference forward."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy

from codegen.ir.nest import Range
from codegen.passes import grad, gradient_rules
from tensordsl.backends import reference
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse
from tests.corpus import CORPUS, make_inputs

DIFFERENTIABLE = [c for c in CORPUS if c.differentiable and not c.ties]


def forward_nest(case):
    return lower(parse(case.source), reduce=case.reduce, ranges=case.ranges).nest


def float_names(nest, inputs):
    return [
        n for n in nest.operand_names if np.issubdtype(np.asarray(inputs[n]).dtype, np.floating)
    ]


def run_gradient_nest(nest, wrt, inputs, output, cotangent):
    """Evaluate the gradient nest of `wrt` with the reference back end."""
    shapes = {n: np.shape(v) for n, v in inputs.items()}
    gradient = grad.gradient(nest, wrt)
    by_role = {gradient_rules.COTANGENT: cotangent, gradient_rules.OUTPUT: output}
    for role, aux in gradient_rules.auxiliary_nests(nest).items():
        by_role[role] = reference.evaluate(aux, inputs, shapes)
    operands = {}
    for name, role in gradient.roles:
        operands[name] = inputs[name] if role == "input" else by_role[role]
    g_shapes = dict(shapes)
    cotangent_name = next(n for n, r in gradient.roles if r == gradient_rules.COTANGENT)
    g_shapes[cotangent_name] = g_shapes[nest.output] = np.shape(output)
    g_shapes[gradient.nest.output] = np.shape(inputs[wrt])
    return reference.evaluate(gradient.nest, operands, g_shapes, jnp.float64)


@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=lambda c: c.name)
def test_gradient_nest_matches_vjp(case):
    nest = forward_nest(case)
    inputs = make_inputs(case)
    shapes = {n: np.shape(v) for n, v in inputs.items()}
    names = float_names(nest, inputs)

    def forward(*values):
        return reference.evaluate(nest, {**inputs, **dict(zip(names, values))}, shapes)

    # Each side jitted, traced and compiled as one program: eagerly each jnp operation of
    # the evaluation is compiled alone, several times the time (docs/testing.md).
    @jax.jit
    def oracle(cotangent, *values):
        output, vjp = jax.vjp(forward, *values)
        return output, vjp(cotangent)

    primals = [jnp.asarray(inputs[n], jnp.float64) for n in names]
    shape = jax.eval_shape(forward, *primals).shape
    rng = np.random.default_rng(7)
    cotangent = rng.uniform(0.5, 1.5, shape) * rng.choice([-1, 1], shape)
    output, expected = oracle(jnp.asarray(cotangent), *primals)
    for name, want in zip(names, expected):
        got = jax.jit(
            lambda output, cotangent, name=name: run_gradient_nest(
                nest, name, inputs, output, cotangent
            )
        )(output, cotangent)
        assert got.shape == np.shape(inputs[name]), name
        np.testing.assert_allclose(
            np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-11, err_msg=f"gradient of {name}"
        )


def bound_symbols(nest, term):
    return set(nest.free_indices) | set(term.reduced_indices)


@pytest.mark.parametrize("case", DIFFERENTIABLE, ids=lambda c: c.name)
def test_gradient_nest_structure(case):
    """Free indices are the input's axes; each loop index is looped once; written once."""
    nest = forward_nest(case)
    for op in nest.operands:
        g = grad.gradient(nest, op.name).nest
        assert len(g.free) == op.rank
        assert g.reduction == "sum"
        for axis, r in enumerate(g.free):
            assert r.start == 0
            assert r.stop == sympy.Symbol(
                f"{g.output}.shape[{axis}]", integer=True, nonnegative=True
            )
        for term in g.terms:
            loop = list(g.free_indices) + list(term.reduced_indices)
            assert len(loop) == len(set(loop)), "an index is looped twice"
            # The gradient is never read inside its own nest: no read-modify-write.
            assert all(a.base.name != g.output for a in term.body.atoms(sympy.Indexed))
            for r in term.reduced:
                assert isinstance(r, Range)
                assert not (r.start.free_symbols | r.stop.free_symbols) & set(loop)
            used = set()
            for expr in term.expressions():
                used |= {s for s in expr.free_symbols if s.is_integer and ".shape[" not in s.name}
            assert used <= bound_symbols(g, term), (used, term)


def test_valid_correlation_gradient_reads_like_a_full_convolution():
    nest = lower(parse("Y[i] := X[i+k] * W[k]")).nest
    g = grad.gradient(nest, "X").nest
    assert str(g) == "dX[p] := dY[p - k]*W[k]*(k <= p)*(p + W.shape[0] <= k + dX.shape[0])"


def test_two_occurrences_give_two_terms():
    nest = lower(parse("C[i,j] := A[i,k] * A[k,j]")).nest
    assert len(grad.gradient(nest, "A").nest.terms) == 2


def test_repeated_index_gradient_writes_the_diagonal_only():
    nest = lower(parse("D[i] := A[i,i]")).nest
    (term,) = grad.gradient(nest, "A").nest.terms
    assert term.guard != sympy.true


def tie_inputs():
    X = np.array([[1.0, 3.0, 3.0, 0.5], [2.0, 2.0, -1.0, 2.0], [0.0, -4.0, -4.0, 5.0]])
    return X


@pytest.mark.parametrize(
    "reduction, winners",
    [
        ("max", [(0, 1), (1, 0), (2, 3)]),
        ("min", [(0, 3), (1, 2), (2, 1)]),
    ],
)
def test_max_min_tie_rule_first_in_iteration_order(reduction, winners):
    nest = lower(parse("M[i] := X[i,k]"), reduce=reduction).nest
    X = tie_inputs()
    inputs = {"X": X}
    output = reference.evaluate(nest, inputs, {"X": X.shape})
    cotangent = np.array([1.5, -2.0, 0.25])
    got = np.asarray(run_gradient_nest(nest, "X", inputs, output, cotangent))
    expected = np.zeros_like(X)
    for i, k in winners:
        expected[i, k] = cotangent[i]
    np.testing.assert_array_equal(got, expected)


def test_prod_gradient_with_zeros_has_no_division_by_the_output():
    nest = lower(parse("P[j] := X[i,j]"), reduce="prod").nest
    X = np.array([[2.0, 0.0, 0.0], [3.0, 5.0, 0.0], [0.5, 7.0, 4.0]])
    output = reference.evaluate(nest, {"X": X}, {"X": X.shape})
    cotangent = np.array([1.0, 2.0, 3.0])
    got = np.asarray(run_gradient_nest(nest, "X", {"X": X}, output, cotangent))
    expected = np.array(
        [[1.0 * 3.0 * 0.5, 2.0 * 35.0, 0.0], [1.0 * 2.0 * 0.5, 0.0, 0.0], [1.0 * 6.0, 0.0, 0.0]]
    )
    np.testing.assert_allclose(got, expected)
