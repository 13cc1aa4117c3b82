"""The ZooKeeper lock for asyncio: :class:`tasklock.zookeeper.Lock`'s semantics, awaited through
a thread offload.

::

    from tasklock.asyncio.zookeeper import Lock

    async with Lock("zookeeper://zk1:2181,zk2:2181,zk3:2181/tasklock", "ledger:42") as lock:
        await ledger.write(..., fence=lock.fence)

Why a thread offload and not aiozk: kazoo is a threaded client whose session (heartbeats,
reconnects, watches) runs on its own threads whatever the caller does, and it is the client the
blocking lock is built and tested on; each step here is the blocking lock's own step
(:class:`tasklock.zookeeper.Lock`'s hooks, one kazoo round trip or two) run by
:func:`asyncio.to_thread`, so the rules exist once. aiozk, the asyncio-native client, has had few
releases and few users, and a second client would be a second set of session and reconnect
behaviours to get right. The cost is a thread hop per request (tens of microseconds against a
ZooKeeper round trip's hundreds). A waiter does not hold a thread while it waits: the node's
watch wakes an :class:`asyncio.Event` through ``call_soon_threadsafe``.

What is asyncio's own is :class:`tasklock.asyncio._base.AsyncBaseLock`'s: holds per task,
cancellation safety (an attempt or a release runs to its answer in a shielded task), the
asyncio watchdog. This module imports kazoo: ``import tasklock.asyncio`` does not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from tasklock.asyncio._base import AsyncBaseLock, _AsyncWaiter
from tasklock.asyncio.batches import async_renewer
from tasklock.core.batches import judge_hold
from tasklock.core.lease import Attempt, Number
from tasklock.core.owner import Holder, token_id
from tasklock.core.renewal import Renewal
from tasklock.core.scripting import Script
from tasklock.zookeeper import lock as zk
from tasklock.zookeeper.client import Client
from tasklock.zookeeper.queue import about_session

__all__ = ["Lock", "Semaphore"]


class Lock(AsyncBaseLock):
    """An asyncio lock on ZooKeeper with the API of :class:`tasklock.asyncio.Lock`; parameters
    and semantics (ttl capped at the session timeout, watchdog on by default, the fence is the
    node's czxid) are :class:`tasklock.zookeeper.Lock`'s."""

    def __init__(
        self,
        url_or_client: str | Client,
        name: str,
        timeout: Number | None = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Number | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        watchdog: bool | None = None,
        on_lost: Callable[[AsyncBaseLock], Any] | None = None,
        owner_info: Mapping[str, Any] | None = None,
        limit: int | None = None,
    ) -> None:
        #: The blocking lock whose steps this one runs in threads (its holds are never used).
        self._steps: zk.Lock = (
            zk.Lock(url_or_client, name, timeout)
            if limit is None
            else zk.Semaphore(url_or_client, name, limit, timeout)
        )
        super().__init__(
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            raise_on_release_error,
            watchdog=True if watchdog is None else watchdog,
            on_lost=on_lost,
            owner_info=owner_info,
        )
        self.ttl = self._steps.ttl
        self.client = self._steps.client
        self.limit = self._steps.limit
        self._renew_every = self._steps._renew_every

    async def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        return await asyncio.to_thread(self._steps._attempt, token, waiting)

    async def _leave_queue(self, token: str) -> None:
        await asyncio.to_thread(self._steps._leave_queue, token)

    async def _early_waiter(self, token: str) -> _AsyncWaiter | None:
        return _AsyncWatchWaiter(self, token)

    async def _waiter(self, token: str) -> _AsyncWaiter:
        return _AsyncWatchWaiter(self, token)

    async def _release_value(
        self, value: bytes, on_cancel: Callable[[asyncio.Future[Any]], None] | None = None
    ) -> bool:
        return await asyncio.to_thread(self._steps._release_value, value)

    async def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        return await asyncio.to_thread(self._steps._extend_value, value, seconds, replace)

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        call = (async_renewer(self.client, _confirm_hold), _CONFIRM, (self.name,), (self, value))
        return Renewal(self.name, self.ttl, [call], judge_hold, on_lost)

    async def locked(self) -> bool:
        return await asyncio.to_thread(self._steps.locked)

    async def _stored_value_is(self, value: bytes) -> bool:
        return await asyncio.to_thread(self._steps._stored_value_is, value)

    async def _peek(self) -> tuple[bytes | None, int | None]:
        return await asyncio.to_thread(self._steps._peek)


class Semaphore(Lock):
    """An asyncio semaphore on ZooKeeper: :class:`tasklock.zookeeper.Semaphore`, awaited."""

    def __init__(
        self, url_or_client: str | Client, name: str, limit: int, *args: Any, **kwargs: Any
    ) -> None:
        super().__init__(url_or_client, name, *args, limit=limit, **kwargs)

    async def holders(self) -> list[tuple[Holder, float | None]]:
        """Who holds the permits now (or the lock of the same name), in the order they came."""
        steps = self._steps
        assert isinstance(steps, zk.Semaphore)
        return await asyncio.to_thread(steps.holders)


class _AsyncWatchWaiter:
    """Waits for what the last failed attempt named, with the blocking waiter's rules
    (:class:`tasklock.zookeeper.queue.Watch`: armed in a thread, news or not judged the same);
    the watch wakes an :class:`asyncio.Event` on this loop."""

    def __init__(self, lock: Lock, token: str) -> None:
        self._lock = lock
        self._tid = token_id(token)

    def arm(self) -> None:
        pass

    async def wait(self, timeout: float) -> bool:
        steps = self._lock._steps
        watch = steps._watch.get(self._tid)
        if watch is None or timeout <= 0:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            woken = asyncio.Event()
            events: list[Any] = []

            def fired(event: Any, events: list[Any] = events, woken: asyncio.Event = woken) -> None:
                events.append(event)
                loop.call_soon_threadsafe(woken.set)

            try:
                if await asyncio.to_thread(watch.arm, steps.client, fired):
                    return True
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(min(timeout, float(self._lock.sleep)))
                return False
            try:
                await asyncio.wait_for(woken.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                return False
            if about_session(events[0]):
                left = max(0.0, deadline - loop.time())
                await asyncio.to_thread(steps.client.wait_connected, left)
                return True
            if watch.wakes(events[0]):
                return True

    def close(self) -> None:
        self._lock._steps._watch.pop(self._tid, None)


# -- watchdog ----------------------------------------------------------------------------------
# The asyncio watchdog renews ZooKeeper holds with one confirmation each (in a thread), through
# the per-hold batches of tasklock.asyncio.batches.

_CONFIRM = Script("ZooKeeper hold confirmation", "-- tasklock.asyncio.zookeeper confirm")


async def _confirm_hold(lock: Lock, value: bytes) -> int:
    """Confirm the hold's node: 1 while it is there, 0 when gone or released meanwhile."""
    steps = lock._steps
    if value not in steps._nodes:
        return 0
    what = f"renewing {steps._kind_word} {lock.name!r}"
    return 1 if await asyncio.to_thread(steps._confirm, value, what) else 0
