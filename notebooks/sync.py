"""Write each notebook's .ipynb from its .py twin (the source of truth), or check they agree.

    python notebooks/sync.py           # rewrite notebooks/*.ipynb
    python notebooks/sync.py --check   # exit 1 when an .ipynb differs from its twin

A twin is a percent-format script: `# %%` starts a code cell, `# %% [markdown]` a Markdown
cell whose lines are comments (`# ` is stripped). The .ipynb holds no outputs and gets
stable cell ids, so the same twin always gives the same bytes.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import nbformat

HERE = pathlib.Path(__file__).resolve().parent
MARKER = "# %%"


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


def notebook(twin: pathlib.Path) -> str:
    """The .ipynb text for a twin."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
    }
    for n, (kind, source) in enumerate(cells(twin.read_text())):
        make = nbformat.v4.new_markdown_cell if kind == "markdown" else nbformat.v4.new_code_cell
        cell = make(source)
        cell["id"] = f"{twin.stem}-{n:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nbformat.writes(nb) + "\n"


def twins(folder: pathlib.Path = HERE) -> list[pathlib.Path]:
    """The notebook twins: `NN_name.py` files."""
    return sorted(p for p in folder.glob("[0-9][0-9]_*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    stale = []
    for twin in twins():
        target = twin.with_suffix(".ipynb")
        text = notebook(twin)
        if args.check:
            if not target.exists() or target.read_text() != text:
                stale.append(target.name)
        else:
            target.write_text(text)
    if stale:
        print("out of date (run python notebooks/sync.py): " + ", ".join(stale), file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
