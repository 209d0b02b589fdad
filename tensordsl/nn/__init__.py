"""Ready layers written as index-expression programs: pure functions of arrays, like `jax.nn`.

They work inside plain JAX, Flax or Equinox (parameters are arguments; nothing is stored) and
under `jit`, `grad` and `vmap`. Layouts follow Flax: `dense` takes `(in, out)` weights, the
convolutions are channels last, `attention` takes `(..., T, heads, width)` as
`jax.nn.dot_product_attention`. Leading batch axes are flattened into one index and restored.
Each configuration's kernels are built once (cached) and compiled on first call; `backend=`
picks the back end ("auto": C on a CPU). See docs/nn.md.

>>> import numpy as np, tensordsl as td
>>> td.nn.dense(np.ones((4, 3)), np.ones((3, 2)), backend="reference").shape
(4, 2)
"""

from tensordsl.nn.attention import attention
from tensordsl.nn.conv import conv1d, conv2d
from tensordsl.nn.layers import cross_entropy, dense, embedding, layer_norm, rms_norm
from tensordsl.nn.modifiers import and_masks, or_masks

__all__ = [
    "and_masks",
    "attention",
    "conv1d",
    "conv2d",
    "cross_entropy",
    "dense",
    "embedding",
    "layer_norm",
    "or_masks",
    "rms_norm",
]
