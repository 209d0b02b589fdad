"""`memo.key_text`: dataclasses printed completely, hashable ones once per process; sympy
expressions as complete texts (`memo.sympy_text`)."""

from dataclasses import dataclass

import pytest
import sympy
from sympy.core.symbol import Str
from sympy.functions.elementary.piecewise import ExprCondPair

from codegen.cache import memo
from codegen.ir import functions
from codegen.ir.nest import Reduce, extent_symbol, index_symbol, tensor_base
from codegen.passes import grad
from tensordsl.frontend.lower import lower
from tensordsl.frontend.parse import parse


@dataclass(frozen=True)
class Frozen:
    index: object
    size: int


@dataclass
class Mutable:  # unhashable: printed each time
    values: list


def test_a_frozen_dataclass_is_printed_once_and_completely():
    i = index_symbol("i")
    before = memo._record_text.cache_info().misses
    first = memo.key_text(Frozen(i, 3))
    assert first == memo.key_text(Frozen(i, 3)) == f"Frozen(index={memo.key_text(i)}, size=3)"
    assert memo._record_text.cache_info().misses == before + 1
    assert memo.key_text(Frozen(i, 4)) != first


def test_an_unhashable_dataclass_is_printed_as_well():
    assert memo.key_text(Mutable([1, 2])) == "Mutable(values=(1, 2,))"
    assert memo.digest_of(Mutable([1, 2])) != memo.digest_of(Mutable([1, 3]))


def _read_back(text: str) -> sympy.Basic:
    """A `sympy_text` evaluated: every class it names, sympy's and the IR's."""
    names = {**vars(sympy), **vars(functions), "Reduce": Reduce, "Str": Str}
    names["ExprCondPair"] = ExprCondPair
    return eval(text, names)  # noqa: S307 - texts printed by the test itself


@pytest.mark.parametrize(
    "source",
    [
        "Y[i] := exp(X[i, j] - L[i]) * W[j] + 0.5",
        "Y[i, j] := sigmoid(X[i, j]) * where(j <= i, X[i, j], 0)",
        "(logsumexp) Y[i] := X[i + k] * W[k] / 3",
    ],
)
def test_a_nest_key_reads_back_as_the_same_expressions(source):
    """The text is complete: each expression of a nest and of its gradient nests, read back
    from `sympy_text`, is the expression itself, `srepr` for `srepr`."""
    nest = lower(parse(source)).nest
    nests = [nest] + [grad.gradient(nest, name).nest for name in nest.operand_names]
    for each in nests:
        for expr in each.expressions():
            text = memo.sympy_text(expr)
            assert sympy.srepr(_read_back(text)) == sympy.srepr(expr), text


def test_a_nested_reduction_reads_back():
    i, d = index_symbol("i"), index_symbol("d")
    inner = Reduce("max", tensor_base("Q")[i, d] * sympy.Float(2.5), d, 1, extent_symbol("Q", 1))
    expr = functions.sigmoid(inner - tensor_base("L")[i])
    assert sympy.srepr(_read_back(memo.sympy_text(expr))) == sympy.srepr(expr)


def test_equal_looking_expressions_have_different_texts():
    """What sympy keeps apart stays apart: a float and an integer of one value, floats of
    one value at two precisions, a symbol under two sets of assumptions."""
    x = sympy.Symbol("x", real=True)
    pairs = [
        (x + sympy.Float(2.0), x + 2),
        (sympy.Float("0.1", 15) * x, sympy.Float("0.1", 30) * x),
        (x + 1, sympy.Symbol("x", integer=True) + 1),
    ]
    for a, b in pairs:
        assert memo.sympy_text(a) != memo.sympy_text(b)
        assert memo.digest_of(a) != memo.digest_of(b)
