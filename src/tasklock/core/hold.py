"""One acquisition (:class:`Hold`) and what ``lock.lost`` means for it (:class:`ClockedLost`):
the watchdog's finding, or the lease run out by this process's own clock. Shared by the blocking
and the asyncio drivers (each adds only how its flag waits: :class:`LostFlag` here, the asyncio
one in :mod:`tasklock.asyncio._base`); the lease rules that use them are in
:mod:`tasklock.core.lease`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from tasklock.core.clock import clock

__all__ = [
    "GONE",
    "MARGIN_FRACTION",
    "MARGIN_SECONDS",
    "ClockedLost",
    "Hold",
    "LostFlag",
    "drift_margin",
]


#: How much sooner than its own estimate of the lease's end a holder counts its hold as lost:
#: this share of the TTL plus :data:`MARGIN_SECONDS`. It covers the drift between this process's
#: clock and the server's (Redis counts a TTL by its own clock) and the rounding of the server's
#: expiry; the estimate itself already counts from the send of the request that was confirmed,
#: so the network's delay is on the safe side. The same margin as ``Leader.is_leader`` has
#: always used, now for every holder.
MARGIN_FRACTION = 0.02
MARGIN_SECONDS = 0.05

#: What the server said when a renewal, a release or an extend found the hold no longer there.
GONE = "the lock key was gone or held by another owner"


def drift_margin(ttl: float) -> float:
    """Seconds before the estimated end of a ``ttl``-second lease at which it counts as lost."""
    return ttl * MARGIN_FRACTION + MARGIN_SECONDS


class ClockedLost:
    """What ``lock.lost`` means, for the blocking and the asyncio flag alike.

    Lost is either of two findings. The watchdog's: a renewal found the key gone, or the server
    stayed unreachable until the TTL ran out (the flag is *set*, for good, and ``on_lost``
    runs). Or this process's own clock's: the hold's lease, as last confirmed by the server (the
    acquire, a renewal, an extend), has run out by the monotonic clock, less
    :func:`drift_margin`. The second needs no round trip, so a holder resumed after a pause past
    its TTL sees ``lost`` at once, before its watchdog has had the round trip that would tell it.

    A clock finding is not final: if the watchdog's next renewal (or an ``extend``) then finds
    the key still this hold's, ``lost`` reads False again. That is safe because a renewal is an
    owner-checked script that cannot recreate a key: finding it means it never left the server
    (on Redlock: never left a majority of masters), so no other holder can have taken the lock
    meanwhile, and the hold's fence is still the newest. A release ends the clock's count: a
    hold released in time is not lost afterwards. A release (or an extend) that finds the key
    gone sets the flag, for good (:meth:`~tasklock.core.lease.LeaseCore._not_owned`).
    """

    _hold: Hold | None
    _reason: str | None

    def _setup(self, hold: Hold | None) -> None:
        self._hold = hold
        self._reason = None

    @property
    def reason(self) -> str | None:
        """Why the hold counts as lost (the watchdog's finding, or the clock's), else None."""
        if self._is_set():
            return self._reason
        hold = self._hold
        if hold is not None and hold.lost_by_clock(clock.monotonic()):
            return hold.clock_reason(clock.monotonic())
        return None

    @reason.setter
    def reason(self, value: str | None) -> None:
        self._reason = value

    def lost_at(self) -> float | None:
        """When the hold counts as lost by this process's clock, or None (not held, released,
        or already lost for good)."""
        hold = self._hold
        return None if hold is None else hold.lost_at()

    def _is_set(self) -> bool:
        raise NotImplementedError

    def __bool__(self) -> bool:
        if self._is_set():
            return True
        hold = self._hold
        return hold is not None and hold.lost_by_clock(clock.monotonic())


class LostFlag(threading.Event, ClockedLost):
    """``lock.lost`` of a blocking lock (see :class:`ClockedLost`): truthy when lost, so
    ``while not lock.lost:`` works, and waitable like a :class:`threading.Event`:
    ``lock.lost.wait(5)`` returns True as soon as the watchdog finds the hold gone or its lease
    runs out by this process's clock, whichever is first."""

    def __init__(self, hold: Hold | None = None) -> None:
        super().__init__()
        self._setup(hold)

    def _is_set(self) -> bool:
        return self.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        end = None if timeout is None else clock.monotonic() + timeout
        while True:
            if self:
                return True
            now = clock.monotonic()
            if end is not None and now >= end:
                return False
            # Until the earlier of the caller's bound and the lease's end by the clock; a renewal
            # meanwhile moves the latter, so look again then rather than trust it.
            limits = [at for at in (end, self.lost_at()) if at is not None]
            if super().wait(min(limits) - now if limits else None):
                return True


