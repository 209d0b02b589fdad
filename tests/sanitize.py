"""The sanitizer tier: the corpus and its gradients with AddressSanitizer and UBSan.

Run `make sanitize` (or `python -m tests.sanitize [pytest arguments]`). Every generated
kernel is compiled with `-fsanitize=address,undefined` (through `TENSORDSL_CFLAGS`, into a
cache folder of its own) and the corpus tests run in a Python process that has the ASan
runtime preloaded: kernels are loaded into the process (ctypes, XLA's FFI handler), so ASan
must come first in the library list. libstdc++ is preloaded too, or ASan's `__cxa_throw`
interceptor finds no real function when jaxlib (C++) is loaded later and aborts.

A canary kernel that reads past its buffer is run first: if ASan does not report it, the
tier is not working and nothing else runs. Reports go to `<folder>/asan.*` and
`<folder>/ubsan.*`; UBSan reports and continues, ASan stops the process at its first error.
Pure contractions are generated as kernels too (`TENSORDSL_XLA_CONTRACTIONS=0`).
The exit status is 0 only when the tests pass and no report was written.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tempfile

SANITIZE_FLAGS = "-fsanitize=address,undefined,float-cast-overflow -fno-omit-frame-pointer -g"
#: The corpus forward pass and every gradient, on the C back end.
DEFAULT_TESTS = ("tests/cpu/test_corpus_c.py", "-k", "test_forward or test_gradients")
CANARY = """
import ctypes
from codegen.c.run.compiler import compile_c
library = ctypes.CDLL(str(compile_c("void tdsl_canary(double *x) { x[4] = x[3] + 1; }")))
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
library.tdsl_canary(ctypes.c_void_p(libc.malloc(4 * 8)))  # writes one double past the end
"""


def runtime(name: str) -> str | None:
    """The full path of a runtime library of the configured C compiler, or None."""
    cc = os.environ.get("TENSORDSL_CC") or "cc"
    try:
        found = subprocess.run(
            [cc, f"-print-file-name={name}"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return None
    return found if os.path.isabs(found) and os.path.exists(found) else None


def environment(folder: pathlib.Path) -> dict[str, str]:
    """The environment of a sanitized run whose reports and cache live in `folder`."""
    libraries = [runtime("libasan.so"), runtime("libstdc++.so")]
    if None in libraries:
        raise SystemExit("sanitize: the C compiler has no libasan.so or libstdc++.so")
    return {
        **os.environ,
        "LD_PRELOAD": " ".join(str(path) for path in libraries),
        "ASAN_OPTIONS": f"detect_leaks=0:log_path={folder / 'asan'}",
        "UBSAN_OPTIONS": f"print_stacktrace=1:log_path={folder / 'ubsan'}",
        "TENSORDSL_CFLAGS": f"{os.environ.get('TENSORDSL_CFLAGS', '')} {SANITIZE_FLAGS}".strip(),
        "TENSORDSL_CACHE_DIR": str(folder / "cache"),
        "TENSORDSL_XLA_CONTRACTIONS": "0",  # pure contractions as kernels too, not XLA's dot
    }


def reports(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in folder.glob("*san.*") if p.is_file())


def main(argv: list[str]) -> int:
    folder = pathlib.Path(tempfile.mkdtemp(prefix="tensordsl-sanitize-"))
    env = environment(folder)
    canary = subprocess.run([sys.executable, "-c", CANARY], env=env, check=False)
    found = reports(folder)
    if canary.returncode == 0 or not any("heap-buffer-overflow" in p.read_text() for p in found):
        print(f"sanitize: the canary's overflow was not reported ({folder}); tier not working")
        return 2
    for path in found:
        path.unlink()
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *(argv or DEFAULT_TESTS)]
    print("sanitize: " + " ".join(command), flush=True)
    tests = subprocess.run(command, env=env, check=False)
    found = reports(folder)
    for path in found:
        print(f"---- {path.name} ----\n{path.read_text()}")
    print(f"sanitize: pytest exit status {tests.returncode}, {len(found)} report(s) in {folder}")
    return 1 if tests.returncode or found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
