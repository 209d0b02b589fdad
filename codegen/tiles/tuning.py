"""Tuning as data: the tiles and Triton launch settings of a tile program, and the back end
`auto` prefers on a GPU, per kind of kernel, read from a committed table (`tuning.json`).

A row is keyed by a `TuningKey`: the kind of kernel ("dot": a term is a tile `dot`;
"reduce": elementwise tile code reduced over tiles; "elementwise": no reduced index), the
dtype of its data, the bucket of its reduced extent (the head dim of attention's scores,
the K of a matrix product: the least of `BUCKETS` at or above it) and its mask kind ("none";
"bounded": an affine constraint bounds a reduced loop per tile, as a causal mask does;
"masked": other constraints or guards). It gives the largest free and reduced tiles,
`num_warps`, `num_stages`, the back end `auto` takes for such nests on a GPU ("pallas",
"cuda", or None for today's choice) and where the numbers come from.

The rows come from GPU sweeps (`python -m benchmarks.gpu_check --phases sweep`, which writes
rows in this format); a developer without a GPU never tunes. A key with no row gets
`default_row`: the constants tile programs used before the table (safe everywhere, measured
nowhere), marked "default: no measured row" wherever it is shown.

>>> key = TuningKey("dot", "float32", 64, "none")
>>> row = lookup(key, rows={})
>>> row.free_tile, row.reduced_tile, row.num_warps, row.num_stages, row.measured
(32, 32, 4, 2, False)
>>> bucket(80), bucket(5000), bucket(0)
(128, 1024, 0)
"""

from __future__ import annotations

import functools
import json
import pathlib
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

#: The committed table.
TABLE_PATH = pathlib.Path(__file__).with_name("tuning.json")
#: The format of `tuning.json` this module reads (written by the GPU sweep).
FORMAT = 1
#: Buckets of a reduced extent; the last holds every longer one, 0 is "no reduced index".
BUCKETS = (0, 16, 32, 64, 128, 256, 512, 1024)
MASKS = ("none", "bounded", "masked")
#: The back ends a row may prefer for `auto` on a GPU.
PREFERRED = (None, "pallas", "cuda")
#: What a row without measurements says.
NO_ROW = "default: no measured row"


@dataclass(frozen=True)
class TuningKey:
    """What a row is for (see the module docstring)."""

    kind: str
    dtype: str
    reduced: int
    mask: str

    def describe(self) -> str:
        if not self.reduced:
            extent = "no reduced index"
        elif self.reduced == BUCKETS[-1]:
            extent = f"reduced extent > {BUCKETS[-2]}"
        else:
            extent = f"reduced extent <= {self.reduced}"
        return f"{self.kind}, {self.dtype}, {extent}, mask {self.mask}"


@dataclass(frozen=True)
class TuningRow:
    """The settings of the kernels of one `TuningKey`."""

    key: TuningKey
    free_tile: int
    reduced_tile: int
    num_warps: int
    num_stages: int
    #: The back end `auto` takes for these nests on a GPU; None: today's choice (cuda).
    backend: str | None
    #: "default: ..." or "measured on <device>, <date>: <figures>".
    source: str

    @property
    def measured(self) -> bool:
        return self.source.startswith("measured")

    def describe(self) -> str:
        settings = (
            f"free tile {self.free_tile}, reduced tile {self.reduced_tile}, "
            f"num_warps {self.num_warps}, num_stages {self.num_stages}"
        )
        prefers = f", auto prefers {self.backend}" if self.backend else ""
        return f"tuning ({self.key.describe()}): {settings}{prefers}; {self.source}"

    def as_json(self) -> dict[str, Any]:
        """The row as `tuning.json` holds it."""
        found = asdict(self)
        return {**found.pop("key"), **found}


#: The settings of kinds without a row: tile programs' constants before the table
#: (`codegen.tiles.build`), Triton's launch settings of `tensordsl.backends.pallas.api`.
DEFAULTS: dict[str, dict[str, int]] = {
    "dot": {"free_tile": 32, "reduced_tile": 32, "num_warps": 4, "num_stages": 2},
    "reduce": {"free_tile": 32, "reduced_tile": 16, "num_warps": 4, "num_stages": 2},
    "elementwise": {"free_tile": 32, "reduced_tile": 16, "num_warps": 4, "num_stages": 2},
}


def bucket(extent: int) -> int:
    """The bucket of a reduced extent (0: none)."""
    return next((b for b in BUCKETS if b >= extent), BUCKETS[-1])


def default_row(key: TuningKey) -> TuningRow:
    """The row of a key the table has none for."""
    return TuningRow(key, **DEFAULTS[key.kind], backend=None, source=NO_ROW)


def lookup(key: TuningKey, rows: Mapping[TuningKey, TuningRow] | None = None) -> TuningRow:
    """The row of `key` in `rows` (default: the committed table), else `default_row`."""
    found = (table() if rows is None else rows).get(key)
    return found if found is not None else default_row(key)


@functools.cache
def table() -> Mapping[TuningKey, TuningRow]:
    """The committed table, checked (`TABLE_PATH`)."""
    return parse(json.loads(TABLE_PATH.read_text()))


def parse(data: Mapping[str, Any]) -> dict[TuningKey, TuningRow]:
    """The rows of a table in `tuning.json`'s format, checked.

    Raises:
        ValueError: a row this module cannot use, named with what is wrong.
    """
    if data.get("format") != FORMAT:
        raise ValueError(f"tuning table of format {data.get('format')!r}; expected {FORMAT}")
    rows: dict[TuningKey, TuningRow] = {}
    for n, fields in enumerate(data.get("rows", ())):
        row = _row(n, fields)
        if row.key in rows:
            raise ValueError(f"tuning row {n}: a second row for {row.key.describe()}")
        rows[row.key] = row
    return rows


def _row(n: int, fields: Mapping[str, Any]) -> TuningRow:
    try:
        key = TuningKey(fields["kind"], fields["dtype"], fields["reduced"], fields["mask"])
        row = TuningRow(
            key,
            **{name: fields[name] for name in DEFAULTS["dot"]},
            backend=fields.get("backend"),
            source=fields["source"],
        )
    except (KeyError, TypeError) as error:
        raise ValueError(f"tuning row {n}: missing or unknown field {error}") from None
    problems = []
    if key.kind not in DEFAULTS:
        problems.append(f"kind {key.kind!r} is none of {', '.join(DEFAULTS)}")
    if key.reduced not in BUCKETS:
        problems.append(f"reduced {key.reduced!r} is no bucket of {BUCKETS}")
    if key.mask not in MASKS:
        problems.append(f"mask {key.mask!r} is none of {', '.join(MASKS)}")
    for name in ("free_tile", "reduced_tile", "num_warps"):
        value = getattr(row, name)
        if not isinstance(value, int) or value < 1 or value & (value - 1):
            problems.append(f"{name} {value!r} is not a power of two")
    if key.kind == "dot" and min(row.free_tile, row.reduced_tile) < 16:
        problems.append("a dot's tiles are at least 16 wide (Triton's tl.dot)")
    if not isinstance(row.num_stages, int) or not 1 <= row.num_stages <= 8:
        problems.append(f"num_stages {row.num_stages!r} is not in 1..8")
    if row.backend not in PREFERRED:
        problems.append(f"backend {row.backend!r} is none of {PREFERRED}")
    if not row.source.startswith(("measured on ", "default")):
        problems.append("source must say 'measured on <device>, <date>: ...' or 'default...'")
    if problems:
        raise ValueError(f"tuning row {n} ({key.describe()}): " + "; ".join(problems))
    return row
