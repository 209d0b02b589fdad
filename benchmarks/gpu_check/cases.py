"""The cases the timings phase of `benchmarks.gpu_check` measures, at GPU and toy sizes.

`Case.make(emulate)` returns the work the physical limit is computed from (FLOPs, HBM
bytes), the dtype, {implementation: a thunk that runs it once} with ours first, and the
shape as text. Alternatives: jnp at default precision and at HIGHEST, cuDNN attention on a
GPU, torch where it has a CUDA device (SDPA, eager); a missing one is simply not listed.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import layers
from benchmarks.gpu_check import torch_models as gpu_check_torch

HI = jax.lax.Precision.HIGHEST
GPT2 = {"layers": 12, "width": 768, "heads": 12, "seq": 1024, "batch": 8, "vocab": 50257}
TOY_GPT2 = {"layers": 2, "width": 16, "heads": 2, "seq": 8, "batch": 2, "vocab": 37}
SKIP_QUICK = "not measured (--quick)"
OURS = "tensordsl (cuda)"
#: A float32 computation on the same (rounded) inputs that low-precision results are checked
#: against; not timed.
REFERENCE = "float32 reference"
NO_COMPILE = {"torch compiled": "not measured: compiling 12 layers takes longer than the phase"}


@dataclass
class Case:
    """One timed computation: `make(emulate)` returns (FLOPs, bytes, dtype, {impl: fn})
    where fn() runs it once and returns arrays to wait on; the first impl is ours."""

    name: str
    make: Callable[[bool], tuple[float, float, str, dict[str, Callable[[], Any]]]]
    modes: tuple[str, ...] = ("fwd",)
    quick: bool = False  # measured with --quick too
    notes: dict[str, str] = field(default_factory=dict)
    #: False: our generated contraction kernel (TENSORDSL_XLA_CONTRACTIONS=0); True: the
    #: default, where the cuda back end gives pure contractions to XLA's dot (cuBLAS).
    xla_contractions: bool = True


def _rng() -> np.random.Generator:
    return np.random.default_rng(7)


def torch_or_none() -> Any:
    """torch with a CUDA device, or None (also under the emulator)."""
    try:
        import torch
    except Exception:
        return None
    return torch if torch.cuda.is_available() else None


def _grad_fn(f: Callable[..., Any], args: list[Any]) -> Callable[[], Any]:
    """A jitted forward+backward: the gradient of sum(f * fixed weights) w.r.t. all args
    (an `f` that cannot trace raises when the thunk is called, so that only its row fails)."""
    try:
        out = jax.eval_shape(f, *args)
    except Exception as error:
        failure = error

        def fail() -> Any:
            raise failure

        return fail
    weights = jnp.asarray(_rng().uniform(0.5, 1.5, out.shape), out.dtype)
    g = jax.jit(
        jax.grad(
            lambda *a: jnp.sum((f(*a) * weights).astype(jnp.float32)),
            argnums=tuple(range(len(args))),
        )
    )
    return lambda: g(*args)


def _torch_grad_fn(torch: Any, f: Callable[..., Any], args: list[Any]) -> Callable[[], Any]:
    leaves = [a.detach().requires_grad_(True) for a in args]
    weights = torch.rand_like(f(*leaves)) + 0.5

    def run() -> Any:
        return torch.autograd.grad((f(*leaves) * weights).float().sum(), leaves)

    return run


def _device(a: np.ndarray, dtype: Any = jnp.float32) -> Any:
    return jax.device_put(jnp.asarray(a, dtype))


def _modes(
    mode: str,
    ours: Callable[..., Any],
    args: list[Any],
    alternatives: dict[str, Callable[..., Any]],
    torch_f: Callable[..., Any] | dict[str, Callable[..., Any]] | None,
    torch_args: Any,
) -> dict[str, Callable[[], Any]]:
    """{impl: thunk} for `mode` of ours and the jnp alternatives (jitted), and torch's
    (`torch_f`: a function, or {name: function}) on `torch_args()`."""
    found: dict[str, Callable[[], Any]] = {}
    for name, f in {OURS: ours, **alternatives}.items():
        if mode == "fwd":
            jitted = jax.jit(f)
            found[name] = lambda jitted=jitted: jitted(*args)
        else:
            found[name] = _grad_fn(f, args)
    torch = torch_or_none()
    if torch_f is None or torch is None:
        return found
    targs = torch_args()
    for name, f in (torch_f if isinstance(torch_f, dict) else {"torch": torch_f}).items():
        if mode == "fwd":
            found[name] = lambda f=f: f(*targs)
        else:
            found[name] = _torch_grad_fn(torch, f, targs)
    return found


def _to_torch(arrays: list[Any], dtype: str = "float32") -> Callable[[], list[Any]]:
    def convert() -> list[Any]:
        import torch

        kind = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
        return [torch.as_tensor(np.asarray(a, np.float32), device="cuda").to(kind) for a in arrays]

    return convert


def _torch_tokens(tokens: Any) -> Any:
    torch = torch_or_none()
    return None if torch is None else torch.as_tensor(np.asarray(tokens), device="cuda")


def _highest(f: Callable[..., Any]) -> Callable[..., Any]:
    def run(*args: Any) -> Any:
        with jax.default_matmul_precision("highest"):
            return f(*args)

    return run


def _in_float32(f: Callable[..., Any]) -> Callable[..., Any]:
    """`f` computed in float32 on its arguments' values, returned in their dtype."""

    def run(*args: Any) -> Any:
        return f(*[a.astype(jnp.float32) for a in args]).astype(args[0].dtype)

    return run


