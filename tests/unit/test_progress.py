"""Build progress: one line on stderr for a round of builds past the threshold, the logger."""

from __future__ import annotations

import logging
import time

import pytest

from codegen import config
from codegen.cache.once import OnceMap
from codegen.progress import BuildProgress


def _round(progress: BuildProgress, count: int) -> None:
    for _ in range(count):
        progress.queued()
    for _ in range(count):
        progress.finished()


def test_a_round_past_the_threshold_prints_plain_lines_when_not_a_tty(capsys, monkeypatch):
    monkeypatch.setenv("TENSORDSL_PROGRESS_AFTER", "0")
    progress = BuildProgress()
    _round(progress, 3)
    lines = capsys.readouterr().err.splitlines()
    assert lines[:3] == [
        "tensordsl: building 1 kernel: 0/1",
        "tensordsl: building 2 kernels: 0/2",
        "tensordsl: building 3 kernels: 0/3",
    ]
    assert lines[3:5] == [
        "tensordsl: building 3 kernels: 1/3",
        "tensordsl: building 3 kernels: 2/3",
    ]
    assert lines[5].startswith("tensordsl: built 3 kernels in ") and len(lines) == 6
    assert progress.pending == 0


def test_a_short_round_prints_nothing(capsys, monkeypatch):
    monkeypatch.delenv("TENSORDSL_PROGRESS_AFTER", raising=False)
    _round(BuildProgress(), 5)
    assert capsys.readouterr().err == ""


def test_the_line_appears_once_the_round_passes_the_threshold(capsys, monkeypatch):
    monkeypatch.setenv("TENSORDSL_PROGRESS_AFTER", "0.05")
    progress = BuildProgress()
    progress.queued()
    progress.queued()
    seen = ""
    deadline = time.monotonic() + 5
    while "tensordsl: building 2 kernels: 0/2" not in seen:  # printed by the timer thread
        assert time.monotonic() < deadline, "no progress line after the threshold"
        time.sleep(0.02)
        seen += capsys.readouterr().err
    progress.finished()
    progress.finished()
    err = capsys.readouterr().err
    assert "tensordsl: building 2 kernels: 1/2" in err
    assert "tensordsl: built 2 kernels in " in err


def test_a_terminal_gets_one_line_rewritten_with_a_bar(monkeypatch):
    written = []

    class Terminal:
        def isatty(self):
            return True

        def write(self, text):
            written.append(text)

        def flush(self):
            pass

    monkeypatch.setattr("sys.stderr", Terminal())
    monkeypatch.setenv("TENSORDSL_VERBOSE", "2")
    _round(BuildProgress(), 2)
    assert all(text.startswith("\r\033[K") for text in written)
    assert "\n" not in "".join(written[:-1]) and written[-1].endswith("\n")
    assert "tensordsl: building 2 kernels: 1/2 [##########..........]" in "".join(written)


def test_quiet_prints_nothing_and_the_logger_still_records(capsys, caplog, monkeypatch):
    monkeypatch.setenv("TENSORDSL_PROGRESS_AFTER", "0")
    monkeypatch.setenv("TENSORDSL_VERBOSE", "0")
    with caplog.at_level(logging.DEBUG, logger="tensordsl"):
        _round(BuildProgress(), 2)
    assert capsys.readouterr().err == ""
    messages = [r.getMessage() for r in caplog.records if r.name == "tensordsl"]
    assert messages[0].startswith("building kernels")
    assert messages[-1].startswith("built 2 kernels in ")
    assert [r.levelname for r in caplog.records].count("DEBUG") == 2


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("TENSORDSL_VERBOSE", "loud"),
        ("TENSORDSL_PROGRESS_AFTER", "soon"),
        ("TENSORDSL_PROGRESS_AFTER", "-1"),
        ("TENSORDSL_PROGRESS_AFTER", "nan"),
    ],
)
def test_bad_settings_raise_a_setting_error_naming_them(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(config.SettingError, match=rf"{name}={value!r} is not a"):
        BuildProgress().queued()


def test_once_map_counts_each_computation_once(monkeypatch):
    monkeypatch.setenv("TENSORDSL_PROGRESS_AFTER", "100")
    progress = BuildProgress()
    values: OnceMap[int] = OnceMap(progress)
    values.start("a", lambda: 1, workers=2)
    assert values.get("a", lambda: 0) == 1
    assert values.get("b", lambda: 2) == 2
    assert values.get("b", lambda: 3) == 2  # known: not counted again
    with pytest.raises(ZeroDivisionError):
        values.get("c", lambda: 1 // 0)
    deadline = time.monotonic() + 5
    while progress.pending:
        assert time.monotonic() < deadline
        time.sleep(0.01)
