"""The asyncio driver of the lease rules (:mod:`tasklock.core.lease`): what every async lock does.

Three things differ from the blocking driver, and only these:

* **Holds belong to tasks**, not threads. With ``thread_local=True`` (the default, as in
  redis-py) a hold is kept in a :class:`contextvars.ContextVar`: the task that acquired sees it,
  and so do the tasks it starts while holding (they inherit its context), but not an unrelated
  task of the same loop that uses the same lock object. ``thread_local=False`` shares one token
  between every task, as redis-py's flag does.
* **Cancellation never leaves a half-done lock.** An acquire attempt runs to its answer even when
  the waiting task is cancelled (a shielded task), and a hold it took meanwhile is released
  straight away; a release runs to completion even when its caller is cancelled, and the hold
  stays visible until it has (a second ``release()`` awaits the same one, and learns its
  outcome). redis-py's own async lock lost the key in this case (redis-py #3847).
* Waiting, renewing and wake-ups are tasks on the running loop (see
  :mod:`tasklock.asyncio.watchdog` and :mod:`tasklock.asyncio.wakeup`).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable
from contextvars import ContextVar
from types import SimpleNamespace, TracebackType
from typing import Any, Literal, Protocol, Self

from tasklock.asyncio.background import keep
from tasklock.asyncio.watchdog import AsyncWatchdog, get_async_watchdog
from tasklock.core.clock import clock
from tasklock.core.hold import ClockedLost, Hold
from tasklock.core.lease import GIVE_UP, Attempt, LeaseCore, Number, check_seconds
from tasklock.core.owner import Holder, parse_value
from tasklock.core.renewal import Renewal
from tasklock.errors import LockError

log = logging.getLogger("tasklock.lock")


def _log_failed_leave(leaving: asyncio.Future[None]) -> None:
    if not leaving.cancelled() and leaving.exception() is not None:
        log.debug("leaving a wait queue failed (%s); it drops out", leaving.exception())


__all__ = ["AsyncBaseLock", "AsyncLostFlag", "TaskLocal"]


class AsyncLostFlag(asyncio.Event, ClockedLost):
    """``lock.lost`` of an asyncio lock (see :class:`tasklock.core.hold.ClockedLost`): truthy
    when lost (``while not lock.lost:``), and awaitable: ``await lock.lost.wait()`` (with
    ``asyncio.timeout`` for a bound) returns as soon as the watchdog finds the hold gone or its
    lease runs out by this process's clock, whichever is first."""

    def __init__(self, hold: Hold | None = None) -> None:
        super().__init__()
        self._setup(hold)

    def _is_set(self) -> bool:
        return self.is_set()

    async def wait(self) -> Literal[True]:
        while not self:
            at = self.lost_at()
            if at is None:
                return await super().wait()
            # Until the lease's end by the clock; a renewal meanwhile moves it: look again then.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, at - clock.monotonic())):
                    return await super().wait()
        return True


#: Per context: each task-local lock's attributes. The mapping is copied on every write, so a
#: task's writes never show in its parent's or siblings' contexts; the per-lock dicts inside are
#: shared, so a hold released by a child task is released for the task that took it too.
_task_holds: ContextVar[dict[TaskLocal, dict[str, Any]]] = ContextVar("tasklock_task_holds")
_ATTRIBUTES = frozenset({"token", "hold", "last_hold", "lost"})


