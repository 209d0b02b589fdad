"""How a tile program's dots round: the `precision=` modes, as jax.numpy has them on a GPU.

A user of jax.numpy on an NVIDIA GPU gets float32 matrix products on TF32 tensor cores at the
default precision (operands rounded to 10-bit mantissas, float32 accumulation) and asks for
more with `precision=`; tile programs do the same, one row per mode:

* `"default"`: TF32 (Triton's `inputPrecision = tf32`), what jnp users get and expect the
  speed of;
* `"high"`: TF32 too: `jax.lax.Precision("tensorfloat32")` is HIGH (3 bfloat16 passes "or
  tensorfloat32 where available"), and Pallas' Triton lowering gives TF32 for it;
* `"highest"`: exact float32 (`ieee`: FMAs, no tensor cores), what jnp's HIGHEST gives.

Triton also has 3xTF32 (`tf32x3`: about float32's accuracy at about a third of TF32's
speed, jax's `DotAlgorithmPreset.TF32_TF32_F32_X3`); `precision=` takes jax.lax.Precision
names only, so no mode selects it yet.

float16/bfloat16 operands go to the tensor cores as they are, whatever the mode, and
accumulate in float32 (`HALF`). On the CPU (Pallas' interpret mode) every dot is exact
float32: each mode is at least as accurate there as it says.

`tolerance` is the bound the docs state and the tests check, `‖out - ref‖ / ‖ref‖` against a
float64 computation on the same inputs, for random operands and reduced lengths up to 4096:
the unit roundoff of the operands' rounding (2^-11 for TF32 and float16, 2^-8 for bfloat16,
float32's for the others) with room for the sums.

>>> dot_precision("default", "float32").triton, dot_precision("highest", "bfloat16").name
('tf32', 'bfloat16')
"""

from __future__ import annotations

from dataclasses import dataclass

from codegen.errors import Unsupported


@dataclass(frozen=True)
class DotPrecision:
    """One way a tile dot rounds."""

    #: The mode (`precision=`), or the half type the operands have.
    name: str
    #: Triton's `tt.dot` input precision ("tf32", "tf32x3", "ieee"); None: the operands' own.
    triton: str | None
    #: For people (explain).
    words: str
    #: The bound on `‖out - ref‖ / ‖ref‖` against float64 on the same inputs.
    tolerance: float


#: The modes of float32 (and float64) dots, by `precision=` name (`jax.lax.Precision`'s).
MODES: dict[str, DotPrecision] = {
    "default": DotPrecision(
        "default", "tf32", "TF32 tensor cores, float32 accumulation (jnp's default)", 2e-3
    ),
    "high": DotPrecision("high", "tf32", "TF32 tensor cores, float32 accumulation", 2e-3),
    "highest": DotPrecision("highest", "ieee", "exact float32 (FMAs, no tensor cores)", 1e-5),
}

#: Dots of half-type operands: tensor cores on the operands as they are, float32 sums.
HALF: dict[str, DotPrecision] = {
    "bfloat16": DotPrecision("bfloat16", None, "bfloat16 tensor cores, float32 accumulation", 1e-2),
    "float16": DotPrecision("float16", None, "float16 tensor cores, float32 accumulation", 2e-3),
}


def dot_precision(mode: str, dtype: str) -> DotPrecision:
    """How a dot of `dtype` operands rounds at `mode` ("default", "high" or "highest").

    Raises:
        Unsupported: `mode` is none of `MODES` (the user-facing option is checked before,
            by `tensordsl.frontend.arguments.precision`).
    """
    if mode not in MODES:
        raise Unsupported(
            f"tile programs have no dot precision '{mode}'", expected=f"one of {', '.join(MODES)}"
        )
    return HALF.get(dtype, MODES[mode])
