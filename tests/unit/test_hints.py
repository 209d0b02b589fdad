"""Targeted hints for notations from elsewhere: einsum strings, `@`, missing reductions."""

from __future__ import annotations

import pytest

import tensordsl as td


@pytest.mark.parametrize(
    ("source", "hint"),
    [
        ("ik,kj->ij", "as in 'Y[i,j] := A[i,k] * B[k,j]'"),
        ("bij,bjk->bik", "as in 'Y[b,i,k] := A[b,i,j] * B[b,j,k]'"),
        ("i,i->", "as in 'Y := A[i] * B[i]'"),
        ("C = A @ B", "'@' is not an operator: write the product with its indices"),
        ("C[i,j] := A[i,k] @ B[k,j]", "as in 'C[i,j] := A[i,k] * B[k,j]'"),
        # the user's own statement, '@' replaced by '*', and what is summed
        (
            "Y[b,o] := X[b, i] @ W[i, o]",
            "'@' is not an operator: write the product with its indices and '*', as in "
            "'Y[b,o] := X[b, i] * W[i, o]' (i, on no left side, is summed)",
        ),
        ("Y[b,o] := X @ W", "as in 'Y[b,o] := X[b,k] * W[k,o]' (k, on no left side, is summed)"),
        ("C := A @ B", "as in 'C[i,j] := A[i,k] * B[k,j]'"),
        # an einsum call or a quoted einsum string in a statement: the user's names
        ("C[i,j] := einsum('ik,kj->ij', A, B)", "as in 'C[i,j] := A[i,k] * B[k,j]'"),
        ('jnp.einsum("bij,bjk->bik", Q, K)', "as in 'Y[b,i,k] := Q[b,i,j] * K[b,j,k]'"),
        ("s := 'ij->'", "an einsum string: name the tensors, as in 's := A[i,j]'"),
        # a function called through its Python module
        ("Y[i] := jnp.exp(X[i,j])", "functions are named without a module: 'exp(...)', not 'jnp"),
        ("Y[i] := X[i] * jax.nn.sigmoid(X[i])", "'sigmoid(...)', not 'jax.nn.sigmoid(...)'"),
        ("Y[i] := np.arccos(X[i])", "'arccos(...)', not 'np.arccos(...)'"),
    ],
)
def test_einsum_strings_and_matmul_operators_get_a_targeted_hint(source, hint):
    with pytest.raises(td.ParseError) as info:
        td.kernel(source)
    assert info.value.hint is not None and hint in info.value.hint
    assert str(info.value).splitlines()[-1].startswith("hint: ")


@pytest.mark.parametrize("prefix", [False, True])
@pytest.mark.parametrize(
    ("name", "hint"),
    [("avg", "a mean is reduce='mean'"), ("average", "a mean is reduce='mean'")],
)
def test_missing_reductions_say_how_to_write_them(prefix, name, hint):
    source, options = ("M[i] := X[i,j]", {"reduce": name})
    if prefix:
        source, options = f"({name}) M[i] := X[i,j]", {}
    with pytest.raises(td.ReductionError, match=f"unknown reduction '{name}'") as info:
        td.kernel(source, **options)
    assert hint in info.value.hint
    with pytest.raises(td.ReductionError, match=hint):
        td.kernel("M[i] := X[i,j]; N[i] := M[i]", reduce=name)


def test_matmul_in_a_program_points_at_the_statement():
    source = "H[b,o] := X[b,i] * W[i,o]\nY[b,p] := tanh(H[b,o]) @ V[o,p]"
    with pytest.raises(td.ParseError) as info:
        td.kernel(source)
    lines = str(info.value).splitlines()
    assert lines[0] == "unexpected '@' after the end of the expression"
    assert lines[1:4] == [
        "  Y[b,p] := tanh(H[b,o]) @ V[o,p]",
        "                         ^",
        "expected an operator or end of input",
    ]
    assert lines[-1] == (
        "hint: '@' is not an operator: write the product with its indices and '*', as in "
        "'Y[b,p] := tanh(H[b,o]) * V[o,p]' (o, on no left side, is summed)"
    )
