"""The disk cache and the compiler settings: damaged entries are rebuilt, an unusable cache
folder falls back to a private one, and a broken compiler setting is the user's, not a bug."""

from __future__ import annotations

import errno
import os
import pathlib
import shutil
import time
import traceback
import warnings

import jax
import numpy as np
import pytest
import sympy

import tensordsl as td
from codegen import config
from codegen.c.run import compiler
from codegen.c.run.build import build_c, clear_memory_cache
from codegen.c.run.compiler import BuildError, compile_c
from codegen.config import SettingError
from codegen.ir.nest import LoopNest, Operand, Range, Term, extent_symbol, index_symbol, tensor_base
from tests.backends import NEEDS_C_COMPILER

pytestmark = NEEDS_C_COMPILER
DTYPES = {"A": "float64", "Y": "float64"}


def scaled(constant: float) -> LoopNest:
    """`Y[i] = A[i] * constant`: a distinct kernel (and cache entry) per constant."""
    i = index_symbol("i")
    return LoopNest(
        "Y",
        (Range(i, 0, extent_symbol("A", 0)),),
        (Term(tensor_base("A")[i] * sympy.Float(constant)),),
        (Operand("A", 1),),
    )


def run(nest: LoopNest, constant: float) -> None:
    """Build `nest` and check its numbers against NumPy."""
    values = np.random.default_rng(1).normal(size=7)
    out = np.full(7, np.nan)
    build_c(nest, dtypes=DTYPES)(out, [values], {})
    np.testing.assert_allclose(out, values * constant, rtol=1e-15)


@pytest.fixture
def cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(tmp_path / "cache"))
    clear_memory_cache()
    yield tmp_path / "cache"
    clear_memory_cache()


