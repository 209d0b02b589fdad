"""1-d and 2-d convolutions, channels last, with padding, stride and dilation.

The layout is Flax's default (`flax.linen.Conv`, `lax.conv_general_dilated` with
`("NWC", "WIO", "NWC")` or `("NHWC", "HWIO", "NHWC")`): inputs `(..., width, in)` or
`(..., height, width, in)`, kernels `(kw, in, out)` or `(kh, kw, in, out)`. Like Flax and
`lax`, this is a cross-correlation (the kernel is not flipped).

Stride and dilation go into the access, `X[n, 2*w + 3*t, c]`: the output width is what the
range rule gives, the number of windows that fit. The language has no padding (a read outside
an array is an error), so a padding pads the input with zeros in XLA (`jnp.pad`) first.

>>> import numpy as np
>>> x, k = np.arange(5.0).reshape(1, 5, 1), np.ones((3, 1, 1))
>>> conv1d(x, k, padding="valid", backend="reference")[0, :, 0].tolist()
[3.0, 6.0, 9.0]
>>> conv1d(x, k, padding="same", backend="reference")[0, :, 0].tolist()
[1.0, 3.0, 6.0, 9.0, 7.0]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from tensordsl.errors import OptionError, ShapeError, close_match
from tensordsl.nn._common import (
    as_float_array,
    build,
    check_extent,
    check_rank,
    flatten_leading,
    positive_ints,
    unflatten_leading,
)

PADDINGS = ("same", "valid")

#: Output and kernel index names per spatial axis.
_OUT, _TAP = ("h", "w"), ("p", "q")


def _access(out: str, tap: str, stride: int, dilation: int) -> str:
    """`2*w + 3*t`: the input position read for output `out` and kernel tap `tap`."""
    first = out if stride == 1 else f"{stride}*{out}"
    second = tap if dilation == 1 else f"{dilation}*{tap}"
    return f"{first} + {second}"


def conv_source(strides: tuple[int, ...], dilations: tuple[int, ...], bias: bool) -> str:
    """The program of a convolution with these strides and dilations (one per axis)."""
    outs, taps = _OUT[-len(strides) :], _TAP[-len(strides) :]
    reads = ", ".join(_access(o, t, s, d) for o, t, s, d in zip(outs, taps, strides, dilations))
    spatial = ",".join(outs)
    conv = f"Y[n,{spatial},o] := X[n,{reads},c] * K[{','.join(taps)},c,o]"
    if not bias:
        return conv
    return f"{conv.replace('Y[', 'C[', 1)}\nY[n,{spatial},o] := C[n,{spatial},o] + bias[o]"


def _zeros(value: Any) -> bool:
    """Whether `value` is a count of zeros: an int >= 0, not a bool."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and bool(value >= 0)


