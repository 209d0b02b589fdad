"""Tiered builds: a kernel's unoptimised build answers its first calls, the optimised one
takes over when it is ready.

The optimising compiler (`-O3`) spends seconds on a kernel, and a first `jit(value_and_grad)`
of a model builds tens of them before it returns; at `-O0` the compiler needs a small
fraction of that time (benchmarks/RESULTS.md, first calls). So with `TENSORDSL_BUILD=tiered`
(the default, `codegen.config.build_mode`) a kernel missing from the disk cache is built
first at `FAST_LEVEL` with a *slot*: every call of that library (its XLA FFI handler, its
ctypes entry) reads one function pointer, at first its own unoptimised entry point, once per
call. The optimised build runs in a background thread (codegen/c/run/build.py); when it has
loaded, `take_over` stores its entry point in the slot, so the next call runs optimised code
and no call ever switches half way. The optimised library's source is the kernel's source as
an untiered build has it, byte for byte, so both builds share its disk cache entry.

>>> print(slot_source("tdsl_Y_forward_0"))  # doctest: +ELLIPSIS
/* ---- tiered build (codegen/c/tiers.py): calls go through a slot ---- */
typedef void (*tdsl_entry_fn_)(void *, const void *const *, const int64_t *);
static tdsl_entry_fn_ tdsl_slot_ = tdsl_Y_forward_0;
void tdsl_Y_forward_0_take(tdsl_entry_fn_ next) {
...
"""

from __future__ import annotations

import ctypes
import pathlib

#: The optimisation level of the first build.
FAST_LEVEL = "-O0"
#: Suffixes of the slot's exported functions: the entry point that calls through the slot
#: (the library's entry for the runners), and the function that takes a new target.
CALL_SUFFIX, TAKE_SUFFIX, TARGET_SUFFIX = "_tiered", "_take", "_target"


def call_name(entry: str) -> str:
    """The entry point of a fast build: calls `entry`, or what took the slot over."""
    return entry + CALL_SUFFIX


def slot_source(entry: str) -> str:
    """C appended to a fast build's source: the slot, its call and its taker."""
    return "\n".join(
        [
            "/* ---- tiered build (codegen/c/tiers.py): calls go through a slot ---- */",
            "typedef void (*tdsl_entry_fn_)(void *, const void *const *, const int64_t *);",
            f"static tdsl_entry_fn_ tdsl_slot_ = {entry};",
            f"void {entry}{TAKE_SUFFIX}(tdsl_entry_fn_ next) {{",
            "    __atomic_store_n(&tdsl_slot_, next, __ATOMIC_RELEASE);",
            "}",
            f"void *{entry}{TARGET_SUFFIX}(void) {{",
            "    return (void *)__atomic_load_n(&tdsl_slot_, __ATOMIC_ACQUIRE);",
            "}",
            f"void {call_name(entry)}(void *out, const void *const *operands, "
            "const int64_t *params) {",
            "    tdsl_entry_fn_ target = __atomic_load_n(&tdsl_slot_, __ATOMIC_ACQUIRE);",
            "    target(out, operands, params);",
            "}",
            "",
        ]
    )


def fast_flags(flags: tuple[str, ...]) -> tuple[str, ...]:
    """`flags` with their optimisation level (the first flag, `BASE_FLAGS`') at `FAST_LEVEL`;
    the user's own flags, later on the command line, still win."""
    return (FAST_LEVEL, *flags[1:])


def take_over(fast_library: pathlib.Path, fast_entry: str, optimised: ctypes._CFuncPtr) -> None:
    """Make every later call of the fast build `fast_entry` (its `call_name`) in
    `fast_library` run `optimised`, an entry point of the same kernel loaded from another
    library (which stays loaded: its `CompiledNest` is kept by the build cache)."""
    base = fast_entry.removesuffix(CALL_SUFFIX)
    library = ctypes.CDLL(str(fast_library.absolute()))  # the loaded instance, not a new one
    take = getattr(library, base + TAKE_SUFFIX)
    take.restype = None
    take.argtypes = [ctypes.c_void_p]
    take(ctypes.cast(optimised, ctypes.c_void_p))


def slot_target(fast_library: pathlib.Path, fast_entry: str) -> int:
    """The address the fast build's slot calls now (tests: has the optimised build taken
    over?)."""
    library = ctypes.CDLL(str(fast_library.absolute()))
    target = getattr(library, fast_entry.removesuffix(CALL_SUFFIX) + TARGET_SUFFIX)
    target.restype = ctypes.c_void_p
    return target() or 0
