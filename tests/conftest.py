"""Shared test set-up: float64 everywhere, so references can be checked tightly, four CPU
devices, so sharding tests run on any machine (set before JAX initialises), and optimised
C builds only."""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
# The suite checks the optimised kernels users run once the first seconds are over; the tiered
# builds (TENSORDSL_BUILD's default) have their own tests, tests/cpu/test_tiered_builds.py. A
# second, background build of every kernel would double the suite's compiler time.
os.environ.setdefault("TENSORDSL_BUILD", "full")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_enable_x64", True)


@pytest.fixture
def poisoned_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Generated kernels' outputs filled with NaN (or -1 for integers) before each call, so an
    element a kernel forgets to write shows; a file takes it for every test with
    `pytestmark = pytest.mark.usefixtures("poisoned_outputs")`."""
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
