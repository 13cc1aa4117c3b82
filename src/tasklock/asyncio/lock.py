"""The single-instance lock for asyncio: one Redis, one round trip to acquire, fenced.

The same scripts as :class:`tasklock.Lock` (acquire with the fence in one round trip,
owner-checked release and extend; see :mod:`tasklock.core.scripts`), awaited on a
``redis.asyncio`` client (``Redis``, a Sentinel master, or ``RedisCluster``).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from tasklock.asyncio._base import AsyncBaseLock, _AsyncWaiter
from tasklock.asyncio.background import keep
from tasklock.asyncio.lanes import AsyncBoundScript
from tasklock.asyncio.scripts import run_script
from tasklock.asyncio.wakeup import AsyncWakeupHub, async_hub_for
from tasklock.core.connection import backend_errors, describe_client
from tasklock.core.keys import wake_channel
from tasklock.core.layouts import WAITER_LIVENESS, Layout, lock_layout
from tasklock.core.lease import Attempt, Number, check_fair, fence_key_or_default
from tasklock.core.permits import PermitState
from tasklock.core.renewal import Renewal, judge_single
from tasklock.core.scripts import PERMIT_STATE
from tasklock.core.wakeup import PUBLISH_REFUSED, warn_wakeup_refused
from tasklock.errors import ConfigurationError

__all__ = ["Lock"]


class Lock(AsyncBaseLock):
    """An asyncio Redis lock with a TTL that is always set, fencing tokens, a watchdog and
    wake-up on release.

    Interface-compatible with :class:`redis.asyncio.lock.Lock`, so it also works as
    ``redis.asyncio.Redis.lock(name, lock_class=tasklock.asyncio.Lock)``; the parameters and the
    differences from redis-py are :class:`tasklock.Lock`'s. What is asyncio's own: holds belong
    to the task that acquired (and the tasks it starts), not to a thread; cancellation is safe
    (see :mod:`tasklock.asyncio._base`); ``lock.lost`` is an :class:`asyncio.Event`; ``on_lost``
    is called on the event loop, from the watchdog's task.
    """

    def __init__(
        self,
        redis: Any,
        name: str,
        timeout: Number | None = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Number | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        fence_key: str | None = None,
        watchdog: bool | None = None,
        on_lost: Callable[[AsyncBaseLock], Any] | None = None,
        owner_info: Mapping[str, Any] | None = None,
        fair: bool = True,
    ) -> None:
        super().__init__(
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            raise_on_release_error,
            watchdog=watchdog,
            on_lost=on_lost,
            owner_info=owner_info,
        )
        if redis is None or not hasattr(redis, "evalsha") or not hasattr(redis, "pipeline"):
            raise ConfigurationError(
                "redis must be a redis.asyncio client (redis.asyncio.Redis or RedisCluster), "
                f"got {type(redis).__name__}"
            )
        self.redis = redis
        self.fair = check_fair(fair)
        self.fence_key = fence_key_or_default(fence_key, self.name)
        self._ttl_ms = max(1, int(self.ttl * 1000))
        self._channel = wake_channel(self.name)
        self._layout = self._make_layout()
        self._hub_cache: tuple[Any, Any, AsyncWakeupHub] | None = None
        if self._layout.fair:
            self._renew_every = WAITER_LIVENESS / 3
        self._bind(redis)

    def _make_layout(self) -> Layout:
        return lock_layout(self.name, self.fence_key, self.ttl, self.fair)

    def _bind(self, client: Any) -> None:
        # The hot path: acquire and release pre-encoded for this client (see AsyncBoundScript).
        layout = self._layout
        self._bound_to = client
        self._acquire_script = AsyncBoundScript(
            layout.acquire, client, layout.acquire_keys, layout.acquire_tail
        )
        self._release_script = AsyncBoundScript(
            layout.release, client, layout.release_keys, layout.release_tail
        )
        self._attempt_is_cancel_safe = self._acquire_script.fast
        self._release_is_cancel_safe = self._release_script.fast

    def _took_while_cancelled(self, answer: Any, args: tuple[Any, ...]) -> None:
        """An acquire whose caller was cancelled got its answer: release what it took."""
        ok, number = answer
        if ok:
            value = f"{args[0]}#{number}".encode()
            keep(asyncio.ensure_future(self._release_value(value)))

    async def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        if self.redis is not self._bound_to:
            self._bind(self.redis)
        try:
            ok, number = await self._acquire_script(
                *self._layout.attempt_args(token, waiting), on_late=self._took_while_cancelled
            )
        except Exception:  # (backend_errors only here: a block per call costs three calls)
            with backend_errors(self.redis, "acquiring lock", self._layout.acquire_keys, self.name):
                raise
        if ok:
            return Attempt(True, f"{token}#{number}".encode(), int(number))
        return Attempt(False, holder_ttl=number / 1000 if number >= 0 else None)

    async def _release_value(
        self, value: bytes, on_cancel: Callable[[asyncio.Future[Any]], None] | None = None
    ) -> bool:
        if self.redis is not self._bound_to:
            self._bind(self.redis)
        try:
            released = await self._release_script(value, on_cancel=on_cancel)
        except Exception:
            with backend_errors(
                self.redis, "releasing lock", self._layout.release_keys[:1], self.name
            ):
                raise
        if released == PUBLISH_REFUSED:
            warn_wakeup_refused(describe_client(self.redis), "PUBLISH")
        return bool(released)

    async def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        ms = max(1, int(seconds * 1000))
        with backend_errors(self.redis, f"extending lock {self.name!r}"):
            extended = await run_script(
                self.redis, self._layout.extend, (self.name,), (value, ms, "1" if replace else "0")
            )
        return bool(extended)

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        call = (self.redis, self._layout.extend, (self.name,), (value, self._ttl_ms, "1"))
        return Renewal(self.name, self.ttl, [call], judge_single, on_lost)

    def _hub(self) -> AsyncWakeupHub:
        """This client's wake-up hub on the running loop, looked up once per client and loop."""
        cached = self._hub_cache
        loop = asyncio.get_running_loop()
        if (
            cached is None
            or cached[0]() is not loop
            or cached[1] is not self.redis
            or cached[2].retired
        ):
            # (A weak reference: a lock object must not keep a closed loop alive.)
            cached = self._hub_cache = (weakref.ref(loop), self.redis, async_hub_for(self.redis))
        return cached[2]

    async def _waiter(self, token: str) -> _AsyncWaiter:
        hub = self._hub()
        if self.fair:  # woken by name (see queue_scripts)
            return await hub.watch(self._channel, token=self._layout.member(token))
        return await hub.watch(self._channel)

    async def _early_waiter(self, token: str) -> _AsyncWaiter | None:
        if self.fair and self._hub().live(self._channel):
            return await self._waiter(token)
        return None

    async def _leave_queue(self, token: str) -> None:
        leave = self._layout.leave
        if leave is not None:
            script, keys, tail = leave
            member = self._layout.member(token)
            with backend_errors(self.redis, f"leaving the queue of {self.name!r}", keys[:1]):
                await run_script(self.redis, script, keys, (member, *tail))

    async def locked(self) -> bool:
        with backend_errors(self.redis, f"reading lock {self.name!r}"):
            return int(await self.redis.exists(self.name)) > 0

    async def _state(self, value: bytes = b"") -> PermitState:
        """One read of who holds the name, whichever kind holds it (see tasklock.Lock)."""
        with backend_errors(self.redis, f"reading lock {self.name!r}"):
            reply = await run_script(self.redis, PERMIT_STATE, (self.name,), (value,))
        return PermitState.parse(reply)

    async def _peek(self) -> tuple[bytes | None, int | None]:
        return (await self._state()).first()

    async def _stored_value_is(self, value: bytes) -> bool:
        return (await self._state(value)).holds(value)
