"""Where a gathered axis points, computed in JAX's integer type without wrapping.

A gathered axis is `affine(indices) + sum of c * array[...]` (`tensordsl/frontend/gathers.py`),
computed in JAX's default integer type: int32 without `jax_enable_x64`, int64 with it. Done
naively, `A[65536*tok[i]]` with `tok[i] = 65536` is 2^32, which int32 wraps to 0: row 0 read
where the position lies outside the table. So every term is bounded before it is added: the
affine part by its range (known when the call is traced), each index-array term `c * v` by
`(D - A) / k` (D the type's largest value, A the affine part's bound, k the count of terms),
which `v` is compared with before the product is formed. The sum then never wraps, and a term
past its bound marks the position outside: with one term, its magnitude exceeds `D - 2A`,
beyond the table whose extent is at most `D - 2A` (else the call is refused), so no position
inside the table is lost. With several terms, a position whose terms pass the bound but
cancel (`A[65536*p[i] - 65536*q[i]]` with `p = q = 65536`) is outside too: each term must
fit its share of the type (docs/language.md).

>>> import jax.numpy as jnp
>>> base = jnp.zeros((2,), jnp.int32)
>>> position, inside = axis_position(base, 0, [(65536, jnp.array([1, 65536]))], 9, jnp.int32)
>>> inside.tolist()
[False, False]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np


def axis_position(
    base: Any, bound: int, terms: Sequence[tuple[int, Any]], n: int, dtype: Any
) -> tuple[Any, Any]:
    """`(position, inside)` of one gathered axis over an extent of `n`.

    Args:
        base: the affine part's values, of `dtype`; `bound` bounds their magnitude.
        terms: `(coefficient, values)` per index-array read (integer values, any dtype).
        n: the table's extent on this axis.
        dtype: the integer type the positions are computed in.

    Returns:
        The positions (meaningful only where `inside`) and where they lie inside `[0, n)`.
    """
    top = int(np.iinfo(dtype).max)
    share = (top - bound) // max(len(terms), 1)
    position, fits = base, jnp.ones(jnp.shape(base), bool)
    for coefficient, values in terms:
        if not jnp.issubdtype(values.dtype, jnp.integer):  # a one-hot pick's whole numbers
            values = values.astype(dtype)
        info = np.iinfo(values.dtype)
        limit = share // abs(coefficient)
        ok = (values >= max(-limit, int(info.min))) & (values <= min(limit, int(info.max)))
        # Where a term may not be formed its value is 0 (then `ok` is False): a coefficient
        # beyond the type only multiplies the value 0.
        factor = coefficient if abs(coefficient) <= share else 0
        position = position + jnp.where(ok, values, 0).astype(dtype) * factor
        fits = fits & ok
    return position, fits & (position >= 0) & (position < n)


def fits_positions(bound: int, n: int, dtype: Any) -> bool:
    """Whether an axis whose affine part is bounded by `bound`, of extent `n`, has its
    positions computed right in `dtype` (see the module docstring)."""
    return 2 * bound + n <= int(np.iinfo(dtype).max)


def exact_position(base: Any, terms: Sequence[tuple[int, Any]], where: tuple[int, ...]) -> int:
    """The position at `where` in Python's integers: the true value, for an error message."""
    return int(np.asarray(base)[where]) + sum(
        c * int(np.asarray(values)[where]) for c, values in terms
    )
