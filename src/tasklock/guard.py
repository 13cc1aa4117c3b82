"""The task policy that every adapter shares, free of any framework.

An adapter (Celery, RQ) maps its hooks onto one :class:`Guard` per task:

* at decoration: ``Guard(func, name, options)`` validates the options and the ``key``/``fencing``
  choices against the function's signature, so mistakes fail at import time;
* at enqueue (``dedupe_enqueue``): :meth:`Guard.claim_pending` / :meth:`Guard.clear_pending`;
* at execution: :meth:`Guard.run` takes the execution lock right before the body (with
  ``limit=N``, one of N permits: :meth:`Guard.lock_for`), injects the fence token, releases in
  ``finally``, and applies ``on_duplicate`` / ``on_backend_error``. The parts that differ per
  framework (what "skip" and "retry" mean) are callbacks.

The enqueue-time marker names the pending task id. ``dedupe_enqueue=True`` keeps it until the run
*ends* (the adapter clears it then): one at a time, nothing queued behind it.
``dedupe_enqueue="until_start"`` clears it when the run *starts* (:meth:`Guard.run`, between
taking the lock and calling the body): one running plus one queued. See :meth:`Guard.run` for
why exactly there, and :meth:`Guard.keep_pending` / :meth:`Guard.pending_again` for how the
queued run keeps its marker while it waits and when its body asks for a retry.

Key layout (all of one task in one Redis Cluster slot, thanks to the ``{task name}`` hash tag)::

    <prefix>:{<task name>}:lock:<digest>      execution lock (gone after release); with
                                              limit > 1, the sorted set of its permits
    <prefix>:{<task name>}:pending:<digest>   enqueue-time marker, holds the pending task id
    <prefix>:{<task name>}:fence              fence counter, one per task name
"""

from __future__ import annotations

import logging
import os
import random
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from tasklock import fleet, observe, stats
from tasklock.backends import LockMaker, backend_for
from tasklock.config import WHERE_TO_SET_URL, TaskOptions, resolve_options, validate_options
from tasklock.core.base import BaseLock
from tasklock.core.clock import clock
from tasklock.core.connection import client_for_url
from tasklock.core.owner import Holder
from tasklock.duplicates import RETRY_FIRST_DELAY, Duplicate, duplicate_retry_delay
from tasklock.errors import (
    BackendUnavailable,
    ConfigurationError,
    DuplicateTaskError,
    LockError,
)
from tasklock.pending import PendingMarkers
from tasklock.rating import RateCall, RateGate, Throttle
from tasklock.settings_sources import on_settings_changed
from tasklock.signature import CallKey

__all__ = [
    "RETRY_FIRST_DELAY",
    "Duplicate",
    "Guard",
    "Throttle",
    "duplicate_retry_delay",
    "reset_all",
]

log = logging.getLogger("tasklock")

R = TypeVar("R")

#: Fresh non-blocking attempts when the lock was released between a failed attempt and the look
#: at its holder (the lock is free then: the call is no duplicate).
_FREE_RETRIES = 3

#: Jitter for retry delays, from a generator of our own: drawing from the random module's shared
#: one would shift the numbers of an application that seeds it for reproducible runs.
_jitter = random.Random()
# Reseeded in a forked child, as the random module does for its own: prefork siblings must not
# draw the same delays.
os.register_at_fork(after_in_child=_jitter.seed)


def _held_by(lock: BaseLock, holder: Holder, task_id: str) -> bool:
    """Whether task ``task_id`` (an earlier attempt of this very call) holds ``lock``: the holder
    looked at, or with a Semaphore any of its permits."""
    if holder.meta.get("task") == task_id:
        return True
    holders = getattr(lock, "holders", None)  # a Semaphore, on Redis or etcd
    if holders is not None:
        return any(h.meta.get("task") == task_id for h, _ in holders())
    return False


