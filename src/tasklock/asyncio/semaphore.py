"""``tasklock.asyncio.Semaphore``: :class:`tasklock.Semaphore` for asyncio.

The asyncio :class:`~tasklock.asyncio.Lock` with the permit scripts mixed in, as the sync
Semaphore is the sync Lock with them (see :mod:`tasklock.core.permits`); only the awaited reads
of the permits are here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from tasklock.asyncio._base import AsyncBaseLock
from tasklock.asyncio.lock import Lock
from tasklock.core.lease import Number
from tasklock.core.owner import Holder
from tasklock.core.permits import PermitRules, check_limit

__all__ = ["Semaphore"]


class Semaphore(PermitRules, Lock):
    """At most ``limit`` holders of ``name`` at once; see :class:`tasklock.Semaphore` for the
    semantics and :class:`tasklock.asyncio.Lock` for what is asyncio's own (holds per task,
    cancellation safety, ``lost`` as an :class:`asyncio.Event`)."""

    def __init__(
        self,
        redis: Any,
        name: str,
        limit: int,
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
        self.limit = check_limit(limit)
        super().__init__(
            redis,
            name,
            timeout,
            sleep,
            blocking,
            blocking_timeout,
            thread_local,
            raise_on_release_error,
            fence_key=fence_key,
            watchdog=watchdog,
            on_lost=on_lost,
            owner_info=owner_info,
            fair=fair,
        )

    async def locked(self) -> bool:
        """True when all ``limit`` permits are held (an acquire now would wait)."""
        return (await self._state()).full(self.limit)

    async def holders(self) -> list[tuple[Holder, float | None]]:
        """Who holds the permits now, and for how many more seconds each (first to free first)."""
        return (await self._state()).holders()

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} limit={self.limit} ttl={self.ttl} "
            f"fence={self.fence}>"
        )
