"""Time every C nest a forward+backward runs, one by one, outside JAX: which nest is slow.

Run from the repository root:

    python -m benchmarks.profile_nests                 # the run_cpu cases, full sizes
    python -m benchmarks.profile_nests --quick         # small sizes
    python -m benchmarks.profile_nests --case conv2d   # cases whose name contains "conv2d"
    python -m benchmarks.profile_nests --gpt           # every nest of the GPT-style block(s)

The timing core is the package's (`tensordsl.timing`, also behind `k.profile(shapes)` and
`python -m tensordsl explain SRC --shapes ... --time`): the nests are read off the jaxpr of
`jax.value_and_grad`, compiled with the C back end and called directly on random inputs; each
figure is the median of `--reps` calls. This is a diagnostic for finding the slow gradient
nest, not a results table: run_cpu.py and gpt_block.py are those.
"""

from __future__ import annotations

import argparse

import jax

import tensordsl as td
from benchmarks import gpt_block, layers
from benchmarks.run_cpu import cases
from tensordsl.explain import kernel_nests
from tensordsl.timing import profile_jaxpr


def profile_block(size: layers.BlockSize, reps: int) -> None:
    """Every nest of the block's forward and backward, in the order they run, by kernel."""
    params, x, ct = gpt_block.inputs(size)
    loss = layers.loss_of(layers.block_kernels, ct)
    jaxpr = jax.make_jaxpr(jax.value_and_grad(loss, argnums=(0, 1)))(params, x).jaxpr
    names = {
        nest: f"{name}/{role}"
        for name, kernel in layers.kernels("c").items()
        for role, nest in kernel_nests(kernel.nest).items()
    }
    print(profile_jaxpr(jaxpr, names, reps=reps, dtype="float32"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--case", default="")
    parser.add_argument("--gpt", action="store_true", help="the GPT-style block instead")
    parser.add_argument("--reps", type=int, default=9)
    args = parser.parse_args()
    if args.gpt:
        for size in gpt_block.QUICK_SIZES if args.quick else gpt_block.SIZES:
            print(f"GPT-style block {size}")
            profile_block(size, args.reps)
        return
    for case in cases(args.quick):
        if args.case not in case.name:
            continue
        print(case.name)
        kernel = td.kernel(case.source, backend="c", reduce=case.reduce)
        print(kernel.profile(dict(zip(kernel.inputs, case.shapes)), reps=args.reps))


if __name__ == "__main__":
    main()
