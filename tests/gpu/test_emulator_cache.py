"""The CUDA emulator's disk cache survives damaged entries (issue 36, item 5), as the C cache
does (tests/cpu/test_cache_and_compiler.py): a truncated library used to kill every later
process with SIGBUS (the loader maps segments past the end of the file), an emptied one to
raise a raw OSError, each time, since nothing rebuilt it. Each process here is a fresh one:
a process that has a library open keeps its copy."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from codegen.cuda.emulator import emulate
from tests.sampling import sampled

pytestmark = pytest.mark.skipif(not emulate.available(), reason="no CUDA emulator here")
ROOT = pathlib.Path(__file__).resolve().parents[2]

# Two emulated kernel calls, each checked against float64 NumPy; prints the compiler's counters.
# (tanh, not exp: an elementwise nest of exp is XLA's work, `codegen.ir.xla_elementwise`.)
CHILD = (
    "import json\n"
    "import numpy as np\n"
    "import tensordsl as td\n"
    "from codegen.c.run import compiler\n"
    "x = np.random.default_rng(3).uniform(-2.0, 2.0, 37)\n"
    "w = np.random.default_rng(4).uniform(0.5, 1.5, 37)\n"
    "k = td.kernel('Y[i] := X[i] * W[i] + tanh(X[i])', backend='cuda')\n"
    "np.testing.assert_allclose(np.asarray(k(x, w)), x * w + np.tanh(x), rtol=1e-12)\n"
    "k = td.kernel('Z[i] := X[i] / W[i]', backend='cuda')\n"
    "np.testing.assert_allclose(np.asarray(k(x, w)), x / w, rtol=1e-12)\n"
    "print(json.dumps(compiler.STATS))\n"
)


def child_compiles(cache: pathlib.Path) -> int:
    """Run CHILD in a fresh process on `cache`; how many compiler calls it made."""
    env = {**os.environ, "TENSORDSL_CACHE_DIR": str(cache), "JAX_ENABLE_X64": "1"}
    env.update(TENSORDSL_CUDA_EMULATE="1", TENSORDSL_POISON_OUTPUTS="1", JAX_PLATFORMS="cpu")
    done = subprocess.run(
        [sys.executable, "-c", CHILD], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, f"exit status {done.returncode}\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.splitlines()[-1])["compiles"]


@pytest.fixture(scope="module")
def warm(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """A cache holding the call's emulated libraries (its kernel and the launch handlers)."""
    cache = tmp_path_factory.mktemp("emulator") / "cache"
    assert child_compiles(cache) >= 1
    assert child_compiles(cache) == 0
    return cache


def _damaged(data: bytes, other: bytes, how: str) -> bytes:
    return {
        "truncated": data[: len(data) // 2],
        "one_byte_short": data[:-1],
        "emptied": b"",
        "garbage": os.urandom(len(data)),
        "another_library": other,
    }[how]


@pytest.mark.parametrize(
    "how",
    sampled(
        ["truncated", "garbage", "another_library", "one_byte_short", "emptied"],
        every=2,
        ids=str,
    ),
)
def test_a_damaged_emulator_library_is_rebuilt_once(
    warm: pathlib.Path, tmp_path: pathlib.Path, how: str
) -> None:
    copy = tmp_path / "cache"
    shutil.copytree(warm, copy)
    libraries = sorted(copy.glob("cuda_emu/*/*.so"))
    assert len(libraries) >= 3  # the kernels' units and the launch handlers
    contents = [path.read_bytes() for path in libraries]
    for n, path in enumerate(libraries):  # each swapped with the next one for another_library
        path.write_bytes(_damaged(contents[n], contents[(n + 1) % len(contents)], how))
    # Once each; a swapped library that loaded stays loaded under its name (a C++ library may
    # not unload), so its rebuilt file is loaded under another name: built twice.
    most = 2 * len(libraries) if how == "another_library" else len(libraries)
    assert len(libraries) <= child_compiles(copy) <= most
    assert child_compiles(copy) == 0  # the rebuilt entries are whole: disk hits


def test_the_header_is_precompiled_once_two_units_were_compiled(warm: pathlib.Path) -> None:
    # The second kernel's unit builds runtime.h.gch (the launch handlers have flags of their
    # own: their unit does not count).
    (gch,) = warm.glob("cuda_emu_pch/*/runtime.h.gch")
    assert gch.stat().st_size > 1_000_000
    assert (gch.parent / "runtime.h.gch.size").read_text() == str(gch.stat().st_size)


def _damaged_copy(
    warm: pathlib.Path, tmp_path: pathlib.Path, pattern: str, how: str
) -> tuple[pathlib.Path, bytes]:
    """A copy of the warm cache whose one file matching `pattern` is damaged `how`
    (truncated, emptied, garbage of its size, or another file's bytes: the header beside a
    `.gch`, a unit's library for the runtime object), every unit's library removed, and that
    file's bytes before."""
    copy = tmp_path / "cache"
    shutil.copytree(warm, copy)
    (path,) = copy.glob(pattern)
    data = path.read_bytes()
    damaged = {
        "truncated": lambda: data[: len(data) // 2],
        "emptied": lambda: b"",
        "garbage": lambda: os.urandom(len(data)),
        "another_header": lambda: (path.parent / "runtime.h").read_bytes(),
        "another_object": lambda: next(copy.glob("cuda_emu/*/*.so")).read_bytes(),
    }[how]()
    path.write_bytes(damaged)
    for library in copy.glob("cuda_emu/*/*.so"):
        library.unlink()  # every unit is compiled (and linked) again, beside the damaged file
    return copy, data


@pytest.mark.parametrize(
    "how", sampled(["truncated", "garbage", "another_header", "emptied"], every=2, ids=str)
)
def test_a_damaged_precompiled_header_is_never_fatal(
    warm: pathlib.Path, tmp_path: pathlib.Path, how: str
) -> None:
    # g++ stops at a truncated .gch ("while reading precompiled header") and skips one that
    # is not valid for the unit's flags: a truncated one is removed, the others are skipped.
    # A garbage .gch has the recorded size: it is not removed.
    copy, _ = _damaged_copy(warm, tmp_path, "cuda_emu_pch/*/runtime.h.gch", how)
    assert child_compiles(copy) >= 3  # and the kernels' results are checked (CHILD)
    assert child_compiles(copy) == 0


def test_the_runtime_is_compiled_once_and_sealed(warm: pathlib.Path) -> None:
    # The kernels' units link one runtime.o (the launch handlers' unit has none).
    (obj,) = warm.glob("cuda_emu_pch/*/runtime.o")
    digest = hashlib.sha256(obj.read_bytes()).hexdigest()
    assert (obj.parent / "runtime.o.sha256").read_text() == digest


@pytest.mark.parametrize(
    "how", sampled(["truncated", "garbage", "another_object", "emptied"], every=2, ids=str)
)
def test_a_damaged_runtime_object_is_rebuilt(
    warm: pathlib.Path, tmp_path: pathlib.Path, how: str
) -> None:
    # An object whose SHA-256 is not the recorded one is built again before a unit links it
    # (a garbage one of the right size would fail the link: a build error).
    copy, data = _damaged_copy(warm, tmp_path, "cuda_emu_pch/*/runtime.o", how)
    (obj,) = copy.glob("cuda_emu_pch/*/runtime.o")
    assert child_compiles(copy) >= 3  # and the kernels' results are checked (CHILD)
    assert hashlib.sha256(obj.read_bytes()).hexdigest() == hashlib.sha256(data).hexdigest()
    assert child_compiles(copy) == 0
