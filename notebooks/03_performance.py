"""Notebook 03: pairwise distances and a Gaussian-kernel sum timed on the reader's machine,
against the jax.numpy a JAX user writes (the .ipynb is generated from this file by
notebooks/sync.py)."""

# %% [markdown]
# # 03 — Speed and memory, measured on your machine
#
# Two layers built on the distance between every pair of points, timed here in a few seconds
# against the `jax.numpy` a JAX user would write, all in float32 under `jax.jit`:
#
# * **pairwise squared distances** `D[i,j] = sum_k (W[k,i] - X[k,j])^2`, forward and
#   forward + backward. The idiom is the matmul identity `|w|² + |x|² - 2 WᵀX`; the naive
#   broadcast `((W[:, :, None] - X[:, None, :])**2).sum(0)` comes only as an aside, since
#   nobody who knows the identity writes it.
# * a **Gaussian-kernel sum** `Y[i] = sum_j exp(-|x_i - z_j|²) b_j` over 3-D points (KeOps'
#   flagship example), where the `N × N` matrix is only a step on the way to a vector.
#   KeOps (`pykeops`, CPU) is timed too where it is installed (`pip install pykeops`).
#
# Times are medians of `ROUNDS` calls after a first call that compiles, the implementations
# taking turns so that a change in the machine's load falls on all of them alike. Memory is
# computed from the shapes (what each version must hold at once); the measured peaks, in a
# fresh process per measurement, are in `benchmarks/RESULTS.md` (`python -m
# benchmarks.run_cpu`). `TENSORDSL_NOTEBOOK_ROUNDS` sets the rounds (the test suite runs 2).

# %%
import os
import platform
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import tensordsl as td

ROUNDS = int(os.environ.get("TENSORDSL_NOTEBOOK_ROUNDS", "7"))
rng = np.random.default_rng(0)
print(f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
      f"jax {jax.__version__}, tensordsl {td.__version__}")  # fmt: skip
print(f"load average before: {os.getloadavg()[0]:.2f} (other work on the machine slows all)")


def median_ms(functions, *args, rounds=ROUNDS):
    """{name: median milliseconds of `rounds` calls}, after one untimed call of each."""
    for f in functions.values():
        jax.block_until_ready(f(*args))
    times = {name: [] for name in functions}
    for _ in range(rounds):
        for name, f in functions.items():
            started = time.perf_counter()
            jax.block_until_ready(f(*args))
            times[name].append(time.perf_counter() - started)
    return {name: 1e3 * float(np.median(t)) for name, t in times.items()}


def report(case):
    print(case + ": " + ", ".join(f"{name} {ms:.2f} ms" for name, ms in timings[case].items()))


def relative_error(ours, reference):
    ours, reference = np.asarray(ours, np.float64).ravel(), np.asarray(reference).ravel()
    return float(np.abs(ours - reference).max() / np.abs(reference).max())


# %% [markdown]
# ## Pairwise squared distances
#
# 2048 points against 2048, in 64 dimensions. The kernel is the definition; the idiom is
# what a JAX user writes. Both are checked against float64 NumPy on 64 rows first. The
# backward is the gradient of `sum(D * C)` (a fixed random cotangent `C`) with respect to
# both inputs.

# %%
K, I, J = 64, 2048, 2048
W = jnp.asarray(rng.standard_normal((K, I)), jnp.float32)
X = jnp.asarray(rng.standard_normal((K, J)), jnp.float32)
C = jnp.asarray(rng.standard_normal((I, J)), jnp.float32)

distances = td.kernel("D[i,j] := (W[k,i] - X[k,j])^2")


def distances_idiom(W, X):
    return (W * W).sum(0)[:, None] + (X * X).sum(0)[None, :] - 2 * W.T @ X


def distances_broadcast(W, X):
    return ((W[:, :, None] - X[:, None, :]) ** 2).sum(0)


