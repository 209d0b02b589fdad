"""Attention with score and mask modifications: `tensordsl.nn.attention` against jax.numpy.

Run from the repository root:

    python -m benchmarks.attention_mods           # rewrites its RESULTS.md section (minutes)
    python -m benchmarks.attention_mods --quick   # tiny sizes, smoke run; writes nothing

Each row is one modification as attention-gym spells it, written with `score_mod`,
`mask_mod` or `mod_args` on the C back end, next to its jnp formulation in the same run:
`jax.nn.dot_product_attention(..., implementation="xla")` with a bias or a mask where it has
one, else the scores written out with einsum and `jax.nn.softmax` (soft-capping). Every row
is causal; B4 H4 T512 E64 float32 (q, k, v in (B, T, H, E), the layout both take). The
forward and the forward+backward (`jax.value_and_grad` of `sum(out * ct)` with respect to
q, k, v and any float table), both under `jax.jit`, medians, implementations in turns
(benchmarks/common.py). One child process per x64 mode (`JAX_ENABLE_X64` off, then on), the
inputs float32 in both. Every result is checked against jax.numpy before it is timed.
The row "plain causal, (B, H, T, E) program" is the same attention as `td.program` on
heads-first arrays, the layout the program is written in (what nn.attention's layout costs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.common import (
    RESULTS_MD,
    by_implementation,
    child_env,
    finish_run,
    header,
    markers,
    median_of,
    mismatches,
    ms,
    over,
    ratio,
    run_child,
    short,
    start_run,
    time_rounds,
    write_outputs,
)

NAME = "attention_mods"
OURS, JNP = "tensordsl", "jax.numpy"
MODES = ("fwd", "fwd+bwd")
TOLERANCE = 2e-3
SHAPE, QUICK = (4, 512, 4, 64), (2, 40, 2, 8)
WINDOW = 128
PROGRAM = """
    S[b,h,i,j] := Q[b,h,i,d] * K[b,h,j,d] * scale + where(j <= i, 0, -inf)
    (logsumexp) L[b,h,i] := S[b,h,i,j]
    O[b,h,i,e] := exp(S[b,h,i,j] - L[b,h,i]) * V[b,h,j,e]
