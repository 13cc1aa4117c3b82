"""One renewal thread per process that keeps every held lock's TTL fresh.

Why: a short TTL (30 s) is what frees the lock quickly when a worker is SIGKILLed or OOM-killed,
but tasks run for hours. The watchdog renews each held lock at about a third of its TTL, so a live
holder never loses its lock and a dead one loses it within one TTL.

How:
* Held locks sit in a deadline heap; one daemon thread sleeps until the earliest is due.
* Everything due within a sixth of its TTL is renewed in the same tick, and calls for one client go
  in one pipelined round trip: 1,000 held locks cost one round trip per tick, not 1,000.
* A renewal is an owner-checked script, so a renewal that races with a release can never keep a
  released lock alive. :meth:`Watchdog.unwatch` marks the entry cancelled first, and results for a
  cancelled entry are ignored, so a release never shows up as a "lost" lock either.
* When a renewal finds the token gone, or Redis stays unreachable until the TTL has run out, the
  entry's ``on_lost`` runs (the lock sets ``lock.lost``, logs, and calls the user's callback).
* Fork-safe: a child process starts with an empty watchdog and no thread; holds are not inherited.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tasklock.core.clock import clock
from tasklock.core.scripts import Script, run_batch

__all__ = ["Outcome", "RenewCall", "Renewal", "Watchdog", "get_watchdog"]

log = logging.getLogger("tasklock.watchdog")

RenewCall = tuple[Any, Script, Sequence[Any], Sequence[Any]]  # (client, script, keys, args)


class Outcome(Enum):
    RENEWED = "renewed"
    LOST = "lost"  # definitely not ours any more
    UNREACHABLE = "unreachable"  # no verdict: retry until the TTL would have run out


@dataclass(eq=False)
class Renewal:
    """One held lock, as the watchdog sees it.

    ``calls`` are the script calls that renew it (one for a single-instance lock, one per node for
    Redlock); ``judge`` turns their results (a value or an exception each) into an Outcome.
    """

    name: str
    ttl: float
    calls: list[RenewCall]
    judge: Callable[[list[Any], float], Outcome]
    on_lost: Callable[[str], None]
    expires_at: float = 0.0
    due: float = 0.0
    cancelled: bool = False
    queued: bool = False  # in the heap (the cancelled count must only count those)
    renewals: int = field(default=0)


class Watchdog:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Renewal]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        self._wake_at: float | None = None
        self._cancelled = 0
        self._pool: ThreadPoolExecutor | None = None
        self.ticks = 0  # round-trip batches sent, for tests and benchmarks
        self.round_trips = 0

    # -- holders' side -------------------------------------------------------------------------
    def watch(self, entry: Renewal) -> None:
        now = clock.monotonic()
        entry.expires_at = now + entry.ttl
        entry.due = now + entry.ttl / 3
        with self._cond:
            heapq.heappush(self._heap, (entry.due, next(self._seq), entry))
            entry.queued = True
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="tasklock-watchdog", daemon=True
                )
                self._thread.start()
            elif self._wake_at is None or entry.due < self._wake_at:
                self._cond.notify()

    def unwatch(self, entry: Renewal) -> None:
        with self._cond:
            if not entry.cancelled:
                entry.cancelled = True
                if not entry.queued:
                    return
                self._cancelled += 1
                if self._cancelled > 64 and self._cancelled * 2 > len(self._heap):
                    for item in self._heap:
                        item[2].queued = not item[2].cancelled
                    self._heap = [item for item in self._heap if not item[2].cancelled]
                    heapq.heapify(self._heap)
                    self._cancelled = 0

    def held(self) -> int:
        with self._cond:
            return sum(1 for item in self._heap if not item[2].cancelled)

    # -- the thread ----------------------------------------------------------------------------
    def _take_due(self) -> list[Renewal]:
        """Wait until something is due; return every live entry due within its slack."""
        with self._cond:
            while True:
                while self._heap and self._heap[0][2].cancelled:
                    heapq.heappop(self._heap)[2].queued = False
                    self._cancelled -= 1
                now = clock.monotonic()
                if self._heap and self._heap[0][0] <= now:
                    break
                self._wake_at = self._heap[0][0] if self._heap else None
                self._cond.wait(None if self._wake_at is None else self._wake_at - now)
            self._wake_at = None
            due: list[Renewal] = []
            while self._heap:
                when, _, entry = self._heap[0]
                if entry.cancelled:
                    heapq.heappop(self._heap)
                    entry.queued = False
                    self._cancelled -= 1
                    continue
                if when > now + entry.ttl / 6:
                    break
                heapq.heappop(self._heap)
                entry.queued = False
                due.append(entry)
            return due

    def _run(self) -> None:
        while True:
            try:
                batch = self._take_due()
                if batch:
                    self._renew(batch)
            except Exception:  # never let the thread die: held locks depend on it
                log.exception("tasklock watchdog tick failed; retrying")
                threading.Event().wait(0.1)

    def _renew(self, batch: list[Renewal]) -> None:
        started = clock.monotonic()
        by_client: dict[int, tuple[Any, list[tuple[Renewal, int, RenewCall]]]] = {}
        for entry in batch:
            for index, call in enumerate(entry.calls):
                by_client.setdefault(id(call[0]), (call[0], []))[1].append((entry, index, call))
        results: dict[int, list[Any]] = {id(entry): [None] * len(entry.calls) for entry in batch}

        def send(client: Any, items: list[tuple[Renewal, int, RenewCall]]) -> None:
            try:
                answers: list[Any] = run_batch(client, [call[1:] for _, _, call in items])
            except Exception as exc:  # the whole pipeline got no answer
                answers = [exc] * len(items)
            for (entry, index, _), answer in zip(items, answers, strict=True):
                results[id(entry)][index] = answer

        groups = list(by_client.values())
        self.ticks += 1
        self.round_trips += len(groups)
        if len(groups) == 1:
            send(*groups[0])
        else:
            # Several servers (Redlock): in parallel, so a paused node costs one timeout, not N.
            if self._pool is None:
                self._pool = ThreadPoolExecutor(8, thread_name_prefix="tasklock-renew")
            for future in [self._pool.submit(send, c, items) for c, items in groups]:
                future.result()

        now = clock.monotonic()
        lost: list[tuple[Renewal, str]] = []
        with self._cond:
            for entry in batch:
                if entry.cancelled:
                    continue  # released meanwhile: whatever the answer, it is not a loss
                outcome = entry.judge(results[id(entry)], now - started)
                if outcome is Outcome.RENEWED:
                    entry.renewals += 1
                    entry.expires_at = started + entry.ttl
                    entry.due = now + entry.ttl / 3
                elif outcome is Outcome.LOST:
                    lost.append((entry, "the lock key was gone or held by another owner"))
                    continue
                elif now >= entry.expires_at:
                    lost.append((entry, "Redis was unreachable until the TTL ran out"))
                    continue
                else:
                    entry.due = now + min(entry.ttl / 10, 1.0)
                heapq.heappush(self._heap, (entry.due, next(self._seq), entry))
                entry.queued = True
            for entry, _ in lost:
                entry.cancelled = True
        for entry, reason in lost:
            try:
                entry.on_lost(reason)
            except Exception:
                log.exception("on_lost callback for lock %r failed", entry.name)


_watchdog: Watchdog | None = None
_watchdog_lock = threading.Lock()


def get_watchdog() -> Watchdog:
    """The process's watchdog (created on first use; a forked child gets a new one)."""
    global _watchdog
    if _watchdog is None:
        with _watchdog_lock:
            if _watchdog is None:
                _watchdog = Watchdog()
    return _watchdog


def _reset_after_fork() -> None:
    global _watchdog, _watchdog_lock
    _watchdog = None
    _watchdog_lock = threading.Lock()


os.register_at_fork(after_in_child=_reset_after_fork)