# --------------------------------------------------------------------------- cases


def matmul(mode: str, dtype: str = "float32") -> Callable[[bool], Any]:
    def make(emulate: bool) -> Any:
        import tensordsl as td

        m, k, n = (48, 40, 56) if emulate else (4096, 4096, 4096)
        a, b = _rng().standard_normal((m, k)), _rng().standard_normal((k, n))
        kind = jnp.dtype(dtype)
        args = [_device(a, kind), _device(b, kind)]
        ours = td.kernel("C[i,j] := A[i,k] * B[k,j]", backend="cuda")
        alts = {
            "jnp (default precision)": lambda x, y: x @ y,
            "jnp (HIGHEST)": lambda x, y: jnp.matmul(x, y, precision=HI),
        }
        if dtype != "float32":
            alts[REFERENCE] = _in_float32(lambda x, y: jnp.matmul(x, y, precision=HI))
        fns = _modes(
            mode,
            lambda x, y: ours(A=x, B=y),
            args,
            alts,
            lambda x, y: x @ y,
            _to_torch([a, b], dtype),
        )
        flops = 2 * m * n * k * (1 if mode == "fwd" else 3)
        traffic = kind.itemsize * (m * k + k * n + m * n) * (1 if mode == "fwd" else 3)
        return flops, traffic, dtype, fns, f"{m}x{k} @ {k}x{n}"

    return make


def pairwise(emulate: bool) -> Any:
    import tensordsl as td

    n, k = (64, 8) if emulate else (16384, 64)
    x, y = _rng().standard_normal((n, k)), _rng().standard_normal((n, k))
    args = [_device(x), _device(y)]
    ours = td.kernel("D[i,j] := (X[i,k] - Y[j,k])^2", backend="cuda")

    def expanded(a: Any, b: Any, precision: Any = None) -> Any:
        cross = jnp.matmul(a, b.T, precision=precision)
        return jnp.sum(a * a, 1)[:, None] + jnp.sum(b * b, 1)[None, :] - 2 * cross

    alts = {
        "jnp |x|^2+|y|^2-2xy (default)": expanded,
        "jnp |x|^2+|y|^2-2xy (HIGHEST)": lambda a, b: expanded(a, b, HI),
    }
    fns = _modes(
        "fwd",
        lambda a, b: ours(X=a, Y=b),
        args,
        alts,
        lambda a, b: __import__("torch").cdist(a, b) ** 2,
        _to_torch([x, y]),
    )
    return 3 * n * n * k, 4 * (2 * n * k + n * n), "float32", fns, f"{n}x{k}, {n}x{k}"


def logsumexp_rows(emulate: bool) -> Any:
    import tensordsl as td

    rows, cols = (16, 300) if emulate else (4096, 8192)
    x = _rng().standard_normal((rows, cols))
    ours = td.kernel("L[i] := X[i,j]", reduce="logsumexp", backend="cuda")
    fns = _modes(
        "fwd",
        lambda a: ours(X=a),
        [_device(x)],
        {"jax.nn.logsumexp": lambda a: jax.nn.logsumexp(a, axis=1)},
        lambda a: __import__("torch").logsumexp(a, 1),
        _to_torch([x]),
    )
    return 4 * rows * cols, 4 * rows * cols, "float32", fns, f"{rows}x{cols}"


