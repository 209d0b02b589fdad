"""An XLA FFI handler for a generated C entry point, compiled into the same shared object.

The handler is plain C over XLA's FFI C API (`xla/ffi/api/c_api.h`, shipped with jaxlib under
`jax.ffi.include_dir()`). XLA calls it with a call frame holding the operand and output
buffers and two attributes: `params`, the int64 array the entry point expects (computed on
the host from the shapes, which are static per XLA executable), and `poison`, an int32 flag
that fills the output with all-ones bytes first (NaN for floats, -1 for integers) so that
elements a kernel fails to write show up in tests. The handler checks the buffer count, the
element types and the length of `params`, then calls the entry point on the buffers in
place: no Python, no GIL, nothing copied.

>>> text = handler_source("tdsl_C_forward_0", ("float32", "float32"), "float32", 3)
>>> "XLA_FFI_Error *tdsl_C_forward_0_xla_ffi(XLA_FFI_CallFrame *frame)" in text
True
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import pathlib
from collections.abc import Sequence

#: numpy dtype name -> XLA_FFI_DataType enumerator.
FFI_DTYPES = {
    "float32": "XLA_FFI_DataType_F32",
    "float64": "XLA_FFI_DataType_F64",
    "float16": "XLA_FFI_DataType_F16",
    "bfloat16": "XLA_FFI_DataType_BF16",
    "int32": "XLA_FFI_DataType_S32",
    "int64": "XLA_FFI_DataType_S64",
}
HEADER = pathlib.Path("xla") / "ffi" / "api" / "c_api.h"
HANDLER_SUFFIX = "_xla_ffi"

_SUPPORT = """\
/* ---- XLA FFI handler (appended by codegen/c/ffi.py) ---- */
#include <string.h>
#include "xla/ffi/api/c_api.h"

static XLA_FFI_Error *tdsl_ffi_error(const XLA_FFI_Api *api, const char *message) {
    XLA_FFI_Error_Create_Args args;
    memset(&args, 0, sizeof args);
    args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
    args.message = message;
    args.errc = XLA_FFI_Error_Code_INVALID_ARGUMENT;
    return api->XLA_FFI_Error_Create(&args);
}

/* XLA asks a handler which FFI version it was compiled against before first use. */
static XLA_FFI_Error *tdsl_ffi_metadata(XLA_FFI_CallFrame *frame) {
    XLA_FFI_Metadata *metadata = ((XLA_FFI_Metadata_Extension *)frame->extension_start)->metadata;
    if (metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE)
        return tdsl_ffi_error(frame->api, "tensordsl: XLA_FFI_Metadata is too small");
    metadata->api_version.struct_size = XLA_FFI_Api_Version_STRUCT_SIZE;
    metadata->api_version.extension_start = NULL;
    metadata->api_version.major_version = XLA_FFI_API_MAJOR;
    metadata->api_version.minor_version = XLA_FFI_API_MINOR;
    metadata->traits = 0;
    if (metadata->struct_size >= offsetof(XLA_FFI_Metadata, state_type_id) + sizeof(XLA_FFI_TypeId))
        metadata->state_type_id.type_id = 0; /* stateless */
    return NULL;
}

static int tdsl_ffi_named(const XLA_FFI_ByteSpan *name, const char *expected) {
    size_t length = strlen(expected);
    return name->len == length && memcmp(name->ptr, expected, length) == 0;
}

