"""The per-concept tables agree: every table keyed by reduction or function names has one
entry per row of its source table, and every row's columns are usable."""

import importlib

import numpy as np
import pytest
import sympy

from codegen.c import vecmath
from codegen.emit.printer import CPrinter
from codegen.ir.functions import FUNCTIONS
from codegen.ir.reductions import REDUCTIONS, USER_REDUCTIONS
from codegen.passes import gradient_rules
from tensordsl.backends import reference
from tensordsl.binding import partitioning


def test_reduction_tables_have_the_same_keys():
    assert set(reference.REDUCE) == set(REDUCTIONS)
    assert set(gradient_rules.GRADIENT_RULES) == set(REDUCTIONS)
    combines = {row.cross_device for row in REDUCTIONS.values()} - {None}
    assert combines == set(partitioning.COMBINES)


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
    # codegen/c/vecmath.py declares `<name>f` `omp declare simd` for each libmvec row; the
    # rows with a slow path print as their helper, which calls `<name>f`
    x = sympy.Symbol("x", real=True)
    for name, spec in FUNCTIONS.items():
        if spec.libmvec is not None:
            printed = CPrinter("float").doprint(spec.build(x))
            if name in vecmath.WIDE_RANGE:
                helper = vecmath.wide_range_helper(name, inline="", prefix="tdsl_")
                assert printed.startswith(f"tdsl_{name}(") and f" {name}f(c + " in helper
            else:
                assert printed.startswith(f"{name}f(")
            assert vecmath.libmvec_functions(f"y = {name}f(x);") == [name]


def test_float32_helpers_are_the_helper_rows() -> None:
    assert set(vecmath.FLOAT_HELPERS) == {n for n, spec in FUNCTIONS.items() if spec.helper}
