"""A fake clock for the validity, deadline and backoff logic (expiry itself is never faked)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

from tasklock.core.clock import use_clock


class FakeClock:
    """Time moves only when someone waits: ``wait`` advances it by the timeout (unless the event
    is already set), so a blocking loop runs instantly and its arithmetic can be checked exactly."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_700_000_000.0 + self.now

    def wait(self, event: threading.Event, timeout: float) -> bool:
        self.waits.append(timeout)
        if event.is_set():
            return True
        self.now += max(0.0, timeout)
        return False

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def fake_clock() -> Iterator[FakeClock]:
    fake = FakeClock()
    previous = use_clock(fake)
    try:
        yield fake
    finally:
        use_clock(previous)
