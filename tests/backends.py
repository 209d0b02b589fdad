"""Test parameters shared by the files that check generated kernels on every back end:
reference, C (where a compiler is found) and CUDA (a GPU, or the CUDA emulator)."""

from __future__ import annotations

import shutil

import jax
import pytest

from codegen import config
from codegen.cuda.emulator import emulate

#: Skips a test (or, as `pytestmark`, a file) where no C compiler is found.
NEEDS_C_COMPILER = pytest.mark.skipif(
    shutil.which(config.c_compiler()) is None,
    reason=f"no C compiler {config.c_compiler()!r} (set TENSORDSL_CC)",
)


def _cuda_reason() -> str | None:
    if jax.default_backend() == "gpu":
        return None
    return None if emulate.available() else "no GPU and no CUDA emulator"


BACKENDS = [
    "reference",
    pytest.param("c", marks=NEEDS_C_COMPILER),
    pytest.param(
        "cuda", marks=pytest.mark.skipif(_cuda_reason() is not None, reason=str(_cuda_reason()))
    ),
]


@pytest.fixture
def generated_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """Outputs poisoned, contractions generated (not XLA's dot), CUDA emulated without a GPU."""
    monkeypatch.setenv("TENSORDSL_POISON_OUTPUTS", "1")
    monkeypatch.setenv("TENSORDSL_XLA_CONTRACTIONS", "0")  # these test generated kernels
    if jax.default_backend() != "gpu":
        monkeypatch.setenv("TENSORDSL_CUDA_EMULATE", "1")