def layer_norm(mode: str) -> Callable[[bool], Any]:
    def make(emulate: bool) -> Any:
        b, t, d = (2, 8, 24) if emulate else (8, 1024, 768)
        rng = _rng()
        x, g, beta = (
            rng.standard_normal((b, t, d)),
            1 + 0.1 * rng.standard_normal(d),
            0.1 * rng.standard_normal(d),
        )
        program = layers.programs("cuda")["layer_norm"]

        def ours(x: Any, g: Any, beta: Any) -> Any:
            return program(X=x, F=np.float32(d), eps=np.float32(layers.EPS), g=g, beta=beta)

        def torch_ln(x: Any, g: Any, beta: Any) -> Any:
            import torch

            return torch.nn.functional.layer_norm(x, (d,), g, beta, layers.EPS)

        fns = _modes(
            mode,
            ours,
            [_device(v) for v in (x, g, beta)],
            {"jnp": layers.layer_norm_jnp},
            torch_ln,
            _to_torch([x, g, beta]),
        )
        elements = b * t * d
        return (
            8 * elements * (1 if mode == "fwd" else 3),
            4 * elements * (2 if mode == "fwd" else 5),
            "float32",
            fns,
            f"{b}x{t}x{d}",
        )

    return make


def gaussian(emulate: bool) -> Any:
    import tensordsl as td
    from benchmarks.gaussian import SOURCE

    n = 64 if emulate else 32768
    rng = _rng()
    x, z, b = rng.standard_normal((n, 3)), rng.standard_normal((n, 3)), rng.standard_normal(n)
    ours = td.kernel(SOURCE, backend="cuda")

    def jnp_version(x: Any, z: Any, b: Any) -> Any:
        d2 = jnp.sum((x[:, None, :] - z[None, :, :]) ** 2, -1)
        return jnp.exp(-d2) @ b

    def torch_version(x: Any, z: Any, b: Any) -> Any:
        import torch

        return torch.exp(-(torch.cdist(x, z) ** 2)) @ b

    fns = _modes(
        "fwd",
        lambda x, z, b: ours(X=x, Z=z, B=b),
        [_device(v) for v in (x, z, b)],
        {"jnp": jnp_version},
        torch_version,
        _to_torch([x, z, b]),
    )
    return 12 * n * n, 4 * 7 * n, "float32", fns, f"N {n}"


def attention(mode: str, seq: int, dtype: str) -> Callable[[bool], Any]:
    def make(emulate: bool) -> Any:
        t, e = (16 if seq == 1024 else 32, 8) if emulate else (seq, 64)
        heads, batch = (2, 2) if emulate else (12, 8192 // seq)
        arrays = [_rng().standard_normal((batch, heads, t, e)) for _ in range(3)]
        kind = jnp.dtype(dtype)
        args = [_device(a, kind) for a in arrays]
        program = layers.programs("cuda")["attention"]

        def ours(q: Any, k: Any, v: Any) -> Any:
            return program(Q=q, K=k, V=v, scale=np.asarray(1 / math.sqrt(e), kind))

        def cudnn(q: Any, k: Any, v: Any) -> Any:
            swap = [jnp.swapaxes(a, 1, 2) for a in (q, k, v)]  # (B, T, H, E)
            return jax.nn.dot_product_attention(*swap, is_causal=True, implementation="cudnn")

        def torch_sdpa(q: Any, k: Any, v: Any) -> Any:
            import torch

            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)

        alts = {
            "jnp (default precision)": layers.attention_jnp,
            "jnp (HIGHEST)": _highest(layers.attention_jnp),
        }
        if not emulate:
            alts["jax.nn.dot_product_attention (cudnn)"] = cudnn
        if dtype != "float32":
            alts[REFERENCE] = _in_float32(_highest(layers.attention_jnp))
        fns = _modes(mode, ours, args, alts, torch_sdpa, _to_torch(arrays, dtype))
        flops = 2 * batch * heads * t * t * e * (1 if mode == "fwd" else 3.5)
        size = jnp.dtype(kind).itemsize
        traffic = 4 * batch * heads * t * e * size * (1 if mode == "fwd" else 2.5)
        return flops, traffic, dtype, fns, f"B {batch}, H {heads}, T {t}, E {e}"

    return make


def _block_flops(b: int, t: int, d: int) -> float:
    return 24 * b * t * d * d + 2 * b * t * t * d  # projections and MLP; causal attention


