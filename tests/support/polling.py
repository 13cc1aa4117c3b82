"""Wait for a condition with a deadline, instead of sleeping a guessed amount of time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["async_eventually", "async_holds_for", "eventually", "holds_for"]

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


async def async_eventually(
    predicate: Callable[[], Any], what: str, timeout: float = 10.0, interval: float = 0.01
) -> Any:
    """:func:`eventually` inside an event loop: ``predicate()`` may be sync or async, and the
    loop keeps running (a watchdog task, a late reply) while it waits."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not true within {timeout}s: {what}")
        await asyncio.sleep(interval)


async def async_holds_for(
    predicate: Callable[[], object], duration: float, what: str, interval: float = 0.01
) -> None:
    """:func:`holds_for` inside an event loop (``predicate`` is sync)."""
    deadline = asyncio.get_running_loop().time() + duration
    while asyncio.get_running_loop().time() < deadline:
        assert predicate(), f"stopped being true: {what}"
        await asyncio.sleep(interval)