def _pads(
    layer: str,
    padding: Any,
    sizes: Sequence[int],
    window: Sequence[int],
    strides: Sequence[int],
) -> tuple[tuple[int, int], ...]:
    """(low, high) zeros on each spatial axis, for a padding name or explicit pads."""
    count = len(sizes)
    if isinstance(padding, str):
        mode = padding.lower()
        if mode == "valid":
            return ((0, 0),) * count
        if mode == "same":  # lax's "SAME": ceil(size / stride) outputs, the extra zero high
            pads: Any = []
            for size, span, stride in zip(sizes, window, strides):
                total = max((math.ceil(size / stride) - 1) * stride + span - size, 0)
                pads.append((total // 2, total - total // 2))
            return tuple(pads)
        raise OptionError(
            f"{layer}: unknown padding {padding!r}",
            expected="'same', 'valid', an int, or one (low, high) pair per spatial axis",
            hint=close_match(mode, PADDINGS),
        )
    pairs: Any = padding
    if _zeros(padding):
        pairs = ((padding, padding),) * count
    try:
        pads = tuple(tuple(pair) for pair in pairs)
    except TypeError:
        pads = ()
    if len(pads) != count or not all(len(p) == 2 and all(map(_zeros, p)) for p in pads):
        raise OptionError(
            f"{layer}: padding={padding!r} is not {count} pair(s) of zeros to add",
            expected=f"'same', 'valid', an int >= 0, or {count} (low, high) pair(s) of ints >= 0",
        )
    return tuple((int(lo), int(hi)) for lo, hi in pads)


def _check_window(
    layer: str,
    sizes: Sequence[int],
    pads: Sequence[tuple[int, int]],
    window: Sequence[int],
    dilations: Sequence[int],
) -> None:
    """A `ShapeError` where the kernel's span is longer than the padded input: no output."""
    names = ("height", "width")[-len(sizes) :]
    for name, size, (lo, hi), span, dilation in zip(names, sizes, pads, window, dilations):
        if span > size + lo + hi:
            padded = f" ({size + lo + hi} padded)" if lo or hi else ""
            spread = f" with dilation {dilation}" if dilation > 1 else ""
            raise ShapeError(
                f"{layer}: the kernel spans {span} positions{spread} but 'x' has a {name} of "
                f"{size}{padded}: no output position fits",
                expected=f"a {name} of at least {span} in 'x', more padding, or padding='same'",
            )


def _conv(
    layer: str,
    spatial: int,
    x: Any,
    kernel: Any,
    b: Any,
    stride: Any,
    padding: Any,
    dilation: Any,
    backend: str,
) -> Any:
    names = "(..., width, in)" if spatial == 1 else "(..., height, width, in)"
    taps = "(kw, in, out)" if spatial == 1 else "(kh, kw, in, out)"
    x, kernel = as_float_array(x, layer, "x"), as_float_array(kernel, layer, "kernel")
    check_rank(x, layer, "x", spatial + 1, names, at_least=True)
    check_rank(kernel, layer, "kernel", spatial + 2, taps, at_least=False)
    check_extent(layer, "x", x.shape[-1], "kernel", kernel.shape[-2], "the input channel count")
    strides = positive_ints(stride, layer, "stride", spatial)
    dilations = positive_ints(dilation, layer, "dilation", spatial)
    window = [(k - 1) * d + 1 for k, d in zip(kernel.shape[:spatial], dilations)]
    sizes = x.shape[x.ndim - spatial - 1 : -1]
    pads = _pads(layer, padding, sizes, window, strides)
    _check_window(layer, sizes, pads, window, dilations)
    flat, batch = flatten_leading(x, spatial + 1)
    if any(lo or hi for lo, hi in pads):
        flat = jnp.pad(flat, ((0, 0), *pads, (0, 0)))
    inputs = {"X": flat, "K": kernel}
    if b is not None:
        inputs["bias"] = as_float_array(b, layer, "b")
        check_rank(inputs["bias"], layer, "b", 1, "(out,)", at_least=False)
        check_extent(
            layer,
            "b",
            inputs["bias"].shape[0],
            "kernel",
            kernel.shape[-1],
            "the output channel count",
        )
    program = build(conv_source(strides, dilations, b is not None), backend)
    return unflatten_leading(program(**inputs), batch, spatial + 1)


def conv1d(
    x: Any,
    kernel: Any,
    b: Any = None,
    *,
    stride: Any = 1,
    padding: Any = "same",
    dilation: Any = 1,
    backend: str = "auto",
) -> Any:
    """A 1-d convolution (cross-correlation), channels last, as `flax.linen.Conv`.

    Args:
        x: inputs `(..., width, in)`; any leading axes are batch axes (none is fine).
        kernel: `(kw, in, out)`.
        b: an optional bias `(out,)`, added in a statement of its own.
        stride: an int >= 1 (or a 1-tuple).
        padding: "same" (the default, as Flax: `ceil(width / stride)` outputs), "valid"
            (only windows that fit), an int (zeros on both sides) or `((low, high),)`.
        dilation: the kernel dilation, an int >= 1 (or a 1-tuple).
        backend: the kernels' back end.

    Returns:
        `(..., width_out, out)`.

    Raises:
        ShapeError: ranks, or `in` differing between `x` and `kernel`.
        OptionError: an unknown padding, a stride or dilation < 1.
        RangeError: the (dilated) kernel is wider than the padded input.
    """
    return _conv("conv1d", 1, x, kernel, b, stride, padding, dilation, backend)


def conv2d(
    x: Any,
    kernel: Any,
    b: Any = None,
    *,
    stride: Any = 1,
    padding: Any = "same",
    dilation: Any = 1,
    backend: str = "auto",
) -> Any:
    """A 2-d convolution (cross-correlation), channels last (NHWC, HWIO), as `flax.linen.Conv`.

    Args:
        x: inputs `(..., height, width, in)`; any leading axes are batch axes.
        kernel: `(kh, kw, in, out)`.
        b: an optional bias `(out,)`.
        stride: an int >= 1 or a pair.
        padding: "same" (default), "valid", an int, or `((top, bottom), (left, right))`.
        dilation: an int >= 1 or a pair.
        backend: the kernels' back end.

    Returns:
        `(..., height_out, width_out, out)`.

    Raises:
        ShapeError: ranks, or `in` differing between `x` and `kernel`.
        OptionError: an unknown padding, a stride or dilation < 1.
        RangeError: the (dilated) kernel is larger than the padded input.

    >>> import numpy as np
    >>> conv2d(np.ones((1, 4, 4, 2)), np.ones((3, 3, 2, 5)), stride=2,
    ...        backend="reference").shape
    (1, 2, 2, 5)
    """
    return _conv("conv2d", 2, x, kernel, b, stride, padding, dilation, backend)