W64, X64 = np.asarray(W, np.float64), np.asarray(X, np.float64)
expected = ((W64[:, :64, None] - X64[:, None, :]) ** 2).sum(0)
for name, f in (("tensordsl", distances), ("jnp idiom", distances_idiom)):
    print(f"{name}: largest error {relative_error(jax.jit(f)(W, X)[:64], expected):.1e} "
          "(relative to the largest distance)")  # fmt: skip


def with_backward(f):
    return jax.jit(jax.value_and_grad(lambda W, X: jnp.sum(f(W, X) * C), (0, 1)))


timings = {
    "distances, forward": median_ms(
        {"tensordsl": jax.jit(distances), "jnp idiom": jax.jit(distances_idiom)}, W, X
    ),
    "distances, forward + backward": median_ms(
        {"tensordsl": with_backward(distances), "jnp idiom": with_backward(distances_idiom)},
        W,
        X,
    ),
}
report("distances, forward")
report("distances, forward + backward")

# %% [markdown]
# ### Aside: the naive broadcast
#
# At 1024 × 1024 points (a quarter of the pairs above): the broadcast stores the `k × i × j`
# differences, 64 times the output, and is timed on 3 calls only.

# %%
W_small, X_small = W[:, :1024], X[:, :1024]
timings["distances 1024², forward"] = median_ms(
    {
        "tensordsl": jax.jit(distances),
        "jnp idiom": jax.jit(distances_idiom),
        "jnp broadcast": jax.jit(distances_broadcast),
    },
    W_small,
    X_small,
    rounds=min(ROUNDS, 3),
)
report("distances 1024², forward")

# %% [markdown]
# ## A Gaussian-kernel sum
#
# `Y[i] = sum_j exp(-|x_i - z_j|²) b_j` for 4000 points in 3-D. The kernel writes the three
# coordinates out, since the sum over them sits inside `exp` (one statement reduces its
# whole body). The idiom builds the `N × N` matrix through the matmul identity and multiplies
# it by `b`; KeOps, like the kernel, never stores it.

# %%
N = 4000
points = (0.5 * rng.standard_normal((N, 3))).astype(np.float32)
centres = (0.5 * rng.standard_normal((N, 3))).astype(np.float32)
weights = rng.standard_normal(N).astype(np.float32)

gaussian_sum = td.kernel(
    "Y[i] := exp(-((X[i,0]-Z[j,0])^2 + (X[i,1]-Z[j,1])^2 + (X[i,2]-Z[j,2])^2)) * B[j]"
)


def gaussian_sum_idiom(X, Z, B):
    squared = (X * X).sum(1)[:, None] + (Z * Z).sum(1)[None, :] - 2 * X @ Z.T
    return jnp.exp(-squared) @ B


implementations = {"tensordsl": jax.jit(gaussian_sum), "jnp idiom": jax.jit(gaussian_sum_idiom)}
try:
    from pykeops.numpy import LazyTensor

    def gaussian_sum_keops(X, Z, B):
        squared = ((LazyTensor(X[:, None, :]) - LazyTensor(Z[None, :, :])) ** 2).sum(-1)
        return ((-squared).exp() * LazyTensor(B[None, :, None])).sum(dim=1)[:, 0]

    implementations["KeOps"] = gaussian_sum_keops  # its first call compiles (seconds)
except ImportError as error:
    print(f"KeOps not timed: {error} (pip install pykeops)")

expected = np.exp(-((points[:64, None].astype(np.float64) - centres) ** 2).sum(-1)) @ weights
for name, f in implementations.items():
    error = relative_error(f(points, centres, weights)[:64], expected)
    print(f"{name}: largest error {error:.1e} (relative to the largest sum)")
timings[f"Gaussian sum, N={N}, forward"] = median_ms(implementations, points, centres, weights)
report(f"Gaussian sum, N={N}, forward")