"""


def _xla(q, k, v, **options):
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla", **options)


def _relative(t: int) -> Any:
    i = np.arange(t)
    return i[:, None] - i[None, :] + t - 1


def _softcap(q, k, v):
    scale = 1.0 / np.sqrt(q.shape[-1])
    s = jnp.einsum("bihd,bjhd->bhij", q, k) * scale
    s = 30.0 * jnp.tanh(s / 30.0)
    t = q.shape[1]
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -jnp.inf)
    return jnp.einsum("bhij,bjhe->bihe", jax.nn.softmax(s, -1), v)


@dataclasses.dataclass(frozen=True)
class Row:
    """A modification: nn.attention's keywords (`mod_args` named by `tables`), the jnp
    formulation over (q, k, v, *tables), and the tables (float ones differentiated)."""

    name: str
    options: dict[str, str]
    jnp_fn: Callable[..., Any]
    tables: tuple[str, ...] = ()


def _slopes(h: int) -> np.ndarray:
    return (2.0 ** (-8.0 * (np.arange(h) + 1) / h)).astype(np.float32)


ROWS = (
    Row("plain causal", {}, lambda q, k, v: _xla(q, k, v)),
    Row("plain causal, (B, H, T, E) program", {"program": "yes"}, lambda q, k, v: _xla(q, k, v)),
    Row(
        "ALiBi",
        {"score_mod": "S + slope[h] * (j - i)"},
        lambda q, k, v, slope: _xla(
            q, k, v, bias=slope[:, None, None] * (-_relative(q.shape[1]) + q.shape[1] - 1)
        ),
        ("slope",),
    ),
    Row("soft-cap", {"score_mod": "30 * tanh(S / 30)"}, _softcap),
    Row(
        "relative-bias table",
        {"score_mod": "S + R[h, i - j + {T1}]"},
        lambda q, k, v, R: _xla(q, k, v, bias=R[:, _relative(q.shape[1])]),
        ("R",),
    ),
    Row(
        "document mask",
        {"mask_mod": "doc[b, i] == doc[b, j]"},
        lambda q, k, v, doc: _xla(q, k, v, mask=(doc[:, None, :, None] == doc[:, None, None, :])),
        ("doc",),
    ),
    Row(
        "sliding window",
        {"mask_mod": f"i - j < {WINDOW}"},
        lambda q, k, v: _xla(q, k, v, local_window_size=(WINDOW - 1, 0)),
    ),
)


def inputs(row: Row, shape: tuple[int, ...]) -> dict[str, Any]:
    b, t, h, _ = shape
    rng = np.random.default_rng(3)
    data = {n: (0.5 * rng.standard_normal(shape)).astype(np.float32) for n in "qkv"}
    tables = {
        "slope": _slopes(h),
        "R": (0.3 * rng.standard_normal((h, 2 * t - 1))).astype(np.float32),
        # packed sequences: sorted document ids, documents of random lengths
        "doc": np.sort(rng.integers(0, max(t // 96, 2), (b, t)), axis=1).astype(np.int32),
    }
    return {**data, **{n: tables[n] for n in row.tables}}


def functions(row: Row, impl: str, shape: tuple[int, ...]) -> tuple[Any, Any, tuple[str, ...]]:
    """(forward, forward+backward, argument names), jitted."""
    import tensordsl as td

    names = ("q", "k", "v", *row.tables)
    if impl == JNP:
        fn = row.jnp_fn
    elif "program" in row.options:
        program = td.program(PROGRAM, backend="c", outputs=("O",))
        return _heads_first(program, float(1.0 / np.sqrt(shape[-1])))
    else:
        # the relative table's offset, T - 1, written into the modifier
        options = {key: value.format(T1=shape[1] - 1) for key, value in row.options.items()}

        def fn(q, k, v, *tables):
            args = dict(zip(row.tables, tables))
            return td.nn.attention(
                q, k, v, causal=True, backend="c", mod_args=args or None, **options
            )

    floats = tuple(n for n in names if n != "doc")
    argnums = tuple(names.index(n) for n in floats)

    def loss(*values: Any) -> Any:
        *values, ct = values
        return jnp.sum(fn(*values) * ct)

    return jax.jit(fn), jax.jit(jax.value_and_grad(loss, argnums=argnums)), names


def _heads_first(program: Any, scale: float) -> tuple[Any, Any, tuple[str, ...]]:
    """The program on (B, H, T, E) arrays (the caller transposes the inputs and the check)."""

    def direct(q, k, v):
        out = program(Q=q, K=k, V=v, scale=scale)
        return out[0] if isinstance(out, tuple) else out

    def loss(q, k, v, ct):
        return jnp.sum(direct(q, k, v) * ct)

    return jax.jit(direct), jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2))), ("q", "k", "v")


def run_row(row: Row, shape: tuple[int, ...], budget: float, settle: float) -> dict[str, Any]:
    data = inputs(row, shape)
    heads_first = "program" in row.options
    made = {impl: functions(row, impl, shape) for impl in (OURS, JNP)}
    names = made[JNP][2]
    args = [data[n] for n in names]
    out = np.asarray(made[JNP][0](*args))
    ct = np.random.default_rng(1).standard_normal(out.shape).astype(np.float32)
    want = (out, made[JNP][1](*args, ct))
    ours_args = {JNP: [*args, ct], OURS: [*args, ct]}
    if heads_first:  # the program takes heads-first arrays; compare in the jnp layout
        ours_args[OURS] = [np.ascontiguousarray(np.swapaxes(x, 1, 2)) for x in (*args, ct)]
        want = (
            np.swapaxes(want[0], 1, 2),
            (want[1][0], tuple(np.swapaxes(g, 1, 2) for g in want[1][1])),
        )
    failed: dict[str, dict[str, str]] = {OURS: {}, JNP: {}}
    forward, both, _ = made[OURS]
    for mode, fn, call_args, expected in zip(
        MODES, (forward, both), (ours_args[OURS][:-1], ours_args[OURS]), want
    ):
        try:
            bad = mismatches(fn(*call_args), expected, TOLERANCE)
            if bad:
                failed[OURS][mode] = "error: differs from jax.numpy: " + ", ".join(bad)[:120]
        except Exception as error:  # noqa: BLE001 - reported in the table
            failed[OURS][mode] = "error: " + short(error)
    fns = {}
    for impl in (OURS, JNP):
        fns[(impl, "fwd")] = lambda *a, f=made[impl][0]: f(*a[:-1])
        fns[(impl, "fwd+bwd")] = made[impl][1]
        for mode in failed[impl]:
            del fns[(impl, mode)]
    times = time_rounds(fns, ours_args, budget, settle)
    return {"name": row.name, "impls": by_implementation(times, failed, (OURS, JNP), MODES)}


def child(quick: bool) -> dict[str, Any]:
    """Every row in this process (its x64 mode), with the load average at start and end."""
    import os

    shape = QUICK if quick else SHAPE
    load = os.getloadavg()
    rows = []
    for row in ROWS:
        try:
            rows.append(run_row(row, shape, 0.3 if quick else 3.0, 0.05 if quick else 0.2))
        except Exception as error:  # noqa: BLE001 - reported in the table
            cell = {"error": "error: " + short(error)}
            rows.append(
                {"name": row.name, "impls": {i: dict.fromkeys(MODES, cell) for i in (OURS, JNP)}}
            )
    return {"x64": bool(jax.config.jax_enable_x64), "rows": rows, "load": [load, os.getloadavg()]}


# --------------------------------------------------------------------------- report


def table(runs: list[dict[str, Any]]) -> str:
    lines = [
        "| modification | x64 | fwd ms | jnp fwd ms | fwd ratio | fwd+bwd ms | jnp fwd+bwd ms "
        "| fwd+bwd ratio |",
        "|---|---|--:|--:|--:|--:|--:|--:|",
    ]
    for index in range(len(ROWS)):
        for run in runs:
            if "rows" not in run:
                continue
            row = run["rows"][index]
            impls = row["impls"]
            cells = [
                row["name"],
                "on" if run["x64"] else "off",
                ms(impls[OURS]["fwd"]),
                ms(impls[JNP]["fwd"]),
                ratio(over(median_of(row, OURS, "fwd"), median_of(row, JNP, "fwd"))),
                ms(impls[OURS]["fwd+bwd"]),
                ms(impls[JNP]["fwd+bwd"]),
                ratio(over(median_of(row, OURS, "fwd+bwd"), median_of(row, JNP, "fwd+bwd"))),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def loads(runs: list[dict[str, Any]]) -> str:
    found = []
    for run in runs:
        if "load" in run:
            start, end = (", ".join(f"{v:.2f}" for v in each) for each in run["load"])
            found.append(f"x64 {'on' if run['x64'] else 'off'}: {start} at start, {end} at end")
        else:
            found.append(f"a child failed: {run.get('error')}")
    return "; ".join(found)


def section(runs: list[dict[str, Any]], info: dict[str, Any]) -> str:
    begin, end = markers(NAME)
    b, t, h, e = SHAPE
    return f"""{begin}
