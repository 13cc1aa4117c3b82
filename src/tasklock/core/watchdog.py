"""One renewal thread per process that keeps every held lock's TTL fresh.

Why: a short TTL (30 s) is what frees the lock quickly when a worker is SIGKILLed or OOM-killed,
but tasks run for hours. The watchdog renews each held lock at about a third of its TTL, so a live
holder never loses its lock and a dead one loses it within one TTL.

How:
* Held locks sit in a deadline heap; one daemon thread sleeps until the earliest is due.
* Everything due within a sixth of its TTL is renewed in the same tick, and calls for one client go
  in one pipelined round trip: 1,000 held locks cost one round trip per tick, not 1,000.
* The watchdog thread never waits on a socket. Each client's round trip runs on a short-lived
  daemon thread, and a renewal that has no answer within a sixth of its TTL is judged with "no
  answer" in place of the missing results. So a stalled server (SIGSTOPped, partitioned, and
  redis-py's default of no socket timeout) neither delays renewals on other servers nor hides the
  loss of its own locks; while one round trip to a client is outstanding, no other is sent to it.
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
import math
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tasklock.core.clock import clock
from tasklock.core.scripts import Script, run_batch

__all__ = ["NoAnswer", "Outcome", "RenewCall", "Renewal", "Watchdog", "get_watchdog"]

log = logging.getLogger("tasklock.watchdog")

RenewCall = tuple[Any, Script, Sequence[Any], Sequence[Any]]  # (client, script, keys, args)

GONE = "the lock key was gone or held by another owner"
UNREACHABLE = "Redis was unreachable until the TTL ran out"


class Outcome(Enum):
    RENEWED = "renewed"
    LOST = "lost"  # definitely not ours any more
    UNREACHABLE = "unreachable"  # no verdict: retry until the TTL would have run out


class NoAnswer(TimeoutError):
    """Given to a judge in place of the result of a renewal call that got no answer in time."""


@dataclass(eq=False)
class Renewal:
    """One held lock, as the watchdog sees it.

    ``calls`` are the script calls that renew it (one for a single-instance lock, one per node for
    Redlock); ``judge`` turns their results (a value or an exception each, :class:`NoAnswer` for a
    server that did not answer in time) and the seconds the round took into an Outcome.
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
    flight: _Flight | None = field(default=None, repr=False)  # the renewal round in progress


_PENDING: Any = object()


class _Flight:
    """One renewal round of one entry: answers arrive per client; judged when all are in or at
    its deadline, whichever comes first. Answers for a round that is no longer current are
    dropped."""

    __slots__ = ("answers", "entry", "missing", "started")

    def __init__(self, entry: Renewal, started: float) -> None:
        self.entry = entry
        self.started = started
        self.answers: list[Any] = [_PENDING] * len(entry.calls)
        self.missing = len(entry.calls)


Answered = list[tuple[_Flight, int, Any]]  # (round, index of the call, its result)


