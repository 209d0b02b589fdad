"""Kernel records: what a warm process needs to load a built kernel without emitting C.

A record (`kernels/<2 hex>/<digest>.json` under `config.cache_dir()`) holds, for one nest,
dtypes, schedule, role and toolchain, the shared object built for it (codegen/c/run/build.py),
its entry point, whether it holds an XLA FFI handler, and its host function as Python source
(`codegen.ir.host.compiled_host_function`). A record is stored under two keys: the nest as
written (cheap to compute) and its canonical form (`codegen.ir.nest.canonical`: tensors and
indices renamed by position), so that a nest which differs from a built one only in its
names shares its library. Host functions are stored with canonical tensor names and renamed
for the nest that loads them. Keys are digests of complete texts and of the compiler's
sources (`codegen.cache.memo`). The cache folder is trusted as much as the shared objects in
it, which are loaded and run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import sympy

from codegen.cache.disk import atomic_write
from codegen.cache.memo import CODEGEN_ROOT, digest_of, entry_path, source_version
from codegen.ir.nest import LoopNest, canonical, canonical_names

if TYPE_CHECKING:
    from codegen.c.schedule import Schedule


@dataclass(frozen=True)
class KernelRecord:
    """A built kernel as stored on disk (see the module docstring)."""

    name: str  # the entry name the nest would have alone (`codegen.emit.signature.entry_name`)
    entry: str  # the entry point in `library` (the canonical form's)
    library: str
    handler: bool
    host_names: tuple[str, ...]
    host_extents: tuple[tuple[str, int], ...]  # canonical tensor names
    host_source: str
    warning: str | None = None  # why the FFI handler is missing, to repeat on every load

    def to_json(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> KernelRecord:
        """Raises ValueError, TypeError or KeyError for anything but a well-formed record."""
        raw = json.loads(data)
        record = cls(
            name=str(raw["name"]),
            entry=str(raw["entry"]),
            library=str(raw["library"]),
            handler=bool(raw["handler"]),
            host_names=tuple(str(n) for n in raw["host_names"]),
            host_extents=tuple((str(t), int(a)) for t, a in raw["host_extents"]),
            host_source=str(raw["host_source"]),
            warning=None if raw.get("warning") is None else str(raw["warning"]),
        )
        if not record.host_source.startswith("lambda") or raw != json.loads(record.to_json()):
            raise ValueError("not a kernel record")
        return record


def read_record(folder: pathlib.Path, digest: str) -> KernelRecord | None:
    """The record stored under `digest` whose library exists, else None."""
    try:
        record = KernelRecord.from_json(entry_path(folder, "kernels", digest, ".json").read_bytes())
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return record if pathlib.Path(record.library).is_file() else None


def write_record(folder: pathlib.Path, digest: str, record: KernelRecord) -> None:
    """Store `record` under `digest` (silently not, where the folder cannot be written)."""
    with contextlib.suppress(OSError):
        atomic_write(entry_path(folder, "kernels", digest, ".json"), record.to_json())


def record_digest(
    nest: LoopNest, dtypes: Mapping[str, str], schedule: Schedule, role: str, settings: Any
) -> str:
    """The key of the record of `nest` built with these dtypes, schedule, role and compiler
    settings (as written: the canonical form's key is this of `canonical_form`)."""
    version = source_version(CODEGEN_ROOT)
    dtype_items = tuple(sorted(dtypes.items()))
    return digest_of("kernel", version, nest, dtype_items, schedule, role, settings)


def canonical_form(
    nest: LoopNest, dtypes: Mapping[str, str], schedule: Schedule
) -> tuple[LoopNest, dict[str, str], Schedule] | None:
    """`nest`, its dtypes and schedule in canonical names (`codegen.ir.nest.canonical`), or None
    where renaming by position could make two different nests equal (a name it leaves
    alone clashes with a new one) or `Schedule` has a field `rename_schedule` does not know.
    """
    from codegen.c.run.renaming import rename_schedule, schedule_is_renamable

    tensors, indices = canonical_names(nest)
    if _clashes(nest, tensors, indices) or not schedule_is_renamable():
        return None
    renamed = {tensors[name]: dtype for name, dtype in dtypes.items() if name in tensors}
    return canonical(nest), renamed, rename_schedule(schedule, indices)


def _clashes(nest: LoopNest, tensors: Mapping[str, str], indices: Mapping[str, str]) -> bool:
    new = set(tensors.values()) | set(indices.values())
    for expr in nest.expressions():
        for atom in expr.atoms(sympy.Symbol, sympy.IndexedBase):
            name = str(atom.name) if isinstance(atom, sympy.IndexedBase) else atom.name
            if name in new and name not in tensors and name not in indices:
                return True
    return False