def _damage(library: pathlib.Path, other: pathlib.Path, how: str) -> None:
    data = library.read_bytes()
    damaged = {
        "truncated": data[: len(data) // 2],
        "one_byte_short": data[:-1],
        "emptied": b"",
        "garbage": os.urandom(len(data)),
        "another_kernel": other.read_bytes(),
    }[how]
    library.write_bytes(damaged)


@pytest.mark.parametrize(
    "how", ["truncated", "one_byte_short", "emptied", "garbage", "another_kernel"]
)
def test_a_damaged_cache_entry_is_rebuilt_once(
    cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    constant, other = np.random.default_rng().uniform(1, 2, size=2)
    nest = scaled(constant)
    library = build_c(nest, dtypes=DTYPES).library
    other_library = build_c(scaled(other), dtypes=DTYPES).library
    # A copy of the cache that this process has not loaded yet (the loader reuses an open
    # library of the same path), with the entry damaged.
    copy = cache.parent / "copy"
    shutil.copytree(cache, copy)
    _damage(copy / library.relative_to(cache), copy / other_library.relative_to(cache), how)
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", str(copy))
    clear_memory_cache()
    compiles = compiler.STATS["compiles"]
    run(nest, constant)
    assert compiler.STATS["compiles"] == compiles + 1
    clear_memory_cache()
    run(nest, constant)  # the rebuilt entry is whole: a disk hit
    assert compiler.STATS["compiles"] == compiles + 1


def test_a_failed_build_leaves_no_entry(cache: pathlib.Path, monkeypatch) -> None:
    # A compiler that writes half an output and fails: nothing must stay in the cache.
    script = cache.parent / "half-cc"
    script.write_text(
        '#!/bin/sh\nout=""; while [ $# -gt 0 ]; do [ "$1" = -o ] && out="$2"; shift; done\n'
        'printf "\\177ELF half" > "$out"; exit 1\n'
    )
    script.chmod(0o755)
    monkeypatch.setenv("TENSORDSL_CC", str(script))
    with pytest.raises(SettingError):
        compile_c("int tdsl_half(void) { return 1; }\n")
    assert not list(cache.glob("c/*/*.so")) and not list(cache.glob("c/*/*.tmp"))


def _unusable(where: str, tmp_path: pathlib.Path) -> str:
    if where == "a_file":
        (tmp_path / "file").write_text("not a folder")
        return str(tmp_path / "file")
    if where == "under_a_file":
        (tmp_path / "file").write_text("not a folder")
        return str(tmp_path / "file" / "cache")
    if where == "read_only":
        folder = tmp_path / "read-only"
        folder.mkdir()
        folder.chmod(0o500)
        return str(folder)
    return "/proc/tensordsl-cache"


@pytest.mark.parametrize("where", ["a_file", "under_a_file", "under_proc", "read_only"])
def test_an_unusable_cache_folder_falls_back_with_one_warning(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    if where == "read_only" and os.geteuid() == 0:
        pytest.skip("root writes into read-only folders")
    path = _unusable(where, tmp_path)
    monkeypatch.setenv("TENSORDSL_CACHE_DIR", path)
    clear_memory_cache()
    constants = np.random.default_rng().uniform(1, 2, size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for constant in constants:
            run(scaled(constant), constant)
    messages = [str(w.message) for w in caught if "TENSORDSL_CACHE_DIR" in str(w.message)]
    assert len(messages) == 1, messages
    assert path in messages[0] and "private" in messages[0]
    clear_memory_cache()


def test_a_failing_compiler_is_the_users_setting(cache: pathlib.Path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORDSL_CC", "false")
    with pytest.raises(SettingError, match="TENSORDSL_CC='false'") as error:
        build_c(scaled(np.random.default_rng().uniform(1, 2)), dtypes=DTYPES)
    assert "tensordsl bug" not in str(error.value)
    assert "command: false " in str(error.value)


def test_a_missing_compiler_is_the_users_setting(cache: pathlib.Path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORDSL_CC", "/nonexistent/cc")
    with pytest.raises(SettingError, match="cannot run the compiler '/nonexistent/cc'"):
        build_c(scaled(np.random.default_rng().uniform(1, 2)), dtypes=DTYPES)


def test_bad_cflags_are_the_users_setting(cache: pathlib.Path, monkeypatch) -> None:
    monkeypatch.setenv("TENSORDSL_CFLAGS", "-fno-such-flag-tdsl")
    with pytest.raises(SettingError, match="TENSORDSL_CFLAGS='-fno-such-flag-tdsl'") as error:
        build_c(scaled(np.random.default_rng().uniform(1, 2)), dtypes=DTYPES)
    assert "-fno-such-flag-tdsl" in str(error.value).split("command:")[1]


@pytest.mark.parametrize("flags", ['-DNAME="x', "-O2 '-g"])
def test_unbalanced_quotes_in_cflags_name_the_variable(monkeypatch, flags: str) -> None:
    monkeypatch.setenv("TENSORDSL_CFLAGS", flags)
    with pytest.raises(SettingError, match="TENSORDSL_CFLAGS=.*No closing quotation"):
        config.extra_cflags()


def test_generated_code_the_compiler_rejects_is_still_a_bug(cache: pathlib.Path) -> None:
    with pytest.raises(BuildError, match="tensordsl bug"):
        compile_c("int broken(void) { return }\n")


# ---- Issue 27: settings that raised a plain ValueError, a raw OSError or meant yes ----


@pytest.mark.parametrize(
    "name, value, read",
    [
        ("TENSORDSL_BUILD_JOBS", "abc", config.build_jobs),
        ("TENSORDSL_CUDA_EMULATE", "yes", config.cuda_emulate),
        ("TENSORDSL_FUSE", "maybe", config.fuse_programs),
        ("TENSORDSL_DUMP_DIR", "/proc/x", config.dump_dir),
        ("TENSORDSL_CC", "'gcc", config.c_compiler),
    ],
)
def test_unusable_settings_are_setting_errors(monkeypatch, name: str, value: str, read) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(SettingError, match=f"{name}="):
        read()


@pytest.mark.parametrize(
    "value, fused",
    [("false", False), ("off", False), ("0", False), ("true", True), ("yes", True), ("1", True)],
)
def test_fuse_reads_yes_and_no_words(monkeypatch, value: str, fused: bool) -> None:
    monkeypatch.setenv("TENSORDSL_FUSE", value)
    assert config.fuse_programs() is fused


def test_compiler_setting_with_flags(cache: pathlib.Path, monkeypatch) -> None:
    """`TENSORDSL_CC="cc -O0"`: the compiler is its first word, the rest are flags."""
    monkeypatch.setenv("TENSORDSL_CC", f"{config.c_compiler()} -O0 -DTDSL_ISSUE_27=1")
    assert shutil.which(config.c_compiler()) is not None
    assert config.c_compiler_flags() == ("-O0", "-DTDSL_ISSUE_27=1")
    assert compiler.compile_flags()[-2:] == ("-O0", "-DTDSL_ISSUE_27=1")
    constant = np.random.default_rng().uniform(1, 2)
    run(scaled(constant), constant)


# ---- Issue 27: a full disk, and temporaries a killed build left ----


def test_a_full_cache_disk_falls_back_with_one_warning(
    cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every write into the cache folder fails with ENOSPC: kernels still build and run (in
    a private folder, one warning) and no temporary file is left behind."""
    from codegen.cache import disk as disk_cache

    write = disk_cache._write

    def full(handle, data, name):
        if name.startswith(str(cache)):
            raise OSError(errno.ENOSPC, "No space left on device")
        write(handle, data, name)

    monkeypatch.setattr(disk_cache, "_write", full)
    monkeypatch.setattr(disk_cache, "_REPLACED", {})
    disk_cache.usable_folder.cache_clear()
    constants = np.random.default_rng().uniform(1, 2, size=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for constant in constants:
            run(scaled(constant), constant)
    messages = [str(w.message) for w in caught if "TENSORDSL_CACHE_DIR" in str(w.message)]
    assert len(messages) == 1 and "No space left on device" in messages[0], messages
    assert not list(cache.rglob("*.tmp"))
    disk_cache.usable_folder.cache_clear()


def test_stale_temporaries_are_removed(cache: pathlib.Path) -> None:
    """A build killed by SIGKILL leaves `*.so.tmp`; the next write to its folder removes it
    once it is older than `STALE_AFTER`, and leaves a fresh one (a build in progress)."""
    from codegen.cache import disk as disk_cache

    constant = np.random.default_rng().uniform(1, 2)
    run(scaled(constant), constant)
    (folder,) = {p.parent for p in cache.glob("c/*/*.so")}
    stale, fresh = folder / "0123.abc.so.tmp", folder / "4567.def.so.tmp"
    stale.write_bytes(b"half a library")
    fresh.write_bytes(b"a build in progress")
    old = time.time() - disk_cache.STALE_AFTER - 60
    os.utime(stale, (old, old))
    disk_cache.atomic_write(folder / "another.c", b"int x;\n")
    assert not stale.exists() and fresh.exists()


# ---- Issue 26: cold builds ----


def test_large_sources_compile_at_O2_unless_the_user_says(
    cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A source over `LARGE_SOURCE` characters compiles with `-O2` (gcc's `-O3` takes 2-4x
    longer on the tiled attention gradients), a smaller one with `-O3`; `TENSORDSL_CFLAGS`
    come later on the command line and win. Every library built computes what it should."""
    import ctypes

    levels = []
    real = compiler._run_compiler

    def recorded(command, tool, flags):
        levels.append([word for word in command if word.startswith("-O")])
        real(command, tool, flags)

    monkeypatch.setattr(compiler, "_run_compiler", recorded)
    tag = int(np.random.default_rng().integers(1 << 30))
    small = f"int tdsl_f0(int x) {{ return x * 3 + {tag}; }}\n"
    count = compiler.LARGE_SOURCE // len(small) + 2
    large = "".join(
        f"int tdsl_f{i}(int x) {{ return x * {i % 7 + 3} + {tag}; }}\n" for i in range(count)
    )
    assert len(small) <= compiler.LARGE_SOURCE < len(large)
    built = [compile_c(small), compile_c(large)]
    monkeypatch.setenv("TENSORDSL_CFLAGS", "-O3")
    built.append(compile_c(large))
    assert levels == [["-O3"], ["-O2"], ["-O2", "-O3"]]
    assert len(set(built)) == 3
    for library in built:
        f = ctypes.CDLL(str(library)).tdsl_f0
        f.restype, f.argtypes = ctypes.c_int, [ctypes.c_int]
        assert f(5) == 15 + tag


# ---- Issue 36.8: a bad setting reached the user as codegen's own error, inside JAX's lowering ----


@pytest.mark.parametrize(
    "name, value, wording",
    [
        ("TENSORDSL_BUILD_JOBS", "abc", "TENSORDSL_BUILD_JOBS='abc' is not a number of jobs"),
        ("TENSORDSL_DUMP_DIR", "/proc/no/such", "TENSORDSL_DUMP_DIR='/proc/no/such': the folder"),
        ("TENSORDSL_VERBOSE", "loud", "TENSORDSL_VERBOSE='loud' is not a verbosity"),
        ("TENSORDSL_GPU_CALL", "x", "TENSORDSL_GPU_CALL='x' is not a way to launch"),
        ("TENSORDSL_FUSE", "maybe", "TENSORDSL_FUSE='maybe' is not a yes/no value"),
    ],
)
@pytest.mark.parametrize("call", ["kernel", "program", "jit"])
def test_a_bad_setting_is_a_tensordsl_error_before_jax_lowers(
    monkeypatch, name, value, wording, call
):
    monkeypatch.setenv(name, value)
    k = td.kernel("Y[i] := X[i,j] * X[i,j]", backend="c")
    p = td.program("N[i] := X[i,j]; Y[i] := X[i,j] / N[i]", backend="c")
    X = np.random.default_rng(0).normal(size=(3, 4))
    run = {"kernel": k, "program": p, "jit": jax.jit(k)}[call]
    with pytest.raises(td.SettingError, match=wording) as error:
        run(X)
    assert isinstance(error.value, td.TensorDSLError) and isinstance(error.value, ValueError)
    assert "\nexpected " in str(error.value)
    frames = [frame.filename for frame in traceback.extract_tb(error.value.__traceback__)]
    assert not any("jax/_src/interpreters" in f for f in frames), frames


def test_a_compiler_that_cannot_run_is_a_tensordsl_error(cache: pathlib.Path, monkeypatch):
    monkeypatch.setenv("TENSORDSL_CC", "/nonexistent/cc")
    k = td.kernel(f"Y[i] := X[i] * {np.random.default_rng().uniform(1, 2)}", backend="c")
    with pytest.raises(td.SettingError, match="cannot run the compiler '/nonexistent/cc'"):
        k(np.random.default_rng(0).normal(size=3))
