"""Multi-head attention with score and mask modifiers written in the language (FlexAttention's
idea), as one program whose `(T, S)` scores are never stored, forwards or backwards.

The program, for queries `(B, T, H, E)` and keys and values `(B, S, H, E)`::

    s_[b,h,i,j] := q_[b,i,h,d] * k_[b,j,h,d] * scale_
    (logsumexp) lse_[b,h,i] := where(MASK, MOD, -inf)
    out_[b,h,i,e] := where(MASK, exp(MOD - lse_[b,h,i]), 0) * v_[b,j,h,e]

(the output transposed to `(B, T, H, E)` after the call) where `MOD` is `score_mod` with `S`
standing for `s_[b,h,i,j]` (plus the bias, if any), and `MASK` the product of `j <= i`
(causal) and `mask_mod`. The scores `s_` are a sum larger than every input and output, read
only by reductions: the program recomputes them inside the logsumexp, the weighted sum and
every gradient nest (docs/language.md, "Programs"; on C and reference, unmasked scores up to
`codegen.passes.cost.BESIDE_STORE_BYTES` are stored: XLA's dots run them faster), and a
mask made of index comparisons
bounds the loops instead of being tested. The output is written head-major, `out_[b,h,i,e]`,
like the logsumexp `lse_[b,h,i]`: the two then share their rows' order with the query `i`
innermost, and the back ends that have one run them as one pass
(`codegen.passes.online.pair`: a block of consecutive queries shares each row of `v_`)
instead of computing every score twice; the transpose to the layout of
`jax.nn.dot_product_attention` is one copy of the output.

The convention of `score_mod` and `mask_mod`: an expression of the language over

* `S`, the scaled score `q . k * scale` (plus `bias`), written alone (score_mod only);
* the indices `b` (the batch position, the leading axes flattened row-major), `h` (head),
  `i` (query position) and `j` (key position); no other index (it would be summed over);
* the names of `mod_args`: arrays read with index expressions over b, h, i, j
  (`R[h, i - j + 7]`), and scalars read bare.

>>> import numpy as np
>>> q = k = v = np.arange(12.0).reshape(1, 3, 1, 4) / 10
>>> out = attention(q, k, v, causal=True, backend="reference")
>>> out.shape
(1, 3, 1, 4)
>>> np.asarray(out[0, 0, 0], np.float64).round(4).tolist()   # the first query: the first key
[0.0, 0.1, 0.2, 0.3]
"""

from __future__ import annotations

import math
from typing import Any

import jax.numpy as jnp
import numpy as np

from tensordsl.errors import ShapeError, TensorDSLError
from tensordsl.nn._common import as_float_array, build, check_rank
from tensordsl.nn.modifiers import INDICES, check_reads, in_modifier, mod_inputs, modifier


def _bias(bias: Any, batch: tuple[int, ...], full: tuple[int, ...]) -> tuple[Any, str]:
    """The bias reshaped for the program, and its access (`bias_[h,i,j]`): a batch axis and
    the h, i, j axes it has (an axis of extent 1 that broadcasts is dropped)."""
    bias = as_float_array(bias, "attention", "bias")
    shape = (*batch, *full)
    if bias.ndim > len(shape) or any(
        b not in (1, s) for b, s in zip(bias.shape[::-1], shape[::-1])
    ):
        raise ShapeError(
            f"attention: 'bias' of shape {tuple(bias.shape)} does not broadcast to {shape}",
            expected="a bias broadcastable to (..., heads, queries, keys)",
        )
    bias = bias.reshape((1,) * (len(shape) - bias.ndim) + tuple(bias.shape))
    lead, rest = bias.shape[: len(batch)], bias.shape[len(batch) :]
    names, keep = [], []
    if any(n != 1 for n in lead):
        bias = jnp.broadcast_to(bias, (*batch, *rest)).reshape((math.prod(batch), *rest))
        names.append("b")
        keep.append(0)
    else:
        bias = bias.reshape(rest)
    offset = len(names)
    for axis, (name, extent, wanted) in enumerate(zip(INDICES[1:], rest, full)):
        if extent == wanted:
            names.append(name)
            keep.append(offset + axis)
    bias = bias.reshape(tuple(bias.shape[a] for a in keep))
    return bias, (f"bias_[{','.join(names)}]" if names else "bias_")


