# %% [markdown]
# # 02 — Layers as index expressions, and a model trained end to end
#
# The usual layers, each written as one or two index expressions and checked against
# `jax.numpy`: an MLP block, multi-head attention (scores and the weighted sum), a 2-D
# convolution, an RBF (distance) layer and LayerNorm statistics. Then a small classifier built
# from these kernels is trained with plain JAX (SGD) on synthetic data, beside the same model
# written in `jax.numpy`, and both loss curves are saved next to the notebook as
# `02_layers_loss.png`.
#
# One rule to keep in mind: **the reduction applies to the whole right-hand side**.
# `Y[b,j] := relu(X[b,k] * W[k,j])` is `sum_k relu(X[b,k]*W[k,j])`, not `relu(X @ W)`. A
# nonlinearity of a sum is therefore two statements: two kernels, a kernel and a `jax.numpy`
# call, or one kernel of two statements (a *program*, below).

# %%
import os

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

import tensordsl as td

jax.config.update("jax_enable_x64", True)  # float64: the checks below compare to 1e-10
rng = np.random.default_rng(0)
STEPS = int(os.environ.get("TENSORDSL_NOTEBOOK_STEPS", "300"))  # SGD steps (the tests run 120)


def assert_close(ours, theirs, tolerance=1e-10):
    """Largest difference relative to the largest magnitude of the reference."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    error = float(np.abs(ours - theirs).max() / np.abs(theirs).max())
    assert error < tolerance, error
    return error


# %% [markdown]
# ## MLP block
#
# `relu(X @ W1 + c) @ W2`: a matrix product, then one kernel that adds the bias, applies the
# ReLU and multiplies by `W2` — the ReLU sits *inside* the second sum, over `k`, where it
# belongs.

# %%
matmul = td.kernel("C[i,j] := A[i,k] * B[k,j]")
relu_matmul = td.kernel("Y[b,j] := relu(H[b,k] + c[k]) * W[k,j]")


def mlp_block(X, W1, c, W2):
    return relu_matmul(matmul(X, W1), c, W2)


X = rng.normal(size=(16, 8))
W1, c, W2 = rng.normal(size=(8, 32)), rng.normal(size=32), rng.normal(size=(32, 4))
print(relu_matmul.explain())
assert_close(mlp_block(X, W1, c, W2), jax.nn.relu(X @ W1 + c) @ W2)

# %% [markdown]
# ## Multi-head attention
#
# Scores `S[h,i,j] = scale * sum_d Q[h,i,d] K[h,j,d]` (a scalar input, `scale`, is passed as
# a Python float), a softmax over `j` in `jax.numpy`, then the weighted sum of the values.

# %%
scores = td.kernel("S[h,i,j] := Q[h,i,d] * K[h,j,d] * scale")
weighted_sum = td.kernel("O[h,i,d] := P[h,i,j] * V[h,j,d]")
print(scores.inputs, weighted_sum.inputs)


def attention(Q, K, V):
    P = jax.nn.softmax(scores(Q, K, 1 / np.sqrt(Q.shape[-1])), axis=-1)
    return weighted_sum(P, V)


def attention_reference(Q, K, V):
    S = jnp.einsum("hid,hjd->hij", Q, K) / np.sqrt(Q.shape[-1])
    return jnp.einsum("hij,hjd->hid", jax.nn.softmax(S, axis=-1), V)


Q, K, V = (rng.normal(size=(2, 6, 4)) for _ in range(3))
assert_close(attention(Q, K, V), attention_reference(Q, K, V))

# %% [markdown]
# ## 2-D convolution layer
#
# Channels in `c`, out `o`, a `dy × dx` window; the output is the "valid" part, of size
# `(H - KH + 1) × (W - KW + 1)`, by the range rule (see the user guide).

# %%
conv2d = td.kernel("Y[o,y,x] := I[c,y+dy,x+dx] * K[o,c,dy,dx]")
image, filters, bias = (
    rng.normal(size=(3, 12, 10)),
    rng.normal(size=(5, 3, 3, 3)),
    rng.normal(size=5),
)


def conv_layer(image, filters, bias):
    return jax.nn.relu(conv2d(image, filters) + bias[:, None, None])


reference = jax.lax.conv_general_dilated(image[None], filters, (1, 1), "VALID")[0]
print(conv_layer(image, filters, bias).shape)  # (5, 10, 8)
assert_close(conv_layer(image, filters, bias), jax.nn.relu(reference + bias[:, None, None]))

# %% [markdown]
# ## RBF (distance) layer
#
# Squared distances from every point to every centre, then a Gaussian of the distance. The
# exponential comes *after* the sum over `d`, so it is a `jax.numpy` call (inside the kernel
# it would be `sum_d exp(...)`, a different function).

# %%
distances = td.kernel("D[i,j] := (X[i,d] - C[j,d])^2")


def rbf(X, C, width):
    return jnp.exp(-distances(X, C) / (2 * width**2))


points, centres = rng.normal(size=(10, 2)), rng.normal(size=(7, 2))
expected = np.exp(-((points[:, None, :] - centres[None, :, :]) ** 2).sum(-1) / (2 * 0.5**2))
assert_close(rbf(points, centres, 0.5), expected)

# %% [markdown]
# ## LayerNorm statistics
#
# The mean and the (biased) variance of every row, as two kernels; `F`, the number of
# features, is a scalar input. The normalisation itself is elementwise `jax.numpy`.

# %%
row_mean = td.kernel("M[b] := X[b,f] / F")
row_variance = td.kernel("V[b] := (X[b,f] - M[b])^2 / F")


def layer_norm(X, eps=1e-5):
    F = X.shape[1]
    M = row_mean(X, F)
    V = row_variance(X, M, F)
    return (X - M[:, None]) * jax.lax.rsqrt(V[:, None] + eps)


rows = rng.normal(size=(5, 9)) * 3 + 1
assert_close(row_mean(rows, 9), rows.mean(1))
assert_close(row_variance(rows, rows.mean(1), 9), rows.var(1))
assert_close(
    layer_norm(rows),
    (rows - rows.mean(1, keepdims=True)) / np.sqrt(rows.var(1, keepdims=True) + 1e-5),
)

# %% [markdown]
# ## Layers as programs: several statements in one kernel
#
# A kernel may hold several statements, each with its own reduction; later ones read earlier
# ones' outputs. LayerNorm is then one kernel, and so is causal attention, written as its
# definition: scores, their logsumexp, the weighted sum. At each call, a cost model decides
# which intermediates are recomputed where they are read instead of stored (the `(H, T, T)`
# scores are, forwards and backwards; the causal mask bounds the loops). On the C
# back end the logsumexp and the weighted sum run in one pass over the scores (online
# softmax, as FlashAttention's forward). The explain tool says what runs for given shapes.

# %%
layer_norm_program = td.kernel("""
    M[b] := X[b,f] / F
    V[b] := (X[b,f] - M[b])^2 / F
    N[b,f] := (X[b,f] - M[b]) * rsqrt(V[b] + eps)
