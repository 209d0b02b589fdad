# %% [markdown]
# # 01 — Quickstart
#
# A layer is one index expression. `td.kernel` parses and checks it; the first call compiles
# a C function for it (cached on disk), and `jax.grad` runs a *generated gradient nest* per
# input. This notebook builds three kernels — a matrix product, pairwise squared distances and
# a 1-D convolution — prints their forward and gradient nests with `explain()`, and checks
# every output and gradient against `jax.grad` of the same computation written in `jax.numpy`.
#
# The twin of this notebook is `01_quickstart.py`; `python notebooks/sync.py` regenerates the
# `.ipynb` from it.

# %%
import jax
import jax.numpy as jnp
import numpy as np

import tensordsl as td

# float64, so that the checks against jax.numpy can be tight (kernels work in float32 too).
jax.config.update("jax_enable_x64", True)
rng = np.random.default_rng(0)
gradient_errors = {}  # largest relative error of every gradient, filled in below


def relative_error(ours, theirs):
    """Largest absolute difference, relative to the largest magnitude of the reference."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    return float(np.abs(ours - theirs).max() / max(np.abs(theirs).max(), 1e-300))


def check(name, kernel, reference, *inputs):
    """Compare the kernel with a jnp reference: the output, and the gradient of every input
    (the vector-Jacobian product with a random cotangent, through `jax.grad` of both)."""
    expected = jax.jit(reference)(*inputs)
    assert relative_error(kernel(*inputs), expected) < 1e-12
    cotangent = rng.normal(size=np.shape(expected))
    argnums = tuple(range(len(inputs)))
    ours = jax.jit(jax.grad(lambda *a: jnp.sum(kernel(*a) * cotangent), argnums))(*inputs)
    theirs = jax.jit(jax.grad(lambda *a: jnp.sum(reference(*a) * cotangent), argnums))(*inputs)
    for input_name, a, b in zip(kernel.inputs, ours, theirs):
        gradient_errors[f"{name}: d{input_name}"] = error = relative_error(a, b)
        print(f"{name}: gradient of {input_name} {np.shape(a)}, relative error {error:.1e}")
        assert error < 1e-10


# %% [markdown]
# ## Matrix multiplication
#
# `C[i,j] := A[i,k] * B[k,j]`: `i` and `j` are on the left, so they are the output's axes
# (*free indices*); `k` is not, so it is summed over (a *reduced index*). Extents come from
# the shapes of the inputs.

# %%
matmul = td.kernel("C[i,j] := A[i,k] * B[k,j]")
A, B = rng.normal(size=(30, 20)), rng.normal(size=(20, 10))
C = matmul(A, B)
print(type(C).__name__, C.shape, C.dtype)
print(matmul.explain())

# %% [markdown]
# Each input gets its own gradient nest: `dA[i,k] = sum_j dC[i,j]*B[k,j]` is itself a
# matrix product. It accumulates in a register and writes every element once.

# %%
check("matmul", matmul, lambda A, B: A @ B, A, B)

# %% [markdown]
# ## Pairwise squared distances
#
# `D[i,j] := (W[k,i] - X[k,j])^2` is `sum_k (W[k,i] - X[k,j])^2`. Written in `jax.numpy` it
# builds a `k × i × j` temporary; the kernel never does — the nest loops over `k` in
# registers. `explain(shapes=...)` shows the bounds as numbers.

# %%
distances = td.kernel("D[i,j] := (W[k,i] - X[k,j])^2")
W, X = rng.normal(size=(8, 40)), rng.normal(size=(8, 30))
print(distances.explain(shapes={"W": W.shape, "X": X.shape}))
check(
    "distances",
    distances,
    lambda W, X: jnp.sum((W[:, :, None] - X[:, None, :]) ** 2, axis=0),
    W,
    X,
)

# %% [markdown]
# ## A 1-D convolution
#
# `Y[o,i] := X[c,i+k] * W[o,c,k]` reads `X` at a shifted index. Ranges follow Tullio's rule:
# `i` gets every value for which `i+k` stays inside `X` for all `k`, so the output has
# `N - K + 1` positions (a "valid" convolution). The gradient of `X` solves `p = i + k` for
# `i`, giving `dX[c,p] = sum_{o,k} dY[o,p-k]*W[o,c,k]` with bounds that keep `p - k` in range.

# %%
conv = td.kernel("Y[o,i] := X[c,i+k] * W[o,c,k]")
X, W = rng.normal(size=(3, 50)), rng.normal(size=(4, 3, 5))
print(conv(X, W).shape)  # (4, 50 - 5 + 1)
print(conv.explain(shapes={"X": X.shape, "W": W.shape}))


def conv_reference(X, W):
    """The same valid cross-correlation with XLA's convolution (batch of one)."""
    return jax.lax.conv_general_dilated(X[None], W, window_strides=(1,), padding="VALID")[0]


check("conv1d", conv, conv_reference, X, W)

# %% [markdown]
# ## Under `jax.jit`, and the generated code
#
# Kernels are ordinary JAX functions: they work under `jax.jit`, `jax.grad`, `jax.vmap` and
# forward mode (`jax.jvp`, `jax.jacfwd`, `jax.hessian`). `k.source("c")` returns
# the generated C of every nest; `python -m tensordsl explain SRC --shapes ... --source c`
# prints it from the command line.

# %%
step = jax.jit(jax.grad(lambda W, X: jnp.sum(conv(X, W) ** 2)))
expected = jax.grad(lambda W, X: jnp.sum(conv_reference(X, W) ** 2))(W, X)
assert relative_error(step(W, X), expected) < 1e-10
sources = conv.source("c")
print(list(sources))
print("\n".join(sources["grad_X"].splitlines()[:5]))
print(
    f"checked {len(gradient_errors)} gradients; largest relative error "
    f"{max(gradient_errors.values()):.1e}"
)
