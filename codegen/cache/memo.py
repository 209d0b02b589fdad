"""Values computed once and kept on disk between processes, keyed by complete texts.

A memo (`memo/<namespace>/<2 hex>/<digest>.pickle` under `config.cache_dir()`) is a value
computed once and pickled: the gradient nests of `codegen.passes.grad.gradient`, the CPU
schedules of `codegen.c.schedule.choose_cpu_schedule`, the compiler's version line and OpenMP
flags (`codegen.c.run.compiler`). A key is the sha256 of the complete text of its parts
(`key_text`: every field of every dataclass, sympy expressions as `srepr` prints them with
their arguments in sympy's order (`sympy_text`), so equal texts mean equal values) and of a
version: a digest of the source files of the compiler (`source_version`), so any change to the
code generator or the derivation starts new entries.
Entries are written atomically; one that cannot be read or does not hold what is expected
counts as missing and is computed again.

>>> from codegen.ir.nest import extent_symbol
>>> key_text((extent_symbol("X", 0) + 1, "a"))
"(Add(Integer(1), Symbol('X.shape[0]', integer=True, nonnegative=True)), 'a',)"
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import pathlib
import pickle
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import sympy

from codegen.cache.disk import atomic_write

Value = TypeVar("Value")
#: The compiler package: every source file in it keys the entries (`source_version`).
CODEGEN_ROOT = pathlib.Path(__file__).resolve().parents[1]


def key_text(value: Any) -> str:
    """A complete, deterministic text of `value` (dataclasses, tuples, sympy, plain values)."""
    if isinstance(value, sympy.Basic):
        return sympy_text(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        record: Any = value
        try:
            return _record_text(record)
        except TypeError:  # unhashable: printed each time
            return _record_text.__wrapped__(record)
    if isinstance(value, (tuple, list)):
        return "(" + "".join(f"{key_text(v)}, " for v in value).rstrip() + ")"
    return repr(value)


def sympy_text(expr: sympy.Basic) -> str:
    """`expr` as `srepr` prints it, but with the arguments in sympy's own order: an
    expression is its class applied to its `args` (`expr.func(*expr.args) == expr`), and an
    atom (no arguments) is its `srepr` (a symbol's assumptions, a float's precision). `srepr`
    sorts the terms of every sum and product for display, which costs more than the rest of
    a key; the `args` order is already canonical (`Basic.compare`), the same in every
    process. A subexpression shared within `expr` is printed once.

    >>> x = sympy.Symbol("x", real=True)
    >>> sympy_text(2 * x + 1)
    "Add(Integer(1), Mul(Integer(2), Symbol('x', real=True)))"
    """
    done: dict[int, str] = {}

    def text(node: sympy.Basic) -> str:
        found = done.get(id(node))
        if found is None:
            if node.args:
                found = f"{type(node).__name__}({', '.join(map(text, node.args))})"
            elif isinstance(node, sympy.Float):  # equal floats may differ in precision
                found = sympy.srepr(node)
            else:
                found = _atom_text(f"{type(node).__module__}.{type(node).__qualname__}", node)
            done[id(node)] = found
        return found

    return text(expr)


@functools.lru_cache(maxsize=4096)
def _atom_text(kind: str, atom: sympy.Basic) -> str:
    """`srepr` of an atom, once per process for equal atoms of one class, `kind` (a symbol
    equals only a symbol of its name and assumptions)."""
    return sympy.srepr(atom)


@functools.lru_cache(maxsize=4096)
def _record_text(value: Any) -> str:
    """A dataclass's `key_text`, printed once per process for equal values (equal as the
    in-process caches of gradients and schedules take them): one nest keys its gradients and
    its schedules."""
    fields = ", ".join(
        f"{f.name}={key_text(getattr(value, f.name))}" for f in dataclasses.fields(value)
    )
    return f"{type(value).__name__}({fields})"


@functools.lru_cache(maxsize=8)
def source_version(*folders: pathlib.Path) -> str:
    """A digest of every `.py` file under `folders` and of the Python and sympy versions."""
    digest = hashlib.sha256(f"{sys.version} sympy {sympy.__version__}".encode())
    for folder in folders:
        root = pathlib.Path(folder)
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def digest_of(*parts: Any) -> str:
    """The sha256 of the `key_text` of `parts`."""
    return hashlib.sha256(key_text(parts).encode()).hexdigest()


def entry_path(folder: pathlib.Path, kind: str, digest: str, suffix: str) -> pathlib.Path:
    return folder / kind / digest[:2] / f"{digest}{suffix}"


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
    path = entry_path(folder, "memo/" + namespace, digest_of(version, key), ".pickle")
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
