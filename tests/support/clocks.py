"""A clock for the lease tests: the system clock moved on, as a process resumed from a pause sees
it (its monotonic clock ran on while it was stopped, and nothing else has told it yet)."""

from __future__ import annotations

import threading

from tasklock.core.clock import SystemClock

__all__ = ["ClockAhead"]


class ClockAhead:
    """The system clock, ``ahead`` seconds on (install with ``tasklock.core.clock.use_clock``)."""

    def __init__(self, ahead: float) -> None:
        self.real = SystemClock()
        self.ahead = ahead

    def monotonic(self) -> float:
        return self.real.monotonic() + self.ahead

    def wall(self) -> float:
        return self.real.wall() + self.ahead

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return self.real.wait(event, timeout)
