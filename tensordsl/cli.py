"""Command line: `python -m tensordsl demo` and `python -m tensordsl explain SOURCE`.

>>> main(["explain", "Y[i] := X[i+k] * W[k]", "--shapes", "X=10", "W=3"])  # doctest: +ELLIPSIS
statement  Y[i] := X[i+k] * W[k]
parsed     Y[i] := X[i + k]*W[k]
...
ranges
  i in [0, X.shape[0] - W.shape[0] + 1) = [0, 8)   free
  k in [0, W.shape[0]) = [0, 3)   reduced
...
gradient of X
  dX[p] = sum_k dY[p - k]*W[k]
    p in [0, 10)
    k in [max(0, p - 7), min(3, p + 1))
...
0
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np

from codegen.progress import BUILDS
from tensordsl.backends import table
from tensordsl.program_kernel import ProgramKernel

DEMO: tuple[tuple[Any, ...], ...] = (
    (
        "matmul",
        "C[i,j] := A[i,k] * B[k,j]",
        "sum",
        {"A": (64, 48), "B": (48, 32)},
        lambda A, B: jnp.einsum("ik,kj->ij", A, B),
    ),
    (
        "pairwise distances",
        "D[i,j] := (W[k,i] - X[k,j])^2",
        "sum",
        {"W": (16, 40), "X": (16, 30)},
        lambda W, X: ((W[:, :, None] - X[:, None, :]) ** 2).sum(0),
    ),
    (
        "1-D convolution",
        "Y[o,i] := X[c,i+k] * W[o,c,k]",
        "sum",
        {"X": (4, 50), "W": (6, 4, 5)},
        lambda X, W: sum(jnp.einsum("ci,oc->oi", X[:, k : k + 46], W[:, :, k]) for k in range(5)),
    ),
    (
        "logsumexp rows",
        "(logsumexp) L[i] := X[i,j]",
        None,
        {"X": (20, 30)},
        lambda X: jnp.log(jnp.exp(X).sum(1)),
    ),
)


def _parse_shapes(items: Sequence[str]) -> dict[str, tuple[int, ...]]:
    """`NAME=D1xD2...` items (`NAME=()` for a scalar) as a dict of shapes."""
    from tensordsl.errors import ShapeError

    shapes = {}
    for item in items:
        name, _, dims = item.partition("=")
        parts = dims.split("x") if dims != "()" else []
        if not name or not dims or not all(part.isdigit() for part in parts):
            raise ShapeError(
                f"--shapes {item!r} is not NAME=D1xD2...",
                expected="a name, '=' and extents (ints >= 0) joined by 'x', "
                "as in W=64x2048, or NAME=() for a scalar",
            )
        if name in shapes:
            raise ShapeError(f"--shapes gives '{name}' twice", expected="one shape per input")
        shapes[name] = tuple(int(part) for part in parts)
    return shapes


def _progress(prefix: str) -> Callable[[str], None]:
    """Report build progress on stderr: rewritten in place on a terminal, one line each else."""
    tty = sys.stderr.isatty()

    def report(line: str) -> None:
        text = f"{prefix}{line}"
        print(f"\r\033[K{text}" if tty else text, end="" if tty else "\n", file=sys.stderr)
        sys.stderr.flush()

    return report


def _built(name: str, seconds: float, cached: set[str]) -> str:
    return "loaded from cache" if name in cached else f"{seconds:.2f} s"


def explain_command(args: argparse.Namespace) -> int:
    from tensordsl.explain.nests import build_nests, range_lines, schedule_lines
    from tensordsl.explain.spelling import label, spelled_nest
    from tensordsl.kernel import kernel

    k = kernel(args.source, reduce=args.reduce)
    shapes = _parse_shapes(args.shapes)
    if isinstance(k, ProgramKernel):
        return _explain_program(k, args, shapes)
    if shapes:
        k.check_shapes(shapes)
    print(f"statement  {args.source}")
    print(f"parsed     {spelled_nest(k.nest, k.spelled)}")
    print(f"inputs     {', '.join(k.inputs)}   output {k.output}   reduction {k.nest.reduction}")
    print("ranges")
    print("\n".join("  " + line for line in range_lines(k.nest, shapes or None)))
    print(k.explain(shapes=shapes or None, target=args.report_target, summary=False))
    print(f"schedules ({args.dtype})")
    lines = schedule_lines(k.nest, dtype=args.dtype, spelled=k.spelled)
    print("\n".join("  " + line for line in lines))
    if args.build:
        cached: set[str] = set()
        with BUILDS.silenced():
            seconds = build_nests(
                k.nest,
                dtype=args.dtype,
                progress=_progress("  "),
                cached=cached,
                spelled=k.spelled,
            )
        if sys.stderr.isatty():
            print(file=sys.stderr)
        print(f"built (c, {args.dtype})")
        for name, elapsed in seconds.items():
            print(f"  {label(name, k.spelled)}: {_built(name, elapsed, cached)}")
    if args.time:
        print(k.profile(shapes, dtype=args.dtype, reps=args.reps))
    if args.source_target:
        for name, text in k.source(args.source_target).items():
            print(f"--- {name} ({args.source_target}) ---")
            print(text)
    return 0


def _explain_program(k: ProgramKernel, args: argparse.Namespace, shapes: dict) -> int:
    """`explain` for a program: its summary and each statement's nests, schedules, code."""
    from tensordsl.explain.nests import build_nests, schedule_lines
    from tensordsl.explain.spelling import label

    print(f"inputs     {', '.join(k.inputs)}   outputs {', '.join(k.outputs)}")
    print(k.explain(shapes=shapes or None, target=args.report_target))
    for n, nest in enumerate(k.program.statements):
        print(f"schedules of statement {n + 1}, {nest.output} ({args.dtype})")
        lines = schedule_lines(nest, dtype=args.dtype, spelled=k.spelled)
        print("\n".join("  " + line for line in lines))
        if args.build:
            cached: set[str] = set()
            with BUILDS.silenced():
                seconds = build_nests(
                    nest,
                    dtype=args.dtype,
                    progress=_progress("  "),
                    cached=cached,
                    spelled=k.spelled,
                )
            if sys.stderr.isatty():
                print(file=sys.stderr)
            print(
                f"built (c, {args.dtype}) "
                + ", ".join(
                    f"{label(m, k.spelled)}: {_built(m, t, cached)}" for m, t in seconds.items()
                )
            )
    if args.time:
        print(k.profile(shapes, dtype=args.dtype, reps=args.reps))
    sources = k.source(args.source_target, shapes or None) if args.source_target else {}
    for name, text in sources.items():
        print(f"--- {name} ({args.source_target}) ---")
        print(text)
    return 0


