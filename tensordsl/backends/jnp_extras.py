"""jax implementations of the language's functions that jax.numpy spells differently: the
classification functions as 1.0/0.0 values in their argument's type (jnp's are booleans,
which a sum would count as integers), and `polygamma` of a float order (the reference
evaluator passes every argument as a float; jax's polygamma takes an integer order).
The rows of `codegen.ir.functions.FUNCTIONS` name them by dotted path."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.scipy import special


def _as_value(test, x: jax.Array) -> jax.Array:
    x = jnp.asarray(x)
    return test(x).astype(x.dtype if jnp.issubdtype(x.dtype, jnp.floating) else jnp.float32)


def isnan(x: jax.Array) -> jax.Array:
    """1 where x is NaN, else 0."""
    return _as_value(jnp.isnan, x)


def isinf(x: jax.Array) -> jax.Array:
    """1 where x is +-inf, else 0."""
    return _as_value(jnp.isinf, x)


def isfinite(x: jax.Array) -> jax.Array:
    """1 where x is finite, else 0."""
    return _as_value(jnp.isfinite, x)


def signbit(x: jax.Array) -> jax.Array:
    """1 where x's sign bit is set, else 0."""
    return _as_value(jnp.signbit, x)


def polygamma(order: jax.Array, x: jax.Array) -> jax.Array:
    """The order-th derivative of digamma; NaN where the order is not a whole number >= 0."""
    order = jnp.asarray(order)
    whole = (order == jnp.floor(order)) & (order >= 0)
    value = special.polygamma(jnp.where(whole, order, 0).astype(jnp.int32), x)
    return jnp.where(whole, value, jnp.nan)
