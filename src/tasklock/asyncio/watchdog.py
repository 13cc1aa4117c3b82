"""One renewal task per event loop that keeps every lock held on that loop fresh.

The rules (due times, batching per server, answer deadlines, verdicts, late warnings) are
:class:`tasklock.core.renewal.RenewalBook`'s, shared with the thread watchdog; this is the asyncio
driver. The task starts with the first hold on a loop and ends when the loop has nothing left to
renew, or when the loop cancels it at shutdown, and then forgets the watchdog: an idle loop has
no pending task, and nothing here keeps a closed loop alive (the per-loop mapping is weak, and
its entry goes with the task). Each
server's round trip is a task of its own, so a stalled server cannot delay the others' renewals.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

from tasklock.asyncio.scripts import run_batch
from tasklock.core.clock import clock
from tasklock.core.renewal import Answered, Renewal, RenewalBook, RenewCall, _Flight

__all__ = ["AsyncWatchdog", "get_async_watchdog"]

log = logging.getLogger("tasklock.watchdog")

_LOOP_CAUSE = (
    "the event loop did not run the watchdog's task (a coroutine that ran CPU-bound or blocking "
    "code without awaiting, or a paused process): move such work to a thread "
    "(await asyncio.to_thread(...)) or a process pool"
)


class AsyncWatchdog(RenewalBook):
    """The asyncio driver of :class:`RenewalBook`, for one event loop."""

    def __init__(self) -> None:
        super().__init__()
        self._task: asyncio.Task[None] | None = None
        self._wakeup = asyncio.Event()
        self._trips: set[asyncio.Task[None]] = set()

    def late_cause(self) -> str:
        return _LOOP_CAUSE

    # -- holders' side (called on the loop) ----------------------------------------------------
    def watch(self, entry: Renewal) -> None:
        if self.add(entry, clock.monotonic()):
            self._wakeup.set()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name="tasklock-watchdog"
            )

    def unwatch(self, entry: Renewal) -> float | None:
        now = clock.monotonic()
        late = self.remove(entry, now)
        if late is not None:
            self.warn_released_late(entry, late, now)
        return late

    # -- the task ------------------------------------------------------------------------------
    async def _run(self) -> None:
        try:
            await self._renew_while_held()
        finally:
            # Idle (or the loop is shutting down): forget this watchdog, so that nothing here
            # refers to the loop any more; the next hold on the loop makes a new one.
            self._task = None
            loop = asyncio.get_running_loop()
            if _watchdogs.get(loop) is self:
                del _watchdogs[loop]

    async def _renew_while_held(self) -> None:
        while True:
            try:
                now = clock.monotonic()
                work = self.take_work(now)
                if not isinstance(work, tuple):
                    if work is None and not self._live and not self._flights:
                        return  # nothing to renew
                    self._wake_at = float("inf") if work is None else work
                    self._wakeup.clear()
                    try:
                        async with asyncio.timeout(None if work is None else work - now):
                            await self._wakeup.wait()
                    except TimeoutError:
                        pass
                    self._wake_at = None
                    continue
                due, overdue = work
                text = self.late_text(now)
                if text is not None:
                    log.warning("%s", text)
                if overdue:
                    self.report(self.conclude(overdue)[0])
                if due:
                    self._send(now, due)
            except asyncio.CancelledError:
                raise  # the loop is closing
            except Exception:  # never let the task die: held locks depend on it
                log.exception("tasklock watchdog tick failed; retrying")
                await asyncio.sleep(0.1)

    def _send(self, now: float, batch: list[Renewal]) -> None:
        groups, skipped = self.start_round(now, batch)
        for key, (client, items) in groups.items():
            trip = asyncio.get_running_loop().create_task(self._round_trip(key, client, items))
            self._trips.add(trip)
            trip.add_done_callback(self._trips.discard)
        if skipped:
            self._answer(skipped)

    async def _round_trip(
        self, key: int, client: Any, items: list[tuple[_Flight, int, RenewCall]]
    ) -> None:
        started = clock.monotonic()
        try:
            answers: list[Any] = await run_batch(client, [call[1:] for _, _, call in items])
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the whole pipeline got no answer
            answers = [exc] * len(items)
        finally:
            self.trip_done(key, clock.monotonic() - started)
        self._answer(
            [
                (flight, index, answer)
                for (flight, index, _), answer in zip(items, answers, strict=True)
            ]
        )

    def _answer(self, answered: Answered) -> None:
        lost, wake = self.answer(answered)
        if wake:
            self._wakeup.set()
        self.report(lost)


_watchdogs: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncWatchdog] = (
    weakref.WeakKeyDictionary()
)


def get_async_watchdog() -> AsyncWatchdog:
    """The running loop's watchdog (created on first use)."""
    loop = asyncio.get_running_loop()
    watchdog = _watchdogs.get(loop)
    if watchdog is None:
        watchdog = _watchdogs[loop] = AsyncWatchdog()
    return watchdog
