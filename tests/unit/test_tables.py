"""The per-concept tables agree: every table keyed by reduction or function names has one
entry per row of its source table, and every row's columns are usable."""

import importlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import sympy

from codegen.c import vecmath
from codegen.emit.printer import CPrinter
from codegen.ir.functions import FUNCTIONS
from codegen.ir.reductions import REDUCTIONS, USER_REDUCTIONS
from codegen.passes import gradient_rules
from codegen.tiles import build as tiles
from tensordsl.backends import reference
from tensordsl.backends.pallas import reductions as pallas_reductions
from tensordsl.binding import partitioning


def test_reduction_tables_have_the_same_keys():
    assert set(reference.REDUCE) == set(REDUCTIONS)
    assert set(gradient_rules.GRADIENT_RULES) == set(REDUCTIONS)
    combines = {row.cross_device for row in REDUCTIONS.values()} - {None}
    assert combines == set(partitioning.COMBINES)


def test_tile_reductions_are_rows():
    assert set(pallas_reductions.TILE_REDUCTIONS) == set(tiles.TILE_REDUCTIONS)
    assert set(tiles.TILE_REDUCTIONS) <= set(REDUCTIONS)


def test_value_rows_have_every_facet_and_positions_none():
    """A row that reduces values to one value starts from `init=` and folds constants;
    positions and selections do neither; a weight is given where the derivative needs no
    saved value (max, min and prod save positions or counts: `GRADIENT_RULES`)."""
    for name, row in REDUCTIONS.items():
        one_value = not (row.positional or row.selects)
        assert (row.init_combine is not None) == one_value, name
        assert (row.repeated is not None) == one_value, name
    assert [n for n, row in REDUCTIONS.items() if row.weight] == ["sum", "logsumexp"]


_VALUES = np.array([[0.75, -1.5, 2.25, 0.125]])


def _reduce(name, values):
    values = jnp.asarray(values)
    return reference.REDUCE[name](values, jnp.ones(values.shape, bool), (values.ndim - 1,))


@pytest.mark.parametrize("name", [n for n, row in REDUCTIONS.items() if row.weight])
def test_reduction_weight_is_the_derivative_of_the_reference(name):
    weight = REDUCTIONS[name].weight
    want = jax.grad(lambda v: _reduce(name, v).sum())(_VALUES)
    result = float(_reduce(name, _VALUES)[0])
    x, y = sympy.symbols("x y", real=True)
    got = [float(weight(x, y).subs({x: float(v), y: result})) for v in _VALUES[0]]
    np.testing.assert_allclose(got, np.asarray(want)[0], rtol=1e-12)


@pytest.mark.parametrize("name", [n for n, row in REDUCTIONS.items() if row.repeated])
@pytest.mark.parametrize("count", [1, 3, 7])
def test_reduction_of_a_repeated_value_folds_as_the_reference(name, count):
    value = 1.375
    got = REDUCTIONS[name].repeated(sympy.Float(value), sympy.Integer(count))
    want = _reduce(name, np.full((1, count), value))
    np.testing.assert_allclose(float(got), np.asarray(want), rtol=1e-12)


@pytest.mark.parametrize("name", [n for n, row in REDUCTIONS.items() if row.init_combine])
@pytest.mark.parametrize("init", [-2.5, 0.625])
def test_init_combine_starts_the_reduction_from_init(name, init):
    combine = getattr(jnp, REDUCTIONS[name].init_combine)
    got = combine(jnp.asarray(init, jnp.float64), _reduce(name, _VALUES))
    want = _reduce(name, np.concatenate([[[init]], _VALUES], axis=1))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-12)


def test_user_reductions_are_the_user_rows():
    names = ("sum", "max", "min", "prod", "logsumexp", "argmax", "argmin", "topk", "argtopk")
    assert names == USER_REDUCTIONS
    positional = [n for n in USER_REDUCTIONS if REDUCTIONS[n].positional]
    assert positional == ["argmax", "argmin", "argtopk"]
    assert [n for n in USER_REDUCTIONS if REDUCTIONS[n].selects] == ["topk", "argtopk"]


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction_identity_is_neutral_for_the_reference(name):
    row = REDUCTIONS[name]
    if row.positional or row.selects:
        pytest.skip("a position has no neutral value; a selection keeps k values, not one")
    values = np.array([[0.75, -1.5]])
    with_identity = np.array([[0.75, -1.5, row.identity]])
    mask = np.ones_like(values, bool)
    got = reference.REDUCE[name](with_identity, np.ones_like(with_identity, bool), (1,))
    want = reference.REDUCE[name](values, mask, (1,))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_function_rows_are_consistent(name):
    spec = FUNCTIONS[name]
    module, _, attribute = spec.reference.rpartition(".")
    assert callable(getattr(importlib.import_module(module), attribute))
    low, high = spec.domain
    assert low < high
    args = [sympy.Symbol(f"x{n}", real=True) for n in range(spec.arity)]
    built = spec.build(*args)
    if spec.function is not None:
        assert isinstance(built, spec.function)
        assert spec.function in reference._FUNCTIONS
    assert not spec.helper or spec.function is not None


def test_libmvec_rows_print_as_the_functions_they_declare() -> None:
    # codegen/c/vecmath.py declares `<name>f` `omp declare simd` for each libmvec row the
    # printer notes as called (by the row's name); the rows with a slow path print as their
    # helper, which calls `<name>f`
    x = sympy.Symbol("x", real=True)
    for name, spec in FUNCTIONS.items():
        if spec.libmvec is not None:
            printer = CPrinter("float")
            printed = printer.doprint(spec.build(x))
            assert name in printer.functions
            if name == "exp":  # inline arithmetic, no libm call (vecmath.EXP_HELPER)
                helper = vecmath.EXP_HELPER.format(inline="", prefix="tdsl_")
                assert printed.startswith("tdsl_exp(") and "expf(" not in helper
            elif name in vecmath.WIDE_RANGE:
                helper = vecmath.wide_range_helper(name, inline="", prefix="tdsl_")
                assert printed.startswith(f"tdsl_{name}(") and f" {name}f(c + " in helper
            else:
                assert printed.startswith(f"{name}f(")
            assert vecmath.libmvec_functions({name, "sqrt"}) == [name]


def test_float32_helpers_are_the_helper_rows() -> None:
    assert set(vecmath.FLOAT_HELPERS) == {n for n, spec in FUNCTIONS.items() if spec.helper}
    assert set(vecmath.HELPER_CALLS) == set(vecmath.FLOAT_HELPERS)
    x = sympy.Symbol("x", real=True)
    for name in vecmath.FLOAT_HELPERS:  # noted as called by the row's name, as vecmath reads
        printer = CPrinter("float")
        assert printer.doprint(FUNCTIONS[name].build(x)).startswith(f"tdsl_{name}(")
        assert name in printer.functions
