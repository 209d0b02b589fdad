"""The one place that reads `TENSORDSL_*` environment variables (read at call time).

>>> isinstance(cache_dir(), pathlib.Path)
True
"""

from __future__ import annotations

import difflib
import os
import pathlib
import shlex
from collections.abc import Callable

from codegen.errors import SettingError

__all__ = ["SettingError", "check_settings"]  # SettingError: where the readers raise it


def cache_dir() -> pathlib.Path:
    """Where compiled kernels are cached: `TENSORDSL_CACHE_DIR`, else the user cache dir.

    codegen/c/run/build.py falls back to a private temporary folder, with one warning, when this
    one cannot be created or written.
    """
    explicit = os.environ.get("TENSORDSL_CACHE_DIR")
    if explicit:
        return pathlib.Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
    return base / "tensordsl"


def dump_dir() -> pathlib.Path | None:
    """`TENSORDSL_DUMP_DIR`: where every generated source is also written, or None.

    Raises:
        SettingError: the folder cannot be created.
    """
    value = os.environ.get("TENSORDSL_DUMP_DIR")
    if not value:
        return None
    folder = pathlib.Path(value)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise SettingError(
            f"TENSORDSL_DUMP_DIR={value!r}: the folder cannot be created ({error.strerror})",
            expected="a writable folder, or TENSORDSL_DUMP_DIR unset",
        ) from None
    return folder


#: The words a yes/no setting accepts (case-insensitive); empty means no.
FLAGS = {"1": True, "true": True, "yes": True, "on": True, "": False}
FLAGS |= {"0": False, "false": False, "no": False, "off": False}


def _flag(name: str, default: str) -> bool:
    """A yes/no setting; anything else is a `SettingError` (never silently yes)."""
    value = os.environ.get(name, default).strip().lower()
    if value not in FLAGS:
        raise SettingError(
            f"{name}={value!r} is not a yes/no value",
            expected="1, true, yes, on (yes) or 0, false, no, off (no)",
        )
    return FLAGS[value]


def debug() -> bool:
    """`TENSORDSL_DEBUG`: verbose build messages and `-g` builds when set (not "0")."""
    return _flag("TENSORDSL_DEBUG", "0")


def c_compiler() -> str:
    """`TENSORDSL_CC`: the C compiler (default "cc"): its first word, split like a shell
    would (`TENSORDSL_CC="gcc -O0"` is gcc; the other words are `c_compiler_flags`).

    Raises:
        SettingError: the value does not split (an unbalanced quote).
    """
    words = _compiler_words()
    return words[0] if words else "cc"


def c_compiler_flags() -> tuple[str, ...]:
    """The words of `TENSORDSL_CC` after the compiler: flags given with it."""
    return _compiler_words()[1:]


def _compiler_words() -> tuple[str, ...]:
    value = os.environ.get("TENSORDSL_CC", "")
    try:
        return tuple(shlex.split(value))
    except ValueError as error:
        raise SettingError(f"TENSORDSL_CC={value!r}: {error}") from None


def extra_cflags() -> tuple[str, ...]:
    """`TENSORDSL_CFLAGS`: extra compiler flags, split like a shell would.

    Raises:
        SettingError: the value does not split (an unbalanced quote).
    """
    value = os.environ.get("TENSORDSL_CFLAGS", "")
    try:
        return tuple(shlex.split(value))
    except ValueError as error:
        raise SettingError(f"TENSORDSL_CFLAGS={value!r}: {error}") from None


def poison_outputs() -> bool:
    """`TENSORDSL_POISON_OUTPUTS`: fill every output with NaN (or -1 for integers) before a
    kernel runs, so that elements a kernel fails to write show up in tests."""
    return _flag("TENSORDSL_POISON_OUTPUTS", "0")