""")
assert_close(layer_norm_program(rows, 9.0, 1e-5), layer_norm(rows))

causal_attention = td.kernel("""
    S[h,i,j] := Q[h,i,d] * K[h,j,d] * scale + where(j <= i, 0, -inf)
    (logsumexp) L[h,i] := S[h,i,j]
    O[h,i,e] := exp(S[h,i,j] - L[h,i]) * V[h,j,e]
""")


def causal_attention_reference(Q, K, V, scale):
    S = jnp.einsum("hid,hjd->hij", Q, K) * scale
    S = jnp.where(jnp.tril(jnp.ones(S.shape[1:], bool)), S, -jnp.inf)
    return jnp.einsum("hij,hje->hie", jax.nn.softmax(S, axis=-1), V)


Q, K, V = (rng.normal(size=(2, 12, 4)) for _ in range(3))
assert_close(causal_attention(Q, K, 0.5, V), causal_attention_reference(Q, K, V, 0.5))
ours = jax.grad(lambda q, k, v: causal_attention(q, k, 0.5, v).sum(), (0, 1, 2))(Q, K, V)
theirs = jax.grad(lambda q, k, v: causal_attention_reference(q, k, v, 0.5).sum(), (0, 1, 2))(
    Q, K, V
)
for got, want in zip(ours, theirs):
    assert_close(got, want)
shapes = {"Q": Q.shape, "K": K.shape, "scale": (), "V": V.shape}
for line in causal_attention.explain(shapes).splitlines():
    if line.startswith(("fused for", "one pass")):
        print(line)

# %% [markdown]
# ## A small model, trained end to end
#
# Three interleaved noisy spirals in the plane, one class each, 100 points per class to
# train on and as many held out. The model: an RBF layer with learned centres, LayerNorm,
# the MLP block, and a cross-entropy loss whose `logsumexp` is a kernel too
# (`reduce="logsumexp"`). Every layer's gradient is a generated gradient nest.

# %%
logsumexp = td.kernel("L[i] := Z[i,j]", reduce="logsumexp")


def spirals(n_per_class, classes=3, noise=0.2, turns=5.0):
    t = rng.uniform(0.25, 1.0, size=(classes, n_per_class))
    angle = turns * t + 2 * np.pi * np.arange(classes)[:, None] / classes
    xy = np.stack([t * np.cos(angle), t * np.sin(angle)], -1) * 2
    xy += noise * rng.normal(size=xy.shape)
    return xy.reshape(-1, 2), np.repeat(np.arange(classes), n_per_class)


def model(params, X):
    features = layer_norm(rbf(X, params["centres"], 0.5))
    return mlp_block(features, params["W1"], params["c"], params["W2"])


def loss(params, X, labels):
    logits = model(params, X)
    return jnp.mean(logsumexp(logits) - logits[jnp.arange(len(labels)), labels])


points, labels = spirals(100)
held_out, held_out_labels = spirals(100)
params = {
    "centres": points[rng.choice(len(points), 24, replace=False)],
    "W1": rng.normal(size=(24, 32)) / np.sqrt(24),
    "c": np.zeros(32),
    "W2": rng.normal(size=(32, 3)) / np.sqrt(32),
}

# %% [markdown]
# Before training, the gradient of the loss with respect to every parameter is compared with
# `jax.grad` of the same model written in `jax.numpy` only.


# %%
def loss_reference(params, X, labels):
    squared = ((X[:, None, :] - params["centres"][None, :, :]) ** 2).sum(-1)
    features = jnp.exp(-squared / (2 * 0.5**2))
    mean = features.mean(1, keepdims=True)
    features = (features - mean) * jax.lax.rsqrt(features.var(1, keepdims=True) + 1e-5)
    logits = jax.nn.relu(features @ params["W1"] + params["c"]) @ params["W2"]
    return jnp.mean(jax.nn.logsumexp(logits, axis=1) - logits[jnp.arange(len(labels)), labels])


value_and_grad = jax.jit(jax.value_and_grad(loss))
value, gradients = value_and_grad(params, points, labels)
expected_value, expected = jax.jit(jax.value_and_grad(loss_reference))(params, points, labels)
assert_close(value, expected_value)
for name in params:
    print(f"gradient of {name}: relative error {assert_close(gradients[name], expected[name]):.1e}")

# %% [markdown]
# Plain SGD, full batch, `STEPS` steps (300) at a learning rate of 0.05, from the same initial
# parameters for both models: the tensordsl model (`loss`) and the `jax.numpy` one
# (`loss_reference`). In float64 the two losses should agree to rounding at every step.


# %%
def train(loss_fn, params, steps=STEPS, learning_rate=0.05):
    @jax.jit
    def sgd_step(params):
        value, gradients = jax.value_and_grad(loss_fn)(params, points, labels)
        return value, jax.tree.map(lambda p, g: p - learning_rate * g, params, gradients)

    losses = []
    for _ in range(steps):
        value, params = sgd_step(params)
        losses.append(float(value))
    return params, losses


def accuracy_of(params, X, labels):
    return float(jnp.mean(jnp.argmax(model(params, X), 1) == labels))


trained, losses = train(loss, params)
_, losses_reference = train(loss_reference, params)
accuracy = accuracy_of(trained, points, labels)
held_out_accuracy = accuracy_of(trained, held_out, held_out_labels)
curve_difference = max(abs(a - b) for a, b in zip(losses, losses_reference))
half = STEPS // 2
print(f"loss {losses[0]:.3f}, {losses[half]:.3f} at step {half}, {losses[-1]:.3f} at step {STEPS}")
print(f"accuracy: {accuracy:.0%} on the training points, {held_out_accuracy:.0%} held out")
print(f"largest difference between the two loss curves: {curve_difference:.1e}")
assert losses[-1] < 0.8 * losses[half] and curve_difference < 1e-8

# %%
figure, axes = plt.subplots(figsize=(6, 3.5))
axes.plot(losses_reference, label="jax.numpy", linewidth=4, alpha=0.4)
axes.plot(losses, label="tensordsl", linewidth=1.2)
axes.set(xlabel="SGD step", ylabel="cross-entropy (nats), log scale", yscale="log")
axes.set_title("spirals: RBF + LayerNorm + MLP, same data, same initial parameters")
axes.legend()
figure.tight_layout()
figure.savefig("02_layers_loss.png", dpi=100)  # Jupyter also shows the figure inline
