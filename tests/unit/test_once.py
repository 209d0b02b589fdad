"""codegen/cache/once.py: values computed once per key, by the first thread or a background pool."""

from __future__ import annotations

import threading
import time

from codegen.cache.once import OnceMap


def test_many_threads_asking_at_once_compute_once() -> None:
    values: OnceMap[int] = OnceMap()
    calls = []
    gate = threading.Event()

    def compute() -> int:
        calls.append(1)
        gate.wait(5)
        return 42

    results = []
    threads = [
        threading.Thread(target=lambda: results.append(values.get("k", compute))) for _ in range(8)
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert results == [42] * 8 and len(calls) == 1


def test_an_error_reaches_every_waiter_and_is_not_kept() -> None:
    values: OnceMap[int] = OnceMap()
    gate = threading.Event()

    def broken() -> int:
        gate.wait(5)
        raise ValueError("no such kernel")

    errors = []

    def ask() -> None:
        try:
            values.get("k", broken)
        except ValueError as error:
            errors.append(str(error))

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.05)
    gate.set()
    for thread in threads:
        thread.join(10)
    assert errors == ["no such kernel"] * 3
    assert values.get("k", lambda: 7) == 7  # tried again, now it works


def test_background_start_then_get() -> None:
    values: OnceMap[str] = OnceMap()
    started = threading.Event()

    def compute() -> str:
        started.set()
        return threading.current_thread().name

    values.start("k", compute, workers=2)
    assert started.wait(10)
    assert values.get("k", lambda: "not used").startswith("tensordsl")
    values.start("k", lambda: "not used", workers=2)  # known: nothing started
    assert values.get("k", lambda: "not used").startswith("tensordsl")


def test_a_start_no_longer_wanted_is_left_to_get() -> None:
    values: OnceMap[str] = OnceMap()
    values.start("k", lambda: "background", still_wanted=lambda: False, workers=1)
    time.sleep(0.2)  # the pool takes the job up and drops it
    assert values.get("k", lambda: "asked") == "asked"


def test_clear_forgets_values() -> None:
    values: OnceMap[int] = OnceMap()
    assert values.get("k", lambda: 1) == 1
    values.clear()
    assert values.get("k", lambda: 2) == 2