def xla_contractions() -> bool:
    """`TENSORDSL_XLA_CONTRACTIONS`: contractions (with their elementwise companions,
    `codegen.ir.contraction.xla_plan`) run as XLA's dot (`jnp.einsum`), and elementwise nests
    of exp as XLA's fused work (`codegen.ir.xla_elementwise`), unless set to "0"; "0"
    generates a kernel for them too (to compare, or to test the kernels)."""
    return _flag("TENSORDSL_XLA_CONTRACTIONS", "1")


def build_jobs() -> int:
    """`TENSORDSL_BUILD_JOBS`: how many C kernels may build at once in background threads,
    started while a function is traced (default: the CPUs this process may run on); "0"
    builds each kernel only when it is first needed. Read when a build starts; the pool's
    size is fixed by the first background build.

    Raises:
        SettingError: for anything but a number of jobs, 0 or more.
    """
    value = os.environ.get("TENSORDSL_BUILD_JOBS", "").strip()
    if not value:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    if not value.isdigit():
        raise SettingError(
            f"TENSORDSL_BUILD_JOBS={value!r} is not a number of jobs",
            expected="a whole number, 0 or more",
        )
    return int(value)


#: The ways C kernels are built (`build_mode`).
BUILD_MODES = ("tiered", "fast", "full")


def build_mode() -> str:
    """`TENSORDSL_BUILD`: how a C kernel missing from the disk cache is built.

    "tiered" (default): first unoptimised (a fraction of the optimising compiler's time), used
    at once, while the optimised build runs in a background thread and takes over between two
    calls when it is ready (codegen/c/run/tiers.py); "fast": unoptimised only; "full": optimised
    only, waited for. Both builds are cached; a kernel whose optimised build is on disk loads it
    whatever the mode but "fast".

    Raises:
        SettingError: for anything but one of `BUILD_MODES`.
    """
    written = os.environ.get("TENSORDSL_BUILD", "")
    value = written.strip().lower() or "tiered"
    if value not in BUILD_MODES:
        close = difflib.get_close_matches(value, BUILD_MODES, n=1)
        raise SettingError(
            f"TENSORDSL_BUILD={written!r} is not a build mode",
            expected=f"one of {', '.join(BUILD_MODES)} (the default is tiered)",
            hint=f"did you mean {close[0]!r}?" if close else None,
        )
    return value


def fuse_programs() -> bool:
    """`TENSORDSL_FUSE`: programs recompute their large and elementwise intermediates inside
    the statements that read them (`codegen.passes.fusion`) unless set to "0"; "0" runs every
    statement as its own kernel and stores every intermediate (to compare, or to debug)."""
    return _flag("TENSORDSL_FUSE", "1")


def group_gradients() -> bool:
    """`TENSORDSL_GROUP_GRADIENTS`: the gradients of several inputs of one nest that share
    their loops run as one multi-output nest (`codegen.passes.group`) on a back end that
    supports it, unless set to "0"; "0" runs each gradient nest alone (to compare)."""
    return _flag("TENSORDSL_GROUP_GRADIENTS", "1")


def pair_gradients() -> bool:
    """`TENSORDSL_PAIR_GRADIENTS`: two weighted gradient nests over the same loops
    (attention's dK and dV) run as one CUDA kernel with two outputs
    (`codegen.cuda.attention.paired`) unless set to "0"; "0" runs each alone (to compare)."""
    return _flag("TENSORDSL_PAIR_GRADIENTS", "1")


def centred_rows() -> bool:
    """`TENSORDSL_CENTRED_ROWS`: "1" makes the gradient of a parameter read beside softmax
    scores times a factor of indices (ALiBi's learnt slopes, `S + A[h] * (j - i)`), summed
    from the stored scores' cotangent on C and reference, take each row's sum out of that
    cotangent first (`codegen.passes.centring`): float32's rounding of the logsumexp is
    then not multiplied by `j - i`, at the cost of one more pass over the scores'
    cotangent and the scores' weights recomputed in the gradient's pass (benchmarks/
    RESULTS.md, "alibi"); "0" (default) sums the cotangent as it is."""
    return _flag("TENSORDSL_CENTRED_ROWS", "0")


