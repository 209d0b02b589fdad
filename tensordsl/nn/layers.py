"""Dense, LayerNorm, RMSNorm, embedding and cross-entropy as index-expression programs.

Each layer is a pure function of arrays, like `jax.nn`: parameters are arguments, nothing is
stored. The statements are written so that their meaning does not depend on how a sum treats
a term free of its reduced indices: a bias, an `eps` or a logsumexp is always added in a
statement that reduces nothing (or outside the kernel), never inside a sum.

>>> import numpy as np
>>> x = np.arange(6.0).reshape(2, 3)
>>> y = layer_norm(x, np.ones(3), np.zeros(3), backend="reference")
>>> np.asarray(y, np.float64).round(4).tolist()
[[-1.2247, 0.0, 1.2247], [-1.2247, 0.0, 1.2247]]
"""

from __future__ import annotations

from typing import Any

from tensordsl.errors import ShapeError
from tensordsl.nn._common import (
    as_float_array,
    as_int_array,
    build,
    check_extent,
    check_rank,
    flatten_leading,
    real_in,
    unflatten_leading,
)

DENSE = "Y[n,o] := X[n,i] * W[i,o]"
EMBEDDING = "Y[..., d] := table[ids[...], d]"
DENSE_BIAS = "H[n,o] := X[n,i] * W[i,o]\nY[n,o] := H[n,o] + bias[o]"

#: LayerNorm over the last axis; `F` is its width (a scalar input), `eps` a scalar.
LAYER_NORM = (
    "mu[n] := X[n,f] / F",
    "var[n] := (X[n,f] - mu[n])^2 / F",
)
RMS_NORM = ("ms[n] := X[n,f]^2 / F",)

#: Cross-entropy per position: `L - sum_c X[n,c] * weight_c`, with the weights of the label
#: smoothing `on * (c == y[n]) + off` (on = 1 - smoothing, off = smoothing / C).
CROSS_ENTROPY = "(logsumexp) L[n] := X[n,c]\nP[n] := X[n,c] * (c == y[n])\nloss[n] := L[n] - P[n]"
CROSS_ENTROPY_SMOOTHED = (
    "(logsumexp) L[n] := X[n,c]\nP[n] := X[n,c] * (on * (c == y[n]) + off)\nloss[n] := L[n] - P[n]"
)


def dense(x: Any, w: Any, b: Any = None, *, backend: str = "auto") -> Any:
    """A dense (fully connected) layer, `x @ w + b`, over the last axis of `x`.

    Args:
        x: inputs of shape `(..., in)`; the leading axes are any batch axes.
        w: weights of shape `(in, out)` (Flax's `Dense` kernel layout).
        b: an optional bias of shape `(out,)`, added in a statement of its own.
        backend: the kernels' back end ("auto", "c", "cuda", "reference").

    Returns:
        An array of shape `(..., out)`.

    Raises:
        ShapeError: `w` is not 2-d, `in` differs between `x` and `w`, or `b` is not `(out,)`.

    >>> import numpy as np
    >>> dense(np.ones((2, 3)), np.ones((3, 4)), np.arange(4.0), backend="reference").tolist()
    [[3.0, 4.0, 5.0, 6.0], [3.0, 4.0, 5.0, 6.0]]
    """
    x, w = as_float_array(x, "dense", "x"), as_float_array(w, "dense", "w")
    check_rank(x, "dense", "x", 1, "(..., in)", at_least=True)
    check_rank(w, "dense", "w", 2, "(in, out)", at_least=False)
    check_extent("dense", "x", x.shape[-1], "w", w.shape[0], "the input width (last axis)")
    flat, batch = flatten_leading(x, 1)
    if b is None:
        y = build(DENSE, backend)(X=flat, W=w)
    else:
        b = as_float_array(b, "dense", "b")
        check_rank(b, "dense", "b", 1, "(out,)", at_least=False)
        check_extent("dense", "b", b.shape[0], "w", w.shape[1], "the output width")
        y = build(DENSE_BIAS, backend)(X=flat, W=w, bias=b)
    return unflatten_leading(y, batch, 1)


