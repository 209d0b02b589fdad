"""Time every C nest a forward+backward runs, one by one, outside JAX: which nest is slow.

Run from the repository root:

    python -m benchmarks.profile_nests                 # the run_cpu cases, full sizes
    python -m benchmarks.profile_nests --quick         # small sizes
    python -m benchmarks.profile_nests --case conv2d   # cases whose name contains "conv2d"
    python -m benchmarks.profile_nests --gpt           # every nest of the GPT-style block(s)

The timing core is the package's (`tensordsl.explain.timing`, also behind `k.profile(shapes)` and
`python -m tensordsl explain SRC --shapes ... --time`): the nests are read off the jaxpr of
`jax.value_and_grad`, compiled with the C back end and called directly on random inputs; each
figure is the median of `--reps` calls. This is a diagnostic for finding the slow gradient
nest, not a results table: run_cpu.py and gpt_block.py are those.
"""

from __future__ import annotations

import argparse

import tensordsl as td
from benchmarks import gpt_block
from benchmarks.run_cpu import cases


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
            print(gpt_block.block_profile(size, args.reps))
        return
    for case in cases(args.quick):
        if args.case not in case.name:
            continue
        print(case.name)
        kernel = td.kernel(case.source, backend="c", reduce=case.reduce)
        print(kernel.profile(dict(zip(kernel.inputs, case.shapes)), reps=args.reps))


if __name__ == "__main__":
    main()
