"""Wait for a condition with a deadline, instead of sleeping a guessed amount of time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["eventually", "holds_for"]

T = TypeVar("T")


def eventually(
    predicate: Callable[[], T], timeout: float = 10.0, interval: float = 0.005, what: str = ""
) -> T:
    """Return the first truthy value of ``predicate()``; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout}s: {what or predicate}")
        time.sleep(interval)


def holds_for(
    predicate: Callable[[], object], duration: float, interval: float = 0.01, what: str = ""
) -> int:
    """Check ``predicate()`` over and over for ``duration`` s; fail the first time it is falsy.

    Returns how many checks were made (so a caller can assert it really looked).
    """
    deadline = time.monotonic() + duration
    checks = 0
    while time.monotonic() < deadline:
        assert predicate(), f"stopped being true after {checks} checks: {what or predicate}"
        checks += 1
        time.sleep(interval)
    return checks