CPU_CALLS = ("ffi", "callback")


def cpu_call() -> str:
    """`TENSORDSL_CPU_CALL`: how JAX calls a compiled C kernel: "ffi" (default), an XLA FFI
    handler compiled with the kernel, or "callback", `buffer_callback` and ctypes (holds the
    GIL per call). "ffi" falls back to "callback" for a kernel whose handler did not build.

    Raises:
        SettingError: for any other value.
    """
    value = os.environ.get("TENSORDSL_CPU_CALL", "").strip().lower() or "ffi"
    if value not in CPU_CALLS:
        raise SettingError(
            f"TENSORDSL_CPU_CALL={value!r} is not a way to call a C kernel",
            expected=f"one of {', '.join(CPU_CALLS)}",
        )
    return value


def cxx_compiler() -> str:
    """`TENSORDSL_CXX`: the C++ compiler of the CUDA emulator (default "g++")."""
    return os.environ.get("TENSORDSL_CXX") or "g++"


def cuda_home() -> pathlib.Path | None:
    """`TENSORDSL_CUDA_HOME`: a CUDA toolkit folder whose include/ the emulator and the GPU
    launch handler compile against (default: the CUDA wheels, then /usr/local/cuda)."""
    value = os.environ.get("TENSORDSL_CUDA_HOME")
    return pathlib.Path(value) if value else None


EMULATE_ORDERS = {"0": None, "": None, "1": "forward", "forward": "forward", "reverse": "reverse"}


def cuda_emulate() -> str | None:
    """`TENSORDSL_CUDA_EMULATE`: run `backend="cuda"` through the CUDA emulator on the CPU:
    "1" or "forward" (threads and blocks in order), "reverse" (in reverse order, so that a
    missing barrier changes the result); None when unset or "0".

    Raises:
        SettingError: for any other value.
    """
    value = os.environ.get("TENSORDSL_CUDA_EMULATE", "").strip().lower()
    if value not in EMULATE_ORDERS:
        expected = ", ".join(repr(v) for v in EMULATE_ORDERS if v)
        raise SettingError(
            f"TENSORDSL_CUDA_EMULATE={value!r} is not an emulation order",
            expected=f"one of {expected}",
        )
    return EMULATE_ORDERS[value]


GPU_CALLS = ("ffi", "callback")


def gpu_call() -> str:
    """`TENSORDSL_GPU_CALL`: how JAX launches a CUDA kernel: "ffi" (default), an XLA FFI
    handler that launches the NVRTC-compiled cubin through the CUDA driver on XLA's stream,
    or "callback", a `buffer_callback` that launches a CuPy RawKernel (Python per call).

    Raises:
        SettingError: for any other value.
    """
    value = os.environ.get("TENSORDSL_GPU_CALL", "").strip().lower() or "ffi"
    if value not in GPU_CALLS:
        raise SettingError(
            f"TENSORDSL_GPU_CALL={value!r} is not a way to launch a CUDA kernel",
            expected=f"one of {', '.join(GPU_CALLS)}",
        )
    return value


VERBOSITY = {"0": 0, "quiet": 0, "1": 1, "": 1, "2": 2, "verbose": 2}


def verbosity() -> int:
    """`TENSORDSL_VERBOSE`: what building kernels reports on stderr (codegen/progress.py):
    "0" or "quiet" nothing; "1" (default) one progress line once a round of builds has run
    for `progress_after()` seconds; "2" or "verbose" that line from the first build, and
    the `tensordsl` logger at INFO level gets a record per kernel built.

    Raises:
        SettingError: for any other value.
    """
    value = os.environ.get("TENSORDSL_VERBOSE", "").strip().lower()
    if value not in VERBOSITY:
        raise SettingError(
            f"TENSORDSL_VERBOSE={value!r} is not a verbosity",
            expected="0 (quiet), 1 (default) or 2 (verbose)",
        )
    return VERBOSITY[value]


