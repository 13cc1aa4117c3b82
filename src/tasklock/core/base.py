"""The blocking driver of the lease rules: what every sync tasklock lock does the same way.

:class:`BaseLock` holds the redis-py-compatible surface (``acquire`` with
``blocking``/``blocking_timeout``, ``release``, ``extend``, ``reacquire``, context manager,
thread-local holds) plus what tasklock adds (fence token, watchdog, ``lost``/``on_lost``). The
rules themselves (argument checks, when to wait and how long, what a hold keeps, which error a
lost hold raises) are in :mod:`tasklock.core.lease`, shared with :mod:`tasklock.asyncio`; this
module only does the blocking I/O around them. Subclasses supply the backend:
:class:`tasklock.Lock` talks to one Redis, :class:`tasklock.Redlock` to N independent masters.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType
from typing import Any, Literal, Protocol, Self

from tasklock.core.clock import clock
from tasklock.core.hold import LostFlag
from tasklock.core.lease import (
    DEFAULT_TTL,
    GIVE_UP,
    MAX_POLL_INTERVAL,
    MAX_TTL,
    Attempt,
    LeaseCore,
    Number,
    check_seconds,
)
from tasklock.core.owner import Holder, parse_value
from tasklock.core.watchdog import Renewal, Watchdog, get_watchdog
from tasklock.errors import LockError

__all__ = [
    "DEFAULT_TTL",
    "MAX_POLL_INTERVAL",
    "MAX_TTL",
    "Attempt",
    "BaseLock",
    "LostFlag",
    "Number",
]


log = logging.getLogger("tasklock.lock")


class _Waiter(Protocol):
    def arm(self) -> None: ...
    def wait(self, timeout: float) -> bool: ...
    def close(self) -> None: ...


class _ThreadHolds(threading.local):
    """``lock.local`` with ``thread_local``: each thread's hold. The class attributes are every
    thread's starting values, so reading one a thread never set costs no AttributeError."""

    token: bytes | None = None
    hold: Any = None
    last_hold: Any = None
    lost: Any = None


class _SharedHolds:
    """``lock.local`` without ``thread_local``: one hold for every thread."""

    token: bytes | None = None
    hold: Any = None
    last_hold: Any = None
    lost: Any = None


class BaseLock(LeaseCore):
    """The shared surface; see :class:`tasklock.Lock` for the parameters."""

    def _new_local(self) -> Any:
        return _ThreadHolds() if self.thread_local else _SharedHolds()

    def _watchdog(self) -> Watchdog:
        return get_watchdog()

    # -- backend, supplied by subclasses -------------------------------------------------------
    def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        """One try. ``waiting``: the caller has subscribed and will wait if this fails (a fair
        lock queues it, or keeps it queued)."""
        raise NotImplementedError

    def _leave_queue(self, token: str) -> None:
        """A waiter that waited (``_attempt(waiting=True)``) gave up: take it out of the queue.
        Nothing to do for a lock without one."""

    def _release_value(self, value: bytes) -> bool:
        raise NotImplementedError

    def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        raise NotImplementedError

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        raise NotImplementedError

    def _waiter(self, token: str) -> _Waiter:
        raise NotImplementedError

    def _early_waiter(self, token: str) -> _Waiter | None:
        """A waiter to register before the first attempt, when that costs no round trip (the
        wake channel is subscribed already): then the first attempt waits too, and no second
        one is needed to catch a release. None: subscribe after a failed first attempt."""
        return None

    def locked(self) -> bool:
        """True if this lock name is held by anyone."""
        raise NotImplementedError

    def _stored_value_is(self, value: bytes) -> bool:
        raise NotImplementedError

    def _peek(self) -> tuple[bytes | None, int | None]:
        """The stored value (any owner) and its PTTL in ms, or (None, None) when free."""
        raise NotImplementedError

    def peek(self) -> tuple[Holder | None, float | None]:
        """Who holds this lock name now, whoever it is, and for how many more seconds."""
        value, pttl = self._peek()
        if value is None:
            return None, None
        return parse_value(value), (pttl / 1000 if pttl is not None and pttl >= 0 else None)

    # -- acquire -------------------------------------------------------------------------------
    def acquire(
        self,
        sleep: Number | None = None,
        blocking: bool | None = None,
        blocking_timeout: Number | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        """Take the lock; True once held, False if not held within ``blocking_timeout``.

        A waiter is woken by the holder's release; polling with jittered backoff (starting at
        ``sleep``) is only the fallback, and never outlasts the holder's remaining TTL.
        """
        owner, rules = self._plan_acquire(sleep, blocking, blocking_timeout, token)
        waiter: _Waiter | None = None
        acquired = False
        try:
            if rules.may_wait:
                waiter = self._early_waiter(owner)
                if waiter is not None:
                    rules.subscribed()
            while True:
                if waiter is not None:
                    waiter.arm()
                sent = clock.monotonic()
                attempt = self._attempt(owner, waiter is not None)
                if attempt.acquired:
                    assert attempt.value is not None
                    self._start_hold(attempt.value, attempt.fence, sent)
                    acquired = True
                    return True
                step = rules.after_failure(attempt)
                if isinstance(step, str):
                    if step is GIVE_UP:
                        return False
                    waiter = self._waiter(owner)  # SUBSCRIBE: then try again at once
                    continue
                assert waiter is not None  # (SUBSCRIBE always comes first)
                waiter.wait(step)
                owner = rules.retry_owner(owner)
        finally:
            if waiter is not None:
                waiter.close()
                if not acquired:
                    self._give_up_place(owner)

    def _give_up_place(self, owner: str) -> None:
        """Leave the queue after waiting in vain; a failure here only costs the queue the
        waiter's liveness (it drops out by itself), so it never hides the acquire's outcome."""
        try:
            self._leave_queue(owner)
        except Exception as exc:
            log.debug("lock %r: leaving the queue failed (%s); it drops out", self.name, exc)

    # -- release / extend ----------------------------------------------------------------------
    def release(self) -> None:
        """Release the lock; LockNotOwnedError if it was no longer ours (LockLostError if the
        hold already counted as lost: the watchdog's finding, or its lease run out by this
        process's clock); either way ``lost`` stays true after it."""
        hold = self._hold_to_release()
        self._end_hold(hold)
        if not self._release_value(hold.value):
            self._not_owned(hold, "release")

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to the TTL (or set it to that, with ``replace_ttl``)."""
        check_seconds("additional_time", additional_time, allow_none=False, allow_zero=False)
        hold = self._require_hold("extend")
        sent = clock.monotonic()
        if not self._extend_value(hold.value, float(additional_time), replace_ttl):
            self._end_hold()
            self._not_owned(hold, "extend")
        hold.extended(sent, float(additional_time), replace_ttl)
        return True

    def reacquire(self) -> Literal[True]:
        """Reset the TTL to the lock's full TTL."""
        hold = self._require_hold("reacquire")
        sent = clock.monotonic()
        if not self._extend_value(hold.value, self.ttl, True):
            self._end_hold()
            self._not_owned(hold, "reacquire")
        hold.extended(sent, self.ttl, True)
        return True

    def owned(self) -> bool:
        """True if the lock is held by this lock object (in this thread, with thread_local)."""
        hold = self._hold()
        return hold is not None and self._stored_value_is(hold.value)

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> Self:
        if self.acquire():
            return self
        raise self._not_acquired()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            self._release_failed_on_exit()
