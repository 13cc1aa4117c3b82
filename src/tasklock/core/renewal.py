"""When each held lock is renewed and what a renewal's answer means, with no I/O.

The watchdog's rules, one copy for the thread driver (:mod:`tasklock.core.watchdog`) and the
asyncio one (:mod:`tasklock.asyncio.watchdog`); the drivers only wait, send and synchronise.

* Held locks sit in a deadline heap, due at a third of their TTL. Everything due within a sixth
  of its TTL is renewed in the same tick, and the calls for one server go in one pipelined round
  trip: 1,000 held locks cost one round trip per tick, not 1,000.
* A round that has no answer by the lock's expiry (a Redlock's: within a sixth of its TTL, or by
  the expiry) is judged with :class:`NoAnswer` in place of the missing results, so a stalled
  server neither delays renewals on other servers nor hides the loss of its own locks, and a
  slow one still renews; while one round trip to a server is outstanding, no other is sent to
  it.
* A renewal is an owner-checked script, so one that races with a release can never keep a
  released lock alive; a released entry is marked cancelled first and its answers are ignored,
  so a release never shows up as a "lost" lock either.
* When a renewal finds the token gone, or the server stays unreachable until the TTL has run
  out, the entry's ``on_lost`` runs.
* Late renewals are reported, because nothing else would tell: when a renewal is more than a
  quarter of its TTL overdue at the tick that sends it, or at the release of its lock, a WARNING
  on the ``tasklock.watchdog`` logger names the locks, how late, whether the TTL ran out and the
  likely cause (:meth:`RenewalBook.late_cause`, which each driver words for what starves it).
"""

from __future__ import annotations

import heapq
import itertools
import logging
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from tasklock.core.clock import clock
from tasklock.core.hold import GONE
from tasklock.core.lanes import green_threads
from tasklock.core.scripts import Script

__all__ = [
    "GONE",
    "LATE_FRACTION",
    "UNREACHABLE",
    "Answered",
    "NoAnswer",
    "Outcome",
    "RenewCall",
    "Renewal",
    "RenewalBook",
    "RoundTrips",
    "judge_single",
    "server_client",
]

log = logging.getLogger("tasklock.watchdog")

RenewCall = tuple[Any, Script, Sequence[Any], Sequence[Any]]  # (client, script, keys, args)

UNREACHABLE = "the lock's server (Redis, etcd) was unreachable until the TTL ran out"

#: A renewal more overdue than this share of its TTL is reported. It is due at a third of the TTL,
#: so this late it runs with under half of the TTL left; two thirds late, the lock has expired.
LATE_FRACTION = 0.25

_GREEN_CAUSE = (
    "under gevent or eventlet the watchdog is a greenlet, and a task body that does not yield "
    "(CPU-bound code, or blocking calls the monkey-patching does not cover) keeps it from running: "
    "run CPU-bound tasks on the prefork or threads pool, or yield now and then with "
    "gevent.sleep(0) / eventlet.sleep(0)"
)
_THREAD_CAUSE = (
    "this process did not let the watchdog thread run (paused by SIGSTOP or a debugger, swapped "
    "out, or a C extension holding the GIL)"
)


class Outcome(Enum):
    RENEWED = "renewed"
    LOST = "lost"  # definitely not ours any more
    UNREACHABLE = "unreachable"  # no verdict: retry until the TTL would have run out


class NoAnswer(TimeoutError):
    """Given to a judge in place of the result of a renewal call that got no answer in time."""


def judge_single(results: list[Any], elapsed: float) -> Outcome:
    """The verdict on a single-instance lock's renewal (its EXTEND script's answer)."""
    answer = results[0]
    if isinstance(answer, BaseException):
        return Outcome.UNREACHABLE
    return Outcome.RENEWED if answer else Outcome.LOST


@dataclass(eq=False, slots=True)
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
    #: When the request that took the lock was sent (this process's monotonic clock), or None
    #: (then: when the watching began). The server's TTL started after it, never before.
    granted_at: float | None = None
    cancelled: bool = False
    queued: bool = False  # in the heap (the cancelled count must only count those)
    renewals: int = field(default=0)
    late: float = 0.0  # the most a renewal of it was overdue beyond LATE_FRACTION, in seconds
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

#: Per server (keyed by id): the client to send on and the calls of this tick for it.
RoundTrips = dict[int, tuple[Any, list[tuple[_Flight, int, RenewCall]]]]


