"""Long tile cases of the C emitter as functions of their own.

A tiled nest runs up to six variants of its tile body (interior, edge, reduced edge; each
for full and partial tiles), all inside one OpenMP loop, that is inside one function for the
compiler. gcc's dataflow passes ("df live regs") grow faster than linearly with a function's
size: the second-order nests of a Hessian-vector product through attention (an exponential
and three inner sums per term, 100-200 KB of C) spent most of their build there. A case
body of at least `OUTLINE_LINES` lines becomes a `static`, never inlined function that
reads the operands and parameters again from the entry point's arguments and takes the
loop variables it uses; the entry point calls it once per tile, which costs nothing
measurable next to a tile's reduction.
"""

from __future__ import annotations

from collections.abc import Iterable

from codegen.emit.emitter import Emitter, Lines, block_lines

#: A tile case body of at least this many lines is emitted as a function of its own.
OUTLINE_LINES = 150


def outlined_call(e: Emitter, body: Lines, names: Iterable[tuple[str, str]]) -> Lines:
    """`body` itself when short; else a call to a new function (kept in `e.outlined`) that
    runs it, passing every variable of `names` (name, type; the first of repeated names).

    `names` are the variables the tile's grid, its tiles and its padded copies declare,
    recorded as they are written (`codegen.c.tiles.tiles.tiled`,
    `codegen.c.tiles.padding.Prepared.declared`), all in scope where the case runs. They
    are passed whether or not the case reads them: the emitter never searches what it wrote
    (issue 34), and an unread parameter of a static function costs nothing measurable."""
    if len(body) < OUTLINE_LINES:
        return body
    args = tuple(dict(names).items())
    name = f"tdsl_case{len(e.outlined)}_"
    e.outlined.append((name, args, tuple(body)))
    return [f"{name}({', '.join(('out', 'operands', 'params', *(n for n, _ in args)))});"]


def outlined_functions(e: Emitter, prologue: Lines) -> Lines:
    """The definitions of `e.outlined`, each starting with the entry point's `prologue`."""
    lines: Lines = []
    for name, args, body in e.outlined:
        params = ", ".join(
            ("void *out", "const void *const *operands", "const int64_t *params")
            + tuple(f"{ctype} {a}".replace("* ", "*") for a, ctype in args)
        )
        head = f"static __attribute__((noinline)) void {name}({params})"
        lines += [*block_lines(head, [*prologue, *body]), ""]
    return lines