def attention_source(score: str, mask: str | None, heads: str = "h") -> str:
    """The program for a score expression (over s_) and a mask condition (or None).

    `heads` names the head indices: `h`, or `hk_,g_` for grouped-query heads, where the
    queries `q_[b,hk_,g_,i,d]` of group `g_` read the keys and values `k_[b,j,hk_,d]` of
    their head `hk_` (query head `hk_ * G + g_`, as `jnp.repeat` of K and V would pair them,
    with K and V not copied). Grouped queries are read heads first, so that the queries `i`
    are the free index next to the width in dQ's nest: its tiles take their rows from them,
    not from the (short) group axis `g_` (docs/performance.md, "Layouts").
    """
    kv = heads.split(",")[0]
    rows = f"b,{heads},i"
    queries = f"q_[b,i,{heads},d]" if kv == heads else f"q_[b,{heads},i,d]"
    lines = [f"s_[b,{heads},i,j] := {queries} * k_[b,j,{kv},d] * scale_"]
    if mask is None:
        lines.append(f"(logsumexp) lse_[{rows}] := {score}")
        lines.append(f"out_[{rows},e] := exp({score} - lse_[{rows}]) * v_[b,j,{kv},e]")
    else:
        lines.append(f"(logsumexp) lse_[{rows}] := where({mask}, {score}, -inf)")
        lines.append(
            f"out_[{rows},e] := where({mask}, exp({score} - lse_[{rows}]), 0) * v_[b,j,{kv},e]"
        )
    return "\n".join(lines)


def _check_qkv(q: Any, k: Any, v: Any, enable_gqa: bool | None) -> tuple[Any, Any, Any]:
    arrays = {"q": q, "k": k, "v": v}
    for name in arrays:
        arrays[name] = as_float_array(arrays[name], "attention", name)
        layout = "(..., keys, heads, width)" if name != "q" else "(..., queries, heads, width)"
        check_rank(arrays[name], "attention", name, 3, layout, at_least=True)
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    pairs = (
        ("k", k.shape[:-3], "q", q.shape[:-3], "the leading (batch) shape"),
        ("v", v.shape[:-3], "q", q.shape[:-3], "the leading (batch) shape"),
        ("v", v.shape[-2], "k", k.shape[-2], "the head count"),
        ("k", k.shape[-1], "q", q.shape[-1], "the width (last axis)"),
        ("v", v.shape[-3], "k", k.shape[-3], "the key count"),
    )
    for name, got, other, want, what in pairs:
        if tuple(np.atleast_1d(got)) != tuple(np.atleast_1d(want)):
            raise ShapeError(
                f"attention: {what} of '{name}' is {got} but {want} in '{other}'",
                expected=f"the same {what} in '{name}' and '{other}' "
                "(q: (..., T, H, E), k: (..., S, Hk, E), v: (..., S, Hk, Ev))",
            )
    heads, kv_heads = q.shape[-2], k.shape[-2]
    grouped = heads != kv_heads
    if grouped and (enable_gqa is False or kv_heads == 0 or heads % kv_heads):
        allowed = "a head count that divides q's" if enable_gqa is not False else "q's"
        raise ShapeError(
            f"attention: 'k' and 'v' have {kv_heads} heads and 'q' has {heads}"
            + (" with enable_gqa=False" if enable_gqa is False and grouped else ""),
            expected=f"k and v with {allowed} (grouped-query heads: each of k's heads serves "
            "H / Hk consecutive query heads)",
        )
    return q, k, v


def attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    causal: bool = False,
    score_mod: str | None = None,
    mask_mod: str | None = None,
    bias: Any = None,
    scale: Any = None,
    mod_args: dict[str, Any] | None = None,
    backend: str = "auto",
    return_lse: bool = False,
    enable_gqa: bool | None = None,
) -> Any:
    """Softmax attention, `softmax(q k^T * scale + bias, masked) v` per head, with no
    `(T, S)` array stored, forwards or backwards (the layout of `jax.nn.dot_product_attention`),
    but where an array is read beside the scores on c and reference (docs/nn.md).

    Args:
        q: queries `(..., T, H, E)`; the leading axes are batch axes, flattened into `b`.
        k: keys `(..., S, Hk, E)`, the same leading axes; `Hk` = `H` heads, or fewer that
            divide `H` (grouped-query or multi-query attention: key head `n` serves the
            query heads `n * H/Hk` to `(n + 1) * H/Hk - 1`, as after `jnp.repeat(k, H/Hk,
            axis=-2)`, but nothing is repeated or copied).
        v: values `(..., S, Hk, Ev)`.
        causal: keep only keys `j <= i` (query i sees keys 0..i, aligned at the start).
        score_mod: an expression of the new score over `S` (the scaled score plus the bias),
            b, h, i, j and `mod_args`, e.g. `"S + R[h, i - j + 7]"` (a relative bias per
            head), `"S - slope * abs(i - j)"` (ALiBi), `"30 * tanh(S / 30)"` (soft-capping).
        mask_mod: a condition over b, h, i, j and `mod_args`, nonzero where a key is kept,
            e.g. `"abs(i - j) <= 64"` (a band: the loops visit the band only), or
            `"M[b, j] > 0"` (a padding mask). Combined with `causal` by "and".
        bias: an array broadcastable to `(..., H, T, S)`, added to the scaled scores.
        scale: multiplies `q . k`; default `1 / sqrt(E)`.
        mod_args: arrays and scalars the modifiers read, by name; arrays are differentiated;
            an entry no modifier reads is left out.
        backend: the kernels' back end.
        return_lse: also return the log-sum-exp of each query's modified, masked scores,
            `(..., H, T)` (FlexAttention's `return_lse`); gradients flow through it too.
        enable_gqa: None (default) or True: k and v may have fewer heads than q (above);
            False: they must have as many (FlexAttention's default).

    Returns:
        `(..., T, H, Ev)`; with `return_lse`, the pair `(out, lse)`. A query that keeps no
        key gets 0 and gives no gradient (FlexAttention's rule), whatever the mask reads.

    Raises:
        ShapeError: the shapes of q, k, v or bias do not agree.
        OptionError: a modifier that is not a string, a bad mod_args name.
        UnknownNameError, ParseError: a modifier that reads an unknown name, or does not parse
            (the message underlines it in the modifier, as every error about a modifier).
        UnsupportedError: a score_mod that does not read S.
    """
    q, k, v = _check_qkv(q, k, v, enable_gqa)
    batch, (T, H, E), S = tuple(q.shape[:-3]), q.shape[-3:], k.shape[-3]
    group = H // k.shape[-2] if k.shape[-2] != H else 1
    # Grouped-query heads: query head h is (hk_, g_) with h = hk_ * group + g_.
    heads, head = ("h", None) if group == 1 else ("hk_,g_", f"hk_*{group} + g_")
    inputs, scalars, arrays = mod_inputs(mod_args)
    score = f"s_[b,{heads},i,j]"
    if bias is not None:
        inputs["bias_"], access = _bias(bias, batch, (H, T, S))
        if group > 1 and "h" in access:
            inputs["bias_"], access = _grouped_bias(inputs["bias_"], access, group)
        score = f"{score} + {access}"
    modifiers = []
    if score_mod is not None:
        modifiers.append(modifier("score_mod", score_mod, scalars, arrays, score, head))
        score = modifiers[-1].text
    conditions = ["j <= i"] if causal else []
    if mask_mod is not None:
        modifiers.append(modifier("mask_mod", mask_mod, scalars, arrays, "", head))
        conditions.append(modifiers[-1].text)
    mask = " * ".join(f"({c})" for c in conditions) if conditions else None
    # One mod_args dict is often shared by several modifiers: what none reads is left out.
    read = {name for each in modifiers for name in each.reads}
    extents = dict(zip(INDICES, (math.prod(batch), H, T, S)))
    check_reads(modifiers, extents, {n: np.shape(inputs[n]) for n in arrays})
    inputs = {name: value for name, value in inputs.items() if name in read or name == "bias_"}
    flat = [x.reshape((math.prod(batch), *x.shape[-3:])) for x in (q, k, v)]
    if group > 1:  # the query heads of one key head are consecutive: (b, hk_, g_, i, d)
        grouped_q = flat[0].reshape((*flat[0].shape[:2], H // group, group, E))
        flat[0] = jnp.transpose(grouped_q, (0, 2, 3, 1, 4))
    inputs.update(q_=flat[0], k_=flat[1], v_=flat[2])
    inputs["scale_"] = (
        1.0 / math.sqrt(max(E, 1))  # a head of width 0 scores 0 whatever the scale
        if scale is None
        else (float(scale) if isinstance(scale, (int, float)) else jnp.asarray(scale, q.dtype))
    )
    outputs = ("out_", "lse_") if return_lse else None
    try:
        found = build(attention_source(score, mask, heads), backend, outputs)(**inputs)
    except TensorDSLError as error:
        raise in_modifier(error, modifiers) from None
    out, lse = found if return_lse else (found, None)
    rows = math.prod(batch)
    out = jnp.swapaxes(out.reshape((rows, H, T, out.shape[-1])), 1, 2)
    out = out.reshape((*batch, *out.shape[1:]))
    if not return_lse:
        return out
    return out, lse.reshape((*batch, H, T))


def _grouped_bias(bias: Any, access: str, group: int) -> tuple[Any, str]:
    """A bias with a head axis (from `_bias`), that axis split into (key head, group) for
    grouped-query heads: a free reshape."""
    names = access[access.index("[") + 1 : -1].split(",")
    axis = names.index("h")
    shape = (*bias.shape[:axis], bias.shape[axis] // group, group, *bias.shape[axis + 1 :])
    names[axis : axis + 1] = ["hk_", "g_"]
    return bias.reshape(shape), f"bias_[{','.join(names)}]"
