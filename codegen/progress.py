"""What building kernels reports: the `tensordsl` logger and one progress line on stderr.

Kernels build on a model's first `jit` call, in rounds: the binding starts every kernel of a
traced function at once (codegen/c/run/build.py), and they finish while tracing goes on. A round
that has run for `TENSORDSL_PROGRESS_AFTER` seconds (default 1) gets one line on stderr,
`tensordsl: building 7 kernels: 3/7`, rewritten in place with a bar on a terminal and
printed once per finished kernel otherwise, then `tensordsl: built 7 kernels in 3.1 s`.
A short round prints nothing. `TENSORDSL_VERBOSE=0` silences the line, `2` shows it from
the first build (codegen/config.py). The `tensordsl` logger gets an INFO record when a round
is shown and when it ends, and a DEBUG record per kernel, whatever the verbosity.

The builds are counted where they run once per kernel: `codegen.cache.once.OnceMap` calls
`queued` when a kernel is started or first asked for, `finished` when its build returns or
fails, and `dropped` for a background start that was given up.

>>> progress = BuildProgress()
>>> progress.queued(); progress.finished()
>>> progress.pending
0
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator

from codegen import config

logger = logging.getLogger("tensordsl")

BAR_WIDTH = 20


class BuildProgress:
    """Counts the builds of the current round and reports them (see the module docstring)."""

    def __init__(self, what: str = "kernel") -> None:
        self.what = what
        self._lock = threading.Lock()
        self._total = 0
        self._done = 0
        self._started = 0.0
        self._round = 0
        self._shown = False
        self._verbosity = 1
        self._silenced = 0
        self._timer: threading.Timer | None = None

    @property
    def pending(self) -> int:
        """Builds queued or running and not finished."""
        with self._lock:
            return self._total - self._done

    def queued(self) -> None:
        """One more build in this round (a new round when none is under way).

        Raises:
            config.SettingError: `TENSORDSL_VERBOSE` or `TENSORDSL_PROGRESS_AFTER` is bad.
        """
        with self._lock:
            if self._total == self._done:
                verbosity = config.verbosity()
                delay = 0.0 if verbosity >= 2 else config.progress_after()
                self._start_round(verbosity, delay)
            self._total += 1
            if self._shown:
                self._show()

    def finished(self) -> None:
        """A build of this round returned (or failed)."""
        with self._lock:
            self._done += 1
            logger.debug("%s %d/%d of the round built", self.what, self._done, self._total)
            if self._done >= self._total:
                self._end_round()
            elif self._shown:
                self._show()

    def dropped(self) -> None:
        """A queued build that will not run in this round."""
        with self._lock:
            self._total -= 1
            if self._done >= self._total:
                self._end_round()

    @contextlib.contextmanager
    def silenced(self) -> Iterator[None]:
        """No progress line inside (a caller that reports builds itself, as the CLI does)."""
        with self._lock:
            self._silenced += 1
        try:
            yield
        finally:
            with self._lock:
                self._silenced -= 1

    def _start_round(self, verbosity: int, delay: float) -> None:
        self._round += 1
        self._total = self._done = 0
        self._started = time.perf_counter()
        self._shown = False
        self._verbosity = verbosity
        if delay <= 0:
            self._begin_showing()
            return
        self._timer = threading.Timer(delay, self._on_timer, args=(self._round,))
        self._timer.daemon = True
        self._timer.start()

    def _on_timer(self, round_number: int) -> None:
        with self._lock:
            if round_number == self._round and self._done < self._total and not self._shown:
                self._begin_showing()
                self._show()

    def _begin_showing(self) -> None:
        self._shown = True
        logger.info(
            "building %ss: the first calls wait for the C compiler (the disk cache keeps them)",
            self.what,
        )

    def _end_round(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        seconds = time.perf_counter() - self._started
        if self._shown and self._done:
            logger.info("built %d %ss in %.1f s", self._done, self.what, seconds)
            self._write(f"built {self._done} {self._plural(self._done)} in {seconds:.1f} s", True)
        self._shown = False
        self._total = self._done = 0

    def _show(self) -> None:
        if self._total <= 0:
            return
        text = f"building {self._total} {self._plural(self._total)}: {self._done}/{self._total}"
        self._write(text, False)

    def _plural(self, count: int) -> str:
        return self.what + "s" * (count != 1)

    def _write(self, text: str, last: bool) -> None:
        """One line on stderr: rewritten in place with a bar on a terminal, else printed."""
        if self._verbosity <= 0 or self._silenced:
            return
        stream = sys.stderr
        try:
            tty = stream.isatty()
        except (AttributeError, ValueError):
            tty = False
        if tty and last:
            stream.write(f"\r\033[Ktensordsl: {text}\n")
        elif tty:
            filled = BAR_WIDTH * self._done // max(self._total, 1)
            bar = "#" * filled + "." * (BAR_WIDTH - filled)
            seconds = time.perf_counter() - self._started
            stream.write(f"\r\033[Ktensordsl: {text} [{bar}] {seconds:.0f} s")
        else:
            stream.write(f"tensordsl: {text}\n")
        stream.flush()


#: The builds of C kernels (codegen/c/run/build.py).
BUILDS = BuildProgress()
