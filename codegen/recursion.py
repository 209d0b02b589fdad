"""Room on Python's stack for deep expressions.

sympy walks an expression recursively, several frames per level, and so do the passes here
(`trace_cache.key_text`, the derivative rules). An elementwise chain of N statements, once
fused, is one expression N levels deep: a 100-statement chain needs about 4000 frames
(issue 27), beyond Python's default limit of 1000. `deep_recursion` raises the limit while
tensordsl works and restores it when the last thread leaves, so a user's own code keeps
its limit.

>>> import sys
>>> before = sys.getrecursionlimit()
>>> with deep_recursion():
...     sys.getrecursionlimit() >= LIMIT
True
>>> sys.getrecursionlimit() == before
True
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["LIMIT", "deep_recursion", "deeply"]

#: Frames allowed while tensordsl works: a chain of about 500 statements.
LIMIT = 20_000

_lock = threading.Lock()
_active = 0
_saved = 0

F = TypeVar("F", bound=Callable[..., Any])


@contextlib.contextmanager
def deep_recursion() -> Iterator[None]:
    """Python's recursion limit at least `LIMIT` inside (counted across threads)."""
    global _active, _saved
    with _lock:
        if _active == 0:
            _saved = sys.getrecursionlimit()
            sys.setrecursionlimit(max(_saved, LIMIT))
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1
            if _active == 0:
                sys.setrecursionlimit(_saved)


def deeply(function: F) -> F:
    """`function` run inside `deep_recursion` (for the entry points JAX or a user calls)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with deep_recursion():
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
