"""Values computed once per key, by the first thread that asks or by a background pool.

`OnceMap.get(key, compute)` returns the value for `key`, computing it at most once however
many threads ask at the same time; `OnceMap.start(key, compute)` asks a pool of background
threads to compute it ahead of need. Whoever comes first does the work: a thread that asks
for a value whose background computation has not started yet computes it itself instead of
waiting in the queue. A failed computation is not kept (the next `get` tries again); its
error is raised in every thread waiting for it.

The build of C kernels uses it (codegen/c/run/build.py): kernels are started at trace time, so
independent compiles run in parallel with each other and with the rest of the trace.

>>> values = OnceMap()
>>> values.start("a", lambda: 1 + 1, workers=2)
>>> values.get("a", lambda: 0), values.get("b", lambda: 3)
(2, 3)
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import Generic, Protocol, TypeVar

Value = TypeVar("Value")


class Progress(Protocol):
    """What a `OnceMap` reports about its computations (codegen/progress.py)."""

    def queued(self) -> None: ...
    def finished(self) -> None: ...
    def dropped(self) -> None: ...


class _Slot(Generic[Value]):
    """One computation in progress: `claim` is taken by whoever runs it."""

    def __init__(self) -> None:
        self.claim = threading.Lock()
        self.done = threading.Event()
        self.value: Value | None = None
        self.error: BaseException | None = None
        self.skipped = False  # a background start that did not run (see `start`)
        self.counted = False  # reported to the map's progress as queued


class OnceMap(Generic[Value]):
    """A thread-safe map from keys to values computed once (see the module docstring).

    `progress`, when given, is told of every computation: queued when started in the
    background or first asked for, finished when it returns or fails, dropped when a
    background start does not run.
    """

    def __init__(self, progress: Progress | None = None) -> None:
        self._progress = progress
        self._lock = threading.Lock()
        self._values: dict[Hashable, Value] = {}
        self._slots: dict[Hashable, _Slot[Value]] = {}
        self._pool: ThreadPoolExecutor | None = None

    def get(self, key: Hashable, compute: Callable[[], Value]) -> Value:
        """The value of `key`: known, computed by another thread, or computed now."""
        while True:
            with self._lock:
                if key in self._values:
                    return self._values[key]
                slot = self._slots.setdefault(key, _Slot())
            if slot.claim.acquire(blocking=False):
                self._run(key, slot, compute)
            slot.done.wait()
            if slot.error is not None:
                raise slot.error
            if not slot.skipped:
                return slot.value  # type: ignore[return-value]

    def start(
        self,
        key: Hashable,
        compute: Callable[[], Value],
        *,
        still_wanted: Callable[[], bool] = lambda: True,
        workers: int = 1,
    ) -> None:
        """Compute `key` in the background unless it is known or under way.

        `still_wanted()` is asked when a pool thread takes the job up; when it says no (the
        settings changed) the job is dropped and a later `get` computes the value itself, as
        it is when the interpreter is exiting. `workers` sizes the pool when this call
        creates it.
        """
        with self._lock:
            if key in self._values or key in self._slots:
                return
            slot = self._slots[key] = _Slot()
            if self._pool is None:
                self._pool = ThreadPoolExecutor(max(1, workers), thread_name_prefix="tensordsl")
            pool = self._pool
        if self._progress is not None:
            try:
                self._progress.queued()
            except BaseException:
                with self._lock:
                    self._slots.pop(key, None)
                raise
            slot.counted = True
        pool.submit(self._background, key, slot, compute, still_wanted)

    def clear(self) -> None:
        """Forget every known value (computations under way finish and are kept)."""
        with self._lock:
            self._values.clear()

    def _background(
        self,
        key: Hashable,
        slot: _Slot[Value],
        compute: Callable[[], Value],
        still_wanted: Callable[[], bool],
    ) -> None:
        if not slot.claim.acquire(blocking=False):
            return  # a caller of `get` took it over
        # The interpreter is shutting down once the main thread has stopped: leave the rest.
        if threading.main_thread().is_alive() and still_wanted():
            self._run(key, slot, compute)
            return
        with self._lock:
            self._slots.pop(key, None)
        slot.skipped = True
        if self._progress is not None and slot.counted:
            self._progress.dropped()
        slot.done.set()

    def _run(self, key: Hashable, slot: _Slot[Value], compute: Callable[[], Value]) -> None:
        progress = self._progress
        try:
            if progress is not None and not slot.counted:
                progress.queued()
                slot.counted = True
            value = compute()
        except BaseException as error:
            slot.error = error
            with self._lock:
                self._slots.pop(key, None)
        else:
            slot.value = value
            with self._lock:
                self._values[key] = value
                self._slots.pop(key, None)
        finally:
            if progress is not None and slot.counted:
                progress.finished()
            slot.done.set()
