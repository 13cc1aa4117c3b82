"""The etcd lock for asyncio: :class:`tasklock.etcd.Lock`'s semantics, awaited.

::

    from tasklock.asyncio.etcd import Lock

    async with Lock("etcd://10.0.0.1:2379,10.0.0.2:2379", "ledger:42") as lock:
        await ledger.write(..., fence=lock.fence)

The same protocol as the blocking lock (one copy of every request body, reply parse and error,
in :mod:`tasklock.etcd.protocol`), sent through :class:`tasklock.etcd.aclient.AsyncClient`
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
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tasklock.asyncio._base import AsyncBaseLock, _AsyncWaiter
from tasklock.core.lease import Attempt, Number
from tasklock.core.renewal import Outcome, Renewal
from tasklock.core.scripting import Script
from tasklock.etcd import protocol
from tasklock.etcd.aclient import AsyncClient, as_async_client

__all__ = ["AsyncClient", "Lock"]


class Lock(AsyncBaseLock):
    """An asyncio lock on etcd with the API of :class:`tasklock.asyncio.Lock`.

    ``endpoints_or_client``: ``"etcd://h1:2379,h2:2379"`` (``etcds://`` for TLS), a list of
    ``http(s)://host:port`` URLs, or an :class:`AsyncClient` to share between locks. The other
    parameters and the differences from the Redis lock (whole-second TTL of at least 1 s, no
    ``fence_key``, no ``fair``) are :class:`tasklock.etcd.Lock`'s.
    """

    def __init__(
        self,
        endpoints_or_client: str | Sequence[str] | AsyncClient,
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
        self._lease_ttl = protocol.lease_ttl(self.ttl)
        self.client = as_async_client(endpoints_or_client)
        self._key = self.name.encode()
        #: The lease of each hold (by its hold value); extend swaps it.
        self._leases: dict[bytes, int] = {}
        #: A waiting acquire's watch start: one past the revision its last attempt read.
        self._watch_from: dict[str, int] = {}
        # A waiter re-checks on its own no sooner than the holder's lease would run out: the
        # watch is what wakes it.
        self._renew_every = float(self._lease_ttl)
        self._granted_ttl = self._lease_ttl
        self._acquiring = f"acquiring lock {self.name!r}"

    # -- acquire -------------------------------------------------------------------------------
    async def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        grant = await self.client.call(
            protocol.GRANT, {"TTL": str(self._lease_ttl)}, self._acquiring
        )
        lease = protocol.lease_id(grant)
        self._granted_ttl = int(grant.get("TTL", self._lease_ttl))
        try:
            body = protocol.acquire_txn(self._key, token.encode(), lease)
            reply = await self.client.call(protocol.TXN, body, self._acquiring)
        except BaseException:
            await self._revoke_quietly(lease)  # frees the key too, had the put been applied
            raise
        revision = protocol.reply_revision(reply)
        if reply.get("succeeded"):
            value = f"{token}#{revision}".encode()
            self._leases[value] = lease
            return Attempt(True, value, revision)
        await self.client.revoke(lease, self._acquiring)
        holder_ttl: float | None = None
        if waiting:
            self._watch_from[token] = revision + 1
            holder = protocol.holder_of(reply)
            if holder is not None and holder.lease:
                holder_ttl = await self._lease_left(holder.lease)
        return Attempt(False, holder_ttl=holder_ttl)

    async def _lease_left(self, lease: int) -> float | None:
        reply = await self.client.call(
            protocol.TIMETOLIVE, {"ID": str(lease)}, f"reading lock {self.name!r}"
        )
        ttl = int(reply.get("TTL", -1))
        return float(ttl) if ttl >= 0 else None

    async def _revoke_quietly(self, lease: int) -> None:
        with contextlib.suppress(Exception):  # (it expires by itself)
            await self.client.revoke(lease, f"revoking a lease of lock {self.name!r}")

    async def _waiter(self, token: str) -> _AsyncWaiter:
        return _AsyncWatchWaiter(self, token)

    # -- release / extend ----------------------------------------------------------------------
    async def _release_value(
        self, value: bytes, on_cancel: Callable[[asyncio.Future[Any]], None] | None = None
    ) -> bool:
        lease = self._leases.pop(value, None)
        if lease is None:
            return False
        try:
            reply = await self.client.call(
                protocol.TXN,
                protocol.release_txn(self._key, lease),
                f"releasing lock {self.name!r}",
            )
        finally:
            await self._revoke_quietly(lease)
        return bool(reply.get("succeeded"))

    async def _keepalive(self, lease: int) -> int:
        reply = await self.client.call(
            protocol.KEEPALIVE, {"ID": str(lease)}, f"renewing lock {self.name!r}"
        )
        return protocol.keepalive_ttl(reply)

    async def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        lease = self._leases.get(value)
        if lease is None:
            return False
        if replace and protocol.lease_ttl(seconds) == self._lease_ttl:
            renewed = await self._keepalive(lease)
            if renewed <= 0:
                return False
            if renewed == self._granted_ttl:
                return True
            # (an earlier extend moved the key to a lease of another TTL: swap back)
        if replace:
            ttl = protocol.lease_ttl(seconds)
        else:
            left = await self._lease_left(lease)
            if left is None:
                return False
            ttl = protocol.lease_ttl(left + seconds)
        what = f"extending lock {self.name!r}"
        new = protocol.lease_id(await self.client.call(protocol.GRANT, {"TTL": str(ttl)}, what))
        token = value.rpartition(b"#")[0]
        try:
            reply = await self.client.call(
                protocol.TXN, protocol.swap_lease_txn(self._key, token, lease, new), what
            )
        except BaseException:
            await self._revoke_quietly(new)
            raise
        if not reply.get("succeeded"):
            await self._revoke_quietly(new)
            return False
        self._leases[value] = new
        await self._revoke_quietly(lease)
        return True

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        call = (_renewer_for(self.client), _KEEPALIVE, (self.name,), (self, value))
        return Renewal(self.name, self.ttl, [call], _judge_keepalive, on_lost)

    # -- reads ---------------------------------------------------------------------------------
    async def _read(self) -> protocol.Holder | None:
        reply = await self.client.call(
            protocol.RANGE, {"key": protocol.b64(self._key)}, f"reading lock {self.name!r}"
        )
        return protocol.holder_of(reply)

    async def locked(self) -> bool:
        return await self._read() is not None

    async def _stored_value_is(self, value: bytes) -> bool:
        lease = self._leases.get(value)
        holder = await self._read()
        return (
            lease is not None
            and holder is not None
            and holder.lease == lease
            and value == holder.value + b"#%d" % holder.create_revision
        )

    async def _peek(self) -> tuple[bytes | None, int | None]:
        holder = await self._read()
        if holder is None:
            return None, None
        value = holder.value + b"#%d" % holder.create_revision
        left = await self._lease_left(holder.lease) if holder.lease else None
        return value, (int(left * 1000) if left is not None else -1)


class _AsyncWatchWaiter:
    """Waits for the lock key's delete with a watch from the revision the last attempt read."""

    def __init__(self, lock: Lock, token: str) -> None:
        self._lock = lock
        self._token = token

    def arm(self) -> None:
        pass  # the watch starts from the attempt's revision: nothing can be missed meanwhile

    async def wait(self, timeout: float) -> bool:
        start = self._lock._watch_from.get(self._token)
        if start is None or timeout <= 0:
            return False
        try:
            return await self._lock.client.wait_for_delete(self._lock._key, start, timeout)
        except asyncio.CancelledError:
            raise
        except Exception:
            # No watch (etcd going away): back off for ``sleep``, then the next attempt says
            # what is wrong.
            await asyncio.sleep(min(timeout, float(self._lock.sleep)))
            return False

    def close(self) -> None:
        self._lock._watch_from.pop(self._token, None)


# -- watchdog ----------------------------------------------------------------------------------
# The asyncio watchdog renews holds in batches, one per server, through the Redis-shaped
# interface of tasklock.asyncio.scripts.run_batch: ``client.pipeline(transaction=False)``,
# ``pipe.execute_command("EVALSHA", sha, numkeys, *keys, *args)`` and
# ``await pipe.execute(raise_on_error=False)``. The classes below speak it with keep-alives, so
# etcd holds get the same scheduling, deadlines, late warnings and lost verdicts as Redis ones.

_KEEPALIVE = Script("etcd lease keep-alive", "-- tasklock.asyncio.etcd keep-alive")


class _AsyncKeepAliveBatch:
    def __init__(self) -> None:
        self._items: list[tuple[Lock, bytes]] = []

    def execute_command(self, *args: Any) -> None:
        # ("EVALSHA", sha, 1, name, lock, value): the call's args are (lock, value).
        self._items.append((args[-2], args[-1]))

    async def execute(self, raise_on_error: bool = False) -> list[Any]:
        return list(await asyncio.gather(*(self._one(lock, value) for lock, value in self._items)))

    @staticmethod
    async def _one(lock: Lock, value: bytes) -> Any:
        lease = lock._leases.get(value)
        if lease is None:
            return 0  # released meanwhile (its entry is cancelled: not judged)
        try:
            return await lock._keepalive(lease)
        except Exception as exc:
            return exc


class _AsyncRenewer:
    """One per client: the watchdog's "server", so one round's keep-alives go together."""

    def __init__(self, client: AsyncClient) -> None:
        self.client = client

    def pipeline(self, transaction: bool = False) -> _AsyncKeepAliveBatch:
        return _AsyncKeepAliveBatch()


def _renewer_for(client: AsyncClient) -> _AsyncRenewer:
    renewer: _AsyncRenewer | None = getattr(client, "_tasklock_renewer", None)
    if renewer is None:
        renewer = _AsyncRenewer(client)
        client._tasklock_renewer = renewer  # type: ignore[attr-defined]
    return renewer


def _judge_keepalive(results: list[Any], elapsed: float) -> Outcome:
    answer = results[0]
    if isinstance(answer, BaseException):
        return Outcome.UNREACHABLE
    return Outcome.RENEWED if answer else Outcome.LOST
