"""Shared test set-up: float64 everywhere, so references can be checked tightly."""

import jax

jax.config.update("jax_enable_x64", True)