# %% [markdown]
# ## All the times, and each relative to the idiom
#
# Left: the medians, in milliseconds, on a log axis (they span three orders of magnitude).
# Right: each time divided by the jnp idiom's in the same case; a bar starts at 1 (as fast
# as the idiom) and ends at the ratio, written beside it: left of 1 is faster, right of 1
# slower. The axis is logarithmic so that 2x faster and 2x slower are the same length.

# %%
print(f"{'case':<36}{'implementation':<16}{'median ms':>10}{'/ idiom':>10}")
for case, row in timings.items():
    for name, ms in row.items():
        print(f"{case:<36}{name:<16}{ms:10.2f}{ms / row['jnp idiom']:10.2f}")
print(f"load average after: {os.getloadavg()[0]:.2f}")

COLOURS = {"tensordsl": "C0", "jnp idiom": "C1", "jnp broadcast": "C2", "KeOps": "C3"}
rows = [(case, name, ms) for case, row in timings.items() for name, ms in row.items()]
figure, (left, right) = plt.subplots(1, 2, figsize=(12, 0.45 * len(rows) + 1.5), sharey=True)
positions = np.arange(len(rows))[::-1]
for y, (case, name, ms) in zip(positions, rows):
    ratio = ms / timings[case]["jnp idiom"]
    left.plot(ms, y, "o", color=COLOURS[name])
    right.barh(y, ratio - 1, left=1, color=COLOURS[name], height=0.6)
    label = "the idiom" if name == "jnp idiom" else f"{ratio:.3g}x"
    side = 1 if ratio >= 1 else -1
    right.annotate(label, (ratio, y), xytext=(4 * side, 0), textcoords="offset points",
                   va="center", ha="left" if side > 0 else "right")  # fmt: skip
left.set_yticks(positions, [f"{case}: {name}" for case, name, _ in rows], fontsize=8)
left.set_xscale("log")
left.set_xlabel("median time (ms), log scale")
right.set_xscale("log")
right.axvline(1, color="black", linewidth=0.8)
right.set_xlabel("time / the jnp idiom's time in the same case (log scale)")
low = min(ms / timings[c]["jnp idiom"] for c, _, ms in rows)
high = max(ms / timings[c]["jnp idiom"] for c, _, ms in rows)
right.set_xlim(min(low, 1) / 4, max(high, 1) * 4)
figure.suptitle(f"float32, jax.jit, medians of {ROUNDS} rounds, {os.cpu_count()} CPUs")
figure.tight_layout()
figure.savefig("03_performance.png", dpi=100)  # Jupyter also shows the figure inline

# %% [markdown]
# ## Memory, from the shapes
#
# The arrays each version writes, beyond its inputs, in float32 (4 bytes): for the distances,
# every version writes the `i × j` output; the broadcast also stores the `k × i × j`
# differences (and its backward keeps them); the idiom writes the `i × j` product `WᵀX`
# before adding the norms (XLA may reuse that buffer for the output, so count it as at most
# twice the output). The distances themselves need the `i × j` matrix whoever computes
# them. For the Gaussian sum the output is a vector: the idiom stores the `N × N` matrix,
# the kernel (and KeOps) nothing beyond the vector. The same layers at 50 000 points show
# where the matrix stops fitting.

# %%
MiB = 2**20


def memory(k, i, j, n):
    """Bytes each version holds beyond its inputs (float32)."""
    return {
        f"distances {i}x{j}, k={k}": {
            "tensordsl": 4 * i * j,
            "jnp idiom": 4 * i * j * 2,
            "jnp broadcast": 4 * i * j * (k + 1),
        },
        f"Gaussian sum, N={n}": {"tensordsl": 4 * n, "jnp idiom": 4 * n * n + 4 * n},
    }


footprints = {**memory(K, I, J, N), **memory(K, 50_000, 50_000, 50_000)}
print(f"{'case':<32}{'implementation':<16}{'MiB':>14}")
for case, row in footprints.items():
    for name, size in row.items():
        print(f"{case:<32}{name:<16}{size / MiB:14,.2f}")
