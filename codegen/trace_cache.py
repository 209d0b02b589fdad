"""Trace-time work kept on disk between processes: kernel records and memos.

A warm process should only load what an earlier one built. Two kinds of entries live under
`config.cache_dir()`, next to the shared objects:

* kernel records (`kernels/<2 hex>/<digest>.json`): for one nest, dtypes, schedule, role
  and toolchain, the shared object built for it (codegen/build.py), its entry point,
  whether it holds an XLA FFI handler, and its host function as Python source
  (`codegen.host.compiled_host_function`), so a warm build loads the library without
  emitting C. A record is stored under two keys: the nest as written (cheap to compute) and
  its canonical form (`codegen.ir.canonical`: tensors and indices renamed by position), so
  that a nest which differs from a built one only in its names shares its library. Host
  functions are stored with canonical tensor names and renamed for the nest that loads them.
* memos (`memo/<namespace>/<2 hex>/<digest>.pickle`): a value computed once, pickled (the
  gradient nests of `tensordsl.grad.gradient`; the compiler's version line and OpenMP flags,
  codegen/compiler.py).

A key is the sha256 of the complete text of its parts (`key_text`: every field of every
dataclass, sympy expressions in `srepr`, so equal texts mean equal values) and of a version:
a digest of the source files of the packages whose code computes the entry
(`source_version`), so any change to the code generator or the derivation starts new
entries. Entries are written atomically; one that cannot be read or does not hold what is
expected counts as missing and is written again. The cache folder is trusted as much as the
shared objects in it, which are loaded and run.

>>> from codegen.ir import extent_symbol
>>> key_text((extent_symbol("X", 0) + 1, "a"))
"(Add(Symbol('X.shape[0]', integer=True, nonnegative=True), Integer(1)), 'a',)"
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import pathlib
import pickle
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import sympy

from codegen.disk_cache import atomic_write
from codegen.ir import LoopNest, canonical, canonical_names

if TYPE_CHECKING:  # imported when used: `import tensordsl` does not need the schedules
    from codegen.schedule import Schedule

Value = TypeVar("Value")
_CODEGEN = pathlib.Path(__file__).resolve().parent


def key_text(value: Any) -> str:
    """A complete, deterministic text of `value` (dataclasses, tuples, sympy, plain values)."""
    if isinstance(value, sympy.Basic):
        return sympy.srepr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(
            f"{f.name}={key_text(getattr(value, f.name))}" for f in dataclasses.fields(value)
        )
        return f"{type(value).__name__}({fields})"
    if isinstance(value, (tuple, list)):
        return "(" + "".join(f"{key_text(v)}, " for v in value).rstrip() + ")"
    return repr(value)


@functools.lru_cache(maxsize=8)
def source_version(*folders: pathlib.Path) -> str:
    """A digest of every `.py` file in `folders` and of the Python and sympy versions."""
    digest = hashlib.sha256(f"{sys.version} sympy {sympy.__version__}".encode())
    for folder in folders:
        for path in sorted(pathlib.Path(folder).glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def digest_of(*parts: Any) -> str:
    """The sha256 of the `key_text` of `parts`."""
    return hashlib.sha256(key_text(parts).encode()).hexdigest()


def _entry(folder: pathlib.Path, kind: str, digest: str, suffix: str) -> pathlib.Path:
    return folder / kind / digest[:2] / f"{digest}{suffix}"


# --------------------------------------------------------------------------- memos


def memo(
    folder: pathlib.Path,
    namespace: str,
    key: Any,
    compute: Callable[[], Value],
    *,
    version: str,
    expected: type[Value],
) -> Value:
    """`compute()`, or its pickled value from an earlier process.

    Args:
        folder: the cache folder.
        namespace: the kind of value (a folder of its own).
        key: what the value is computed from (anything `key_text` prints).
        compute: computes the value (its exceptions propagate; nothing is stored then).
        version: `source_version` of the code behind `compute`.
        expected: the type of the value; a stored entry of another type is recomputed.
    """
    path = _entry(folder, "memo/" + namespace, digest_of(version, key), ".pickle")
    try:
        found = pickle.loads(path.read_bytes())
        if isinstance(found, expected):
            return found
    except Exception:  # noqa: BLE001 - missing, damaged or stale: computed again
        pass
    value = compute()
    with contextlib.suppress(OSError):  # a cache that cannot be written costs time only
        atomic_write(path, pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
    return value


# --------------------------------------------------------------------------- kernel records


@dataclass(frozen=True)
class KernelRecord:
    """A built kernel as stored on disk (see the module docstring)."""

    name: str  # the entry name the nest would have alone (`codegen.emitter.entry_name`)
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
        record = KernelRecord.from_json(_entry(folder, "kernels", digest, ".json").read_bytes())
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return record if pathlib.Path(record.library).is_file() else None


def write_record(folder: pathlib.Path, digest: str, record: KernelRecord) -> None:
    """Store `record` under `digest` (silently not, where the folder cannot be written)."""
    with contextlib.suppress(OSError):
        atomic_write(_entry(folder, "kernels", digest, ".json"), record.to_json())


def record_digest(
    nest: LoopNest, dtypes: Mapping[str, str], schedule: Schedule, role: str, settings: Any
) -> str:
    """The key of the record of `nest` built with these dtypes, schedule, role and compiler
    settings (as written: the canonical form's key is this of `canonical_form`)."""
    version = source_version(_CODEGEN)
    dtype_items = tuple(sorted(dtypes.items()))
    return digest_of("kernel", version, nest, dtype_items, schedule, role, settings)


def canonical_form(
    nest: LoopNest, dtypes: Mapping[str, str], schedule: Schedule
) -> tuple[LoopNest, dict[str, str], Schedule] | None:
    """`nest`, its dtypes and schedule in canonical names (`codegen.ir.canonical`), or None
    where renaming by position could make two different nests equal (a name it leaves
    alone clashes with a new one) or `Schedule` has a field `rename_schedule` does not know.
    """
    tensors, indices = canonical_names(nest)
    if _clashes(nest, tensors, indices) or schedule_fields() != _RENAMED_FIELDS:
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


#: The fields of `Schedule` that `rename_schedule` knows: those naming indices (renamed) and
#: the others (numbers, a strategy). A new field turns canonical forms off until it is added.
_RENAMED_FIELDS = frozenset(
    ("free_order", "reduced_order", "row", "vector", "small")
    + ("strategy", "parallel", "rows", "width", "chunks", "lanes")
)


def schedule_fields() -> frozenset[str]:
    """The names of `Schedule`'s fields."""
    from codegen.schedule import Schedule

    return frozenset(f.name for f in dataclasses.fields(Schedule))


def rename_schedule(schedule: Schedule, indices: Mapping[str, str]) -> Schedule:
    """`schedule` with its index names renamed (`{old: new}`; others kept)."""

    def new(name: str | None) -> str | None:
        return None if name is None else indices.get(name, name)

    def names(order: Sequence[str]) -> tuple[str, ...]:
        return tuple(indices.get(n, n) for n in order)

    return dataclasses.replace(
        schedule,
        free_order=names(schedule.free_order),
        reduced_order=tuple(names(order) for order in schedule.reduced_order),
        row=new(schedule.row),
        vector=new(schedule.vector),
        small=None if schedule.small is None else rename_schedule(schedule.small, indices),
    )
