"""Issue 36's items 1-4 and issue 38's items 1-3 on the tile back end (`backend="pallas"`,
Pallas' interpret mode without a GPU), each through the test that checks it on reference,
c and emulated cuda (the same inputs, the same float64 references):

* Einstein's rule term by term (36.1): the LoRA line, `X[i,j] + c[i] - X[i,j]`, fused and
  unfused programs, with gradients;
* a NaN or inf at a masked key stays out (36.2): causal and padding masks, forward and the
  gradients of q, k and v;
* index-array positions that would wrap (36.3) and large affine offsets (36.4);
* negative integer powers, `2^(-(h + 1))` and ALiBi written with one (38.1);
* a query row that keeps no key gives 0 and zero gradients (38.2);
* the gradient of `S * F[mod(i - j)]` (38.3).

Interpret mode compiles each kernel in about a second, so each item runs a few cases, not
every case of its table.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl import nn
from tensordsl.errors import UnsupportedError
from tests.backends import generated_kernels  # noqa: F401 (a fixture)
from tests.cpu import test_einstein_terms as einstein
from tests.gpu import test_index_widths as widths
from tests.jax import test_attention_masks as masks
from tests.jax import test_gather_overflow as overflow
from tests.jax import test_gym_modifiers as gym

pytestmark = pytest.mark.usefixtures("generated_kernels")

BACKEND = "pallas"
LORA = "Y[b,o] := X[b,i] * (W[i,o] + A[i,r] * B[r,o])"
CANCELLING = "Y[i] := X[i,j] + c[i] - X[i,j]"


# --------------------------------------------------------------------------- 36.1 terms


@pytest.mark.parametrize("source", [LORA, CANCELLING])
def test_each_term_is_summed_over_the_indices_it_reads(source):
    assert source in einstein.CASES
    einstein.test_each_term_is_summed_over_the_indices_it_reads(BACKEND, source)
    einstein.test_gradients_follow_the_rule(BACKEND, source)


def test_a_cancelling_pair_stays_nan_at_an_infinity():
    einstein.test_a_cancelling_pair_stays_nan_at_an_infinity(BACKEND)


@pytest.mark.parametrize("fuse", [True, False])
def test_programs_fused_or_not_follow_the_rule(fuse):
    einstein.test_programs_fused_or_not_follow_the_rule(BACKEND, fuse)


# --------------------------------------------------------------------------- 36.2 masks


@pytest.mark.parametrize(
    ("special", "fusion"), [("nan-v-last-key", "fused"), ("inf-v-last-key", "unfused")]
)
def test_a_special_value_at_a_causally_masked_key_stays_out(special, fusion, monkeypatch):
    masks.test_a_special_value_at_a_causally_masked_pair_stays_out(
        BACKEND, "float64", special, fusion, monkeypatch
    )


def test_padding_keys_no_query_sees_may_hold_nan():
    masks.test_keys_no_query_sees_may_hold_nan(BACKEND, "float64")


@pytest.mark.parametrize("which", sorted(masks.ARRAY_MASKED_NAN))
def test_a_nan_at_a_key_an_array_mask_drops(which):
    """As on the reference and as docs/nn.md says (an array mask is a value, not a bound)."""
    masks.test_a_nan_at_a_key_an_array_mask_drops(BACKEND, which)


# --------------------------------------------------------------------------- 36.3, 36.4


@pytest.mark.parametrize("case", [0, 4], ids=lambda n: overflow.IDS[n])
def test_a_position_beyond_the_index_type_is_outside(case, monkeypatch):
    x64, source, rows, tok, true = overflow.OVERFLOWS[case]
    overflow.test_a_position_beyond_the_index_type_is_outside(
        x64, source, rows, tok, true, BACKEND, monkeypatch
    )


@pytest.mark.parametrize("case", [0, 1, 3], ids=lambda n: widths.SHIFTED[n][0])
def test_large_offsets_read_the_right_elements(case):
    widths.test_large_offsets_read_the_right_elements(*widths.SHIFTED[case], BACKEND)


def test_wide_index_arithmetic_without_x64_is_refused():
    """Without `jax_enable_x64` the tile back end has no 64-bit integers: an UnsupportedError
    that says so, never a wrapped position."""
    x = np.arange(6.0, dtype=np.float32)
    with jax.enable_x64(False):
        k = td.kernel("Y[i] := X[mod(i + 1099511627776)]", ranges={"i": 6}, backend=BACKEND)
        with pytest.raises(UnsupportedError, match="beyond JAX's 32-bit integers"):
            k(x)


# --------------------------------------------------------------------------- 38.1-3


@pytest.mark.parametrize("body", ["X[h] + 2^(-(h + 1))", "X[h]^(-h)", "X[h] + (h + 1)^(-2)"])
def test_powers_follow_ieee_floats(body):
    gym.test_powers_follow_ieee_floats(BACKEND, "float64", body)


def test_alibi_written_with_a_power():
    gym.test_alibi_written_with_a_power(BACKEND, "float64")


@pytest.mark.parametrize(
    ("mask", "fusion"), [("array-offset", "fused"), ("padding-ids", "unfused")]
)
def test_a_query_that_keeps_no_key_gives_zero_and_zero_gradients(mask, fusion, monkeypatch):
    masks.test_a_query_that_keeps_no_key_gives_zero_and_zero_gradients(
        BACKEND, fusion, mask, monkeypatch
    )


def test_table_read_through_a_wrapped_relative_position():
    """`S * F[mod(i - j)]`: the output and the gradients of q, k and v as jax.numpy's, and
    the gradient of F (a sum holding the scores' sum, hoisted: `codegen.tiles.hoist`)."""
    B, T, H, E = 2, 70, 4, 32
    rng = np.random.default_rng(2)
    q, k, v = gym._qkv(rng, (B, T, H, E), "float64")
    table = jnp.asarray(rng.normal(size=T))
    wrapped = (np.arange(T)[:, None] - np.arange(T)[None, :]) % T

    def ours(q, k, v, table=table):
        mod, args = "S * F[mod(i - j)]", {"F": table}
        return nn.attention(q, k, v, score_mod=mod, mod_args=args, backend=BACKEND)

    def theirs(q, k, v):
        return gym._attention_jnp(q, k, v, mod=lambda s: s * table[wrapped])

    gym._check(ours, theirs, (q, k, v), "float64")
    ct = jnp.asarray(rng.normal(size=(B, T, H, E)))

    def theirs_of(table):
        return gym._attention_jnp(q, k, v, mod=lambda s: s * table[wrapped])

    got = jax.grad(lambda table: jnp.sum(ours(q, k, v, table) * ct))(table)
    want = jax.grad(lambda table: jnp.sum(theirs_of(table) * ct))(table)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-9, atol=1e-9)