class TaskLocal:
    """``lock.local`` for asyncio: the attributes of the current task's hold.

    One module-level ContextVar serves every lock (a ContextVar per lock would stay in a
    long-lived task's context for ever, one per lock object it ever used); entries of released
    holds are dropped at the next write, so a worker task that locks a million ids keeps none.
    """

    __slots__ = ("__weakref__",)

    def __getattr__(self, name: str) -> Any:
        if name not in _ATTRIBUTES:
            raise AttributeError(name)
        state = _task_holds.get({}).get(self)
        return None if state is None else state.get(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _ATTRIBUTES:
            raise AttributeError(f"tasklock's task-local lock state has no {name!r}")
        state = _task_holds.get({}).get(self)
        if state is None:
            if value is None:
                return  # what reading it gives already: no new state (a new lock sets its token)
            state = self.fresh()
        state[name] = value

    def fresh(self) -> dict[str, Any]:
        """A new state for this task (and the tasks it starts from now on): an acquire's."""
        state: dict[str, Any] = {}
        table = {
            local: other
            for local, other in _task_holds.get({}).items()
            if local is not self and other.get("hold") is not None
        }
        table[self] = state
        _task_holds.set(table)
        return state


class _AsyncWaiter(Protocol):
    def arm(self) -> None: ...
    async def wait(self, timeout: float) -> bool: ...
    def close(self) -> None: ...


class AsyncBaseLock(LeaseCore):
    """The shared async surface; see :class:`tasklock.asyncio.Lock` for the parameters."""

    _flag_class = AsyncLostFlag
    _holder_word = "task"
    #: The last hold any task took (``lost`` after a release, from any task).
    _last_hold: Hold | None = None

    def _new_local(self) -> Any:
        return TaskLocal() if self.thread_local else SimpleNamespace()

    def _watchdog(self) -> AsyncWatchdog:
        return get_async_watchdog()

    # -- backend, supplied by subclasses -------------------------------------------------------
    async def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        """One try; ``waiting`` as in :meth:`tasklock.core.base.BaseLock._attempt`."""
        raise NotImplementedError

    async def _leave_queue(self, token: str) -> None:
        """A waiter that waited gave up (or was cancelled): take it out of the queue."""

    async def _release_value(
        self, value: bytes, on_cancel: Callable[[asyncio.Future[Any]], None] | None = None
    ) -> bool:
        raise NotImplementedError

    async def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        raise NotImplementedError

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        raise NotImplementedError

    async def _waiter(self, token: str) -> _AsyncWaiter:
        raise NotImplementedError

    async def _early_waiter(self, token: str) -> _AsyncWaiter | None:
        """As :meth:`tasklock.core.base.BaseLock._early_waiter`."""
        return None

    async def locked(self) -> bool:
        """True if this lock name is held by anyone."""
        raise NotImplementedError

    async def _stored_value_is(self, value: bytes) -> bool:
        raise NotImplementedError

    async def _peek(self) -> tuple[bytes | None, int | None]:
        raise NotImplementedError

    async def peek(self) -> tuple[Holder | None, float | None]:
        """Who holds this lock name now, whoever it is, and for how many more seconds."""
        value, pttl = await self._peek()
        if value is None:
            return None, None
        return parse_value(value), (pttl / 1000 if pttl is not None and pttl >= 0 else None)

    # -- holds ---------------------------------------------------------------------------------
    @property
    def lost(self) -> Any:
        """Set when the watchdog found the current (or last) hold gone."""
        hold = getattr(self.local, "last_hold", None) or self._last_hold
        if hold is not None:
            return hold.lost
        return super().lost

    def _call_on_lost(self) -> None:
        """``on_lost`` may be a coroutine function too: its coroutine runs as a task."""
        assert self.on_lost is not None
        result = self.on_lost(self)
        if inspect.isawaitable(result):
            keep(asyncio.ensure_future(result))

    def _start_hold(self, value: bytes, fence: int | None, sent: float | None = None) -> Hold:
        if self.thread_local:
            self.local.fresh()  # this task's (and its future children's) hold, nobody else's
        hold = self._last_hold = super()._start_hold(value, fence, sent)
        return hold

    def _end_this_hold(self, hold: Hold) -> None:
        """End ``hold`` (stop renewing; clear the token if it is still this context's hold)."""
        self._stop_hold(hold)
        if getattr(self.local, "hold", None) is hold:
            self.local.hold = None
            self.local.token = None

    # -- acquire -------------------------------------------------------------------------------
    async def acquire(
        self,
        sleep: Number | None = None,
        blocking: bool | None = None,
        blocking_timeout: Number | None = None,
        token: str | bytes | None = None,
    ) -> bool:
        """Take the lock; True once held, False if not held within ``blocking_timeout``.

        A waiter is woken by the holder's release; polling with jittered backoff (starting at
        ``sleep``) is only the fallback, and never outlasts the holder's remaining TTL.
        Cancelling the waiting task leaves no key of its own behind.
        """
        owner, rules = self._plan_acquire(sleep, blocking, blocking_timeout, token)
        waiter: _AsyncWaiter | None = None
        acquired = False
        try:
            if rules.may_wait:
                waiter = await self._early_waiter(owner)
                if waiter is not None:
                    rules.subscribed()
            while True:
                if waiter is not None:
                    waiter.arm()
                sent = clock.monotonic()
                if self._attempt_is_cancel_safe:  # (one coroutine fewer on the hot path)
                    attempt = await self._attempt(owner, waiter is not None)
                else:
                    attempt = await self._shielded_attempt(owner, waiter is not None)
                if attempt.acquired:
                    assert attempt.value is not None
                    self._start_hold(attempt.value, attempt.fence, sent)
                    acquired = True
                    return True
                step = rules.after_failure(attempt)
                if isinstance(step, str):
                    if step is GIVE_UP:
                        return False
                    waiter = await self._waiter(owner)  # SUBSCRIBE: then try again at once
                    continue
                assert waiter is not None  # (SUBSCRIBE always comes first)
                await waiter.wait(step)
                owner = rules.retry_owner(owner)
        finally:
            if waiter is not None:
                waiter.close()
                if not acquired:
                    await self._give_up_place(owner)

    async def _give_up_place(self, owner: str) -> None:
        """Leave the queue after waiting in vain, also when cancelled (the leaving goes on in
        the background then); a failure only costs the queue the waiter's liveness."""
        leaving = keep(asyncio.ensure_future(self._leave_queue(owner)))
        leaving.add_done_callback(_log_failed_leave)
        try:
            await asyncio.shield(leaving)
        except asyncio.CancelledError:
            raise  # (the leaving itself goes on)
        except Exception:
            pass  # logged by _log_failed_leave

    #: True when ``_attempt`` itself deals with its caller's cancellation (the single lock's
    #: lane reads the reply in the background and releases a lock taken meanwhile): then no
    #: shielding task is needed.
    _attempt_is_cancel_safe = False

    async def _shielded_attempt(self, owner: str, waiting: bool) -> Attempt:
        """One attempt that runs to its answer even if the caller is cancelled meanwhile: the
        script may already have taken the key, and only its answer says so (then it is released
        at once, in the background)."""
        if self._attempt_is_cancel_safe:
            return await self._attempt(owner, waiting)
        attempt = asyncio.ensure_future(self._attempt(owner, waiting))
        try:
            return await asyncio.shield(attempt)
        except asyncio.CancelledError:
            attempt.add_done_callback(self._undo_cancelled_attempt)
            keep(attempt)
            raise

    def _undo_cancelled_attempt(self, attempt: asyncio.Future[Attempt]) -> None:
        if attempt.cancelled() or attempt.exception() is not None:
            return
        result = attempt.result()
        if result.acquired and result.value is not None:
            keep(asyncio.ensure_future(self._release_value(result.value)))

    # -- release / extend ----------------------------------------------------------------------
    async def release(self) -> None:
        """Release the lock; LockNotOwnedError if it was no longer ours (LockLostError if the
        hold already counted as lost: the watchdog's finding, or its lease run out by this
        process's clock); either way ``lost`` stays true after it. Runs to completion even if
        the caller is cancelled: until then the hold stays, and calling ``release()`` again
        waits for the same release."""
        hold = self._hold_to_release()
        if hold.releasing is not None:  # an earlier release was cancelled: its outcome
            released: bool = await asyncio.shield(hold.releasing)
        elif self._release_is_cancel_safe:
            try:
                released = await self._release_value(
                    hold.value, on_cancel=lambda late: self._release_later(hold, late)
                )
            except asyncio.CancelledError:
                raise  # the hold stays: not sent, or finishing in hold.releasing
            except BaseException:
                self._end_this_hold(hold)
                raise
            self._end_this_hold(hold)
        else:
            hold.releasing = keep(asyncio.ensure_future(self._release_hold(hold)))
            released = await asyncio.shield(hold.releasing)
        if not released:
            self._not_owned(hold, "release")

    #: True when ``_release_value`` takes ``on_cancel`` (the single lock's lane): a release
    #: cancelled after it was sent hands over the task that reads its reply, and a release
    #: cancelled before that was not sent at all. Otherwise each release runs as a shielded task.
    _release_is_cancel_safe = False

    def _release_later(self, hold: Hold, late: asyncio.Future[Any]) -> None:
        """The release was sent, its caller cancelled: the hold ends when ``late`` has the reply."""

        async def finish() -> bool:
            try:
                return bool(await late)
            finally:
                self._end_this_hold(hold)

        hold.releasing = keep(asyncio.ensure_future(finish()))

    async def _release_hold(self, hold: Hold) -> bool:
        try:
            return await self._release_value(hold.value)
        finally:
            self._end_this_hold(hold)

    async def extend(self, additional_time: Number, replace_ttl: bool = False) -> Literal[True]:
        """Add ``additional_time`` seconds to the TTL (or set it to that, with ``replace_ttl``)."""
        check_seconds("additional_time", additional_time, allow_none=False, allow_zero=False)
        hold = self._require_hold("extend")
        sent = clock.monotonic()
        if not await self._extend_value(hold.value, float(additional_time), replace_ttl):
            self._end_this_hold(hold)
            self._not_owned(hold, "extend")
        hold.extended(sent, float(additional_time), replace_ttl)
        return True

    async def reacquire(self) -> Literal[True]:
        """Reset the TTL to the lock's full TTL."""
        hold = self._require_hold("reacquire")
        sent = clock.monotonic()
        if not await self._extend_value(hold.value, self.ttl, True):
            self._end_this_hold(hold)
            self._not_owned(hold, "reacquire")
        hold.extended(sent, self.ttl, True)
        return True

    async def owned(self) -> bool:
        """True if the lock is held by this lock object (in this task, with thread_local)."""
        hold = self._hold()
        return hold is not None and await self._stored_value_is(hold.value)

    # -- context manager -----------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        if await self.acquire():
            return self
        raise self._not_acquired()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        try:
            await self.release()
        except LockError:
            if self.raise_on_release_error:
                raise
            self._release_failed_on_exit()
