"""One renewal thread per process that keeps every held lock's TTL fresh.

Why: a short TTL (30 s) is what frees the lock quickly when a worker is SIGKILLed or OOM-killed,
but tasks run for hours. The watchdog renews each held lock at about a third of its TTL, so a live
holder never loses its lock and a dead one loses it within one TTL.

The rules (when each lock is due, batching per server, deadlines for answers, verdicts, late
warnings) are in :mod:`tasklock.core.renewal`, shared with the asyncio watchdog. This module is
the thread driver:

* One daemon thread sleeps on a condition until the earliest entry or overdue answer is due.
* The watchdog thread never waits on a socket. Each server's round trip runs on a short-lived
  daemon thread, so a stalled server (SIGSTOPped, partitioned, and redis-py's default of no
  socket timeout) cannot delay the renewals on the others.
* Fork-safe: a child process starts with an empty watchdog and no thread; holds are not inherited.
* Late renewals are reported. The watchdog only works while the process lets its thread run: a
  SIGSTOPped or swapped-out process, a C extension that holds the GIL, and above all a task body
  that never yields under gevent or eventlet (whose "threads" are greenlets: a CPU-bound body
  keeps the watchdog greenlet from running at all) leave the lock unrenewed, and it expires under
  a body that is still running. That cannot be prevented from inside the process, nor even seen
  while it happens, but it can be seen afterwards: :meth:`Watchdog.unwatch` returns the lateness
  and :attr:`Renewal.late` keeps the worst, so a release that then finds the lock gone can say
  why.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any

from tasklock.core.clock import clock
from tasklock.core.renewal import (
    GONE,
    LATE_FRACTION,
    UNREACHABLE,
    Answered,
    NoAnswer,
    Outcome,
    Renewal,
    RenewalBook,
    RenewCall,
    _Flight,
)
from tasklock.core.scripts import run_batch

__all__ = [
    "GONE",
    "LATE_FRACTION",
    "UNREACHABLE",
    "NoAnswer",
    "Outcome",
    "RenewCall",
    "Renewal",
    "Watchdog",
    "get_watchdog",
]

log = logging.getLogger("tasklock.watchdog")


class Watchdog(RenewalBook):
    """The thread driver of :class:`RenewalBook`."""

    def __init__(self) -> None:
        super().__init__()
        # Holders take the condition's lock itself on every acquire and release: a plain lock's
        # ``with`` runs no Python code, the Condition's two methods.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._thread: threading.Thread | None = None
        #: The driver thread runs (set when it is started, cleared when it ends): what
        #: ``Thread.is_alive`` would say, without its calls on every acquire.
        self._running = False

    # -- holders' side -------------------------------------------------------------------------
    def watch(self, entry: Renewal) -> None:
        now = clock.monotonic()
        with self._mutex:
            wake = self.add(entry, now)
            if not self._running:
                self._thread = threading.Thread(
                    target=self._run, name="tasklock-watchdog", daemon=True
                )
                self._thread.start()
                self._running = True
            elif wake:
                self._cond.notify()  # it sleeps past this entry's due time

    def forget(self) -> None:
        """Stop renewing every hold, without a word: for tests, whose servers stop with the
        module that started them. A hold left on such a server would be renewed (and retried,
        through the client's own backoff, and reported lost) while later modules run."""
        with self._mutex:
            for entry in list(self._live):
                self.remove(entry, -math.inf)  # (at no time: never reported late)

    def unwatch(self, entry: Renewal) -> float | None:
        """Stop renewing ``entry``. Returns how many seconds its next renewal was overdue when
        that is more than LATE_FRACTION of its TTL (and logs a warning), else None."""
        now = clock.monotonic()
        with self._mutex:
            late = self.remove(entry, now)
        if late is not None:
            self.warn_released_late(entry, late, now)
        return late

    def held(self) -> int:
        """How many holds this watchdog is keeping alive."""
        with self._cond:
            return len(self._live)

    # -- the thread ----------------------------------------------------------------------------
    def _next_work(self) -> tuple[float, list[Renewal], list[_Flight]]:
        """Wait until an entry is due or a round's answers are overdue; return both kinds."""
        with self._cond:
            while True:
                now = clock.monotonic()
                work = self.take_work(now)
                if isinstance(work, tuple):
                    self._wake_at = None
                    return now, *work
                self._wake_at = math.inf if work is None else work
                self._cond.wait(None if work is None else work - now)

    def _report_late(self) -> None:
        with self._cond:
            text = self.late_text(clock.monotonic())
        if text is not None:
            log.warning("%s", text)

    def _run(self) -> None:
        try:
            while True:
                try:
                    now, due, overdue = self._next_work()
                    self._report_late()
                    if overdue:
                        with self._cond:
                            lost, wake = self.conclude(overdue)
                            if wake:
                                self._cond.notify()
                        self.report(lost)
                    if due:
                        self._send(now, due)
                except Exception:  # never let the thread die: held locks depend on it
                    log.exception("tasklock watchdog tick failed; retrying")
                    threading.Event().wait(0.1)
        finally:  # (a BaseException out of a callback): the next watch starts a new thread
            with self._mutex:
                self._running = False

    def _send(self, now: float, batch: list[Renewal]) -> None:
        """Start one renewal round for every entry in ``batch``: one round trip per server."""
        with self._cond:
            groups, skipped = self.start_round(now, batch)
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
                self.trip_done(key, clock.monotonic() - started)
        self._answer(
            [
                (flight, index, answer)
                for (flight, index, _), answer in zip(items, answers, strict=True)
            ]
        )

    def _answer(self, answered: Answered) -> None:
        with self._cond:
            lost, wake = self.answer(answered)
            if wake:
                self._cond.notify()
        self.report(lost)


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
