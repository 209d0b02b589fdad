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
