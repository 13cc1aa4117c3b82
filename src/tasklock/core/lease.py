"""The lease rules every tasklock lock follows, with no I/O: one copy for sync and asyncio.

A lock is a *lease*: a key with a TTL that its owner may release, extend or lose. What a lock
decides (which arguments are valid, when a waiter gives up, subscribes or sleeps and for how
long, what a hold remembers, which error a release that found the key gone raises) lives here;
what it does on the wire lives in the drivers: :class:`tasklock.core.base.BaseLock` (blocking
calls) and :class:`tasklock.asyncio._base.AsyncBaseLock` (coroutines), each with a single-Redis
and a Redlock backend. The drivers differ only where I/O does: a driver's ``acquire`` is a loop
of "attempt, then ask :class:`AcquireLoop` what next".
"""

from __future__ import annotations

import logging
import math
import os
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from tasklock.core.backoff import Backoff
from tasklock.core.clock import clock
from tasklock.core.hold import GONE, ClockedLost, Hold, LostFlag
from tasklock.core.keys import fence_key_for
from tasklock.core.owner import new_token, restamped
from tasklock.core.pids import current_pid
from tasklock.errors import ConfigurationError, LockError, LockLostError, LockNotOwnedError

__all__ = [
    "DEFAULT_TTL",
    "GIVE_UP",
    "MAX_POLL_INTERVAL",
    "MAX_TTL",
    "SUBSCRIBE",
    "AcquireLoop",
    "Attempt",
    "Hold",
    "LeaseCore",
    "LostFlag",
    "Number",
    "check_fair",
    "check_name",
    "check_owner_info",
    "check_seconds",
    "fence_key_or_default",
]

log = logging.getLogger("tasklock.lock")

DEFAULT_TTL = 30.0
#: Longest gap between fallback polls while waiting (wake-ups normally come much sooner).
MAX_POLL_INTERVAL = 1.0
#: The longest TTL a lock takes: a year. A TTL is the backstop for a holder that crashed (the
#: watchdog renews a short one for as long as the holder lives), so a longer one amounts to "never
#: expires", which tasklock refuses by design; and Redis refuses an expiry past 2**63 ms only
#: when the script runs, as a bare ResponseError.
MAX_TTL = 365 * 86400.0
#: The options that set a TTL (the others are waits, where any length is fine).
_TTL_OPTIONS = ("timeout", "additional_time", "Leader ttl", "tasklock_beat_ttl")

Number = int | float


