"""What gcc's vectoriser reports about generated C: the `#pragma omp simd` loops it could not
vectorise (tests of the emitters' vectorisable forms)."""

from __future__ import annotations

import pathlib
import subprocess

from codegen.c.run.compiler import compile_flags


def unvectorised_simd_loops(source: str, folder: pathlib.Path, reading: str = "") -> list[str]:
    """gcc's reports of the `#pragma omp simd` loops of `source` that it could not vectorise,
    among those whose first lines contain `reading` (all of them for "")."""
    c_file = folder / "nest.c"
    c_file.write_text(source)
    command = ["gcc", *compile_flags(), "-fopt-info-vec-missed", str(c_file), "-o"]
    done = subprocess.run([*command, str(folder / "nest.so")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    lines = source.splitlines()
    pragmas = [
        n + 1
        for n, line in enumerate(lines)
        if line.strip() == "#pragma omp simd" and reading in "\n".join(lines[n : n + 6])
    ]
    simd = {p + k for p in pragmas for k in (1, 2)}  # gcc names the loop's line or its first
    return [
        report
        for report in done.stderr.splitlines()
        if "couldn't vectorize loop" in report and int(report.split(":")[1]) in simd
    ]