@dataclass(eq=False)
class _Attempt:
    """One call's attempt at the execution lock: the call, and what the acquire found.

    Made by :meth:`Guard.run` before the acquire step and filled in by it as it goes, so that
    the handler of an exception raised in the middle of that step (an asynchronous one included)
    still has the lock, to release a hold the acquire script may already have taken, and the
    seconds spent waiting, for the acquire's scope.
    """

    key: str
    args: tuple[Any, ...]
    kwargs: Mapping[str, Any]
    task_id: str | None
    until_start: bool
    lock: BaseLock | None = None
    acquired: bool = False
    waited: bool = False
    waited_for: float = 0.0
    holder: Holder | None = None
    holder_ttl: float | None = None


_guards: weakref.WeakSet[Guard] = weakref.WeakSet()


def reset_all() -> None:
    """Make every guard re-read its settings on next use (project settings changed: Django's
    ``setting_changed``, through :func:`tasklock.config.settings_changed`)."""
    for guard in list(_guards):
        guard.reset()


on_settings_changed(reset_all)


class Guard(PendingMarkers):
    """The singleton policy of one task. Thread-safe; one instance per task per process.

    The enqueue-time marker's methods (``claim_pending``, ``keep_pending``, ``pending_again``,
    ``clear_pending``) are in its base, :class:`tasklock.pending.PendingMarkers`."""

    def __init__(
        self,
        func: Callable[..., Any],
        name: str,
        options: Mapping[str, Any],
        *,
        conf: Callable[[], Mapping[str, Any] | None] | None = None,
        default_client: Callable[[], Any] | None = None,
        exclude: Iterable[str] = (),
    ) -> None:
        self.name = name
        self.explicit = validate_options(options, f"options of task {name}")
        self._conf = conf
        self._default_client = default_client
        fencing = self.explicit.get("fencing", False)
        self.fence_keyword: str | None = (
            "fence_token" if fencing is True else (fencing if isinstance(fencing, str) else None)
        )
        excluded = [*exclude, *([self.fence_keyword] if self.fence_keyword else [])]
        self.call_key = CallKey(func, name, key=self.explicit.get("key"), exclude=excluded)
        #: The rate limit (``rate=``): its keys and its policy around one admission.
        self.rate_gate = RateGate(func, name, self.explicit, self.call_key, exclude=excluded)
        if self.fence_keyword:
            params = self.call_key.signature.parameters
            if self.fence_keyword not in params and not any(
                p.kind is p.VAR_KEYWORD for p in params.values()
            ):
                raise ConfigurationError(
                    f"fencing passes {self.fence_keyword}= to {name}, but it does not accept "
                    f"that keyword: add a parameter `{self.fence_keyword}=None`, or name another "
                    "keyword with fencing='...'"
                )
        self._options: TaskOptions | None = None
        self._options_lock = threading.Lock()
        #: What makes every call's lock (see :meth:`lock_for`), for the options and store it
        #: was made for.
        self._maker: LockMaker | None = None
        #: Where the maker's store keeps the fleet counts (bound on each use, as they move).
        self._counts: list[Any] = []
        _guards.add(self)

    # -- configuration ---------------------------------------------------------------------------
    @property
    def options(self) -> TaskOptions:
        """Options merged from every source, resolved on first use (see tasklock.config)."""
        options = self._options
        if options is None:
            with self._options_lock:
                if self._options is None:
                    conf = self._conf() if self._conf is not None else None
                    self._options = resolve_options(self.explicit, conf)
                options = self._options
        return options

    def reset(self) -> None:
        """Forget resolved options (Django's override_settings, tests)."""
        with self._options_lock:
            self._options = None
            self._maker = None

    def _client(self) -> Any:
        options = self.options
        if options.url:
            return client_for_url(options.url)
        if self._default_client is not None:
            client = self._default_client()
            if client is not None:
                return client
        raise ConfigurationError(
            f"no Redis configured for tasklock (task {self.name}): {WHERE_TO_SET_URL}"
        )

    # -- keys ------------------------------------------------------------------------------------
    def _base(self) -> str:
        return f"{self.options.key_prefix}:{{{self.name}}}"

    def lock_key(self, args: Iterable[Any], kwargs: Mapping[str, Any]) -> str:
        return f"{self._base()}:lock:{self.call_key.digest(args, kwargs)}"

    def pending_key(self, args: Iterable[Any], kwargs: Mapping[str, Any]) -> str:
        return f"{self._base()}:pending:{self.call_key.digest(args, kwargs)}"

    @property
    def fence_key(self) -> str:
        return f"{self._base()}:fence"

    def lock_for(self, key: str, task_id: str | None = None) -> BaseLock:
        """The execution lock object for ``key``, from the backend the options name
        (:mod:`tasklock.backends`): on Redis a :class:`~tasklock.Lock` (a Redlock when ``urls``
        is configured), or with ``limit`` > 1 a :class:`~tasklock.Semaphore` of that many
        permits at the same key (never with ``urls``: validation refuses that); on etcd or
        ZooKeeper, that backend's.

        A Lock and a Semaphore on one key exclude each other, so a deployment that moves a
        task's ``limit`` between 1 and N never runs more bodies than either allows while old and
        new workers overlap: a Lock held by the old ones counts as every permit taken, and
        permits held count as the lock taken.
        """
        options = self.options
        store = self._store()
        maker = self._maker
        if maker is None or maker.store is not store:
            # Made (and the options checked) once per store; each call's lock comes from it.
            common = {
                "timeout": options.ttl,
                "fence_key": self.fence_key,
                "watchdog": options.watchdog,
                "on_lost": self._on_lost,
            }
            hooks = backend_for(store).load_hooks()
            maker = self._maker = hooks.lock_maker(store, options.limit, **common)
            self._counts = hooks.count_clients(store)
        if self._counts:
            first, *others = self._counts
            fleet.bind(self.name, first, options.key_prefix, fallbacks=others)
        owner = {"task": task_id, "name": self.name} if task_id else {"name": self.name}
        return maker(key, owner)

    def _on_lost(self, lock: BaseLock) -> None:
        stats.increment("lost", self.name)
        log.error(
            "%s: lock %s was lost while the task ran (%s); another run may start. Fencing tokens "
            "protect writes made with fence_token.",
            self.name,
            lock.name,
            lock.lost.reason,
        )

    # -- execution -------------------------------------------------------------------------------
    def run(
        self,
        args: Iterable[Any],
        kwargs: Mapping[str, Any],
        body: Callable[[dict[str, Any]], R],
        *,
        task_id: str | None,
        on_skip: Callable[[Duplicate], R],
        on_retry: Callable[[Duplicate], R],
        duplicate_error: type[DuplicateTaskError],
        on_rate_limit: Callable[[Throttle], R] | None = None,
        rate_near: float | None = None,
    ) -> R:
        """Run ``body(extra_kwargs)`` under the execution lock, or apply the duplicate policy.

        ``extra_kwargs`` holds the fence token under the fencing keyword when fencing is on.

        With ``rate``, the call is admitted by the rate limit once it holds the lock (see
        :mod:`tasklock.rating`); one that may not run now goes to ``on_rate_limit`` (with the
        lock released when that returns or raises). ``rate_near``: the adapter can re-send this
        call, and a slot nearer than this many seconds is slept for instead; None: it cannot
        (direct and eager calls), and ``on_rate_limit="retry"`` sleeps until the slot.

        The steps: :meth:`_acquire` takes the lock (or finds its holder, and waits when the
        policy says so); then either :meth:`_apply_duplicate_policy`, or :meth:`_start_hold`
        with the release in this method's ``finally``. ``dedupe_enqueue="until_start"``: see
        :meth:`_start_hold` for where the pending marker is cleared, and why there.
        """
        args = tuple(args)
        options = self.options
        until_start = task_id is not None and options.dedupe_enqueue == "until_start"
        if options.limit is None:
            unlocked = RateCall(self, args, kwargs, task_id, on_rate_limit, rate_near)
            return self._run_unlocked(args, kwargs, body, unlocked, until_start)
        # Only a task with a rate pays for one (the hot path of every other task is unchanged).
        rated = options.rate is not None
        gate = RateCall(self, args, kwargs, task_id, on_rate_limit, rate_near) if rated else None
        key = self.lock_key(args, kwargs)
        scope = observe.acquiring(self.name, key)
        attempt = _Attempt(key, args, kwargs, task_id, until_start)
        try:
            lock = self._acquire(attempt)
        except BackendUnavailable as exc:
            if options.on_backend_error != "run":
                stats.increment("backend_error", self.name)
                scope.done("backend_error", attempt.waited_for, None)
                raise
            stats.increment("ran_unlocked", self.name)
            scope.done("ran_unlocked", attempt.waited_for, None)
            log.warning(
                "%s: running WITHOUT the lock because the lock store is unreachable "
                "(on_backend_error='run'): %s",
                self.name,
                exc,
            )
            return self._hold(scope, body, self._fence_kwargs(None))
        except BaseException:
            # Raised asynchronously (RQ's job timeout, Celery's soft time limit, Ctrl-C), it can
            # land after the acquire script succeeded: never leave that hold to the watchdog,
            # which would renew it for as long as this process lives. (Hence the lock is kept
            # on ``attempt`` as soon as it is made: the step may end anywhere.)
            scope.done("interrupted", attempt.waited_for, None)
            if attempt.lock is not None and attempt.lock.fence is not None:
                self._release(attempt.lock)
            raise
        if not attempt.acquired:
            return self._apply_duplicate_policy(
                attempt, lock, scope, on_skip, on_retry, duplicate_error
            )
        # This try follows the acquire's handler with no call in between (a call is where an
        # asynchronous exception can land), so every hold is released by one or the other.
        try:
            return self._start_hold(attempt, lock, scope, body, gate)
        finally:
            self._release(lock)

    def _acquire(self, attempt: _Attempt) -> BaseLock:
        """The execution lock for ``attempt``'s call, taken if it can be: at once, or after a
        wait when the policy is ``"wait"`` or the holder is this call's own earlier attempt.
        What is found is recorded on ``attempt`` as it is found (:class:`_Attempt` says why)."""
        options = self.options
        # In the caller's try: a cluster client connects when it is made, so an unreachable
        # cluster is a backend error here too (on_backend_error applies).
        lock = attempt.lock = self.lock_for(attempt.key, attempt.task_id)
        attempt.acquired = lock.acquire(blocking=False)
        for _ in range(_FREE_RETRIES):
            if attempt.acquired:
                break
            attempt.holder, attempt.holder_ttl = lock.peek()
            if attempt.holder is not None:
                break
            # Released between our attempt and the look: the lock is free, so this call is
            # no duplicate. Try again rather than skip work while nothing runs.
            attempt.acquired = lock.acquire(blocking=False)
        if attempt.acquired:
            return lock
        task_id, holder = attempt.task_id, attempt.holder
        if task_id and holder is not None and _held_by(lock, holder, task_id):
            # Our own earlier attempt (Celery's self.retry sends the retry before the
            # attempt's finally runs): it is releasing now, so wait for it.
            attempt.acquired = lock.acquire(blocking=True, blocking_timeout=options.ttl)
        elif options.on_duplicate == "wait":
            attempt.waited = True
            started = clock.monotonic()
            try:
                if attempt.until_start:
                    attempt.acquired = self._wait_pending(
                        lock, attempt.args, attempt.kwargs, cast(str, task_id)
                    )
                else:
                    attempt.acquired = lock.acquire(
                        blocking=True, blocking_timeout=options.wait_timeout
                    )
            finally:
                attempt.waited_for = self._count_wait(started)
        return lock

    def _apply_duplicate_policy(
        self,
        attempt: _Attempt,
        lock: BaseLock,
        scope: observe.AcquireScope,
        on_skip: Callable[[Duplicate], R],
        on_retry: Callable[[Duplicate], R],
        duplicate_error: type[DuplicateTaskError],
    ) -> R:
        """The lock was not taken: describe its holder (looked at again after a wait, or when
        the first look found none) and apply ``on_duplicate`` (``on_wait_timeout`` after a
        wait)."""
        options = self.options
        holder, holder_ttl = attempt.holder, attempt.holder_ttl
        if attempt.waited or holder is None:
            holder, holder_ttl = self._peek(lock)
        duplicate = Duplicate(
            self.name,
            attempt.key,
            holder.describe() if holder is not None else "unknown (released just now)",
            holder_ttl,
            attempt.waited,
            cast(int, options.limit),  # set: run() took limit=None elsewhere
        )
        if attempt.until_start and self._policy(duplicate) == "retry":
            # The retry is sent for up to a TTL later (duplicate_retry_delay's ceiling).
            self.keep_pending(
                attempt.args,
                attempt.kwargs,
                cast(str, attempt.task_id),
                delay=max(options.ttl, RETRY_FIRST_DELAY),
            )
        scope.done(f"duplicate_{self._policy(duplicate)}", attempt.waited_for, None)
        return self._duplicate(duplicate, on_skip, on_retry, duplicate_error)

    def _start_hold(
        self,
        attempt: _Attempt,
        lock: BaseLock,
        scope: observe.AcquireScope,
        body: Callable[[dict[str, Any]], R],
        gate: RateCall[R] | None,
    ) -> R:
        """With the lock held (the caller releases it, whatever happens here): count the
        acquire, let the rate limit admit the call, clear the pending marker, run the body.

        With ``dedupe_enqueue="until_start"`` (and a ``task_id``) the pending marker is cleared
        after the lock is taken and before the body begins, and the body begins only once it is
        cleared. That is the one point where the promise is exact:

        * not earlier (when the run is picked up, or before the acquire): a run that then waits
          for the lock would have let the next submission queue a second run behind the running
          one (two queued), and a skipped or failed acquire would have dropped its marker;
        * not later (inside or after the body): a submission made after the body began, which
          may have read the old data, would get this run's handle and be lost.

        So a submission that finds the marker gets the handle of a run whose body begins after
        the submission; one that finds none queues the next run, which waits for this one.
        """
        stats.increment("acquired", self.name)
        scope.done("acquired", attempt.waited_for, lock.fence)
        if gate is not None:
            throttle = gate.throttle()
            if throttle is not None:
                return gate.defer(throttle)
        if attempt.until_start:
            self._clear_at_start(attempt.args, attempt.kwargs, cast(str, attempt.task_id))
        return self._hold(scope, body, self._fence_kwargs(lock.fence))

    def _hold(
        self,
        scope: observe.AcquireScope,
        body: Callable[[dict[str, Any]], R],
        extra: dict[str, Any],
    ) -> R:
        """Run the body, counted (``ran``) and observed (the hold's scope)."""
        stats.increment("ran", self.name)
        hold = scope.hold()
        try:
            result = body(extra)
        except BaseException as exc:
            hold.done(exc)
            raise
        hold.done(None)
        return result

    def _count_wait(self, started: float) -> float:
        """Count a wait for the lock (``waited``, ``wait_us``); the seconds it took."""
        seconds = max(0.0, clock.monotonic() - started)
        stats.increment("waited", self.name)
        stats.add("wait_us", self.name, int(seconds * 1_000_000))
        return seconds

    def _run_unlocked(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        body: Callable[[dict[str, Any]], R],
        gate: RateCall[R],
        until_start: bool,
    ) -> R:
        """``limit=None``: no execution lock, only the rate limit (and the enqueue marker)."""
        try:
            self._bind_unlocked_counts()
            throttle = gate.throttle()
        except BackendUnavailable:
            stats.increment("backend_error", self.name)
            raise
        if throttle is not None:
            return gate.defer(throttle)
        if until_start:
            self._clear_at_start(args, kwargs, cast(str, gate.task_id))
        stats.increment("ran", self.name)
        return body({})

    def _bind_unlocked_counts(self) -> None:
        """Where a task without an execution lock writes its fleet counts: the Redis its rate
        limit and enqueue markers use (with a lock, :meth:`lock_for` binds that lock's). Bound
        nowhere, a rate-only task's counts stayed in this process, and ``tasklock stats``, the
        exporter and the admin page showed nothing for it. A task that uses no Redis at all
        (limit=None, no rate, none configured) has nowhere to write them."""
        options = self.options
        if not backend_for(options.url).keeps_counts:
            return
        try:
            client = self._client()
        except ConfigurationError:
            return  # no Redis: a rate or a marker would say so itself, right after this
        fleet.bind(self.name, client, options.key_prefix)

    def admit_rate(
        self,
        args: tuple[Any, ...],
        kwargs: Mapping[str, Any],
        task_id: str | None,
        near: float | None,
    ) -> Throttle | None:
        """The rate limit's verdict on this call (None: run it now; see
        :meth:`RateGate.admit`). With ``on_backend_error="run"`` an unreachable Redis admits the
        call, as it runs a task unlocked."""
        options = self.options
        if options.rate is None:
            return None
        try:
            return self.rate_gate.admit(
                self._client(), options, args, kwargs, task_id=task_id, near=near
            )
        except BackendUnavailable as exc:
            if options.on_backend_error != "run":
                raise
            stats.increment("ran_unlimited", self.name)
            log.warning(
                "%s: running WITHOUT the rate limit because Redis is unreachable "
                "(on_backend_error='run'): %s",
                self.name,
                exc,
            )
            return None

    def _fence_kwargs(self, fence: int | None) -> dict[str, Any]:
        return {self.fence_keyword: fence} if self.fence_keyword else {}

    def _release(self, lock: BaseLock) -> None:
        try:
            lock.release()
        except LockError as exc:
            stats.increment("lost", self.name)
            log.error("%s: the lock was no longer held at release: %s", self.name, exc)
        except BackendUnavailable as exc:
            log.warning(
                "%s: could not release lock %s (it expires within %ss): %s",
                self.name,
                lock.name,
                self.options.ttl,
                exc,
            )

    @staticmethod
    def _peek(lock: BaseLock) -> tuple[Holder | None, float | None]:
        try:
            return lock.peek()
        except BackendUnavailable:
            return None, None

    def _duplicate(
        self,
        duplicate: Duplicate,
        on_skip: Callable[[Duplicate], R],
        on_retry: Callable[[Duplicate], R],
        duplicate_error: type[DuplicateTaskError],
    ) -> R:
        policy = self._policy(duplicate)
        stats.increment(f"duplicate_{policy}", self.name)
        log.info("%s -> %s", duplicate.message(), policy)
        if policy == "raise":
            raise duplicate_error(duplicate.message(), duplicate.key, duplicate.holder)
        if policy == "retry":
            return on_retry(duplicate)
        return on_skip(duplicate)

    def _policy(self, duplicate: Duplicate) -> str:
        return self.options.on_wait_timeout if duplicate.waited else self.options.on_duplicate

    def retry_delay(
        self, duplicate: Duplicate, *, attempt: int, max_retries: int | None = None
    ) -> float:
        """Seconds until a duplicate's retry is worth trying: :func:`duplicate_retry_delay` with
        this task's TTL and the guard's own jitter generator. ``attempt`` is how many retries the
        call made before (Celery: ``request.retries``; RQ: the count in the job's meta), and
        ``max_retries`` the adapter's limit on them, if any."""
        return duplicate_retry_delay(
            attempt,
            ttl=self.options.ttl,
            holder_ttl=duplicate.holder_ttl,
            rng=_jitter,
            max_retries=max_retries,
        )
