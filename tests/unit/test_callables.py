"""Kernels look like Python functions: signatures, docstrings, equality, TypeError arity."""

from __future__ import annotations

import inspect
import pydoc

import jax
import numpy as np
import pytest

import tensordsl as td

DIST = "D[i,j] := (W[k,i] - X[k,j])^2"
ATTENTION = """
    S[h,i,j] := Q[h,i,d] * K[h,j,d] * scale + where(j <= i, 0, -inf)
    (logsumexp) L[h,i] := S[h,i,j]
    O[h,i,e] := exp(S[h,i,j] - L[h,i]) * V[h,j,e]
"""


def test_signature_names_the_inputs_scalars_included():
    assert str(inspect.signature(td.kernel(DIST))) == "(W, X)"
    assert str(inspect.signature(td.kernel("Y[i] := alpha * X[i]"))) == "(alpha, X)"
    program = td.kernel(ATTENTION, outputs=("O", "L"))
    assert str(inspect.signature(program)) == "(Q, K, scale, V)"


def test_keyword_calls_still_work_and_match_positional_ones():
    k = td.kernel(DIST, backend="reference")
    rng = np.random.default_rng(0)
    W, X = rng.normal(size=(3, 4)), rng.normal(size=(3, 5))
    expected = ((W[:, :, None] - X[:, None, :]) ** 2).sum(0)
    np.testing.assert_allclose(np.asarray(k(X=X, W=W)), expected, rtol=1e-12)
    np.testing.assert_allclose(np.asarray(k(W, X)), expected, rtol=1e-12)
    bound = inspect.signature(k).bind(W, X=X)  # what IDEs and functools check
    assert list(bound.arguments) == ["W", "X"]


def test_docstring_gives_statement_inputs_output_and_reduction():
    doc = td.kernel(DIST).__doc__
    assert doc.splitlines()[0] == DIST
    assert "    W: a 2-d array." in doc
    assert "    D: a 2-d array [i, j], the sum over k of the right-hand side." in doc
    lse = td.kernel("L[i] := X[i,j]", reduce="logsumexp").__doc__
    assert lse.splitlines()[0] == "(logsumexp) L[i] := X[i,j]"
    assert "the logsumexp over j" in lse
    scaled = td.kernel("Y[i] := alpha * X[i]").__doc__
    assert "    alpha: a scalar." in scaled
    assert "right-hand side" not in scaled  # nothing reduced


def test_program_docstring_lists_every_returned_output():
    doc = td.kernel(ATTENTION, outputs=("O", "L")).__doc__
    assert doc.startswith("S[h,i,j] := Q[h,i,d]")
    assert "    O: a 3-d array [h, i, e], the sum over j" in doc
    assert "    L: a 2-d array [h, i], the logsumexp over j" in doc
    assert "    scale: a scalar." in doc


def test_help_shows_the_generated_docstring_and_call_is_documented():
    text = pydoc.render_doc(td.kernel(DIST), renderer=pydoc.plaintext)
    assert "the sum over k of the right-hand side" in text
    assert "or all by name" in td.Kernel.__call__.__doc__
    assert "or all by name" in td.ProgramKernel.__call__.__doc__


def test_identical_kernels_are_equal_and_hash_equal():
    a, b = td.kernel(DIST), td.kernel("D[i,j] :=  (W[k,i] - X[k,j])^2")
    assert a == b and hash(a) == hash(b) and a is not b
    assert a != td.kernel(DIST, backend="reference")
    assert a != td.kernel(DIST, nograd="X")
    assert a != td.kernel(DIST, reduce="max")
    assert a != td.kernel("D[i,j] := (W[k,i] - Z[k,j])^2")
    assert a != DIST
    p, q = td.kernel(ATTENTION, outputs=("O", "L")), td.kernel(ATTENTION, outputs=("O", "L"))
    assert p == q and hash(p) == hash(q)
    assert p != td.kernel(ATTENTION) and p != td.kernel(ATTENTION, outputs=("L", "O"))


def test_equal_kernels_as_static_arguments_trace_once():
    traces = []

    def apply(k, x):
        traces.append(k)
        return k(x)

    applied = jax.jit(apply, static_argnums=0)
    x = np.arange(4.0)
    for _ in range(3):
        applied(td.kernel("Y[i] := X[i] * 2", backend="reference"), x)
    assert len(traces) == 1


@pytest.mark.parametrize("program", [False, True])
def test_wrong_arity_is_a_type_error_with_the_same_message(program):
    source = "Y[i] := X[i] * 2; Z[i] := Y[i] + W[i]" if program else DIST
    k = td.kernel(source, backend="reference")
    with pytest.raises(TypeError, match=r"the kernel takes 2 inputs, got 1") as info:
        k(np.ones(3))
    assert isinstance(info.value, td.ShapeError)  # as before
    with pytest.raises(TypeError, match="missing input"):
        k(**{k.inputs[0]: np.ones(3)})
    with pytest.raises(TypeError, match="all by position or all by name"):
        k(np.ones(3), **{k.inputs[1]: np.ones(3)})


def test_build_checks_its_shapes_like_a_call():
    k = td.kernel(DIST, backend="reference")
    with pytest.raises(TypeError, match="missing input 'X'"):
        k.build({"W": (3, 4)})
    with pytest.raises(td.UnknownNameError, match="'V' is not an input"):
        k.build({"W": (3, 4), "X": (3, 5), "V": (1,)})
    with pytest.raises(td.ShapeError):
        k.build({"W": (3, 4), "X": (2, 5, 1)})
    with pytest.raises(td.InputError, match="is not a dtype"):
        k.build({"W": (3, 4), "X": (3, 5)}, dtype="floaty")
    assert k.build({"W": (3, 4), "X": np.ones((3, 5), np.float32)}) is None
