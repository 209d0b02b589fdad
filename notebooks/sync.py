"""Write each notebook's .ipynb from its .py twin (the source of truth), executed, or check
that they agree.

    python notebooks/sync.py                 # rewrite and execute every notebooks/*.ipynb
    python notebooks/sync.py 03_performance  # only the named ones
    python notebooks/sync.py --check         # exit 1 when an .ipynb is stale or unexecuted

A twin is a percent-format script: `# %%` starts a code cell, `# %% [markdown]` a Markdown
cell whose lines are comments (`# ` is stripped). Its cells get stable ids. Executing needs
nbclient and ipykernel (the test extra): the notebook runs in a fresh kernel in notebooks/
(where its figures are saved; git ignores them), with the checkout first on PYTHONPATH and
Jupyter's inline figures, so the .ipynb carries its printed output and its plots as PNG.
Outputs differ from run to run (times, the machine), so `--check` compares the cells'
sources with the twin and checks that every code cell ran, in order, without an error.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

import nbformat

HERE = pathlib.Path(__file__).resolve().parent
MARKER = "# %%"
FIGURE_CALLS = ("plt.subplots(", "plt.figure(")


def metadata() -> dict:
    """The notebook's metadata: the kernel, and the language's name only (not the versions
    of the Python that executed it)."""
    return {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }


def cells(text: str) -> list[tuple[str, str]]:
    """The (kind, source) cells of a percent-format script; text before the first marker
    (a module docstring, say) is dropped."""
    found: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith(MARKER):
            found.append(("markdown" if "[markdown]" in line else "code", []))
        elif found:
            found[-1][1].append(line)
    result = []
    for kind, lines in found:
        if kind == "markdown":
            lines = [line[2:] if line.startswith("# ") else line.lstrip("#") for line in lines]
        result.append((kind, "\n".join(lines).strip("\n")))
    return result


def notebook(twin: pathlib.Path) -> nbformat.NotebookNode:
    """The notebook of a twin, not executed."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = metadata()
    for n, (kind, source) in enumerate(cells(twin.read_text())):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cell = make(source)
        cell["id"] = f"{twin.stem}-{n:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def execute(nb: nbformat.NotebookNode, folder: pathlib.Path, timeout: int = 1200) -> None:
    """Run every cell of `nb` in a fresh kernel started in `folder`, filling in the outputs."""
    from nbclient import NotebookClient  # the test extra; only writing needs it

    root = str(HERE.parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    os.environ.pop("MPLBACKEND", None)  # the kernel's default, inline figures, gives PNGs
    client = NotebookClient(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(folder)}}
    )
    client.record_timing = False  # no timestamps in the committed file
    client.execute()
    nb.metadata = metadata()


def problems(twin: pathlib.Path, written: str) -> list[str]:
    """What is wrong with the .ipynb text `written` for `twin`: cells that differ from the
    twin's, and code cells that were not run in order, failed, or make a figure and show
    none."""
    nb = nbformat.reads(written, as_version=4)
    found = [(cell.cell_type, cell.source) for cell in nb.cells]
    wanted = cells(twin.read_text())
    if found != wanted:
        n = next((n for n, (a, b) in enumerate(zip(found, wanted)) if a != b), len(wanted))
        return [f"cell {n} differs from the twin (run python notebooks/sync.py {twin.stem})"]
    errors = []
    code = [(n, cell) for n, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    for count, (n, cell) in enumerate(code, 1):
        if cell.execution_count != count:
            errors.append(f"cell {n} has execution count {cell.execution_count}, not {count}")
        if any(output.output_type == "error" for output in cell.outputs):
            errors.append(f"cell {n} raised an error")
        shows = any("image/png" in output.get("data", {}) for output in cell.outputs)
        if any(call in cell.source for call in FIGURE_CALLS) and not shows:
            errors.append(f"cell {n} makes a figure but has no PNG output")
    return errors


def twins(folder: pathlib.Path = HERE) -> list[pathlib.Path]:
    """The notebook twins: `NN_name.py` files."""
    return sorted(p for p in folder.glob("[0-9][0-9]_*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check, write nothing")
    parser.add_argument("names", nargs="*", help="twins to write (default: all), e.g. 02_layers")
    args = parser.parse_args(argv)
    chosen = [t for t in twins() if not args.names or t.stem in args.names]
    if args.names and len(chosen) != len(args.names):
        parser.error(f"unknown notebook among {args.names}: {[t.stem for t in twins()]}")
    failed = False
    for twin in chosen:
        target = twin.with_suffix(".ipynb")
        if args.check:
            found = problems(twin, target.read_text()) if target.exists() else ["missing"]
            for problem in found:
                print(f"{target.name}: {problem}", file=sys.stderr)
            failed = failed or bool(found)
        else:
            nb = notebook(twin)
            execute(nb, HERE)
            target.write_text(nbformat.writes(nb) + "\n")
            print(f"wrote {target.name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
