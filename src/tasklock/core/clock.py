"""The one seam through which the core reads time.

Validity, deadlines and backoff are computed from :data:`clock`, so unit tests can swap in a fake
clock (or use freezegun, which patches ``time.monotonic`` that the system clock reads). Expiry
itself is never faked: it is tested against a real redis-server with short TTLs.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock", "clock", "use_clock"]


class Clock(Protocol):
    def monotonic(self) -> float: ...

    def wall(self) -> float: ...

    def wait(self, event: threading.Event, timeout: float) -> bool:
        """Block until ``event`` is set or ``timeout`` seconds pass; True if it was set."""
        ...


class SystemClock:
    """The real clock: ``time.monotonic`` for intervals, ``time.time`` for display only."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return event.wait(max(0.0, timeout))


clock: Clock = SystemClock()


def use_clock(new: Clock) -> Clock:
    """Replace the process clock (tests only); returns the previous one so it can be restored."""
    global clock
    previous, clock = clock, new
    return previous
