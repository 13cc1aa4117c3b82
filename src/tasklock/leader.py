"""Leader election on the lock core: one process of many leads, the others stand by.

::

    election = tasklock.Leader(redis, "reports-cron", ttl=10)
    with election:                      # blocks until elected (woken when the leader leaves)
        while election.is_leader:       # renewed by the watchdog; the term is election.fence
            run_one_round(term=election.fence)

Leadership is a hold of an ordinary lock (on one Redis, on Redlock's masters, or on etcd, as the
task layer's ``url``/``urls`` choose), taken with the watchdog on: its TTL is renewed every third
of ``ttl`` while the process lives, a dead leader's lock frees itself within ``ttl``, and the
term is the hold's fencing token, strictly increasing from one leader to the next.

Why :attr:`Leader.is_leader` looks at the clock, not only at the watchdog: a leader paused past
its TTL (GC, SIGSTOP, a VM migration) resumes with its threads all at once, and its loop may ask
"am I leader?" before the watchdog has had the round trip that would tell it no. So ``lost``,
like every tasklock holder's, is also true once the lease has run out by this process's own
monotonic clock (which runs on while the process is stopped), less a margin for the clocks'
drift (:func:`tasklock.core.hold.drift_margin`): a resumed leader sees ``is_leader`` False at
once, with no round trip, and never acts on a term it no longer holds. Where one
round trip per action is affordable, :meth:`Leader.confirm` checks with the store too. And a
term that is already stale by the time a write lands (a pause between the check and the write)
is what fencing is for: pass ``election.fence`` to a fenced store (:mod:`tasklock.fencing`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from tasklock.backends import backend_for, lock_on
from tasklock.core.base import BaseLock, Number
from tasklock.core.lease import check_seconds
from tasklock.core.owner import Holder
from tasklock.core.urls import validate_url
from tasklock.errors import BackendUnavailable, ConfigurationError, LockError

__all__ = ["Leader"]

log = logging.getLogger("tasklock")


class Leader:
    """One of many processes leads ``name``; see the module docstring.

    ``store``: a redis-py client, a Redis URL (``redis://``, ``rediss://``, ``unix://``, Cluster
    and Sentinel forms), a list of Redis URLs (Redlock's masters), or an etcd URL
    (``etcd://h1:2379,h2:2379``). ``ttl``: seconds a dead leader keeps the others waiting (its
    lock expires; etcd: whole seconds, at least 1). ``on_elected(leader)`` runs in the thread that
    won; ``on_lost(leader)`` when leadership was lost while held (on the watchdog's thread, or in
    :meth:`confirm`), not on :meth:`resign`. ``owner_info`` is added to the holder's metadata
    (``tasklock ls`` shows it).
    """

    def __init__(
        self,
        store: Any,
        name: str,
        ttl: Number = 10,
        *,
        owner_info: Mapping[str, Any] | None = None,
        on_elected: Callable[[Leader], Any] | None = None,
        on_lost: Callable[[Leader], Any] | None = None,
    ) -> None:
        check_seconds("Leader ttl", ttl, allow_none=False, allow_zero=False)
        for option, callback in (("on_elected", on_elected), ("on_lost", on_lost)):
            if callback is not None and not callable(callback):
                raise ConfigurationError(
                    f"Leader {option} must be a callable taking the Leader, got {callback!r}"
                )
        self.name = name
        self.ttl = float(ttl)
        self.on_elected = on_elected
        self.on_lost = on_lost
        if owner_info is not None and not isinstance(owner_info, Mapping):
            raise ConfigurationError(
                f"Leader owner_info must be a dict of what to show about the leader, got "
                f"{owner_info!r}"
            )
        _check_store(store)
        meta = {"role": "leader", **dict(owner_info or {})}
        self._lock = _leadership_lock(store, name, self.ttl, meta, self._lost_by_watchdog)
        # One campaign or resignation at a time, re-entrant: a signal handler runs on the thread
        # it interrupts, so celery beat's SIGTERM handler resigns (through the scheduler's
        # close()) on the very thread that is waiting for leadership with this guard held; a
        # plain lock made that standby wait on itself for ever.
        self._guard = threading.RLock()
        # Where this Leader reports its terms (elected, resigned, stepped down, lost). A user of
        # the Leader that reports them itself in its own words (LeaderScheduler: "beat: became
        # leader of ...") sets it to DEBUG, so each event is logged once, not twice.
        self._report_level = logging.INFO

    @property
    def _warn_level(self) -> int:
        return logging.WARNING if self._report_level == logging.INFO else self._report_level

    def __repr__(self) -> str:
        state = f"leader, term {self.fence}" if self.is_leader else "standby"
        return f"<tasklock.Leader {self.name!r} ({state})>"

    @property
    def lock(self) -> BaseLock:
        """The lock whose hold is the leadership (for its ``name``, ``peek()``, ...)."""
        return self._lock

    # -- state -----------------------------------------------------------------------------
    @property
    def fence(self) -> int | None:
        """The current term: the hold's fencing token (strictly increasing across leaders), or
        None while not leading."""
        return self._lock.fence

    @property
    def lost(self) -> Any:
        """Truthy when leadership was lost while held: found gone by the watchdog, or its lease
        run out by this process's clock; ``lost.reason`` says which. Event-like:
        ``election.lost.wait(5)`` returns at either."""
        return self._lock.lost

    @property
    def is_leader(self) -> bool:
        """Whether this process leads now, by its own view: elected and not lost, by the
        watchdog nor by its own clock (no round trip; see the module docstring)."""
        return self._lock.fence is not None and not self._lock.lost

    def leader(self) -> Holder | None:
        """Who leads now (one round trip): the holder's metadata (host, pid, ...), or None."""
        holder, _ = self._lock.peek()
        return holder

    # -- campaigning -----------------------------------------------------------------------
    def campaign(self) -> bool:
        """One attempt, not waiting: True when this process leads now (also when it already
        did and still does). A lost term is let go first, so a new one can be won."""
        return self._elect(blocking=False, timeout=None)

    def wait_for_leadership(self, timeout: Number | None = None) -> bool:
        """Block until elected (woken when the leader releases; within ``ttl`` of its death), or
        until ``timeout`` seconds have passed (False)."""
        return self._elect(blocking=True, timeout=timeout)

    def _elect(self, *, blocking: bool, timeout: Number | None) -> bool:
        with self._guard:
            if self.is_leader:
                return True
            self._let_go()
            won = self._lock.acquire(blocking=blocking, blocking_timeout=timeout)
        if won:
            log.log(self._report_level, "%s: elected leader (term %s)", self.name, self.fence)
            if self.on_elected is not None:
                self.on_elected(self)
        return bool(won)

    def confirm(self) -> bool:
        """Ask the store (one round trip) whether this process still holds the leadership. When
        it does not, step down: ``is_leader`` becomes False and ``on_lost`` runs. An unreachable
        store is not a confirmation (False), and does not step down by itself: the watchdog
        decides that when the TTL runs out."""
        if not self.is_leader:
            return False
        try:
            held = self._lock.owned()
        except BackendUnavailable as exc:
            log.log(self._warn_level, "%s: could not confirm leadership: %s", self.name, exc)
            return False
        if held and self.is_leader:
            return True
        if not held:
            self._step_down("the store no longer holds this term")
        return False

    def resign(self) -> None:
        """Give up leadership now (a standby is woken at once). Nothing happens when not
        leading; a term that was lost meanwhile is let go quietly."""
        with self._guard:
            self._let_go()

    def _let_go(self) -> None:
        if self._lock.fence is None:
            return
        term = self._lock.fence
        try:
            self._lock.release()
        except LockError:
            pass  # lost already: nothing of ours to release
        except BackendUnavailable as exc:
            log.log(self._warn_level, "%s: could not resign term %s (it expires within %ss): %s",
                    self.name, term, self.ttl, exc)  # fmt: skip
        else:
            log.log(self._report_level, "%s: resigned (term %s)", self.name, term)

    def _step_down(self, reason: str) -> None:
        flag = self._lock.lost
        if not flag.is_set():
            flag.reason = reason
            flag.set()
        log.log(self._warn_level, "%s: stepped down (term %s): %s", self.name, self.fence, reason)
        if self.on_lost is not None:
            self.on_lost(self)

    def _lost_by_watchdog(self, lock: BaseLock) -> None:
        log.log(
            self._warn_level, "%s: leadership lost (term %s): %s", self.name, lock.fence,
            lock.lost.reason,
        )  # fmt: skip
        if self.on_lost is not None:
            self.on_lost(self)

    # -- with --------------------------------------------------------------------------------
    def __enter__(self) -> Leader:
        self.wait_for_leadership(None)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.resign()


def _check_store(store: Any) -> None:
    """A ConfigurationError naming ``store`` unless it is something a Leader can be built on."""
    if isinstance(store, str):
        if problem := backend_for(store).load_hooks().url_problem("Leader store", store):
            raise ConfigurationError(problem)
    elif isinstance(store, Sequence) and not isinstance(store, bytes):
        if not store:
            raise ConfigurationError(
                "Leader store is an empty list: list Redlock's masters' URLs (3 or 5)"
            )
        for index, item in enumerate(store):
            if isinstance(item, str) or not callable(getattr(item, "execute_command", None)):
                validate_url(item, f"Leader store[{index}]", single_server=True)
    elif not callable(getattr(store, "execute_command", None)):
        raise ConfigurationError(
            "Leader store must be a redis-py client, a Redis, etcd or ZooKeeper URL, or a list "
            f"of Redis URLs (Redlock's masters), got {type(store).__name__}"
        )


def _leadership_lock(
    store: Any,
    name: str,
    ttl: float,
    owner_info: Mapping[str, Any],
    on_lost: Callable[[BaseLock], Any],
) -> BaseLock:
    """The lock for ``store`` (as the task layer chooses by URL), watchdog on, shared by the
    threads of this process (leadership belongs to the process, not to a thread)."""
    options: dict[str, Any] = {
        "timeout": ttl,
        "watchdog": True,
        "thread_local": False,
        "on_lost": on_lost,
        "owner_info": owner_info,
    }
    return lock_on(store, name, None, **options)
