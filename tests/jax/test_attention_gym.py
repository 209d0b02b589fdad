"""attention-gym's score and mask modifications (pytorch-labs/attention-gym, `attn_gym/mods`
and `attn_gym/masks`) written as docs/nn.md's table spells them: `nn.attention`'s values and
the gradients of q, k, v (and of a learnt table or slopes) against float64 jax.numpy with
materialised scores, on the reference back end for every case and on C for a few."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import tensordsl as td
from tensordsl import nn
from tests.backends import NEEDS_C_COMPILER
from tests.jax.test_nn import attention_jnp, check

pytestmark = pytest.mark.usefixtures("poisoned_outputs")

B, T, H, E = 2, 12, 2, 3
I = np.arange(T)[:, None]  # query positions, against
J = np.arange(T)[None, :]  # key positions


def _alibi_slopes() -> np.ndarray:
    return 2.0 ** (-(np.arange(H) + 1.0) * 8 / H)


#: name -> (nn.attention options, reference {"mod": ..., "mask": ...}, learnt mod_args): the
#: learnt arrays are differentiated as well as q, k, v.
DOC = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2], [0, 0, 0, 0, 0, 1, 1, 2, 2, 2, 2, 2]])
INTERVALS = np.array([[0, 7], [1, 7], [7, 12]])  # Flamingo: the text rows each image serves
IMAGE_OF_KEY = np.repeat(np.arange(3), 3)  # 3 images of 3 tokens: 9 keys
TABLE = np.random.default_rng(5).normal(size=(H, 2 * T - 1))
SLOPES = np.random.default_rng(6).uniform(0.1, 1.0, size=H)


def _natten_2d(w: int, h: int, k: int):
    """NATTEN on a w-wide, h-high canvas, a k x k kernel: attention-gym's generate_natten,
    with the row clamped by the height (attention-gym clamps it by the width; the same on
    a square canvas)."""
    cx, cy = np.clip(I // w, k // 2, (h - 1) - k // 2), np.clip(I % w, k // 2, (w - 1) - k // 2)
    return (np.abs(cx - J // w) <= k // 2) & (np.abs(cy - J % w) <= k // 2)


def _sta_2d():
    """Sliding-tile attention, canvas 2 x 6, tiles 1 x 2, kernel 2 x 4 (no text tokens)."""
    tiles_w = 3
    qh, qw, kh, kw = (
        (I // 2) // tiles_w,
        (I // 2) % tiles_w,
        (J // 2) // tiles_w,
        (J // 2) % tiles_w,
    )
    ch, cw = np.clip(qh, 1, 1), np.clip(qw, 1, 2)
    return (kh >= ch - 1) & (kh <= ch) & (kw >= cw - 1) & (kw <= cw)


CASES = {
    "alibi": (
        {"score_mod": f"S + (j - i) * exp2(-(h + 1) * 8.0 / {H})"},
        {"mod": lambda s: s + _alibi_slopes()[:, None, None] * (J - I)},
        {},
    ),
    "alibi_learnt_slopes": (
        {"score_mod": "S + A[h] * (kv_idx - q_idx)"},
        {"mod": lambda s, a: s + a[:, None, None] * (J - I)},
        {"A": SLOPES},
    ),
    "tanh_softcap": (
        {"score_mod": "2 * tanh(score / 2)"},
        {"mod": lambda s: 2 * jnp.tanh(s / 2)},
        {},
    ),
    "relative_position": (
        {"score_mod": "score + (q_idx - kv_idx)"},
        {"mod": lambda s: s + (I - J)},
        {},
    ),
    "relative_bias_table": (
        {"score_mod": f"S + R[h, i - j + {T - 1}]"},
        {"mod": lambda s, r: s + r[:, I - J + T - 1]},
        {"R": TABLE},
    ),
    "checkerboard": (
        {"score_mod": "where(abs(kv_idx - q_idx) % 2 == 1, score * 0.5, score * 2)"},
        {"mod": lambda s: s * jnp.asarray(np.where(np.abs(J - I) % 2 == 1, 0.5, 2.0))},
        {},
    ),
    "causal": ({"mask_mod": "q_idx >= kv_idx"}, {"mask": I >= J}, {}),
    "sliding_window": (
        {"mask_mod": "(q_idx - kv_idx <= 3) & (q_idx >= kv_idx)"},
        {"mask": (I - J <= 3) & (I >= J)},
        {},
    ),
    "dilated_sliding_window": (
        {"mask_mod": "(abs(q_idx - kv_idx) <= 4) & (abs(q_idx - kv_idx) % 2 == 0)"},
        {"mask": (np.abs(I - J) <= 4) & (np.abs(I - J) % 2 == 0)},
        {},
    ),
    "prefix_lm": (
        {"mask_mod": "(kv_idx < 4) | (q_idx >= kv_idx)"},
        {"mask": (J < 4) | (I >= J)},
        {},
    ),
    "offset_causal": ({"mask_mod": "q_idx + 3 >= kv_idx"}, {"mask": I + 3 >= J}, {}),
    "document_causal": (
        {"mask_mod": "(D[b, i] == D[b, j]) & (q_idx >= kv_idx)", "mod_args": {"D": DOC}},
        {"mask": (DOC[:, None, :, None] == DOC[:, None, None, :]) & (I >= J)},
        {},
    ),
    "natten_1d": (
        {"mask_mod": f"abs(min(max(q_idx, 2), {T - 3}) - kv_idx) <= 2"},
        {"mask": np.abs(np.clip(I, 2, T - 3) - J) <= 2},
        {},
    ),
    "natten_2d": (
        {
            "mask_mod": "(abs(min(max(i // 4, 1), 1) - j // 4) <= 1)"
            " & (abs(min(max(i % 4, 1), 2) - j % 4) <= 1)"
        },
        {"mask": _natten_2d(4, 3, 3)},
        {},
    ),
    "sliding_tile_2d": (
        {
            "mask_mod": "(j // 6 >= min(max(i // 6, 1), 1) - 1)"
            " & (j // 6 <= min(max(i // 6, 1), 1))"
            " & ((j // 2) % 3 >= min(max((i // 2) % 3, 1), 2) - 1)"
            " & ((j // 2) % 3 <= min(max((i // 2) % 3, 1), 2))"
        },
        {"mask": _sta_2d()},
        {},
    ),
    "svg_spatial_head": (
        {"mask_mod": "(kv_idx < 2 + 3) | (q_idx < 2) | (abs(q_idx - kv_idx) < 4)"},
        {"mask": (J < 5) | (I < 2) | (np.abs(I - J) < 4)},
        {},
    ),
    "svg_temporal_head": (
        {"mask_mod": "(q_idx < 2) | (kv_idx < 2) | (abs((q_idx - 2) % 5 - (kv_idx - 2) % 5) < 1)"},
        {"mask": (I < 2) | (J < 2) | (np.abs((I - 2) % 5 - (J - 2) % 5) < 1)},
        {},
    ),
    "flamingo_cross": (
        {
            "mask_mod": "(q_idx >= V[G[kv_idx], 0]) & (q_idx < V[G[kv_idx], 1])",
            "mod_args": {"V": INTERVALS, "G": IMAGE_OF_KEY},
        },
        {
            "mask": (INTERVALS[IMAGE_OF_KEY, 0][None, :] <= I)
            & (INTERVALS[IMAGE_OF_KEY, 1][None, :] > I)
        },
        {},
    ),
}
KEYS = {"flamingo_cross": 9}  # cross-attention: 12 text queries, 9 image keys
ON_C = (
    "alibi_learnt_slopes",
    "tanh_softcap",
    "relative_bias_table",
    "document_causal",
    "natten_2d",
)


def _run(name: str, backend: str) -> None:
    options, ref, learnt = CASES[name]
    rng = np.random.default_rng(sorted(CASES).index(name))
    S = KEYS.get(name, T)
    q = jnp.asarray(rng.normal(size=(B, T, H, E)))
    k, v = (jnp.asarray(rng.normal(size=(B, S, H, E))) for _ in range(2))
    mask = ref.get("mask")
    if mask is not None:
        kept = np.broadcast_to(mask, (B, 1, T, S))
        assert kept.any(axis=-1).all() and not kept.all()  # every query keeps a key, not all
    names = sorted(learnt)
    arrays = tuple(jnp.asarray(learnt[n]) for n in names)

    def ours(q, k, v, *learnt_arrays):
        mod_args = dict(options.get("mod_args", {}), **dict(zip(names, learnt_arrays)))
        kwargs = {key: val for key, val in options.items() if key != "mod_args"}
        return nn.attention(q, k, v, mod_args=mod_args or None, backend=backend, **kwargs)

    def theirs(q, k, v, *learnt_arrays):
        mod = ref.get("mod")
        return attention_jnp(
            q,
            k,
            v,
            mask=None if mask is None else jnp.asarray(mask),
            mod=None if mod is None else (lambda s: mod(s, *learnt_arrays)),
        )

    args = (q, k, v, *arrays)
    check(ours, theirs, args, "float64", tuple(range(len(args))))


@pytest.mark.parametrize("name", sorted(CASES))
def test_attention_gym_on_the_reference_back_end(name):
    _run(name, "reference")


@NEEDS_C_COMPILER
@pytest.mark.parametrize("name", ON_C)
def test_attention_gym_on_c(name):
    _run(name, "c")


BOUNDED = {  # docs/nn.md's "loops" column: the masks whose index comparisons bound the keys
    "causal": "j in [0, min(X.shape[1], i + 1))",
    "offset_causal": "j in [0, min(X.shape[1], i + 4))",
    "sliding_window": "j in [max(0, i - 3), min(X.shape[1], i + 1))",
    "dilated_sliding_window": "j in [max(0, i - 4), min(X.shape[1], i + 5))",
    "document_causal": "j in [0, min(X.shape[1], i + 1))",
}


@pytest.mark.parametrize("name", sorted(n for n in CASES if "mask_mod" in CASES[n][0]))
def test_which_masks_bound_the_loops(name):
    """The same condition as a factor of a plain sum: `explain` shows the keys it visits."""
    mask = CASES[name][0]["mask_mod"].replace("q_idx", "i").replace("kv_idx", "j")
    kernel = td.kernel(f"Y[i] := X[i,j] * ({mask.replace('D[b, ', 'D[')})")
    first = next(
        ln.strip() for ln in kernel.explain().splitlines() if ln.strip().startswith("j in")
    )
    assert first == BOUNDED.get(name, "j in [0, X.shape[1])")