def _normalise(
    layer: str,
    statements: tuple[str, ...],
    last: str,
    x: Any,
    params: dict[str, Any],
    eps: Any,
    backend: str,
) -> Any:
    """Run a normalisation program over the last axis: `statements`, then `last` with the
    parameters present (`params` holds only those that are not None)."""
    x = as_float_array(x, layer, "x")
    check_rank(x, layer, "x", 1, "(..., features)", at_least=True)
    for name, value in params.items():
        params[name] = as_float_array(value, layer, name)
        check_rank(params[name], layer, name, 1, "(features,)", at_least=False)
        check_extent(layer, name, params[name].shape[0], "x", x.shape[-1], "the feature count")
    eps = real_in(eps, layer, "eps", 0.0, float("inf"), closed=False)
    flat, batch = flatten_leading(x, 1)
    program = build("\n".join((*statements, last)), backend)
    inputs = {"X": flat, "F": float(x.shape[-1]), "eps": eps, **params}
    return unflatten_leading(program(**inputs), batch, 1)


def layer_norm(
    x: Any, gamma: Any = None, beta: Any = None, eps: float = 1e-5, *, backend: str = "auto"
) -> Any:
    """LayerNorm over the last axis: `(x - mean) / sqrt(var + eps) * gamma + beta`.

    The variance is the biased one (divided by the width), as in Flax and PyTorch.

    Args:
        x: inputs of shape `(..., features)`.
        gamma: the scale, `(features,)`, or None for none (Flax's `use_scale=False`).
        beta: the offset, `(features,)`, or None for none (`use_bias=False`).
        eps: added to the variance; a number >= 0.
        backend: the kernels' back end.

    Returns:
        An array of `x`'s shape.

    Raises:
        ShapeError: `gamma` or `beta` is not of shape `(features,)`.
        OptionError: `eps` is negative or not a number.
    """
    scale = " * g[f]" if gamma is not None else ""
    shift = " + beta[f]" if beta is not None else ""
    last = f"Y[n,f] := (X[n,f] - mu[n]) * rsqrt(var[n] + eps){scale}{shift}"
    params = {k: v for k, v in (("g", gamma), ("beta", beta)) if v is not None}
    return _normalise("layer_norm", LAYER_NORM, last, x, params, eps, backend)


def rms_norm(x: Any, gamma: Any = None, eps: float = 1e-6, *, backend: str = "auto") -> Any:
    """RMSNorm over the last axis: `x / sqrt(mean(x^2) + eps) * gamma`.

    Args:
        x: inputs of shape `(..., features)`.
        gamma: the scale, `(features,)`, or None for none.
        eps: added to the mean square; a number >= 0.
        backend: the kernels' back end.

    Returns:
        An array of `x`'s shape.

    Raises:
        ShapeError: `gamma` is not of shape `(features,)`.
        OptionError: `eps` is negative or not a number.

    >>> import numpy as np
    >>> y = rms_norm(np.array([[3.0, 4.0]]), eps=0.0, backend="reference")
    >>> np.asarray(y, np.float64).round(4).tolist()
    [[0.8485, 1.1314]]
    """
    scale = " * g[f]" if gamma is not None else ""
    last = f"Y[n,f] := X[n,f] * rsqrt(ms[n] + eps){scale}"
    params = {"g": gamma} if gamma is not None else {}
    return _normalise("rms_norm", RMS_NORM, last, x, params, eps, backend)


