"""Errors of the ready layers (`tensordsl.nn`) name the layer and the user's argument and
underline the user's own text, never a statement of the library's internal programs
(issue 36.9, 38.5). Full messages pinned by goldens in tests/golden/errors/layers; messages
whose lists other work extends (the function table) pinned by `match=`.

Rewrite the goldens on purpose with
`TENSORDSL_UPDATE_GOLDEN=1 pytest tests/jax/test_layer_errors.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl import nn

GOLDEN = Path(__file__).parent.parent / "golden" / "errors" / "layers"
INTERNAL = ("s_[", "lse_", "out_[", "q_[", "Y[n,", "K[q,")

Q = np.random.default_rng(0).normal(size=(1, 4, 2, 3))
R = np.random.default_rng(1).normal(size=(2, 4))

# name: (a call that raises, the error class)
CASES = {
    "score_mod_without_the_score": (
        lambda: nn.attention(Q, Q, Q, score_mod="i - j", backend="reference"),
        td.UnsupportedError,
    ),
    "score_mod_table_without_the_score": (
        lambda: nn.attention(Q, Q, Q, score_mod="R[h, j]", mod_args={"R": R}),
        td.UnsupportedError,
    ),
    "conv1d_kernel_longer_than_input": (
        lambda: nn.conv1d(np.ones((1, 3, 2)), np.ones((5, 2, 4)), padding="valid"),
        td.ShapeError,
    ),
    "conv2d_dilated_kernel_taller_than_input": (
        lambda: nn.conv2d(np.ones((1, 4, 6, 2)), np.ones((3, 3, 2, 1)), padding=0, dilation=2),
        td.ShapeError,
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_layer_error(name: str) -> None:
    call, error = CASES[name]
    with pytest.raises(td.TensorDSLError) as info:
        call()
    assert type(info.value) is error
    message = f"{type(info.value).__name__}: {info.value}\n"
    assert not any(internal in message for internal in INTERNAL), message
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("TENSORDSL_UPDATE_GOLDEN") == "1" or not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(message)
    assert message == path.read_text()


def test_goldens_have_cases() -> None:
    assert {p.stem for p in GOLDEN.glob("*.txt")} <= set(CASES)


@pytest.mark.parametrize(
    "option, text, error, wording",
    [
        (
            "score_mod",
            "S + expp(i - j)",
            td.UnknownNameError,
            r"score_mod: unknown function 'expp'\n  S \+ expp\(i - j\)\n      ~~~~\n"
            r"expected (.|\n)*\nhint: did you mean 'exp'\?$",
        ),
        (
            "mask_mod",
            "sqrtt(i) <= j",
            td.UnknownNameError,
            r"mask_mod: unknown function 'sqrtt'\n  sqrtt\(i\) <= j\n  ~~~~~\n"
            r"expected (.|\n)*\nhint: did you mean 'sqrt'\?$",
        ),
        (
            "score_mod",
            "S + pad(i - j, 1)",
            td.IndexExpressionError,
            r"score_mod: 'pad' with 2 arguments is an index form, not a function of values\n"
            r"  S \+ pad\(i - j, 1\)\n      ~~~~~~~~~~~~~\nexpected 'pad' as the whole index",
        ),
    ],
)
def test_an_error_in_a_modifier_underlines_the_users_text(option, text, error, wording):
    with pytest.raises(error, match=wording) as info:
        nn.attention(Q, Q, Q, **{option: text}, backend="reference")
    assert not any(internal in str(info.value) for internal in INTERNAL), str(info.value)


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_mod_args_shared_by_modifiers_may_hold_what_one_does_not_read(backend):
    """One dict for score_mod and mask_mod: each reads part of it; nothing reads `unused`."""
    rng = np.random.default_rng(2)
    q, k, v = (rng.normal(size=(2, 5, 2, 3)) for _ in range(3))
    table, keep = rng.normal(size=(2, 5)), (rng.uniform(size=(2, 5)) > 0.3).astype(float)
    keep[:, 0] = 1.0  # every query keeps a key
    shared = {"R": table, "M": keep, "slope": 0.5, "unused": rng.normal(size=7)}
    got = nn.attention(
        q,
        k,
        v,
        score_mod="S + slope * R[h, j]",
        mask_mod="M[b, j] > 0",
        mod_args=shared,
        backend=backend,
    )
    scores = jnp.einsum("bihd,bjhd->bhij", q, k) / np.sqrt(3) + 0.5 * table[None, :, None, :]
    scores = jnp.where(keep[:, None, None, :] > 0, scores, -jnp.inf)
    want = jnp.einsum("bhij,bjhe->bihe", softmax(scores), v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)


def softmax(scores):
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True)


@pytest.mark.parametrize(
    "option, text, shape, key_heads, wording",
    [
        # a relative table made for T = 8 at T = 9: was a raw TypeError (a shortened output)
        ("score_mod", "S + R[h, i - j + 7]", (4, 15), 4, r"axis 1 of 'R' at -1\.\.15, outside"),
        ("score_mod", "S + R[h, q_idx - kv_idx + 7]", (4, 15), 2, r"axis 1 of 'R' at -1\.\.15"),
        ("score_mod", "S + R[h + 1]", (4,), 2, r"'R\[h \+ 1\]' reads axis 0 of 'R' at 1\.\.4"),
        # the last key left out without a word, before: a wrong number
        ("score_mod", "S + R[kv_idx + 1]", (9,), 4, r"'R\[kv_idx \+ 1\]' reads axis 0 .* 1\.\.9"),
        ("mask_mod", "R[b, 2 * j - i] > 0", (2, 17), 4, r"axis 1 of 'R' at -8\.\.16, outside"),
    ],
)
def test_a_modifier_array_read_outside_its_shape_is_a_range_error(
    option, text, shape, key_heads, wording
):
    """Attention's indices run over all of q and k: a read outside a mod_args array never
    narrows them (the kernel's rule for an index read only shifted), on any back end."""
    rng = np.random.default_rng(3)
    q = rng.normal(size=(2, 9, 4, 8))
    k, v = rng.normal(size=(2, 9, key_heads, 8)), rng.normal(size=(2, 9, key_heads, 8))
    table = rng.normal(size=shape)
    with pytest.raises(td.RangeError, match=wording) as info:
        nn.attention(q, k, v, **{option: text}, mod_args={"R": table}, backend="reference")
    lines = str(info.value).splitlines()
    assert lines[0].startswith(f"{option}: ") and lines[1] == f"  {text}"
    assert "^" in lines[2] or "~" in lines[2]
    assert lines[3] == (
        "expected every read inside the array for b in [0, 2), h in [0, 4), i in [0, 9), "
        "j in [0, 9) (from q and k)"
    )


@pytest.mark.parametrize("backend", ["reference", "c"])
def test_reads_inside_their_arrays_or_wrapped_are_taken(backend):
    """The check leaves alone what fits, and `mod`/`clamp` reads (against float64)."""
    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(1, 6, 2, 4)) for _ in range(3))
    R, P = rng.normal(size=(2, 11)), rng.normal(size=6)
    got = nn.attention(
        q,
        k,
        v,
        score_mod="S + R[h, i - j + 5] + P[mod(j + 1)]",
        mod_args={"R": R, "P": P},
        backend=backend,
    )
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    scores = jnp.einsum("bihd,bjhd->bhij", q, k) / 2 + R[:, i - j + 5][None] + P[(j + 1) % 6]
    want = jnp.einsum("bhij,bjhe->bihe", softmax(scores), v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-10, atol=1e-12)
