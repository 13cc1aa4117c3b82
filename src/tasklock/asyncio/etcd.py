"""The etcd lock for asyncio: :class:`tasklock.etcd.Lock`'s semantics, awaited.

::

    from tasklock.asyncio.etcd import Lock

    async with Lock("etcd://10.0.0.1:2379,10.0.0.2:2379", "ledger:42") as lock:
        await ledger.write(..., fence=lock.fence)

The same steps as the blocking lock, from one copy (:mod:`tasklock.etcd.steps`: each step a
generator of requests; every request body, reply parse and error in
:mod:`tasklock.etcd.protocol`), awaited through :class:`tasklock.etcd.aclient.AsyncClient`
(``httpx.AsyncClient``):

* Acquire: grant a lease with the TTL, then one transaction that creates the key only if absent
  (else reads it). The fence is the key's create revision. A failed attempt revokes its lease.
* A waiter watches the key for its delete from the revision its attempt read (no polling), and
  re-checks by itself only when the holder's lease would have run out.
* Release: delete the key only while it is on this hold's lease, then revoke the lease.
* Renewal: lease keep-alives from the loop's watchdog (:mod:`tasklock.asyncio.watchdog`); a lease
  etcd no longer knows is a lost hold (``lock.lost``, ``on_lost``). ``extend`` moves the key to a
  new lease of the longer TTL; the fence does not change.

What is asyncio's own is :class:`tasklock.asyncio._base.AsyncBaseLock`'s: holds per task,
cancellation safety (an attempt or a release runs to its answer in a shielded task).

This module imports httpx: ``import tasklock.asyncio`` does not import it; this module is loaded
by ``import tasklock.asyncio.etcd`` (or on first access to ``tasklock.asyncio.etcd``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from tasklock.asyncio._base import AsyncBaseLock, _AsyncWaiter
from tasklock.asyncio.batches import async_renewer
from tasklock.core.batches import judge_hold
from tasklock.core.lease import Attempt
from tasklock.core.renewal import Renewal
from tasklock.core.scripting import Script
from tasklock.etcd.aclient import AsyncClient, as_async_client
from tasklock.etcd.steps import LockSteps, WatchWaiter, drive_async

__all__ = ["AsyncClient", "Lock"]


class Lock(LockSteps[AsyncClient, AsyncBaseLock], AsyncBaseLock):
    """An asyncio lock on etcd with the API of :class:`tasklock.asyncio.Lock`.

    ``endpoints_or_client``: ``"etcd://h1:2379,h2:2379"`` (``etcds://`` for TLS), a list of
    ``http(s)://host:port`` URLs, or an :class:`AsyncClient` to share between locks. The other
    parameters and the differences from the Redis lock (whole-second TTL of at least 1 s, no
    ``fence_key``, no ``fair``) are :class:`tasklock.etcd.Lock`'s, and so are the steps
    (:class:`tasklock.etcd.steps.LockSteps`): this class only awaits them.
    """

    def _as_client(self, endpoints_or_client: Any) -> AsyncClient:
        return as_async_client(endpoints_or_client)

    # -- the hooks of AsyncBaseLock, each one step run by the asyncio driver -----------------
    async def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        return await drive_async(self.client, self._attempt_steps(token, waiting))

    async def _waiter(self, token: str) -> _AsyncWaiter:
        return _AsyncWatchWaiter(self, token)

    async def _release_value(
        self, value: bytes, on_cancel: Callable[[asyncio.Future[Any]], None] | None = None
    ) -> bool:
        return await drive_async(self.client, self._release_steps(value))

    async def _keepalive(self, lease: int) -> int:
        return await drive_async(self.client, self._keepalive_steps(lease))

    async def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        return await drive_async(self.client, self._extend_steps(value, seconds, replace))

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        renewer = async_renewer(self.client, _keepalive_hold)
        return Renewal(
            self.name,
            self.ttl,
            [(renewer, _KEEPALIVE, (self.name,), (self, value))],
            judge_hold,
            on_lost,
        )

    async def locked(self) -> bool:
        return await drive_async(self.client, self._locked_steps())

    async def _stored_value_is(self, value: bytes) -> bool:
        return await drive_async(self.client, self._stored_value_is_steps(value))

    async def _peek(self) -> tuple[bytes | None, int | None]:
        return await drive_async(self.client, self._peek_steps())


class _AsyncWatchWaiter(WatchWaiter):
    """Waits for the lock key's delete (or a permit's, while a semaphore of the same name holds
    permits) with a watch from the revision the last attempt read."""

    _lock: Lock

    async def wait(self, timeout: float) -> bool:
        target = self._target(timeout)
        if target is None:
            return False
        try:
            return await self._lock.client.wait_for_delete(
                target.key, target.start, timeout, **target.options()
            )
        except asyncio.CancelledError:
            raise
        except Exception:
            # No watch (etcd going away): back off for ``sleep``, then the next attempt says
            # what is wrong.
            await asyncio.sleep(min(timeout, float(self._lock.sleep)))
            return False


# -- watchdog ----------------------------------------------------------------------------------
# The asyncio watchdog renews etcd holds with one lease keep-alive each, through the per-hold
# batches of tasklock.asyncio.batches (the same scheduling, deadlines, late warnings and lost
# verdicts as Redis holds).

_KEEPALIVE = Script("etcd lease keep-alive", "-- tasklock.asyncio.etcd keep-alive")


async def _keepalive_hold(lock: Lock, value: bytes) -> int:
    """Keep the hold's lease alive: its TTL back, or 0 when it was released meanwhile."""
    lease = lock._leases.get(value)
    return 0 if lease is None else await lock._keepalive(lease)
