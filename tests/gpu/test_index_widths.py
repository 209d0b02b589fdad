"""Index arithmetic beyond int32 in small tensors (issue 36, item 4): offsets, range starts and
`mod`/`clamp` arguments of 2^40 and more read the right elements on every back end. The CUDA
back end chose 32-bit indices from the tensors' sizes alone: `X[i + 2^40]` over a range
starting at -2^40 read far outside X (a crash under the emulator, an illegal address on a
GPU), `X[mod(i + 2^40)]` and `X[clamp(i + 2^62)]` read wrapped positions."""

from __future__ import annotations

import jax
import numpy as np
import pytest

import tensordsl as td
from tests.backends import BACKENDS, generated_kernels  # noqa: F401 (a fixture)

pytestmark = pytest.mark.usefixtures("generated_kernels")

N = 6
BIG = 2**40

# (statement, ranges, the positions of X each element of Y reads: i's values in order)
SHIFTED = [
    ("Y[i] := X[i + 1099511627776]", {"i": range(-BIG, -BIG + N)}, lambda i: i + BIG),
    ("Y[i] := X[mod(i + 1099511627776)]", {"i": N}, lambda i: (i + BIG) % N),
    ("Y[i] := X[mod(3*i - 1099511627777)]", {"i": N}, lambda i: (3 * i - BIG - 1) % N),
    ("Y[i] := X[clamp(i + 4611686018427387904)]", {"i": N}, lambda i: np.full_like(i, N - 1)),
    ("Y[i] := X[clamp(i - 4611686018427387904)]", {"i": N}, lambda i: np.zeros_like(i)),
]


def _x() -> np.ndarray:
    return np.random.default_rng(0).uniform(0.5, 2.0, N)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("source", "ranges", "read"), SHIFTED, ids=[s for s, _, _ in SHIFTED])
def test_large_offsets_read_the_right_elements(source, ranges, read, backend) -> None:
    x = _x()
    r = ranges["i"]
    i = np.arange(r.start, r.stop) if isinstance(r, range) else np.arange(r)
    positions = read(i)
    k = td.kernel(source, ranges=ranges, backend=backend)
    np.testing.assert_array_equal(np.asarray(k(x)), x[positions])
    cotangent = np.random.default_rng(2).uniform(1.0, 2.0, len(positions))
    grad = jax.grad(lambda x: (k(x) * cotangent).sum())(x)
    expected = np.zeros(N)
    np.add.at(expected, positions, cotangent)
    np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_reduced_index_beside_a_large_range_start(backend) -> None:
    x, w = _x(), np.random.default_rng(1).uniform(-1.0, 1.0, 3)
    k = td.kernel(
        "Y[i] := X[i + k - 1099511627776] * W[k]",
        ranges={"i": range(BIG, BIG + 4)},
        backend=backend,
    )
    expected = np.array([x[i : i + 3] @ w for i in range(4)])
    np.testing.assert_allclose(np.asarray(k(x, w)), expected, rtol=1e-12)
