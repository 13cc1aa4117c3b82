"""The asyncio watchdog's batches for stores with no pipeline (etcd, ZooKeeper): each hold
renewed by its own awaited call, behind the Redis-shaped interface the asyncio watchdog speaks.

The asyncio watchdog sends a round through :func:`tasklock.asyncio.scripts.run_batch`:
``server.pipeline(transaction=False)``, ``pipe.execute_command("EVALSHA", sha, numkeys, *keys,
*args)`` and ``await pipe.execute(raise_on_error=False)``. The batch here speaks it with a
per-hold coroutine, all of a round's holds at once; the "server" and the verdict are the thread
driver's (:mod:`tasklock.core.batches`), so only the awaiting is written here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from tasklock.core.batches import Renewer, renewer_for

__all__ = ["AsyncHoldBatch", "AsyncPerHold", "async_renewer"]

#: Renews one hold, awaited: what a :data:`tasklock.core.batches.PerHold` answers.
AsyncPerHold = Callable[[Any, bytes], Awaitable[Any]]


class AsyncHoldBatch:
    """One round's renewals for one client: every hold's :data:`AsyncPerHold` call at once,
    each call's error in its place."""

    def __init__(self, renew: AsyncPerHold) -> None:
        self._renew = renew
        self._items: list[tuple[Any, bytes]] = []

    def execute_command(self, *args: Any) -> None:
        # ("EVALSHA", sha, 1, name, lock, value): the call's args are (lock, value).
        self._items.append((args[-2], args[-1]))

    async def execute(self, raise_on_error: bool = False) -> list[Any]:
        return list(await asyncio.gather(*(self._one(lock, value) for lock, value in self._items)))

    async def _one(self, lock: Any, value: bytes) -> Any:
        try:
            return await self._renew(lock, value)
        except Exception as exc:
            return exc


def async_renewer(client: Any, renew: AsyncPerHold) -> Renewer[AsyncHoldBatch]:
    """The asyncio watchdog's renewer of ``client``: an :class:`AsyncHoldBatch` of ``renew`` a
    round."""
    return renewer_for(client, renew, lambda: AsyncHoldBatch(renew))
