# %% [markdown]
# # 03 — Performance against `jax.numpy` on the CPU
#
# Forward time, forward + backward time and peak memory of tensordsl's C kernels next to the
# same computation in `jax.numpy` / `jax.lax` (compiled by XLA). The numbers are **not run
# here**: they are read from `benchmarks/results/cpu.json`, written by
#
#     python -m benchmarks.run_cpu
#
# which also writes the table in `benchmarks/RESULTS.md` and documents the method (medians of
# repeated `jax.jit` calls, peak resident-set growth in a fresh process per measurement).
# Re-run it on your machine to get your own numbers; this notebook then plots those.

# %%
import json
import math
import pathlib

import matplotlib.pyplot as plt
import numpy as np

import tensordsl


def find_results(name="benchmarks/results/cpu.json"):
    """The results file: searched from the current folder upwards, then next to the
    tensordsl package (an editable install from a checkout)."""
    here = pathlib.Path.cwd().resolve()
    package_root = pathlib.Path(tensordsl.__file__).resolve().parents[1]
    for folder in (here, *here.parents, package_root):
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"{name} not found: run `python -m benchmarks.run_cpu` in a checkout")


results_path = find_results()
results = json.loads(results_path.read_text())
machine = results["machine"]
print(f"numbers from {results_path}")
print(f"measured {machine['date']} on {machine['model']} ({machine['cpus']} CPUs)")
print(f"jax {machine['jax']}, numpy {machine['numpy']}, Python {machine['python']}")
print(f"C compiler: {machine['cc']}, flags {machine['cflags']}")
print(
    f"load average before/after: {machine['load_before'][0]:.2f} / {machine['load_after'][0]:.2f}"
)

# %% [markdown]
# ## The table
#
# Median times in milliseconds and peak memory growth in MiB; `ours/XLA` below 1 means
# tensordsl is faster (or smaller). A cell the benchmark could not measure (an error, or a
# mode an implementation does not have) is shown as `n/a`, with the reason below the table.

# %%
OURS, XLA = "tensordsl C", "XLA"
MODES = ("fwd", "fwd+bwd")


def seconds(row, implementation, mode):
    cell = row["impls"].get(implementation, {}).get(mode)
    return cell["median_s"] if isinstance(cell, dict) else math.nan


def mebibytes(row, implementation, mode):
    value = row["memory"].get(implementation, {}).get(mode)
    return value / 2**20 if isinstance(value, (int, float)) else math.nan


def show(value, digits=2):
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


cases = [row["case"] for row in results["rows"]]
times = {
    (impl, mode): [seconds(r, impl, mode) * 1e3 for r in results["rows"]]
    for impl in (OURS, XLA)
    for mode in MODES
}
memory = {
    (impl, mode): [mebibytes(r, impl, mode) for r in results["rows"]]
    for impl in (OURS, XLA)
    for mode in MODES
}

columns = ("ours ms", "XLA ms", "ours/XLA", "ours MiB", "XLA MiB")
print(f"{'case':<36}{'mode':<9}" + "".join(f"{c:>10}" for c in columns))
for n, case in enumerate(cases):
    for mode in MODES:
        ours, xla = times[OURS, mode][n], times[XLA, mode][n]
        print(
            f"{case:<36}{mode:<9}{show(ours):>10}{show(xla):>10}{show(ours / xla, 3):>10}"
            f"{show(memory[OURS, mode][n], 1):>10}{show(memory[XLA, mode][n], 1):>10}"
        )
for row in results["rows"]:
    for impl in (OURS, XLA):
        for mode in MODES:
            for what, cell in (
                ("time", row["impls"].get(impl, {}).get(mode)),
                ("memory", row["memory"].get(impl, {}).get(mode)),
            ):
                if isinstance(cell, str):
                    print(f"n/a: {row['case']}, {impl} {mode} {what}: {cell}")

# %% [markdown]
# ## As a bar chart
#
# Log scales: the cases span three orders of magnitude. The chart is saved next to the
# notebook as `03_performance.png`.

# %%
figure, panels = plt.subplots(1, 3, figsize=(15, 4.5))
positions = np.arange(len(cases))
charts = (
    ("forward time (ms)", times, "fwd"),
    ("forward + backward time (ms)", times, "fwd+bwd"),
    ("peak memory growth, fwd + bwd (MiB)", memory, "fwd+bwd"),
)
for axes, (title, table, mode) in zip(panels, charts):
    for offset, impl, label in ((-0.2, OURS, "tensordsl (C)"), (0.2, XLA, "jax.numpy (XLA)")):
        axes.bar(positions + offset, table[impl, mode], width=0.4, label=label)
    axes.set_yscale("log")
    axes.set_title(title)
    axes.set_xticks(positions, cases, rotation=35, ha="right", fontsize=8)
panels[0].legend()
figure.suptitle(
    f"{machine['model']}, {machine['cpus']} CPUs, {machine['date'][:10]} "
    f"(from {results_path.parent.name}/{results_path.name})"
)
figure.tight_layout()
figure.savefig("03_performance.png", dpi=100)  # Jupyter also shows the figure inline