class RenewalBook:
    """The watchdog's state: which holds to renew when, rounds in flight, and their verdicts.

    Not thread-safe by itself: the thread driver calls it under its condition's lock, the asyncio
    driver from its event loop only.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Renewal]] = []
        self._flights: list[tuple[float, int, _Flight]] = []  # rounds in flight, by deadline
        self._seq = itertools.count()
        # When the driver sleeps: until when (inf: until woken). None while it works, when it
        # looks at the heap again anyway: nobody needs to wake it then.
        self._wake_at: float | None = None
        self._cancelled = 0
        self._live: set[Renewal] = set()
        self._busy: set[int] = set()  # ids of servers with a round trip outstanding
        # Counters for tests and benchmarks.
        self.ticks = 0  # batches sent
        self.round_trips = 0  # pipelined round trips (one per server per tick)
        self.calls = 0  # renewal script calls sent
        self.round_trip_seconds: deque[float] = deque(maxlen=256)  # the latest durations
        self.late_reports = 0  # warnings about overdue renewals
        self._late: list[tuple[Renewal, float]] = []  # found by take_work, reported by late_text

    def late_cause(self) -> str:
        """What most likely kept the renewals from running, and the remedy."""
        return _GREEN_CAUSE if green_threads() else _THREAD_CAUSE

    # -- holders' side -------------------------------------------------------------------------
    def add(self, entry: Renewal, now: float) -> bool:
        """Start renewing ``entry``; True when the driver sleeps past its due time (wake it).

        The lease counts from when the acquire was sent (``granted_at``), as a renewal's counts
        from when it was sent: counted from its answer, the first expiry estimate exceeded the
        server's by the answer's way back, and a holder cut off from its server right after
        the acquire heard of the loss that much after another client could take the lock."""
        start = now if entry.granted_at is None else min(entry.granted_at, now)
        entry.expires_at = start + entry.ttl
        entry.due = max(start + entry.ttl / 3, now)
        self._live.add(entry)
        heapq.heappush(self._heap, (entry.due, next(self._seq), entry))
        entry.queued = True
        return self._wake_at is not None and entry.due < self._wake_at

    def remove(self, entry: Renewal, now: float) -> float | None:
        """Stop renewing ``entry``. Returns how many seconds its next renewal was overdue when
        that is more than LATE_FRACTION of its TTL (see :meth:`warn_released_late`), else None."""
        if entry.cancelled:
            return None
        entry.cancelled = True
        self._live.discard(entry)
        if not entry.queued:
            return None
        late: float | None = None
        if now - entry.due > entry.ttl * LATE_FRACTION:
            late = now - entry.due
            entry.late = max(entry.late, late)
            self.late_reports += 1
        self._cancelled += 1
        if self._cancelled > 64 and self._cancelled * 2 > len(self._heap):
            for item in self._heap:
                item[2].queued = not item[2].cancelled
            self._heap = [item for item in self._heap if not item[2].cancelled]
            heapq.heapify(self._heap)
            self._cancelled = 0
        return late

    def warn_released_late(self, entry: Renewal, late: float, now: float) -> None:
        if now >= entry.expires_at:
            fate = (
                f"its TTL ran out {now - entry.expires_at:.2f} s ago, so a duplicate may have "
                "run meanwhile and the release will find the lock gone"
            )
        else:
            fate = f"it had {entry.expires_at - now:.2f} s of its TTL left"
        log.warning(
            "lock %r released %.2f s after its renewal was due, and the watchdog never sent "
            "it (TTL %g s): %s; %s",
            entry.name,
            late,
            entry.ttl,
            fate,
            self.late_cause(),
        )

    def held(self) -> int:
        """How many holds are being kept alive."""
        return len(self._live)

    # -- the driver's side ---------------------------------------------------------------------
    def take_work(self, now: float) -> tuple[list[Renewal], list[_Flight]] | float | None:
        """The entries due now and the rounds whose answers are overdue, or, when there are
        none, until when the driver may sleep (None: until woken)."""
        # Released entries stay in the heap until due (or compacted by remove): popping them
        # here would leave the heap empty after every short hold, and the next add would have
        # to wake the driver, once per acquire.
        overdue: list[_Flight] = []
        while self._flights and self._flights[0][0] <= now:
            flight = heapq.heappop(self._flights)[2]
            if flight.entry.flight is flight:
                overdue.append(flight)
        if not overdue and not (self._heap and self._heap[0][0] <= now):
            return min([item[0] for item in (self._heap[:1] + self._flights[:1])], default=None)
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
            if now - when > entry.ttl * LATE_FRACTION:
                entry.late = max(entry.late, now - when)
                self._late.append((entry, now - when))
        return due, overdue

    def late_text(self, now: float) -> str | None:
        """One warning for the overdue renewals found by the last take_work, if any."""
        late, self._late = self._late, []
        if not late:
            return None
        self.late_reports += 1
        late.sort(key=lambda item: -item[1])
        described = []
        for entry, seconds in late[:5]:
            ran_out = ", ran out: the renewal will most likely find it gone"
            ran_out = ran_out if now >= entry.expires_at else ""
            described.append(f"{entry.name!r} by {seconds:.2f} s (TTL {entry.ttl:g} s{ran_out})")
        if len(late) > 5:
            described.append(f"and {len(late) - 5} more")
        return (
            f"tasklock's watchdog ran late: the renewal of {len(late)} lock(s) was overdue by "
            f"more than a quarter of the TTL: {', '.join(described)}; {self.late_cause()}"
        )

    def start_round(self, now: float, batch: list[Renewal]) -> tuple[RoundTrips, Answered]:
        """Start one renewal round for every entry in ``batch``: the round trips to send (one per
        server), and the answers already known (NoAnswer for a server still busy)."""
        groups: RoundTrips = {}
        skipped: Answered = []
        for entry in batch:
            if entry.cancelled:
                continue
            flight = entry.flight = _Flight(entry, now)
            # Judge without the answer at the expiry at the latest. Past it (this process
            # was paused), still ask: only the server knows whether the key is still ours.
            deadline = now + entry.ttl / 6
            if now < entry.expires_at:
                if len(entry.calls) == 1:
                    # One server: its answer counts until the expiry. Judged at a sixth of the
                    # TTL, a link slower than that (0.1 s round trips under a 0.5 s TTL) lost
                    # holds the server had renewed every time. A stalled server is judged at
                    # the expiry either way: no other round trip goes to it meanwhile.
                    deadline = entry.expires_at
                else:
                    # Redlock: a quorum must answer within the validity, and one stalled master
                    # must not hold the round up.
                    deadline = min(deadline, entry.expires_at)
            heapq.heappush(self._flights, (deadline, next(self._seq), flight))
            for index, call in enumerate(entry.calls):
                target = server_client(call[0], call[2])
                if id(target) in self._busy:
                    skipped.append((flight, index, NoAnswer("previous round trip pending")))
                else:
                    groups.setdefault(id(target), (target, []))[1].append((flight, index, call))
        self._busy.update(groups)
        self.ticks += 1
        self.round_trips += len(groups)
        self.calls += sum(len(items) for _, items in groups.values())
        return groups, skipped

    def trip_done(self, key: int, seconds: float) -> None:
        self._busy.discard(key)
        self.round_trip_seconds.append(seconds)

    def answer(self, answered: Answered) -> tuple[list[tuple[Renewal, str]], bool]:
        """Record answers; judge the rounds they complete. Returns the holds found lost (call
        :meth:`report` outside any lock) and whether the driver must wake sooner."""
        complete: list[_Flight] = []
        for flight, index, answer in answered:
            if flight.entry.flight is not flight or flight.answers[index] is not _PENDING:
                continue  # a round that was already judged
            flight.answers[index] = answer
            flight.missing -= 1
            if flight.missing == 0:
                complete.append(flight)
        return self.conclude(complete)

    def conclude(self, flights: list[_Flight]) -> tuple[list[tuple[Renewal, str]], bool]:
        """Judge finished (or overdue) rounds and schedule what comes next: the holds found
        lost, and whether the driver must wake sooner."""
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
                    # A third of the TTL from the renewal's start, like its expiry, not from its
                    # answer: over a slow link (or a first call that loads the script on a new
                    # connection) counting from the answer left less time than one round trip
                    # before the expiry, and a hold the server renewed every time was reported
                    # lost. Due already when the answer came that late: renewed at once (and
                    # not reported late: the link was slow, nothing starved the watchdog).
                    entry.due = max(flight.started + entry.ttl / 3, now)
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
        wake = earliest is not None and self._wake_at is not None and earliest < self._wake_at
        return lost, wake

    @staticmethod
    def report(lost: list[tuple[Renewal, str]]) -> None:
        for entry, reason in lost:
            try:
                entry.on_lost(reason)
            except Exception:
                log.exception("on_lost callback for lock %r failed", entry.name)
            finally:
                entry.flight = None


def server_client(client: Any, keys: Sequence[Any]) -> Any:
    """The client for the one server that keeps ``keys``: a Redis Cluster client's renewals go to
    the node that serves the key's slot, so that each node gets its own round trip and one
    stalled node cannot hold up (and lose) the locks on the others. Looked up every round from
    the cluster client's slot map, which its own calls keep current after a failover or a slot
    migration; any other client is its own server."""
    find = getattr(client, "get_node_from_key", None)
    if find is None or not keys:
        return client
    try:
        node = find(keys[0])
    except Exception:  # no slot map yet (the cluster was unreachable): the cluster client decides
        return client
    connection = getattr(node, "redis_connection", None)
    return client if connection is None else connection
