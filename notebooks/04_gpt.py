"""Notebook 04: a GPT-style decoder written with tensordsl, trained beside the same model in
jax.numpy (the .ipynb is generated from this file by notebooks/sync.py)."""

# %% [markdown]
# # 04 — A GPT decoder, end to end
#
# A small character-level GPT: token and position embeddings, pre-norm blocks with causal
# multi-head attention and a GELU MLP, dropout, a lm_head tied to the token embedding, and
# the cross-entropy loss. Every layer is written the way a user would write it with
# tensordsl — the ready layers of `tensordsl.nn` where one exists, and index expressions
# (`td.kernel`, `td.program`) for the rest — and the same model is written in `jax.numpy`.
# Both are trained with optax's Adam from the same initial parameters on the same batches,
# on a few fables written for this repository (`notebooks/data/fables.txt`, public domain).
# The loss curves are plotted side by side, and the tensordsl model writes a sample.
#
# `TENSORDSL_NOTEBOOK_STEPS` sets the number of training steps (the test suite runs a few).

# %%
import os
import pathlib
import time

import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import optax

import tensordsl as td

STEPS = int(os.environ.get("TENSORDSL_NOTEBOOK_STEPS", "600"))
LAYERS, WIDTH, HEADS, SEQ, BATCH = 2, 64, 4, 48, 16
DROPOUT = 0.1


def data_folder() -> pathlib.Path:
    """notebooks/data, from a checkout (`__file__` is unset in a notebook kernel)."""
    here = pathlib.Path(globals().get("__file__", "04_gpt.py")).resolve().parent
    for folder in (here, pathlib.Path.cwd(), pathlib.Path.cwd() / "notebooks"):
        if (folder / "data" / "fables.txt").is_file():
            return folder / "data"
    raise FileNotFoundError("notebooks/data/fables.txt: run the notebook from the checkout")


text = (data_folder() / "fables.txt").read_text()
chars = sorted(set(text))
VOCAB = len(chars)
ids = np.array([chars.index(c) for c in text], np.int32)
print(f"{len(text)} characters, vocabulary of {VOCAB}")

# %% [markdown]
# ## The layers
#
# `td.nn` has the layers every model needs (`layer_norm`, `dense`, `attention`,
# `cross_entropy`). The token embedding reads the table through an index array,
# `W[tok[b,t], d]`: a gather, whose gradient sums each row's cotangents deterministically
# (no scatter, no atomics). The MLP is one program of two statements: the hidden layer,
# then GELU inside the second contraction — tensordsl decides whether to store the hidden
# layer or recompute it (`td.explain(mlp)` shows the decision). The lm_head is tied to the
# token embedding: `Z[n,v] := X[n,d] * W[v,d]` reads the table transposed, with no copy.

# %%
mlp = td.program(
    """
    H[n,u] := X[n,f] * W1[f,u]
    G[n,u] := H[n,u] + b1[u]
    Y[n,o] := 0.5 * G[n,u] * (1 + erf(G[n,u] * 0.7071067811865476)) * W2[u,o]
    """
)
embed = td.kernel("E[b,t,d] := W[tok[b,t], d]")  # tok: an index array (a gather)
lm_head = td.kernel("Z[n,v] := X[n,d] * W[v,d]")