def embedding(ids: Any, table: Any, *, backend: str = "auto") -> Any:
    """Rows of `table` picked by `ids`: `table[ids]`, of shape `ids.shape + (features,)`.

    The statement `EMBEDDING` reads the table through the index array (the language's
    gather, `tensordsl/binding/gather.py`): one read per element, no sum over the
    vocabulary; its gradient sums the cotangents of each row's reads in a fixed order
    (serially in the order of the ids on the CPU, by sorted positions on a GPU, no
    atomics), so the same ids give the same bits. An id
    outside `[0, vocabulary)` is a `RangeError` in an eager call; under `jit`, `grad` or
    `vmap` (ids not known yet) its row reads NaN and gets no gradient, as `jnp.take`.

    Args:
        ids: integer token ids, any shape.
        table: the embedding table, `(vocabulary, features)`.
        backend: the kernels' back end (the gather alone runs no nest: the same on all).

    Returns:
        An array of shape `ids.shape + (features,)`, in the dtype of `table`.

    Raises:
        InputError: `ids` are not integers, or `table` is not a float array.
        ShapeError: `table` is not 2-d.
        RangeError: an eager call with an id outside the table.

    >>> import numpy as np
    >>> embedding(np.array([2, 0]), np.arange(6.0).reshape(3, 2)).tolist()
    [[4.0, 5.0], [0.0, 1.0]]
    """
    ids = as_int_array(ids, "embedding", "ids")
    table = as_float_array(table, "embedding", "table")
    check_rank(table, "embedding", "table", 2, "(vocabulary, features)", at_least=False)
    return build(EMBEDDING, backend)(table=table, ids=ids)


def cross_entropy(
    logits: Any, labels: Any, label_smoothing: float = 0.0, *, backend: str = "auto"
) -> Any:
    """Softmax cross-entropy with integer labels, **per position** (take `.mean()` for the
    usual loss), as `optax.softmax_cross_entropy_with_integer_labels`.

    `loss = logsumexp(logits) - sum_c logits[c] * t[c]` where `t` is the one-hot label
    smoothed as in optax: `(1 - label_smoothing) * onehot + label_smoothing / classes`. The
    target is picked by the comparison `(c == y[n])` inside a sum over the classes (no
    one-hot array; without smoothing the language runs this pick as a masked gather,
    `tensordsl/frontend/one_hot.py`). A label outside `[0, classes)` picks nothing: its loss
    is the logsumexp minus the smoothing term alone.

    Args:
        logits: scores of shape `(..., classes)`.
        labels: integer classes of shape `(...)`, the leading shape of `logits`.
        label_smoothing: a number in `[0, 1]`.
        backend: the kernels' back end.

    Returns:
        The loss of each position, of shape `labels.shape`, in the dtype of `logits`.

    Raises:
        InputError: `labels` are not integers.
        ShapeError: `labels.shape` is not `logits.shape[:-1]`.
        OptionError: `label_smoothing` is outside `[0, 1]`.

    >>> import numpy as np
    >>> logits = np.log(np.array([[1.0, 3.0], [2.0, 2.0]]))
    >>> loss = cross_entropy(logits, np.array([1, 0]), backend="reference")
    >>> np.asarray(loss, np.float64).round(4).tolist()
    [0.2877, 0.6931]
    """
    layer = "cross_entropy"
    logits = as_float_array(logits, layer, "logits")
    labels = as_int_array(labels, layer, "labels")
    check_rank(logits, layer, "logits", 1, "(..., classes)", at_least=True)
    if tuple(labels.shape) != tuple(logits.shape[:-1]):
        raise ShapeError(
            f"{layer}: 'labels' has shape {tuple(labels.shape)} but 'logits' has shape "
            f"{tuple(logits.shape)}",
            expected="labels of shape logits.shape[:-1], one class per position",
        )
    smoothing = real_in(label_smoothing, layer, "label_smoothing", 0.0, 1.0, closed=True)
    flat, batch = flatten_leading(logits, 1)
    y = labels.reshape(flat.shape[:1])
    if smoothing == 0.0:
        loss = build(CROSS_ENTROPY, backend)(X=flat, y=y)
    else:
        on, off = 1.0 - smoothing, smoothing / logits.shape[-1]
        loss = build(CROSS_ENTROPY_SMOOTHED, backend)(X=flat, y=y, on=on, off=off)
    return loss.reshape(batch)
