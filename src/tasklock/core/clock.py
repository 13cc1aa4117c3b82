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


class _SwappableClock:
    """The one :data:`clock` object every module imports (``from ... import clock`` binds the
    object, so swapping the module global would not reach them); :func:`use_clock` swaps what
    it delegates to. It holds the current clock's bound methods, so a read costs no extra call."""

    def __init__(self, impl: Clock) -> None:
        self.set(impl)

    def set(self, impl: Clock) -> Clock:
        previous: Clock | None = getattr(self, "impl", None)
        self.impl = impl
        self.monotonic = impl.monotonic  # type: ignore[method-assign]
        self.wall = impl.wall  # type: ignore[method-assign]
        self.wait = impl.wait  # type: ignore[method-assign]
        return previous if previous is not None else impl

    def monotonic(self) -> float:
        return self.impl.monotonic()

    def wall(self) -> float:
        return self.impl.wall()

    def wait(self, event: threading.Event, timeout: float) -> bool:
        return self.impl.wait(event, timeout)


clock: Clock = _SwappableClock(SystemClock())


def use_clock(new: Clock) -> Clock:
    """Replace the process clock (tests only); returns the previous one so it can be restored.

    Every module that did ``from tasklock.core.clock import clock`` sees the new clock at once.
    """
    assert isinstance(clock, _SwappableClock)
    return clock.set(new)