class Watchdog:
    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Renewal]] = []
        self._flights: list[tuple[float, int, _Flight]] = []  # rounds in flight, by deadline
        self._seq = itertools.count()
        self._cond = threading.Condition(threading.Lock())
        self._thread: threading.Thread | None = None
        # When the thread sleeps: until when (inf: until notified). None while it works, when
        # it looks at the heap again anyway: nobody needs to wake it then.
        self._wake_at: float | None = None
        self._cancelled = 0
        self._live: set[Renewal] = set()
        self._busy: set[int] = set()  # ids of clients with a round trip outstanding
        # Counters for tests and benchmarks.
        self.ticks = 0  # batches sent
        self.round_trips = 0  # pipelined round trips (one per client per tick)
        self.calls = 0  # renewal script calls sent
        self.round_trip_seconds: deque[float] = deque(maxlen=256)  # the latest durations

    # -- holders' side -------------------------------------------------------------------------
    def watch(self, entry: Renewal) -> None:
        now = clock.monotonic()
        entry.expires_at = now + entry.ttl
        entry.due = now + entry.ttl / 3
        with self._cond:
            self._live.add(entry)
            heapq.heappush(self._heap, (entry.due, next(self._seq), entry))
            entry.queued = True
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="tasklock-watchdog", daemon=True
                )
                self._thread.start()
            elif self._wake_at is not None and entry.due < self._wake_at:
                self._cond.notify()  # it sleeps past this entry's due time

    def unwatch(self, entry: Renewal) -> None:
        with self._cond:
            if not entry.cancelled:
                entry.cancelled = True
                self._live.discard(entry)
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
        """How many holds this watchdog is keeping alive."""
        with self._cond:
            return len(self._live)

    # -- the thread ----------------------------------------------------------------------------
    def _next_work(self) -> tuple[float, list[Renewal], list[_Flight]]:
        """Wait until an entry is due or a round's answers are overdue; return both kinds."""
        with self._cond:
            while True:
                # Released entries stay in the heap until due (or compacted by unwatch): popping
                # them here would leave the heap empty after every short hold, and the next
                # watch() would have to wake this thread, once per acquire.
                now = clock.monotonic()
                overdue: list[_Flight] = []
                while self._flights and self._flights[0][0] <= now:
                    flight = heapq.heappop(self._flights)[2]
                    if flight.entry.flight is flight:
                        overdue.append(flight)
                if overdue or (self._heap and self._heap[0][0] <= now):
                    break
                wake = min([item[0] for item in (self._heap[:1] + self._flights[:1])], default=None)
                self._wake_at = math.inf if wake is None else wake
                self._cond.wait(None if wake is None else wake - now)
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
            return now, due, overdue

    def _run(self) -> None:
        while True:
            try:
                now, due, overdue = self._next_work()
                if overdue:
                    with self._cond:
                        lost = self._conclude(overdue)
                    self._report(lost)
                if due:
                    self._send(now, due)
            except Exception:  # never let the thread die: held locks depend on it
                log.exception("tasklock watchdog tick failed; retrying")
                threading.Event().wait(0.1)

    def _send(self, now: float, batch: list[Renewal]) -> None:
        """Start one renewal round for every entry in ``batch``: one round trip per client."""
        groups: dict[int, tuple[Any, list[tuple[_Flight, int, RenewCall]]]] = {}
        skipped: Answered = []
        with self._cond:
            for entry in batch:
                if entry.cancelled:
                    continue
                flight = entry.flight = _Flight(entry, now)
                # Judge without the answer at the expiry at the latest. Past it (this process
                # was paused), still ask: only the server knows whether the key is still ours.
                deadline = now + entry.ttl / 6
                if now < entry.expires_at:
                    deadline = min(deadline, entry.expires_at)
                heapq.heappush(self._flights, (deadline, next(self._seq), flight))
                for index, call in enumerate(entry.calls):
                    if id(call[0]) in self._busy:
                        skipped.append((flight, index, NoAnswer("previous round trip pending")))
                    else:
                        groups.setdefault(id(call[0]), (call[0], []))[1].append(
                            (flight, index, call)
                        )
            self._busy.update(groups)
            self.ticks += 1
            self.round_trips += len(groups)
            self.calls += sum(len(items) for _, items in groups.values())
        for key, (client, items) in groups.items():
            sender = threading.Thread(
                target=self._round_trip,
                args=(key, client, items),
                name="tasklock-renew",
                daemon=True,
            )
            try:
                sender.start()
            except RuntimeError:  # no new threads (interpreter shutting down): send it here
                self._round_trip(key, client, items)
        if skipped:
            self._answer(skipped)

    def _round_trip(
        self, key: int, client: Any, items: list[tuple[_Flight, int, RenewCall]]
    ) -> None:
        started = clock.monotonic()
        try:
            answers: list[Any] = run_batch(client, [call[1:] for _, _, call in items])
        except Exception as exc:  # the whole pipeline got no answer
            answers = [exc] * len(items)
        finally:
            with self._cond:
                self._busy.discard(key)
        self.round_trip_seconds.append(clock.monotonic() - started)
        self._answer(
            [
                (flight, index, answer)
                for (flight, index, _), answer in zip(items, answers, strict=True)
            ]
        )

    def _answer(self, answered: Answered) -> None:
        complete: list[_Flight] = []
        with self._cond:
            for flight, index, answer in answered:
                if flight.entry.flight is not flight or flight.answers[index] is not _PENDING:
                    continue  # a round that was already judged
                flight.answers[index] = answer
                flight.missing -= 1
                if flight.missing == 0:
                    complete.append(flight)
            lost = self._conclude(complete)
        self._report(lost)

    def _conclude(self, flights: list[_Flight]) -> list[tuple[Renewal, str]]:
        """Judge finished (or overdue) rounds and schedule what comes next. Holds the lock."""
        now = clock.monotonic()
        lost: list[tuple[Renewal, str]] = []
        earliest: float | None = None
        for flight in flights:
            entry = flight.entry
            if entry.flight is not flight:
                continue
            try:
                if entry.cancelled:
                    continue  # released meanwhile: whatever the answer, it is not a loss
                answers = [
                    NoAnswer("no answer in time") if answer is _PENDING else answer
                    for answer in flight.answers
                ]
                try:
                    outcome = entry.judge(answers, now - flight.started)
                except Exception:
                    log.exception("judging the renewal of lock %r failed", entry.name)
                    outcome = Outcome.UNREACHABLE
                if outcome is Outcome.RENEWED:
                    entry.renewals += 1
                    entry.expires_at = flight.started + entry.ttl
                    entry.due = now + entry.ttl / 3
                elif outcome is Outcome.LOST:
                    lost.append((entry, GONE))
                    continue
                elif now >= entry.expires_at:
                    lost.append((entry, UNREACHABLE))
                    continue
                else:
                    entry.due = min(now + min(entry.ttl / 10, 1.0), entry.expires_at)
                heapq.heappush(self._heap, (entry.due, next(self._seq), entry))
                entry.queued = True
                earliest = entry.due if earliest is None else min(earliest, entry.due)
            finally:
                # Last: "no round in flight" must mean the round is concluded and scheduled (a
                # lost entry keeps it until its loss has been reported, see _report).
                if not lost or lost[-1][0] is not entry:
                    entry.flight = None
        for entry, _ in lost:
            entry.cancelled = True
            self._live.discard(entry)
        if earliest is not None and self._wake_at is not None and earliest < self._wake_at:
            self._cond.notify()
        return lost

    @staticmethod
    def _report(lost: list[tuple[Renewal, str]]) -> None:
        for entry, reason in lost:
            try:
                entry.on_lost(reason)
            except Exception:
                log.exception("on_lost callback for lock %r failed", entry.name)
            finally:
                entry.flight = None


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
