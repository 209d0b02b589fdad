"""Every CUDA strategy with a kernel, run under the CUDA emulator on its case
(tests/strategy_cases.py) against the case's float64 numpy reference: the heuristic's
schedule, both scheduling orders, outputs poisoned (`emulated.run_arrays`).

Needs a C++ compiler and the CUDA headers, no GPU.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from codegen.cuda.emulator import emulate
from tensordsl.backends import cuda as gpu
from tests.gpu import emulated
from tests.strategy_cases import CASES

pytestmark = pytest.mark.skipif(
    not emulate.available(), reason=f"CUDA emulator: {emulate.unavailable_reason()}"
)


@pytest.mark.parametrize("strategy", sorted(CASES))
def test_the_strategy_matches_numpy(strategy: str) -> None:
    case = CASES[strategy]
    nest, values = case.build()
    dtypes = case.dtypes(nest)
    arrays = [np.asarray(values[op.name], jnp.dtype(case.dtype)) for op in nest.operands]
    rounded = {op.name: np.asarray(a, np.float64) for op, a in zip(nest.operands, arrays)}
    want = case.reference(**rounded)
    shapes = {n: np.shape(v) for n, v in values.items()}
    la = gpu.prepare(nest, arrays, shapes, dtypes[nest.output])
    assert la.source.schedule.strategy == strategy
    for order in ("forward", "reverse"):
        got = emulated.run_arrays(la, arrays, order, f"{strategy} {order}")
        emulated.assert_close(got, want, dtypes[nest.output], f"{strategy} order={order}")