def block(mode: str) -> Callable[[bool], Any]:
    def make(emulate: bool) -> Any:
        size = layers.BlockSize(2, 8, 16, 2) if emulate else layers.BlockSize(8, 1024, 768, 12)
        rng = _rng()
        params = jax.device_put(layers.init_params(size, rng))
        x = jax.device_put(layers.init_input(size, rng))

        def ours(p: Any, x: Any) -> Any:
            return layers.block_programs(p, x, "cuda")

        torch_fns = {"torch eager": gpu_check_torch.flat_block}
        if torch_or_none() is not None:
            torch_fns["torch compiled"] = torch_or_none().compile(gpu_check_torch.flat_block)
        flat = [params[k] for k in gpu_check_torch.KEYS] + [x]
        fns = _modes(mode, ours, [params, x], {"jnp": layers.block_jnp}, torch_fns, _to_torch(flat))
        scale = 1 if mode == "fwd" else 3
        flops = _block_flops(size.batch, size.seq, size.width) * scale
        return flops, 4 * 12 * size.width**2 * scale, "float32", fns, str(size)

    return make


def gpt2(mode: str) -> Callable[[bool], Any]:
    def make(emulate: bool) -> Any:
        c = TOY_GPT2 if emulate else GPT2
        size = layers.BlockSize(c["batch"], c["seq"], c["width"], c["heads"])
        rng = _rng()
        blocks = [layers.init_params(size, rng) for _ in range(c["layers"])]
        params = jax.device_put(
            {
                "blocks": blocks,
                "wte": (0.02 * rng.standard_normal((c["vocab"], c["width"]))).astype(np.float32),
                "wpe": (0.01 * rng.standard_normal((c["seq"], c["width"]))).astype(np.float32),
                "g": np.ones(c["width"], np.float32),
                "b": np.zeros(c["width"], np.float32),
            }
        )
        tokens = jnp.asarray(rng.integers(0, c["vocab"], (c["batch"], c["seq"])))

        def decoder(block_fn: Callable[..., Any]) -> Callable[..., Any]:
            def run(p: Any, tokens: Any = tokens) -> Any:
                x = p["wte"][tokens] + p["wpe"][None]
                x = layers.stack(block_fn)(p["blocks"], x)
                return layers.layer_norm_jnp(x, p["g"], p["b"]) @ p["wte"].T  # tied head

            return run

        ours = decoder(lambda p, x: layers.block_programs(p, x, "cuda"))
        torch_f = {"torch eager": gpu_check_torch.flat_decoder(c["layers"], _torch_tokens(tokens))}
        flat = [params[k] for k in ("wte", "wpe", "g", "b")]
        flat += [p[k] for p in params["blocks"] for k in gpu_check_torch.KEYS]
        fns = _modes(
            mode, ours, [params], {"jnp": decoder(layers.block_jnp)}, torch_f, _to_torch(flat)
        )
        b, t, d, v = c["batch"], c["seq"], c["width"], c["vocab"]
        flops = (c["layers"] * _block_flops(b, t, d) + 2 * b * t * d * v) * (
            1 if mode == "fwd" else 3
        )
        weights = 4 * (c["layers"] * 12 * d * d + v * d)
        return (
            flops,
            weights * (1 if mode == "fwd" else 3),
            "float32",
            fns,
            ", ".join(f"{k} {v}" for k, v in c.items()),
        )

    return make


CASES = (
    Case("matmul 4096^3", matmul("fwd"), ("fwd",), quick=True, xla_contractions=False),
    Case("matmul 4096^3", matmul("fwd+bwd"), ("fwd+bwd",), xla_contractions=False),
    Case("matmul bfloat16 4096^3", matmul("fwd", "bfloat16"), ("fwd",), xla_contractions=False),
    Case("pairwise distances 16384^2, k 64", pairwise),
    Case("row logsumexp 4096 x 8192", logsumexp_rows, quick=True),
    Case("LayerNorm 8x1024x768", layer_norm("fwd"), ("fwd",)),
    Case("LayerNorm 8x1024x768", layer_norm("fwd+bwd"), ("fwd+bwd",), quick=True),
    Case("Gaussian kernel N 32768", gaussian),
    *(
        Case(
            f"causal attention {dtype} T {t}",
            attention(mode, t, dtype),
            (mode,),
            quick=(dtype, t) == ("float32", 1024),
        )
        for dtype in ("float32", "bfloat16")
        for t in (1024, 4096)
        for mode in ("fwd", "fwd+bwd")
    ),
    Case("GPT block B 8, T 1024, D 768", block("fwd"), ("fwd",), quick=True),
    Case("GPT block B 8, T 1024, D 768", block("fwd+bwd"), ("fwd+bwd",)),
    Case("GPT-2 small decoder B 8, T 1024", gpt2("fwd"), ("fwd",), notes=NO_COMPILE, quick=True),
    Case("GPT-2 small decoder B 8, T 1024", gpt2("fwd+bwd"), ("fwd+bwd",), notes=NO_COMPILE),
)
