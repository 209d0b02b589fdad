"""What a generated function's signature depends on: the storage type of each dtype, the
accumulation type, the check that every tensor has a dtype, and the entry point's name
(`tdsl_<output>_<role>_<hash8>`). Shared by the C and CUDA emitters (`codegen.emit.emitter`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from codegen.emit.printer import c_name
from codegen.ir.nest import LoopNest

STORAGE = {
    "float32": "float",
    "float64": "double",
    "float16": "uint16_t",
    "bfloat16": "uint16_t",
    "int32": "int32_t",
    "int64": "int64_t",
}


def check_dtypes(nest: LoopNest, dtypes: Mapping[str, str], storage: Mapping[str, str]) -> None:
    """Raise ValueError unless every tensor of `nest` has a dtype with a `storage` type."""
    missing = [n for n in (*nest.operand_names, nest.output) if dtypes.get(n) not in storage]
    if missing:
        raise ValueError(f"dtypes of {missing} missing or not one of {sorted(storage)}")


def entry_name(nest: LoopNest, dtypes: Mapping[str, str], schedule: object, role: str) -> str:
    """`tdsl_<output>_<role>_<hash8>`: the hash covers the nest, dtypes and schedule."""
    digest = hashlib.sha256(
        repr((str(nest), sorted(dtypes.items()), schedule, role)).encode()
    ).hexdigest()[:8]
    return f"tdsl_{c_name(nest.output)}_{c_name(role)}_{digest}"


def accumulation_type(dtypes: Mapping[str, str]) -> str:
    """`double` when any operand or the output is float64, else `float`."""
    return "double" if "float64" in dtypes.values() else "float"
