"""Shared test set-up: float64 everywhere, so references can be checked tightly, four CPU
devices, so sharding tests run on any machine (set before JAX initialises), and C kernels
built unoptimised except in tests marked `optimised`."""

import importlib.metadata
import os

# XLA compiles every jitted test function; its LLVM back end without optimisation takes about
# a fifth less of the suite's CPU time (tests/jax/test_nn.py: 142-154 s -> 114-120 s, the
# kernels cached, 2026-12-07). What XLA compiles keeps its values: it uses no fast math.
# The XLA that jaxlib 0.10 ships also has its older CPU fusion emitters, which compile about 2.5
# times faster than the new ones (a jitted value_and_grad: 106 -> 35 ms, 2026-12-07; codegen
# split into one module, not eight, saves a little more); later XLAs have only the new ones and
# reject the flag as unknown (a fatal error), so it is passed only to jaxlib 0.10.
_LEGACY_EMITTERS = (
    " --xla_cpu_use_fusion_emitters=false --xla_cpu_parallel_codegen_split_count=1"
    if importlib.metadata.version("jaxlib").startswith("0.10.")
    else ""
)
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0"
    " --xla_llvm_disable_expensive_passes=true" + _LEGACY_EMITTERS,
)
# Kernels built cold are a large part of the suite's time, and gcc -O3 takes about 14 times
# the CPU time of -O0 on a kernel (docs/testing.md). So the suite builds unoptimised (`fast`), the
# build users' first calls run, and the tests marked `optimised` (every C strategy under
# every candidate schedule, the corpus forward and gradients, vector math: the C back end's
# own numerical checks) build what users run after that, as `full`. The tiered builds (the
# default outside the suite) have their own tests, tests/cpu/test_tiered_builds.py; a second,
# background build of every kernel would double the compiler time. `TENSORDSL_BUILD=full
# python -m pytest -n auto` runs every test on optimised kernels.
os.environ.setdefault("TENSORDSL_BUILD", "fast")

import jax  # noqa: E402
import pytest  # noqa: E402

from tests import sampling  # noqa: E402

jax.config.update("jax_enable_x64", True)


@pytest.fixture(autouse=True)
def _optimised_builds(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test marked `optimised` builds its C kernels with the optimising compiler."""
    if request.node.get_closest_marker("optimised") is not None:
        monkeypatch.setenv("TENSORDSL_BUILD", "full")


@pytest.fixture
def poisoned_outputs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Generated kernels' outputs filled with NaN (or -1 for integers) before each call, so an
    element a kernel forgets to write shows; a file takes it for every test with
    `pytestmark = pytest.mark.usefixtures("poisoned_outputs")`."""
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by the marks it adds
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The emulated CUDA cases outside the CUDA tier run on a sample (tests/sampling.py)."""
    sampling.sample_emulated_cases(items)