_flag_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _flag_lock
    _flag_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_reset_after_fork)


class Hold:
    """One acquisition, and this process's own view of its lease.

    Its lost flag is made only when someone asks for it, which most holds never do (a
    :class:`LostFlag` is an Event: a Condition and a lock). The lease's end by this process's
    clock is the watchdog's estimate while it renews the hold (counted from the send of the last
    renewal the server confirmed), else ``expires_at``: counted from the send of the acquire,
    moved by a confirmed ``extend`` or ``reacquire``. Both are never later than the server's.
    """

    __slots__ = (
        "_lost",
        "ended",
        "expires_at",
        "fence",
        "flag_class",
        "margin",
        "pid",
        "releasing",
        "renewal",
        "ttl",
        "value",
    )

    def __init__(
        self,
        value: bytes,
        fence: int | None,
        pid: int,
        flag_class: Callable[[Hold], ClockedLost],
        ttl: float,
        granted_at: float,
    ) -> None:
        self.value = value
        self.fence = fence
        self.pid = pid
        self.flag_class = flag_class
        self.ttl = ttl
        self.margin = drift_margin(ttl)
        #: The lease's end by this process's clock when no watchdog renews it.
        self.expires_at = granted_at + ttl
        #: Released (or released in vain): the clock no longer counts.
        self.ended = False
        self.renewal: Any = None  # the watchdog's Renewal, while renewed
        self.releasing: Any = None  # asyncio: the release in flight (see AsyncBaseLock.release)
        self._lost: ClockedLost | None = None

    @property
    def lost(self) -> Any:
        flag = self._lost
        if flag is None:
            with _flag_lock:
                if self._lost is None:
                    self._lost = self.flag_class(self)
                flag = self._lost
        return flag

    def end(self) -> None:
        """Released (or released in vain): the clock stops counting, and the flag lets go of
        the hold (each refers to the other: a cycle only the garbage collector would free)."""
        self.ended = True
        if self._lost is not None:
            self._lost._hold = None

    def lease_end(self) -> float | None:
        """The lease's end by this process's clock, or None once the hold has ended."""
        if self.ended:
            return None
        renewal = self.renewal
        if renewal is not None and renewal.expires_at:
            end: float = renewal.expires_at
            return end
        return self.expires_at

    def lost_at(self) -> float | None:
        end = self.lease_end()
        return None if end is None else end - self.margin

    def lost_by_clock(self, now: float) -> bool:
        at = self.lost_at()
        return at is not None and now >= at

    def ran_out_by(self, now: float) -> bool:
        """Whether the lease had run out by this process's clock at ``now``, the hold ended or
        not: a release that found the key gone asks whether that was already known."""
        renewal = self.renewal
        end = renewal.expires_at if renewal is not None and renewal.expires_at else None
        return now >= (self.expires_at if end is None else end) - self.margin

    def clock_reason(self, now: float) -> str:
        """``lost.reason`` for a lease that ran out by the clock: how long since the server last
        confirmed it, which is the length of the pause (or the stall) that most likely did it."""
        end = self.lease_end()
        since = now - (end if end is not None else now) + self.ttl
        if self.renewal is not None:
            return (
                f"lease ran out by this process's clock (paused {since:.1f} s?): the server last "
                f"confirmed it {since:.1f} s ago, TTL {self.ttl:g} s; no renewal has confirmed it "
                "since, and another holder may have taken the lock"
            )
        return (
            f"lease ran out by this process's clock: held {since:.1f} s with a TTL of "
            f"{self.ttl:g} s and no watchdog (extend it in time, or use watchdog=True)"
        )

    def extended(self, sent: float, seconds: float, replace: bool) -> None:
        """A confirmed ``extend``/``reacquire`` sent at ``sent``: the server's TTL is now
        ``seconds`` from then (``replace``) or ``seconds`` more than it was."""
        self.expires_at = sent + seconds if replace else self.expires_at + seconds