def progress_after() -> float:
    """`TENSORDSL_PROGRESS_AFTER`: seconds a round of kernel builds runs before its progress
    line appears (default 1.0; 0 shows it at once).

    Raises:
        SettingError: for anything but a number of seconds, 0 or more.
    """
    value = os.environ.get("TENSORDSL_PROGRESS_AFTER", "").strip()
    if not value:
        return 1.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise SettingError(
            f"TENSORDSL_PROGRESS_AFTER={value!r} is not a number of seconds",
            expected="a number, 0 or more",
        )
    return seconds


#: Every setting this module reads (tests/unit/test_settings.py checks that none is missing).
SETTINGS = (
    "TENSORDSL_BUILD",
    "TENSORDSL_BUILD_JOBS",
    "TENSORDSL_CACHE_DIR",
    "TENSORDSL_CC",
    "TENSORDSL_CENTRED_ROWS",
    "TENSORDSL_CFLAGS",
    "TENSORDSL_CPU_CALL",
    "TENSORDSL_CUDA_EMULATE",
    "TENSORDSL_CUDA_HOME",
    "TENSORDSL_CXX",
    "TENSORDSL_DEBUG",
    "TENSORDSL_DUMP_DIR",
    "TENSORDSL_FUSE",
    "TENSORDSL_GPU_CALL",
    "TENSORDSL_GROUP_GRADIENTS",
    "TENSORDSL_PAIR_GRADIENTS",
    "TENSORDSL_POISON_OUTPUTS",
    "TENSORDSL_PROGRESS_AFTER",
    "TENSORDSL_VERBOSE",
    "TENSORDSL_XLA_CONTRACTIONS",
)
#: The values of `SETTINGS` that `check_settings` found usable.
_CHECKED: set[tuple[str | None, ...]] = set()


def check_settings() -> None:
    """Read every `TENSORDSL_*` setting, so that a bad value raises its `SettingError` when
    a kernel is called, before JAX traces or lowers anything (each reader is also called
    where the setting is used, later); remembered per values of `SETTINGS` (looked up by
    name: every kernel call checks, and the whole environment is slower to scan).

    Raises:
        SettingError: the first setting whose value cannot be used.
    """
    key = tuple(os.environ.get(name) for name in SETTINGS)
    if key in _CHECKED:
        return
    readers: tuple[Callable[[], object], ...] = (debug, c_compiler, extra_cflags, build_jobs)
    readers += (build_mode,)
    readers += (poison_outputs, xla_contractions, fuse_programs, group_gradients)
    readers += (pair_gradients, cpu_call, cuda_emulate, gpu_call, verbosity, progress_after)
    readers += (centred_rows,)
    for read in (*readers, dump_dir):
        read()
    _CHECKED.add(key)


#: The OpenMP runtimes' own variables that choose how their idle threads wait (GCC's libgomp
#: reads the first two, LLVM's libomp the first and the last).
OPENMP_WAIT_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")
#: libgomp's spins of an idle thread before it sleeps: about 2 ms at 68 ns a pause (measured
#: on the project's machine), long enough that the next kernel of a program finds its team
#: awake, short enough to leave the core soon to XLA's threads and other processes.
SPIN_COUNT = 30000


def openmp_wait_defaults() -> dict[str, str]:
    """What to add to the environment before the OpenMP runtime loads: an idle thread spins
    `SPIN_COUNT` times (libgomp; libomp: 2 ms) and then sleeps, unless the user set one of
    `OPENMP_WAIT_VARIABLES` (even empty), which then wins (codegen/c/threads.py).

    >>> "GOMP_SPINCOUNT" in openmp_wait_defaults() or any(
    ...     name in os.environ for name in OPENMP_WAIT_VARIABLES)
    True
    """
    if any(name in os.environ for name in OPENMP_WAIT_VARIABLES):
        return {}
    return {"GOMP_SPINCOUNT": str(SPIN_COUNT), "KMP_BLOCKTIME": "2"}