static int64_t tdsl_ffi_bytes(const XLA_FFI_Buffer *buffer) {
    int64_t size;
    switch (buffer->dtype) {
    case XLA_FFI_DataType_F16: case XLA_FFI_DataType_BF16: size = 2; break;
    case XLA_FFI_DataType_F32: case XLA_FFI_DataType_S32: size = 4; break;
    default: size = 8; break;
    }
    for (int64_t d = 0; d < buffer->rank; ++d) size *= buffer->dims[d];
    return size;
}
"""


@functools.lru_cache(maxsize=1)
def include_dir() -> pathlib.Path | None:
    """jaxlib's FFI header folder (`jax.ffi.include_dir()`), or None when jaxlib or the C API
    header is missing. Found without importing jaxlib: the compiler never imports JAX."""
    spec = importlib.util.find_spec("jaxlib")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = pathlib.Path(next(iter(spec.submodule_search_locations))) / "include"
    return folder if (folder / HEADER).is_file() else None


@functools.lru_cache(maxsize=1)
def header_digest() -> str:
    """sha256 of the C API header (part of the cache key: a new jaxlib may change it)."""
    folder = include_dir()
    return hashlib.sha256((folder / HEADER).read_bytes()).hexdigest() if folder else "none"


def handler_name(entry: str) -> str:
    """The exported symbol of the handler of `entry`."""
    return entry + HANDLER_SUFFIX


def handler_source(
    entry: str, operand_dtypes: Sequence[str], output_dtype: str, n_params: int
) -> str:
    """C for the FFI handler of `entry`, to be appended to the entry point's own source.

    Args:
        entry: the generated entry point (see codegen/c/emit.py for its calling convention).
        operand_dtypes: numpy dtype name of each operand, in the nest's operand order.
        output_dtype: numpy dtype name of the output.
        n_params: the length of the entry point's `params` array.

    Returns:
        The handler's C source (it needs `jax.ffi.include_dir()` on the include path).
    """
    count = len(operand_dtypes)
    checks = [
        line
        for n, d in enumerate(operand_dtypes)
        for line in (
            f"if (((const XLA_FFI_Buffer *)frame->args.args[{n}])->dtype != {FFI_DTYPES[d]})",
            f'    return tdsl_ffi_error(frame->api, "{entry}: operand {n} is not {d}");',
        )
    ]
    loads = [
        f"operands[{n}] = ((const XLA_FFI_Buffer *)frame->args.args[{n}])->data;"
        for n in range(count)
    ]
    lines = [
        _SUPPORT,
        f"XLA_FFI_Error *{handler_name(entry)}(XLA_FFI_CallFrame *frame) {{",
        "    if (frame->extension_start != NULL",
        "        && frame->extension_start->type == XLA_FFI_Extension_Metadata)",
        "        return tdsl_ffi_metadata(frame);",
        "    if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE)",
        f'        return tdsl_ffi_error(frame->api, "{entry}: called outside the execute stage");',
        f"    if (frame->args.size != {count} || frame->rets.size != 1)",
        "        return tdsl_ffi_error(",
        f'            frame->api, "{entry}: expected {count} operands, 1 output");',
        *(f"    {line}" for line in checks),
        "    XLA_FFI_Buffer *out = (XLA_FFI_Buffer *)frame->rets.rets[0];",
        f"    if (out->dtype != {FFI_DTYPES[output_dtype]})",
        f'        return tdsl_ffi_error(frame->api, "{entry}: output is not {output_dtype}");',
        "    const int64_t *params = NULL;",
        "    int poison = 0;",
        "    for (int64_t a = 0; a < frame->attrs.size; ++a) {",
        "        const XLA_FFI_ByteSpan *name = frame->attrs.names[a];",
        '        if (tdsl_ffi_named(name, "params")'
        " && frame->attrs.types[a] == XLA_FFI_AttrType_ARRAY) {",
        "            const XLA_FFI_Array *array = (const XLA_FFI_Array *)frame->attrs.attrs[a];",
        f"            if (array->dtype == XLA_FFI_DataType_S64 && array->size == {n_params})",
        "                params = (const int64_t *)array->data;",
        '        } else if (tdsl_ffi_named(name, "poison")'
        " && frame->attrs.types[a] == XLA_FFI_AttrType_SCALAR) {",
        "            const XLA_FFI_Scalar *flag = (const XLA_FFI_Scalar *)frame->attrs.attrs[a];",
        "            poison = flag->dtype == XLA_FFI_DataType_S32",
        "                     && *(const int32_t *)flag->value != 0;",
        "        }",
        "    }",
        "    if (params == NULL)",
        f'        return tdsl_ffi_error(frame->api, "{entry}: needs params, {n_params} int64");',
        f"    const void *operands[{max(count, 1)}] = {{NULL}};",
        *(f"    {line}" for line in loads),
        "    int64_t bytes = poison ? tdsl_ffi_bytes(out) : 0;",
        "    if (bytes > 0) memset(out->data, 0xff, (size_t)bytes);",
        f"    {entry}(out->data, operands, params);",
        "    return NULL;",
        "}",
        "",
    ]
    return "\n".join(lines)
