"""A program that gathers from its own outputs (`L[b] := Z[b,y[b]]` after `Z := ...`) runs
as several programs in turn, each of the statements that can run once the index arrays
before them are known (`tensordsl.frontend.statements.stage_groups`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tensordsl.frontend.statements import quoting, statement_spans


def stages(
    whole: Any,
    groups: tuple[tuple[int, ...], ...],
    reduce: str | None,
    ranges: Mapping[str, int | range] | None,
) -> tuple[Any, ...]:
    """A program that gathers from its own outputs, as programs run in turn
    (`stage_groups`): each is the source with the other statements blanked, so that every
    offset, and every error's caret, is that of the whole program (whose text they show).
    `whole` is the `ProgramKernel`; the stages are of its type (this module is imported by
    `tensordsl.program_kernel`, so it names the class only in words)."""
    source, lowered = whole.source_text, whole._lowered
    spans = statement_spans(source)
    reads = [set(s.nest.operand_names) for s in lowered.statements]
    found = []
    for k, group in enumerate(groups):
        later = set().union(*(reads[n] for g in groups[k + 1 :] for n in g))
        defined = [lowered.statements[n].nest.output for n in group]
        outputs = tuple(n for n in defined if n in later or n in whole.outputs)
        if not outputs:
            continue
        text = list(source)
        for n, (start, stop) in enumerate(spans):
            if n not in group:
                text[start:stop] = " " * (stop - start)
        indices = {r.index.name for n in group for r in lowered.statements[n].ranges}
        inner = {name: choice for name, choice in whole.fuse if name in defined}
        stage = type(whole)(
            "".join(text),
            outputs=outputs,
            reduce=reduce,
            ranges={i: r for i, r in (ranges or {}).items() if i in indices},
            backend=whole.backend,
            nograd=(),
            precision=whole.precision,
            fuse={n: c for n, c in inner.items() if n not in outputs} or True,
        )
        stage.nograd, stage.source_text = frozenset(whole.nograd & set(stage.inputs)), source
        stage._lowered = quoting(stage._lowered, source)
        found.append(stage)
    return tuple(found)