def demo_command(args: argparse.Namespace) -> int:
    import jax

    from tensordsl.explain.nests import build_nests
    from tensordsl.kernel import Kernel

    jax.config.update("jax_enable_x64", True)
    rng = np.random.default_rng(0)
    kernels = [Kernel(source, reduce=reduce) for _, source, reduce, _, _ in DEMO]
    # Compile every nest first (a cache hit takes milliseconds), reporting each build on
    # stderr, so that the table on stdout comes out in one piece.
    with BUILDS.silenced():
        for (name, *_), k in zip(DEMO, kernels):
            build_nests(k.nest, dtype="float64", progress=_progress(f"{name}: "))
    if sys.stderr.isatty():
        print("\r\033[K", end="", file=sys.stderr)
    print(
        f"{'kernel':<20} {'source':<34} {'fwd rel err':>11} {'grad rel err':>12} {'fwd+bwd ms':>10}"
    )
    failures = 0
    for (name, source, _, shapes, expected), k in zip(DEMO, kernels):
        inputs = [rng.normal(size=shapes[n]) for n in k.inputs]
        forward_error = _relative_error(k(*inputs), expected(*inputs))

        def loss(*values, k=k):
            return (k(*values) ** 2).sum()

        def jnp_loss(*values, expected=expected):
            return (expected(*values) ** 2).sum()

        argnums = tuple(range(len(inputs)))
        ours = jax.jit(jax.grad(loss, argnums))
        grads = ours(*inputs)
        truth = jax.grad(jnp_loss, argnums)(*[jnp.asarray(v) for v in inputs])
        grad_error = max(_relative_error(a, b) for a, b in zip(grads, truth))
        start = time.perf_counter()
        jax.block_until_ready(ours(*inputs))
        elapsed = (time.perf_counter() - start) * 1e3
        ok = forward_error < 1e-10 and grad_error < 1e-8
        failures += not ok
        print(
            f"{name:<20} {source:<34} {forward_error:11.1e} {grad_error:12.1e} {elapsed:10.2f}"
            + ("" if ok else "  MISMATCH")
        )
    print("rel err: max |ours - jax.numpy| / max |jax.numpy|, float64; ms: one jit(grad) call")
    print("all kernels match jax.numpy" if not failures else f"{failures} kernels mismatch")
    return 1 if failures else 0


