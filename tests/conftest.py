"""Shared test set-up: float64 everywhere, so references can be checked tightly, and four
CPU devices, so sharding tests run on any machine (set before JAX initialises)."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")

import jax  # noqa: E402

jax.config.update("jax_enable_x64", True)
