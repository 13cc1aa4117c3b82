"""The enqueue-time marker of ``dedupe_enqueue``: claimed at enqueue, kept while a queued run
waits, cleared when the run starts (``"until_start"``) or ends (``True``).

:class:`PendingMarkers` is a part of :class:`tasklock.guard.Guard` (its base class), kept apart
because it is bookkeeping of pending work, not the execution policy: every method here either
fails closed like the acquire (:meth:`claim_pending`, :meth:`_clear_at_start`) or never raises
(the marker's TTL is the backstop).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tasklock import fleet, stats
from tasklock.backends import MarkerStore, backend_for
from tasklock.config import TaskOptions
from tasklock.core.base import BaseLock
from tasklock.core.clock import clock
from tasklock.errors import BackendUnavailable, LockError

__all__ = ["PendingMarkers"]

log = logging.getLogger("tasklock")

#: Claims of one pending marker before giving up when every twin it names turns out stale.
_CLAIM_ATTEMPTS = 5

#: A run of ``dedupe_enqueue="until_start"`` that waits for the lock renews its marker at this
#: fraction of ``pending_ttl`` (as the watchdog renews a lock at a third of its TTL).
_PENDING_RENEW_FRACTION = 1 / 3


class PendingMarkers:
    """The marker half of a task's guard; see the module docstring."""

    name: str

    @property
    def options(self) -> TaskOptions:
        raise NotImplementedError

    def _client(self) -> Any:
        raise NotImplementedError

    def pending_key(self, args: Iterable[Any], kwargs: Mapping[str, Any]) -> str:
        raise NotImplementedError

    def _store(self) -> Any:
        """What this task's locks and markers live on: a URL of a backend other than Redis,
        Redlock's masters, or the Redis client (the task's own when no URL is set)."""
        options = self.options
        if options.url is not None and backend_for(options.url).external:
            return options.url
        if options.urls:
            return options.urls
        return self._client()

    def _markers(self) -> MarkerStore:
        # The marker is about pending work, not safety: one node suffices (the first with Redlock).
        store = self._store()
        hooks = backend_for(store).load_hooks()
        counts = hooks.count_clients(store)
        if counts:  # enqueue dedupes are counted too
            fleet.bind(self.name, counts[0], self.options.key_prefix, fallbacks=counts[1:])
        return hooks.markers(store)

    def claim_pending(
        self,
        args: Iterable[Any],
        kwargs: Mapping[str, Any],
        task_id: str,
        *,
        is_pending: Callable[[str], bool] | None = None,
        delay: float = 0.0,
        ttl: float | None = None,
    ) -> str | None:
        """Mark this call as pending under ``task_id``; return the id of a pending twin, if any.

        The marker lives ``pending_ttl`` seconds, plus ``delay`` (seconds until the call is due,
        for a countdown/eta), so a call scheduled far ahead stays pending until it can run.
        ``ttl`` replaces ``pending_ttl`` for this one claim (an adapter whose callers choose the
        marker's life per call, as celery-once's ``apply_async(once={"timeout": ...})`` does).

        ``is_pending(task_id)``, when given, is asked about a twin's id before it is trusted: an
        adapter that can see its framework's job states (RQ) answers False for a twin that is no
        longer queued or running (finished, failed, cancelled, deleted, or never enqueued because
        its producer died). Such a stale marker is cleared (only if it still names that id) and the
        claim is tried again, so a missed clean-up costs one look-up, not ``pending_ttl`` of
        refused enqueues.

        Fails closed like execution: an unreachable Redis raises BackendUnavailable (the caller
        then decides; nothing is enqueued silently twice or dropped).
        """
        key = self.pending_key(args, kwargs)
        markers = self._markers()
        ttl_ms = self._pending_ttl_ms(delay, ttl)
        for _ in range(_CLAIM_ATTEMPTS):
            existing_id = markers.claim(key, task_id, ttl_ms, f"marking {self.name} as pending")
            if existing_id is None:
                return None
            if is_pending is not None and not is_pending(existing_id):
                log.info(
                    "%s: pending marker named task %s, which is no longer queued or running; "
                    "replacing it (key=%s)",
                    self.name,
                    existing_id,
                    key,
                )
                markers.delete_if(
                    key, existing_id, f"clearing a stale pending marker of {self.name}"
                )
                continue
            stats.increment("deduplicated", self.name)
            log.info(
                "%s: not enqueued again, task %s with the same key is pending (key=%s)",
                self.name,
                existing_id,
                key,
            )
            return existing_id
        raise LockError(
            f"{self.name}: could not claim the pending marker {key} in {_CLAIM_ATTEMPTS} attempts: "
            "every twin it named was stale and another producer kept replacing it",
            lock_name=key,
        )

    def keep_pending(
        self, args: Iterable[Any], kwargs: Mapping[str, Any], task_id: str, *, delay: float = 0.0
    ) -> bool:
        """Renew this call's marker while it waits to start (``dedupe_enqueue="until_start"``).

        A queued run of "until_start" waits for the running one by design, for as long as that
        runs: it renews its marker each time it meets the holder again (``"retry"``: before each
        retry, for ``pending_ttl`` plus ``delay``; ``"wait"``: every third of ``pending_ttl``), so
        the marker cannot expire under it and let another submission queue a second run behind
        the running one. A marker that expired anyway (or was found stale) is claimed again:
        this call has not started, so later submissions may rely on it. Returns whether the
        marker names this call now; a marker another call holds is left alone (this call then
        runs as well: one run more, never one lost). Never raises: it is bookkeeping, and the
        marker's TTL is the backstop.
        """
        try:
            key = self.pending_key(args, kwargs)
            existing = self._markers().renew(
                key,
                task_id,
                self._pending_ttl_ms(delay),
                f"renewing the pending marker of {self.name}",
            )
            if existing is not None:
                log.info(
                    "%s: task %s waits to start, but the pending marker names task %r now (key=%s)",
                    self.name,
                    task_id,
                    existing,
                    key,
                )
                return False
            return True
        except Exception as exc:
            log.warning("%s: could not renew pending marker: %s", self.name, exc)
            return False

    def pending_again(
        self, args: Iterable[Any], kwargs: Mapping[str, Any], task_id: str, *, delay: float = 0.0
    ) -> None:
        """A started run of ``dedupe_enqueue="until_start"`` will run again (its body asked for a
        retry): claim the marker for it again, if no later submission holds it by now.

        Call it while the run still holds the execution lock: the retry cannot start (and clear
        the marker) before this claim, so the marker never names a run whose body has begun.
        Submissions made from now on return the retry's handle; they are covered, since the
        retry runs the body again from the start. Never raises.
        """
        if self.options.dedupe_enqueue != "until_start":
            return
        try:
            key = self.pending_key(args, kwargs)
            self._markers().claim(
                key, task_id, self._pending_ttl_ms(delay), f"marking {self.name} as pending again"
            )
        except Exception as exc:
            log.warning("%s: could not mark the retry as pending: %s", self.name, exc)

    def _clear_at_start(self, args: Iterable[Any], kwargs: Mapping[str, Any], task_id: str) -> None:
        """``dedupe_enqueue="until_start"``: this run holds the lock; clear its marker before the
        body begins. Fails closed like the acquire: the body does not run while the marker
        still names it, since every submission returning its handle from then on would be lost
        (``on_backend_error="run"`` runs it all the same, and logs)."""
        key = self.pending_key(args, kwargs)
        try:
            self._markers().delete_if(key, task_id, f"clearing the pending marker of {self.name}")
        except BackendUnavailable as exc:
            if self.options.on_backend_error != "run":
                stats.increment("backend_error", self.name)
                raise
            log.warning(
                "%s: running although the pending marker could not be cleared "
                "(on_backend_error='run'); until it expires, submissions return this run's "
                "handle: %s",
                self.name,
                exc,
            )

    def _pending_ttl_ms(self, delay: float, ttl: float | None = None) -> int:
        base = self.options.pending_ttl if ttl is None else ttl
        return int((base + max(0.0, delay)) * 1000)

    def clear_pending(
        self, args: Iterable[Any], kwargs: Mapping[str, Any], task_id: str | None
    ) -> None:
        """Clear this call's marker if ``task_id`` still owns it. Never raises: the marker's TTL
        is the backstop, and a finished task must not fail because of bookkeeping."""
        if not task_id or not self.options.dedupe_enqueue:
            return
        try:
            key = self.pending_key(args, kwargs)
            self._markers().delete_if(key, task_id, f"clearing the pending marker of {self.name}")
        except Exception as exc:
            log.warning("%s: could not clear pending marker (expires by TTL): %s", self.name, exc)

    def _wait_pending(
        self, lock: BaseLock, args: tuple[Any, ...], kwargs: Mapping[str, Any], task_id: str
    ) -> bool:
        """``on_duplicate="wait"`` for a queued run of ``dedupe_enqueue="until_start"``: wait up
        to ``wait_timeout`` (None: as long as it takes), renewing the marker every third of
        ``pending_ttl`` so that it outlives a long run ahead of this one. Here, not in the guard,
        because the waiting is the marker's renewal; it fails like the acquire it is made of."""
        options = self.options
        renew = options.pending_ttl * _PENDING_RENEW_FRACTION
        timeout = options.wait_timeout
        deadline = None if timeout is None else clock.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - clock.monotonic())
            step = renew if left is None else min(renew, left)
            if lock.acquire(blocking=True, blocking_timeout=step):
                return True
            if left is not None and left <= renew:
                return False
            self.keep_pending(args, kwargs, task_id)