def dropout(x, key, rate):
    """Inverted dropout (no key: evaluation, the identity)."""
    if key is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def block_td(p, x, key):
    b, t, d = x.shape
    keys = (None, None) if key is None else jax.random.split(key)
    h = td.nn.layer_norm(x, p["ln1_g"], p["ln1_b"])
    q, k, v = jnp.split(td.nn.dense(h, p["w_qkv"], p["b_qkv"]), 3, axis=-1)
    heads = [a.reshape(b, t, HEADS, d // HEADS) for a in (q, k, v)]
    a = td.nn.attention(*heads, causal=True).reshape(b, t, d)
    x = x + dropout(td.nn.dense(a, p["w_o"], p["b_o"]), keys[0], DROPOUT)
    h = td.nn.layer_norm(x, p["ln2_g"], p["ln2_b"]).reshape(b * t, d)
    y = mlp(X=h, W1=p["w1"], b1=p["b1"], W2=p["w2"]) + p["b2"]
    return x + dropout(y.reshape(b, t, d), keys[1], DROPOUT)


def logits_td(params, tokens, key=None):
    b, t = tokens.shape
    x = embed(W=params["wte"], tok=tokens) + params["wpe"][:t]
    keys = [None] * LAYERS if key is None else list(jax.random.split(key, LAYERS))
    for p, k in zip(params["blocks"], keys):
        x = block_td(p, x, k)
    x = td.nn.layer_norm(x, params["lnf_g"], params["lnf_b"]).reshape(b * t, -1)
    return lm_head(X=x, W=params["wte"]).reshape(b, t, VOCAB)


def loss_td(params, tokens, targets, key=None):
    return td.nn.cross_entropy(logits_td(params, tokens, key), targets).mean()


# %% [markdown]
# ## The same model in `jax.numpy`


# %%
def layer_norm_jnp(x, g, b, eps=1e-5):
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / jnp.sqrt(var + eps) * g + b


def block_jnp(p, x, key):
    b, t, d = x.shape
    keys = (None, None) if key is None else jax.random.split(key)
    h = layer_norm_jnp(x, p["ln1_g"], p["ln1_b"])
    q, k, v = jnp.split(h @ p["w_qkv"] + p["b_qkv"], 3, axis=-1)
    q, k, v = (a.reshape(b, t, HEADS, d // HEADS) for a in (q, k, v))
    a = jax.nn.dot_product_attention(q, k, v, is_causal=True).reshape(b, t, d)
    x = x + dropout(a @ p["w_o"] + p["b_o"], keys[0], DROPOUT)
    h = layer_norm_jnp(x, p["ln2_g"], p["ln2_b"])
    y = jax.nn.gelu(h @ p["w1"] + p["b1"], approximate=False) @ p["w2"] + p["b2"]
    return x + dropout(y, keys[1], DROPOUT)


def logits_jnp(params, tokens, key=None):
    t = tokens.shape[1]
    x = params["wte"][tokens] + params["wpe"][:t]
    keys = [None] * LAYERS if key is None else list(jax.random.split(key, LAYERS))
    for p, k in zip(params["blocks"], keys):
        x = block_jnp(p, x, k)
    return layer_norm_jnp(x, params["lnf_g"], params["lnf_b"]) @ params["wte"].T


def loss_jnp(params, tokens, targets, key=None):
    logits = logits_jnp(params, tokens, key)
    return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()


# %% [markdown]
# ## Parameters, and a check that both models compute the same function


# %%
def init(seed=0):
    rng = np.random.default_rng(seed)

    def normal(*shape, scale=0.02):
        return jnp.asarray(scale * rng.standard_normal(shape), jnp.float32)

    def block():
        ones, zeros = jnp.ones(WIDTH), jnp.zeros(WIDTH)
        return {
            "ln1_g": ones, "ln1_b": zeros, "ln2_g": ones, "ln2_b": zeros,
            "w_qkv": normal(WIDTH, 3 * WIDTH), "b_qkv": jnp.zeros(3 * WIDTH),
            "w_o": normal(WIDTH, WIDTH), "b_o": zeros,
            "w1": normal(WIDTH, 4 * WIDTH), "b1": jnp.zeros(4 * WIDTH),
            "w2": normal(4 * WIDTH, WIDTH), "b2": zeros,
        }  # fmt: skip

    return {
        "wte": normal(VOCAB, WIDTH),
        "wpe": normal(SEQ, WIDTH, scale=0.01),
        "blocks": [block() for _ in range(LAYERS)],
        "lnf_g": jnp.ones(WIDTH),
        "lnf_b": jnp.zeros(WIDTH),
    }


def batches(seed=1):
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(ids) - SEQ - 1, BATCH)
        window = np.stack([ids[s : s + SEQ + 1] for s in starts])
        yield jnp.asarray(window[:, :-1]), jnp.asarray(window[:, 1:])


params0 = init()
tokens, targets = next(batches(seed=99))
started = time.perf_counter()
value_td, grads_td = jax.jit(jax.value_and_grad(loss_td))(params0, tokens, targets)
first_call_s = time.perf_counter() - started
value_jnp, grads_jnp = jax.jit(jax.value_and_grad(loss_jnp))(params0, tokens, targets)
gradient_error = max(
    float(jnp.abs(a - b).max() / (jnp.abs(b).max() + 1e-30))
    for a, b in zip(jax.tree.leaves(grads_td), jax.tree.leaves(grads_jnp))
)
print(f"loss at initialisation: tensordsl {float(value_td):.6f}, jax.numpy {float(value_jnp):.6f}")
print(f"largest relative difference of a gradient: {gradient_error:.2e}")
print(f"first jit(value_and_grad) call, compiling every kernel: {first_call_s:.1f} s")

# %% [markdown]
# ## Training both models the same way
#
# The same optimizer (Adam, gradients clipped to norm 1), the same batches and the same
# dropout keys. The two curves should lie on top of each other up to float32 rounding (the
# kernels sum in other orders).


# %%
def train(loss_fn, steps, seed=0):
    optimizer = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(2e-3))
    params = init(seed)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, tokens, targets, key):
        value, grads = jax.value_and_grad(loss_fn)(params, tokens, targets, key)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, value

    losses, data, key = [], batches(), jax.random.key(0)
    started = time.perf_counter()
    for _ in range(steps):
        key, sub = jax.random.split(key)
        params, state, value = step(params, state, *next(data), sub)
        losses.append(float(value))
    return params, losses, time.perf_counter() - started


params_td, losses_td, seconds_td = train(loss_td, STEPS)
params_jnp, losses_jnp, seconds_jnp = train(loss_jnp, STEPS)
print(f"{STEPS} steps: tensordsl {seconds_td:.1f} s, jax.numpy {seconds_jnp:.1f} s "
      f"(both including their first, compiling call)")  # fmt: skip
print(f"final loss (mean of the last 10 steps): tensordsl {np.mean(losses_td[-10:]):.3f}, "
      f"jax.numpy {np.mean(losses_jnp[-10:]):.3f}")  # fmt: skip

# %%
figure, axis = plt.subplots(figsize=(6, 3.5))
axis.plot(losses_jnp, label="jax.numpy", linewidth=3, alpha=0.5)
axis.plot(losses_td, label="tensordsl", linewidth=1)
axis.set_xlabel("step")
axis.set_ylabel("cross-entropy (nats per character)")
axis.legend()
figure.tight_layout()
figure.savefig("04_gpt_loss.png", dpi=100)

# %% [markdown]
# ## A sample
#
# Characters drawn one at a time from the tensordsl model's softmax (temperature 0.8),
# feeding the last `SEQ` characters back in.


# %%
@jax.jit
def next_logits(params, window):
    return logits_td(params, window[None])[0, -1]


def sample(params, prompt, length, seed=0):
    out = [chars.index(c) for c in prompt]
    key = jax.random.key(seed)
    for _ in range(length):
        window = np.array(out[-SEQ:], np.int32)
        window = np.pad(window, (SEQ - len(window), 0))  # left pad: the last position counts
        key, sub = jax.random.split(key)
        out.append(int(jax.random.categorical(sub, next_logits(params, window) / 0.8)))
    return "".join(chars[i] for i in out)


text_sample = sample(params_td, "The ", 160)
print(text_sample)
