"""`einsum_dot`: a two-operand einsum as the `dot_general` that `jnp.einsum` emits, the same
program (so XLA compiles the same code) and the same values; everything else left to
`jnp.einsum`."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tensordsl.backends.einsum_dot import dot_plan, einsum_dot

#: Subscripts and shapes as the strategy "xla" gives them (attention's dots and their
#: gradients, projections merged or not, batched and transposed outputs).
CASES = [
    ("ij,jk->ik", [(3, 4), (4, 5)]),
    ("ij,jk->ki", [(3, 4), (4, 5)]),
    ("ij,kj->ik", [(3, 4), (5, 4)]),
    ("ji,jk->ik", [(4, 3), (4, 5)]),
    ("bihe,bjhe->bhij", [(2, 5, 3, 4), (2, 6, 3, 4)]),
    ("bhij,bjhe->bihe", [(2, 3, 5, 6), (2, 6, 3, 4)]),
    ("bhij,bihe->bjhe", [(2, 3, 5, 6), (2, 5, 3, 4)]),
    ("btf,fshe->sbhte", [(2, 5, 4), (4, 3, 2, 6)]),
    ("btf,btg->fg", [(2, 5, 4), (2, 5, 3)]),
    ("abc,acd->abd", [(2, 3, 4), (2, 4, 5)]),
    ("ab,b->a", [(3, 4), (4,)]),
    ("a,b->ab", [(3,), (4,)]),
    ("ab,ab->", [(3, 4), (3, 4)]),
    ("ab,ab->ab", [(3, 4), (3, 4)]),
    ("hjd,hid->hij", [(2, 6, 4), (2, 5, 4)]),
]


def _program(fn, *args):
    """The lowered program without its source locations and names."""
    text = jax.jit(fn).lower(*args).as_text()
    text = re.sub(r"loc\([^)]*\)", "", text)
    return re.sub(r"#loc\S*", "", text)


def _operands(shapes, dtype=np.float32, seed=0):
    rng = np.random.default_rng(seed)
    return [jnp.asarray(rng.standard_normal(s), dtype) for s in shapes]


@pytest.mark.parametrize(("subscripts", "shapes"), CASES)
def test_same_program_as_jnp_einsum(subscripts, shapes):
    assert dot_plan(subscripts, tuple(map(tuple, shapes))) is not None
    args = _operands(shapes)
    ours = _program(lambda a, b: einsum_dot(subscripts, [a, b]), *args)
    theirs = _program(lambda a, b: jnp.einsum(subscripts, a, b), *args)
    assert ours == theirs


@pytest.mark.parametrize(("subscripts", "shapes"), CASES)
def test_values_against_float64(subscripts, shapes):
    args = _operands(shapes, seed=1)
    want = np.einsum(subscripts, *(np.asarray(a, np.float64) for a in args))
    found = einsum_dot(subscripts, args, precision=jax.lax.Precision.HIGHEST)
    assert found.shape == want.shape and found.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(found), want, rtol=1e-5, atol=1e-5)


def test_half_precision_accumulates_wide_as_jnp():
    args = _operands([(3, 4), (4, 5)], jnp.bfloat16)
    kwargs = dict(preferred_element_type=jnp.float32)
    ours = einsum_dot("ij,jk->ik", args, **kwargs)
    assert ours.dtype == jnp.float32
    theirs = _program(lambda a, b: jnp.einsum("ij,jk->ik", a, b, **kwargs), *args)
    assert _program(lambda a, b: einsum_dot("ij,jk->ik", [a, b], **kwargs), *args) == theirs


@pytest.mark.parametrize(
    ("subscripts", "shapes"),
    [
        ("ii,ij->j", [(3, 3), (3, 4)]),  # a letter twice in one operand
        ("ij,jk->k", [(3, 4), (4, 5)]),  # i summed within its operand
        ("ij,jk->ik", [(3, 1), (4, 5)]),  # an axis of 1 against a longer one
        ("ij,jk,kl->il", [(3, 4), (4, 5), (5, 2)]),  # three operands
        ("...j,jk->...k", [(3, 4), (4, 5)]),  # an ellipsis
    ],
)
def test_other_einsums_go_to_jnp(subscripts, shapes):
    args = _operands(shapes, seed=2)
    if len(shapes) == 2:
        assert dot_plan(subscripts, tuple(map(tuple, shapes))) is None
    want = np.einsum(subscripts, *(np.asarray(a, np.float64) for a in args))
    found = einsum_dot(subscripts, args, precision=jax.lax.Precision.HIGHEST)
    np.testing.assert_allclose(np.asarray(found), want, rtol=1e-5, atol=1e-5)


def test_weak_operand_goes_to_jnp():
    a = _operands([(3, 4)])[0]
    found = einsum_dot("ij,->ij", [a, jnp.asarray(2.0)])
    assert found.dtype == jnp.einsum("ij,->ij", a, jnp.asarray(2.0)).dtype
    np.testing.assert_allclose(np.asarray(found), 2 * np.asarray(a), rtol=1e-6)


@pytest.mark.parametrize(
    "precision",
    [
        None,
        "highest",
        jax.lax.Precision.HIGH,
        (jax.lax.Precision.HIGHEST, jax.lax.Precision.DEFAULT),
    ],
)
def test_precision_as_jnp_takes_it(precision):
    args = _operands([(3, 4), (4, 5)], seed=3)
    ours = _program(lambda a, b: einsum_dot("ij,jk->ik", [a, b], precision=precision), *args)
    theirs = _program(lambda a, b: jnp.einsum("ij,jk->ik", a, b, precision=precision), *args)
    assert ours == theirs


@pytest.mark.parametrize(
    "dtypes",
    [(jnp.int32,) * 2, (jnp.bool_,) * 2, (jnp.float16,) * 2, (jnp.float16, jnp.float32)],
)
def test_dtypes_as_jnp(dtypes):
    a, b = (x.astype(d) for x, d in zip(_operands([(3, 4), (4, 5)], seed=4), dtypes))
    found, want = einsum_dot("ij,jk->ik", [a, b]), jnp.einsum("ij,jk->ik", a, b)
    assert found.dtype == want.dtype
    np.testing.assert_array_equal(np.asarray(found), np.asarray(want))