## Attention with score and mask modifications against jax.numpy (issue 38)

Generated by `python -m benchmarks.{NAME}` (benchmarks/{NAME}.py); the text between the
{NAME} markers is rewritten by that script.

{header(info)}
- Load average of each child (x64 mode): {loads(runs)}.

`tensordsl.nn.attention(q, k, v, causal=True, score_mod=..., mask_mod=..., backend="c")`,
B={b}, T={t}, H={h}, E={e}, float32, q, k, v in (B, T, H, E), against the jnp formulation:
`jax.nn.dot_product_attention(..., is_causal=True, implementation="xla")` with a bias
(ALiBi `slope[h] * (j - i)`, the relative table `R[h, i - j + T - 1]`), a mask (documents:
`doc[b, i] == doc[b, j]`, sorted ids, documents of random lengths) or `local_window_size`
(a window of {WINDOW} keys, `i - j < {WINDOW}`), else written out with einsum and softmax
(soft-capping, `30 * tanh(S / 30)`). "plain causal, (B, H, T, E) program": the same
attention as one `td.program` on heads-first arrays (both columns time their own layout's
inputs). "fwd+bwd": `jax.value_and_grad` of `sum(out * ct)` with respect to q, k, v and the
float tables. Medians in ms, implementations in turns, one child process per x64 mode
(inputs float32 in both); results checked against jax.numpy first (relative tolerance
{TOLERANCE:g} of the largest magnitude). Ratios are tensordsl / jax.numpy, compared within
one run only: the machine is shared.

{table(runs)}

Targets (issue 38): every modification, forward and forward+backward, at most 1.5x the jnp
formulation with x64 off and with x64 on; float32 with x64 on within 1.1x of x64 off.

Raw numbers: `benchmarks/results/{NAME}.json`.
{end}
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, smoke run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help="where to write (default RESULTS.md)")
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.quick)))
        return 0
    info = start_run()
    runs = []
    for x64 in ("0", "1"):
        env = child_env({"JAX_ENABLE_X64": x64})
        run = run_child(f"benchmarks.{NAME}", ["--child"] + ["--quick"] * args.quick, env)
        run.setdefault("x64", x64 == "1")
        runs.append(run)
        print(table([run]), file=sys.stderr)
    finish_run(info)
    text = section(runs, info)
    print(text)
    out = args.out or (None if args.quick else RESULTS_MD)
    write_outputs(out, NAME, text, {"info": info, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
