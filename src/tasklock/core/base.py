"""What every tasklock lock does the same way, whatever its backend.

:class:`BaseLock` holds the redis-py-compatible surface (constructor checks, ``acquire`` with
``blocking``/``blocking_timeout``, ``release``, ``extend``, ``reacquire``, context manager,
thread-local holds) plus what tasklock adds (fence token, watchdog, ``lost``/``on_lost``).
Subclasses supply the backend: :class:`tasklock.Lock` talks to one Redis, :class:`tasklock.Redlock`
to N independent masters.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import SimpleNamespace, TracebackType
from typing import Any, Literal, Protocol, Self

from tasklock.core.backoff import Backoff
from tasklock.core.clock import clock
from tasklock.core.owner import Holder, new_token, parse_value
from tasklock.core.watchdog import Renewal, get_watchdog
from tasklock.errors import ConfigurationError, LockError, LockLostError, LockNotOwnedError

__all__ = ["DEFAULT_TTL", "Attempt", "BaseLock", "LostFlag"]

log = logging.getLogger("tasklock.lock")

DEFAULT_TTL = 30.0
#: Longest gap between fallback polls while waiting (wake-ups normally come much sooner).
MAX_POLL_INTERVAL = 1.0

Number = int | float


class LostFlag(threading.Event):
    """Set when the watchdog finds the lock gone. Truthy when set, so ``if lock.lost:`` works,
    and waitable (``lock.lost.wait(5)``) like any :class:`threading.Event`."""

    reason: str | None = None

    def __bool__(self) -> bool:
        return self.is_set()


@dataclass
class Attempt:
    """The answer of one acquire attempt."""

    acquired: bool
    value: bytes | None = None  # the stored value, when acquired
    fence: int | None = None
    holder_ttl: float | None = None  # seconds the current holder's key has left, when known


_flag_lock = threading.Lock()


def _reset_after_fork() -> None:
    global _flag_lock
    _flag_lock = threading.Lock()  # another thread may have held it at the fork


os.register_at_fork(after_in_child=_reset_after_fork)


class _Hold:
    """One acquisition. Its LostFlag (an Event: a Condition and a lock) is made only when someone
    asks for it, which most holds never do."""

    __slots__ = ("_lost", "fence", "pid", "renewal", "value")

    def __init__(self, value: bytes, fence: int | None, pid: int) -> None:
        self.value = value
        self.fence = fence
        self.pid = pid
        self.renewal: Renewal | None = None
        self._lost: LostFlag | None = None

    @property
    def lost(self) -> LostFlag:
        flag = self._lost
        if flag is None:
            with _flag_lock:
                if self._lost is None:
                    self._lost = LostFlag()
                flag = self._lost
        return flag


class _Waiter(Protocol):
    def arm(self) -> None: ...
    def wait(self, timeout: float) -> bool: ...
    def close(self) -> None: ...


def _check_seconds(option: str, value: Any, *, allow_none: bool, allow_zero: bool) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{option} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(f"{option} must be {bound} seconds, got {value!r}")
    if value == math.inf and option != "blocking_timeout":  # waiting for ever is fine; a TTL not
        raise ConfigurationError(f"{option} must be a finite number of seconds, got {value!r}")


class BaseLock:
    """The shared surface; see :class:`tasklock.Lock` for the parameters."""

    def __init__(
        self,
        name: str,
        timeout: Number | None = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Number | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        watchdog: bool | None = None,
        on_lost: Callable[[BaseLock], Any] | None = None,
        owner_info: Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(name, bytes):
            name = name.decode()
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"name must be a non-empty string, got {name!r}")
        _check_seconds("timeout", timeout, allow_none=True, allow_zero=False)
        _check_seconds("sleep", sleep, allow_none=False, allow_zero=False)
        _check_seconds("blocking_timeout", blocking_timeout, allow_none=True, allow_zero=True)
        if timeout is not None and timeout * 1000 < 1:
            raise ConfigurationError(f"timeout must be at least 0.001 seconds, got {timeout!r}")
        if watchdog is not None and not isinstance(watchdog, bool):
            raise ConfigurationError(f"watchdog must be True, False or None, got {watchdog!r}")
        if on_lost is not None and not callable(on_lost):
            raise ConfigurationError(f"on_lost must be callable, got {on_lost!r}")
        self.name = name
        #: As given (None = the default TTL, renewed by the watchdog).
        self.timeout = timeout
        #: The TTL every hold gets, in seconds.
        self.ttl = float(DEFAULT_TTL if timeout is None else timeout)
        self.sleep = sleep
        self.blocking = blocking
        self.blocking_timeout = blocking_timeout
        self.thread_local = bool(thread_local)
        self.raise_on_release_error = raise_on_release_error
        #: Renew while held: default on when ``timeout`` is None, off when a timeout was given
        #: (redis-py's meaning: the lock expires after ``timeout`` unless extended).
        self.watchdog = (timeout is None) if watchdog is None else watchdog
        self.on_lost = on_lost
        self.owner_info = dict(owner_info) if owner_info else None
        self.local: Any = threading.local() if self.thread_local else SimpleNamespace()
        self.local.token = None

    # -- backend, supplied by subclasses -------------------------------------------------------
    def _attempt(self, token: str) -> Attempt:
        raise NotImplementedError

    def _release_value(self, value: bytes) -> bool:
        raise NotImplementedError

    def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        raise NotImplementedError

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        raise NotImplementedError

    def _waiter(self) -> _Waiter:
        raise NotImplementedError

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

    # -- holds ---------------------------------------------------------------------------------
    def _hold(self) -> _Hold | None:
        hold: _Hold | None = getattr(self.local, "hold", None)
        if hold is not None and hold.pid != os.getpid():
            return None  # a forked child does not inherit its parent's holds
        return hold

    @property
    def fence(self) -> int | None:
        """The fencing token of the current hold (strictly increasing per lock), or None."""
        hold = self._hold()
        return hold.fence if hold is not None else None

    @property
    def lost(self) -> LostFlag:
        """Set when the watchdog found the current (or last) hold gone."""
        hold: _Hold | None = getattr(self.local, "last_hold", None)
        if hold is not None:
            return hold.lost
        flag: LostFlag | None = getattr(self.local, "lost", None)
        if flag is None:  # never held: a flag that nothing will set
            flag = self.local.lost = LostFlag()
        return flag

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
        if sleep is None:
            sleep = self.sleep
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        _check_seconds("sleep", sleep, allow_none=False, allow_zero=False)
        _check_seconds("blocking_timeout", blocking_timeout, allow_none=True, allow_zero=True)
        if self._hold() is not None and self.local.token is not None:
            raise LockError(
                f"lock {self.name!r} is already held by this lock object in this thread; "
                "release it first (tasklock locks are not reentrant)",
                lock_name=self.name,
            )
        if token is None:
            owner = new_token(self.owner_info)
        else:
            owner = token.decode() if isinstance(token, bytes) else str(token)
        deadline = None if blocking_timeout is None else clock.monotonic() + blocking_timeout
        waiter: _Waiter | None = None
        backoff: Backoff | None = None  # made when first needed: most acquires never wait
        try:
            while True:
                if waiter is not None:
                    waiter.arm()
                attempt = self._attempt(owner)
                if attempt.acquired:
                    assert attempt.value is not None
                    self._start_hold(attempt.value, attempt.fence)
                    return True
                if not blocking:
                    return False
                remaining = None if deadline is None else deadline - clock.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if waiter is None:
                    # Subscribe, then try again at once: a release between the failed attempt
                    # and the subscription is caught by that second attempt.
                    waiter = self._waiter()
                    continue
                if backoff is None:
                    backoff = Backoff(float(sleep), max(float(sleep), MAX_POLL_INTERVAL))
                waiter.wait(backoff.next_delay(remaining, attempt.holder_ttl))
        finally:
            if waiter is not None:
                waiter.close()

    def _start_hold(self, value: bytes, fence: int | None) -> None:
        hold = _Hold(value, fence, os.getpid())
        if self.watchdog:
            hold.renewal = self._renewal(value, lambda reason: self._mark_lost(hold, reason))
            get_watchdog().watch(hold.renewal)
        self.local.hold = self.local.last_hold = hold
        self.local.token = value

    def _mark_lost(self, hold: _Hold, reason: str) -> None:
        hold.lost.reason = reason
        hold.lost.set()
        log.error("lock %r lost while held (fence %s): %s", self.name, hold.fence, reason)
        if self.on_lost is not None:
            if self.thread_local:
                # The callback runs on the watchdog thread, whose view of a thread-local lock
                # has no hold: show it this one, so that lock.lost there is the flag just set.
                self.local.last_hold = hold
            self.on_lost(self)

    def _end_hold(self) -> _Hold | None:
        hold = self._hold()
        if hold is not None and hold.renewal is not None:
            get_watchdog().unwatch(hold.renewal)
        self.local.hold = None
        self.local.token = None
        return hold

    # -- release / extend ----------------------------------------------------------------------
    def release(self) -> None:
        """Release the lock; LockNotOwnedError if it was no longer ours (LockLostError if the
        watchdog had already found it gone)."""
        hold = self._hold()
        if hold is None:
            if getattr(self.local, "hold", None) is not None:
                raise LockError(
                    f"lock {self.name!r} was acquired in process {self.local.hold.pid}; a forked "
                    "child does not inherit its parent's holds",
                    lock_name=self.name,
                )
            raise LockError(
                "Cannot release a lock that's not owned or is already unlocked.",
                lock_name=self.name,
            )
        self._end_hold()
        if not self._release_value(hold.value):
            self._not_owned(hold, "release")

    def _not_owned(self, hold: _Hold, action: str) -> None:
        if hold.lost:
            raise LockLostError(
                f"Cannot {action} lock {self.name!r}: it was lost while held ({hold.lost.reason})",
                lock_name=self.name,
            )
        raise LockNotOwnedError(
            f"Cannot {action} a lock that's no longer owned ({self.name!r})", lock_name=self.name
        )

    def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to the TTL (or set it to that, with ``replace_ttl``)."""
        _check_seconds("additional_time", additional_time, allow_none=False, allow_zero=False)
        hold = self._require_hold("extend")
        if not self._extend_value(hold.value, float(additional_time), replace_ttl):
            self._end_hold()
            self._not_owned(hold, "extend")
        return True

    def reacquire(self) -> Literal[True]:
        """Reset the TTL to the lock's full TTL."""
        hold = self._require_hold("reacquire")
        if not self._extend_value(hold.value, self.ttl, True):
            self._end_hold()
            self._not_owned(hold, "reacquire")
        return True

    def _require_hold(self, action: str) -> _Hold:
        hold = self._hold()
        if hold is None:
            raise LockError(f"Cannot {action} an unlocked lock", lock_name=self.name)
        return hold

    def owned(self) -> bool:
        """True if the lock is held by this lock object (in this thread, with thread_local)."""
        hold = self._hold()
        return hold is not None and self._stored_value_is(hold.value)

    # -- context manager -----------------------------------------------------------------------
    def __enter__(self) -> Self:
        if self.acquire():
            return self
        raise LockError("Unable to acquire lock within the time specified", lock_name=self.name)

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
            log.warning("Lock %r was no longer owned when exiting the context manager", self.name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl} fence={self.fence}>"