def check_seconds(option: str, value: Any, *, allow_none: bool, allow_zero: bool) -> None:
    """A ConfigurationError naming ``option`` unless ``value`` is a usable number of seconds."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigurationError(f"{option} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigurationError(f"{option} must be {bound} seconds, got {value!r}")
    if value == math.inf and option != "blocking_timeout":  # waiting for ever is fine; a TTL not
        raise ConfigurationError(f"{option} must be a finite number of seconds, got {value!r}")
    if option in _TTL_OPTIONS and value > MAX_TTL:
        raise ConfigurationError(
            f"{option} must be at most {MAX_TTL:.0f} seconds (a year), got {value!r}: a TTL is "
            "the backstop for a crashed holder, and the watchdog renews a shorter one for as long "
            "as the holder lives (watchdog=True)"
        )


def check_name(name: Any) -> str:
    """A lock name as text (UTF-8 bytes decoded), or a ConfigurationError naming it."""
    if isinstance(name, bytes):
        try:
            name = name.decode()
        except UnicodeDecodeError as exc:
            raise ConfigurationError(
                f"name must be text or UTF-8 bytes, got {name!r}, which is not UTF-8 "
                f"({exc.reason} at byte {exc.start}): pass the lock name as a str"
            ) from None
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"name must be a non-empty string, got {name!r}")
    return name


def check_owner_info(owner_info: Any) -> dict[str, Any] | None:
    """``owner_info`` as a dict of its own (None when empty), or a ConfigurationError."""
    if owner_info is not None and not isinstance(owner_info, Mapping):
        raise ConfigurationError(
            f"owner_info must be a dict of what to show about the holder (e.g. "
            f"{{'job': 'nightly'}}), got {owner_info!r}"
        )
    return dict(owner_info) if owner_info else None


def check_fair(fair: Any) -> bool:
    """``fair`` as a bool, or a ConfigurationError naming it."""
    if not isinstance(fair, bool):
        raise ConfigurationError(
            f"fair must be True (waiters served in arrival order, the default) or False "
            f"(every release wakes every waiter), got {fair!r}"
        )
    return fair


def fence_key_or_default(fence_key: Any, name: str) -> str:
    """The fence counter's key: ``fence_key`` when given (a non-empty string), else the lock's
    default, ``{name}:fence`` (in the lock's cluster slot)."""
    if fence_key is None:
        return fence_key_for(name)
    if not isinstance(fence_key, str) or not fence_key:
        raise ConfigurationError(f"fence_key must be a non-empty string, got {fence_key!r}")
    return fence_key


@dataclass
class Attempt:
    """The answer of one acquire attempt."""

    acquired: bool
    value: bytes | None = None  # the stored value, when acquired
    fence: int | None = None
    holder_ttl: float | None = None  # seconds the current holder's key has left, when known


#: What :meth:`AcquireLoop.after_failure` answers besides a number of seconds to wait.
GIVE_UP: Final = "give up"
SUBSCRIBE: Final = "subscribe, then try again at once"


class AcquireLoop:
    """What a blocked ``acquire`` does after each failed attempt, decided without I/O.

    Made at the first failure (an acquire that succeeds at once never builds one). The driver
    tries, and on failure asks :meth:`after_failure`: GIVE_UP (return False), SUBSCRIBE
    (subscribe to the wake-up channel, then try again at once: a release between the failed
    attempt and the subscription is caught by that second attempt), or seconds to wait for a
    wake-up before the next attempt (jittered backoff from ``sleep``, at most
    MAX_POLL_INTERVAL, never past the deadline nor past the holder's remaining TTL).
    """

    __slots__ = (
        "_backoff",
        "_blocking",
        "_deadline",
        "_renew_every",
        "_restamp",
        "_sleep",
        "_subscribed",
    )

    def __init__(
        self,
        blocking: bool,
        deadline: float | None,
        sleep: float,
        renew_every: float | None = None,
        restamp: bool = False,
    ) -> None:
        self._blocking = blocking
        self._deadline = deadline
        self._sleep = sleep
        #: A queued (fair) waiter keeps its place by trying at least this often.
        self._renew_every = renew_every
        self._subscribed = False
        self._backoff: Backoff | None = None
        #: The owner token is tasklock's own (not one the caller passed): each retry restamps it.
        self._restamp = restamp

    def retry_owner(self, owner: str) -> str:
        """The token the next attempt stores: tasklock's own tokens get the time of that attempt
        (so a holder's age counts from the attempt that took the lock, not from when it began
        to wait); a caller's token is used as given."""
        return restamped(owner) if self._restamp else owner

    @property
    def may_wait(self) -> bool:
        """True when a failed first attempt would be followed by waiting."""
        return self._blocking and (self._deadline is None or self._deadline > clock.monotonic())

    def subscribed(self) -> None:
        """The driver subscribed before the first attempt (the channel was live already): no
        SUBSCRIBE step after a failure."""
        self._subscribed = True

    def after_failure(self, attempt: Attempt) -> float | str:
        if not self._blocking:
            return GIVE_UP
        remaining = None if self._deadline is None else self._deadline - clock.monotonic()
        if remaining is not None and remaining <= 0:
            return GIVE_UP
        if not self._subscribed:
            self._subscribed = True
            return SUBSCRIBE
        if self._renew_every is not None:
            # Queued: the release names this waiter, so polling fast would only cost Redis work
            # (and grow with the number of waiters). Try again to renew the place in the queue,
            # or when the holder's key (or the first waiter's place) would run out, whichever
            # comes first; drawn so that many waiters' renewals do not come in step.
            delay = self._renew_every * (0.75 + 0.25 * _renew_jitter.random())
            if attempt.holder_ttl is not None and attempt.holder_ttl >= 0:
                delay = min(delay, attempt.holder_ttl + 0.001)
            if remaining is not None:
                delay = min(delay, remaining)
            return max(0.0, delay)
        if self._backoff is None:
            self._backoff = Backoff(self._sleep, max(self._sleep, MAX_POLL_INTERVAL))
        return self._backoff.next_delay(remaining, attempt.holder_ttl)


#: Jitter of a queued waiter's renewals: a generator of its own (reseeded after a fork), so an
#: application that seeds the random module for reproducible runs is not disturbed.
_renew_jitter = random.Random()
os.register_at_fork(after_in_child=_renew_jitter.seed)


def _unwatched(reason: str) -> None:
    """The loss callback of a renewal no longer watched (see ``LeaseCore._end_hold``)."""


class LeaseCore:
    """The state and rules a lock object keeps, whichever driver and backend it has.

    Subclasses give the I/O (``acquire``, ``release``, ...), :meth:`_new_local` (where holds are
    kept: per thread, per asyncio task, or shared), ``_flag_class`` (what ``lock.lost`` is) and
    :meth:`_watchdog` (who renews holds).
    """

    _flag_class: Callable[[Hold | None], ClockedLost] = LostFlag

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
        on_lost: Callable[[Any], Any] | None = None,
        owner_info: Mapping[str, Any] | None = None,
    ) -> None:
        name = check_name(name)
        check_seconds("timeout", timeout, allow_none=True, allow_zero=False)
        check_seconds("sleep", sleep, allow_none=False, allow_zero=False)
        check_seconds("blocking_timeout", blocking_timeout, allow_none=True, allow_zero=True)
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
        self.owner_info = check_owner_info(owner_info)
        self.local: Any = self._new_local()
        self.local.token = None

    # -- supplied by drivers -------------------------------------------------------------------
    def _new_local(self) -> Any:
        raise NotImplementedError

    def _watchdog(self) -> Any:
        """The watchdog that renews this lock's holds (``watch``/``unwatch`` a Renewal)."""
        raise NotImplementedError

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Any:
        raise NotImplementedError

    # -- acquire -------------------------------------------------------------------------------
    def _plan_acquire(
        self,
        sleep: Number | None,
        blocking: bool | None,
        blocking_timeout: Number | None,
        token: str | bytes | None,
    ) -> tuple[str, AcquireLoop]:
        """Check an ``acquire`` call's arguments; the owner token and the loop's rules."""
        if sleep is None:
            sleep = self.sleep
        if blocking is None:
            blocking = self.blocking
        if blocking_timeout is None:
            blocking_timeout = self.blocking_timeout
        check_seconds("sleep", sleep, allow_none=False, allow_zero=False)
        check_seconds("blocking_timeout", blocking_timeout, allow_none=True, allow_zero=True)
        if self._hold() is not None and self.local.token is not None:
            raise LockError(
                f"lock {self.name!r} is already held by this lock object in this "
                f"{self._holder_word}; release it first (tasklock locks are not reentrant)",
                lock_name=self.name,
            )
        if token is None:
            owner = new_token(self.owner_info)
        else:
            owner = token.decode() if isinstance(token, bytes) else str(token)
        deadline = None if blocking_timeout is None else clock.monotonic() + blocking_timeout
        loop = AcquireLoop(
            bool(blocking), deadline, float(sleep), self._renew_every, restamp=token is None
        )
        return owner, loop

    #: How often a waiter must try to keep its place in the queue (None: no queue). Set by
    #: fair locks (a third of WAITER_LIVENESS); a queued waiter waits for the release that names
    #: it, trying again only this often (``sleep`` and the backoff are for unqueued waiters).
    _renew_every: float | None = None

    #: Whose hold it is, in messages: a thread's (sync) or a task's (asyncio).
    _holder_word = "thread"

    # -- holds ---------------------------------------------------------------------------------
    def _hold(self) -> Hold | None:
        hold: Hold | None = getattr(self.local, "hold", None)
        if hold is not None and hold.pid != current_pid():
            return None  # a forked child does not inherit its parent's holds
        return hold

    @property
    def fence(self) -> int | None:
        """The fencing token of the current hold (strictly increasing per lock), or None."""
        hold = self._hold()
        return hold.fence if hold is not None else None

    def lease_left(self) -> float | None:
        """Seconds the current hold's lease has left by this process's own clock, or None
        without a hold: counted from the send of the last request the server confirmed (the
        acquire, the watchdog's last renewal, an extend), so it never exceeds the server's. A
        process resumed after a pause past its TTL sees it run out here before any round trip;
        ``lost`` turns true :func:`drift_margin` before it reaches 0."""
        hold = self._hold()
        end = None if hold is None else hold.lease_end()
        return None if end is None else end - clock.monotonic()

    @property
    def lost(self) -> Any:
        """Truthy once the current (or last) hold is lost: found gone by the watchdog, or its
        lease run out by this process's clock (see :class:`ClockedLost`)."""
        hold: Hold | None = getattr(self.local, "last_hold", None)
        if hold is not None:
            return hold.lost
        flag = getattr(self.local, "lost", None)
        if flag is None:  # never held: a flag that nothing will set
            flag = self.local.lost = self._flag_class(None)
        return flag

    def _start_hold(self, value: bytes, fence: int | None, sent: float | None = None) -> Hold:
        """A new hold of ``value``; ``sent``: when the attempt that took it was sent (this
        process's monotonic clock), where the watchdog counts its first lease from."""
        granted_at = clock.monotonic() if sent is None else sent
        hold = Hold(value, fence, current_pid(), self._flag_class, self.ttl, granted_at)
        if self.watchdog:
            hold.renewal = self._renewal(value, lambda reason: self._mark_lost(hold, reason))
            hold.renewal.granted_at = sent
            self._watchdog().watch(hold.renewal)
        self.local.hold = self.local.last_hold = hold
        self.local.token = value
        return hold

    def _mark_lost(self, hold: Hold, reason: str) -> None:
        hold.lost.reason = reason
        hold.lost.set()
        log.error("lock %r lost while held (fence %s): %s", self.name, hold.fence, reason)
        if self.on_lost is not None:
            if self.thread_local:
                # The callback runs on the watchdog's thread (or task), whose view of a local
                # lock has no hold: show it this one, so that lock.lost there is the flag just set.
                self.local.last_hold = hold
            self._call_on_lost()

    def _call_on_lost(self) -> None:
        assert self.on_lost is not None
        self.on_lost(self)

    def _stop_hold(self, hold: Hold) -> None:
        """Stop ``hold``'s clock and its renewals: released, or released in vain."""
        hold.end()
        if hold.renewal is not None:
            self._watchdog().unwatch(hold.renewal)
            # Its callback refers to the hold and to this lock, and the hold to it: a cycle that
            # only the garbage collector would free (about 17 objects per hold of a lock made
            # per use). A renewal no longer watched reports nothing anyway: a hold ended in time
            # is never lost afterwards.
            hold.renewal.on_lost = _unwatched

    def _end_hold(self, hold: Hold | None = None) -> Hold | None:
        """End the current hold (``hold``, when the caller has just looked it up)."""
        if hold is None:
            hold = self._hold()
        if hold is not None:
            self._stop_hold(hold)
        self.local.hold = None
        self.local.token = None
        return hold

    def _hold_to_release(self) -> Hold:
        """The hold a ``release`` call ends, or the LockError redis-py raises when there is none."""
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
        return hold

    def _not_owned(self, hold: Hold, action: str) -> None:
        """Raise what a release, extend or reacquire that found the key gone raises, and keep
        the hold lost for good: the server's answer is final, so ``lock.lost`` stays truthy,
        with the reason, after the call that found it (as after the watchdog's finding; the
        end of the hold no longer hides it). LockLostError when the hold already counted as
        lost before this call (the watchdog's finding, or its lease run out by this process's
        clock: a holder resumed after a pause that releases before its watchdog has run);
        LockNotOwnedError when nothing had said so (the key was deleted, or the server lost it
        in a failover)."""
        late = hold.renewal.late if hold.renewal is not None else 0.0
        why = (
            f"; its renewal ran {late:.2f} s late (a body that did not yield under gevent or "
            "eventlet, or a paused process: see the tasklock.watchdog warning)"
            if late
            else ""
        )
        flag = hold.lost
        known = flag.is_set() or hold.ran_out_by(clock.monotonic())
        if not flag.is_set():
            flag.reason = f"{GONE} when the {action} reached the server" + (
                ", after its lease had run out by this process's clock" if known else ""
            )
            flag.set()
        if known:
            raise LockLostError(
                f"Cannot {action} lock {self.name!r}: it was lost while held ({flag.reason}){why}",
                lock_name=self.name,
            )
        raise LockNotOwnedError(
            f"Cannot {action} a lock that's no longer owned ({self.name!r}){why}",
            lock_name=self.name,
        )

    def _require_hold(self, action: str) -> Hold:
        hold = self._hold()
        if hold is None:
            raise LockError(f"Cannot {action} an unlocked lock", lock_name=self.name)
        return hold

    def _not_acquired(self) -> LockError:
        return LockError("Unable to acquire lock within the time specified", lock_name=self.name)

    def _release_failed_on_exit(self) -> None:
        """``with lock:`` ended with the lock no longer ours and raise_on_release_error=False."""
        log.warning("Lock %r was no longer owned when exiting the context manager", self.name)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name!r} ttl={self.ttl} fence={self.fence}>"