def _relative_error(ours: Any, expected: Any) -> float:
    """max |ours - expected| / max |expected| (the difference alone where that is 0)."""
    ours, expected = np.asarray(ours), np.asarray(expected)
    scale = float(np.abs(expected).max()) or 1.0
    return float(np.abs(ours - expected).max()) / scale


DESCRIPTION = """\
tensordsl: index expressions compiled to C or CUDA kernels, differentiated inside JAX.
In Python: `import tensordsl as td; k = td.kernel("C[i,j] := A[i,k] * B[k,j]")`.
"""

EXAMPLES = """\
examples:
  %(prog)s demo
  %(prog)s explain "D[i,j] := (W[k,i] - X[k,j])^2" --shapes W=64x300 X=64x200
  %(prog)s explain "(max) M[i] := X[i,j]" --shapes X=4x7 --source c
  %(prog)s explain "Y[i] := X[i+k] * W[k]" --shapes X=1000 W=5 --build --time
  %(prog)s explain "(logsumexp) L[i] := X[i,j]" --shapes X=4096x8192 --target cuda

Kernels build on first use; TENSORDSL_VERBOSE=0 silences the build progress line.
Guide: README.md and docs/ in the source tree.
"""


def main(argv: Sequence[str] | None = None, *, prog: str = "tensordsl") -> int:
    """Run the command line; returns the exit status."""
    from tensordsl import __version__

    formatter = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(
        prog=prog, description=DESCRIPTION, epilog=EXAMPLES, formatter_class=formatter
    )
    parser.add_argument("--version", action="version", version=f"tensordsl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "demo",
        help="build a few kernels, check them against jax.numpy",
        description="Build four kernels and their gradient nests (progress on stderr), then "
        "print a table on stdout: each kernel's forward and gradient error relative to "
        "jax.numpy, and the time of one jit(grad) call.",
    )
    explain = commands.add_parser(
        "explain",
        help="show the nests, ranges and schedules",
        description="Show a statement's (or program's) forward nest, gradient nests, index\n"
        "ranges and schedules; optionally its generated code, build and timings.",
        epilog=EXAMPLES,
        formatter_class=formatter,
    )
    explain.add_argument(
        "source",
        help='an index expression, e.g. "C[i,j] := A[i,k] * B[k,j]"; several statements '
        "separated by ';' make a program",
    )
    explain.add_argument(
        "--shapes",
        nargs="*",
        default=[],
        metavar="NAME=D1xD2",
        help="the shape of each input, e.g. W=64x2048 (NAME=() for a scalar): ranges and "
        "bounds become numbers; needed for --time",
    )
    explain.add_argument(
        "--reduce",
        default=None,
        metavar="REDUCTION",
        help="the reduction of indices not on the left: sum (default), mean, max, min, prod, "
        "logsumexp, argmax, argmin (or a prefix in the source: '(max) M[i] := X[i,j]'; "
        "topk and argtopk as a prefix with k: '(topk 5) V[i,r] := X[i,j]')",
    )
    explain.add_argument(
        "--source",
        dest="source_target",
        choices=table.CODE_TARGETS,
        default=None,
        help="also print the generated code of every nest for this target",
    )
    explain.add_argument(
        "--dtype", default="float32", choices=("float32", "float64"), help="for schedules, --build"
    )
    explain.add_argument(
        "--build", action="store_true", help="compile every C nest now and report the time"
    )
    explain.add_argument(
        "--time", action="store_true", help="time every C nest alone on --shapes (all inputs)"
    )
    explain.add_argument("--reps", type=int, default=7, help="calls per nest for --time")
    explain.add_argument(
        "--target",
        dest="report_target",
        choices=table.REPORT_TARGETS,
        default=None,
        help="also print the static report of every kernel a forward+backward call runs on "
        "--shapes for this target: cuda: grid, block, lanes, FMAs and bytes per output "
        "element, registers; pallas: each nest's tile program (grid, tiles, dots, bounds)",
    )
    args = parser.parse_args(argv)
    from tensordsl.errors import TensorDSLError

    try:
        return demo_command(args) if args.command == "demo" else explain_command(args)
    except TensorDSLError as error:
        print(f"{type(error).__name__}: {error}", file=sys.stderr)
        return 2
