"""The etcd lock: a lease and a key created only if absent; the key's revision is the fence.

* Acquire: grant a lease with the TTL (whole seconds, rounded up), then one transaction: if the
  key's create revision is 0 (absent), put it with the holder's description on that lease, else
  read it. The hold's fence is the transaction's revision, which is the key's create revision:
  etcd's store revision, strictly increasing for every holder and kept across restarts.
* A failed attempt revokes its lease. A waiter then watches the key for a delete from the
  revision it read (so a release between its read and its watch is not missed), and re-checks
  by itself only when the holder's lease would have run out.
* Release: delete the key only while it is on this hold's lease, then revoke the lease.
* Renewal (watchdog, ``reacquire``) is a lease keep-alive; a lease that etcd no longer knows is
  a lost lock. ``extend`` moves the key to a new lease of the longer TTL (etcd cannot change a
  lease's TTL); the key keeps its create revision, so the fence does not change.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tasklock.core.base import Attempt, BaseLock, Number, _Waiter
from tasklock.core.renewal import Outcome
from tasklock.core.scripting import Script
from tasklock.core.watchdog import Renewal
from tasklock.etcd import protocol
from tasklock.etcd.client import Client, as_client

__all__ = ["Lock"]


class Lock(BaseLock):
    """A lock on etcd with the API of :class:`tasklock.Lock`.

    ``endpoints_or_client``: ``"etcd://h1:2379,h2:2379"`` (``etcds://`` for TLS), a list of
    ``http(s)://host:port`` URLs, or a :class:`tasklock.etcd.client.Client` to share between
    locks. The other parameters mean what they mean for :class:`tasklock.Lock`, except:

    * ``timeout`` is rounded up to whole seconds (etcd's lease unit) and must be at least 1 s.
    * No ``fence_key``: the fence is the lock key's create revision, which etcd itself keeps
      strictly increasing (across restarts too); there is no counter to share.
    * No ``fair``: waiters watch the key and race when it is deleted (etcd wakes them all, at
      the cost of one watch event each; no queue to maintain).
    """

    def __init__(
        self,
        endpoints_or_client: str | Sequence[str] | Client,
        name: str,
        timeout: Number | None = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Number | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        watchdog: bool | None = None,
        on_lost: Callable[[BaseLock], Any] | None = None,
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
        self.client = as_client(endpoints_or_client)
        self._key = self.name.encode()
        #: The lease of each hold (by its hold value); extend swaps it.
        self._leases: dict[bytes, int] = {}
        #: A waiting acquire's watch start: one past the revision its last attempt read.
        self._watch_from: dict[str, int] = {}
        # A waiter re-checks on its own no sooner than the holder's lease would run out (the
        # attempt reports how long that is): the watch is what wakes it.
        self._renew_every = float(self._lease_ttl)
        self._granted_ttl = self._lease_ttl
        self._acquiring = f"acquiring lock {self.name!r}"

    # -- acquire -------------------------------------------------------------------------------
    def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        grant = self.client.call(protocol.GRANT, {"TTL": str(self._lease_ttl)}, self._acquiring)
        lease = protocol.lease_id(grant)
        # What etcd granted: at least its minimum TTL (2 s with the default election timeout).
        self._granted_ttl = int(grant.get("TTL", self._lease_ttl))
        try:
            body = protocol.acquire_txn(self._key, token.encode(), lease)
            reply = self.client.call(protocol.TXN, body, self._acquiring)
        except BaseException:
            self._revoke_quietly(lease)  # frees the key too, had the put been applied
            raise
        revision = protocol.reply_revision(reply)
        if reply.get("succeeded"):
            value = f"{token}#{revision}".encode()
            self._leases[value] = lease
            return Attempt(True, value, revision)
        self.client.revoke(lease, self._acquiring)
        holder_ttl: float | None = None
        if waiting:
            self._watch_from[token] = revision + 1
            holder = protocol.holder_of(reply)
            if holder is not None and holder.lease:
                holder_ttl = self._lease_left(holder.lease)
        return Attempt(False, holder_ttl=holder_ttl)

    def _lease_left(self, lease: int) -> float | None:
        reply = self.client.call(
            protocol.TIMETOLIVE, {"ID": str(lease)}, f"reading lock {self.name!r}"
        )
        ttl = int(reply.get("TTL", -1))
        return float(ttl) if ttl >= 0 else None

    def _revoke_quietly(self, lease: int) -> None:
        with contextlib.suppress(Exception):  # (it expires by itself)
            self.client.revoke(lease, f"revoking a lease of lock {self.name!r}")

    def _waiter(self, token: str) -> _Waiter:
        return _WatchWaiter(self, token)

    # -- release / extend ----------------------------------------------------------------------
    def _release_value(self, value: bytes) -> bool:
        lease = self._leases.pop(value, None)
        if lease is None:
            return False
        try:
            reply = self.client.call(
                protocol.TXN,
                protocol.release_txn(self._key, lease),
                f"releasing lock {self.name!r}",
            )
        finally:
            self._revoke_quietly(lease)
        return bool(reply.get("succeeded"))

    def _keepalive(self, lease: int) -> int:
        reply = self.client.call(
            protocol.KEEPALIVE, {"ID": str(lease)}, f"renewing lock {self.name!r}"
        )
        return protocol.keepalive_ttl(reply)

    def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        lease = self._leases.get(value)
        if lease is None:
            return False
        if replace and protocol.lease_ttl(seconds) == self._lease_ttl:
            renewed = self._keepalive(lease)
            if renewed <= 0:
                return False
            if renewed == self._granted_ttl:
                return True
            # (an earlier extend moved the key to a lease of another TTL: swap back)
        if replace:
            ttl = protocol.lease_ttl(seconds)
        else:
            left = self._lease_left(lease)
            if left is None:
                return False
            ttl = protocol.lease_ttl(left + seconds)
        what = f"extending lock {self.name!r}"
        new = protocol.lease_id(self.client.call(protocol.GRANT, {"TTL": str(ttl)}, what))
        token = value.rpartition(b"#")[0]
        try:
            reply = self.client.call(
                protocol.TXN, protocol.swap_lease_txn(self._key, token, lease, new), what
            )
        except BaseException:
            self._revoke_quietly(new)
            raise
        if not reply.get("succeeded"):
            self._revoke_quietly(new)
            return False
        self._leases[value] = new
        self._revoke_quietly(lease)
        return True

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        call = (_renewer_for(self.client), _KEEPALIVE, (self.name,), (self, value))
        return Renewal(self.name, self.ttl, [call], _judge_keepalive, on_lost)

    # -- reads ---------------------------------------------------------------------------------
    def _read(self) -> protocol.Holder | None:
        reply = self.client.call(
            protocol.RANGE, {"key": protocol.b64(self._key)}, f"reading lock {self.name!r}"
        )
        return protocol.holder_of(reply)

    def locked(self) -> bool:
        return self._read() is not None

    def _stored_value_is(self, value: bytes) -> bool:
        lease = self._leases.get(value)
        holder = self._read()
        return (
            lease is not None
            and holder is not None
            and holder.lease == lease
            and value == holder.value + b"#%d" % holder.create_revision
        )

    def _peek(self) -> tuple[bytes | None, int | None]:
        holder = self._read()
        if holder is None:
            return None, None
        value = holder.value + b"#%d" % holder.create_revision
        left = self._lease_left(holder.lease) if holder.lease else None
        return value, (int(left * 1000) if left is not None else -1)


class _WatchWaiter:
    """Waits for the lock key's delete with a watch from the revision the last attempt read."""

    def __init__(self, lock: Lock, token: str) -> None:
        self._lock = lock
        self._token = token

    def arm(self) -> None:
        pass  # the watch starts from the attempt's revision: nothing can be missed meanwhile

    def wait(self, timeout: float) -> bool:
        start = self._lock._watch_from.get(self._token)
        if start is None or timeout <= 0:
            return False
        try:
            return self._lock.client.wait_for_delete(self._lock._key, start, timeout)
        except Exception:
            # No watch (etcd going away): back off for ``sleep``, then the next attempt says
            # what is wrong.
            threading.Event().wait(min(timeout, float(self._lock.sleep)))
            return False

    def close(self) -> None:
        self._lock._watch_from.pop(self._token, None)


# -- watchdog ----------------------------------------------------------------------------------
# The thread watchdog renews holds in batches, one per server, through a Redis-shaped interface:
# ``client.pipeline(transaction=False)``, ``script.queue(pipe, keys, args)`` and
# ``pipe.execute(raise_on_error=False)``. The classes below speak it with keep-alives, so etcd
# holds get the same scheduling, deadlines, late warnings and lost verdicts as Redis ones.


class _KeepAliveScript(Script):
    def queue(self, pipe: Any, keys: Sequence[Any], args: Sequence[Any]) -> None:
        pipe.add(args[0], args[1])


_KEEPALIVE = _KeepAliveScript("etcd lease keep-alive", "-- tasklock.etcd keep-alive")


class _KeepAliveBatch:
    def __init__(self) -> None:
        self._items: list[tuple[Lock, bytes]] = []

    def add(self, lock: Lock, value: bytes) -> None:
        self._items.append((lock, value))

    def execute(self, raise_on_error: bool = False) -> list[Any]:
        results: list[Any] = []
        for lock, value in self._items:
            lease = lock._leases.get(value)
            if lease is None:
                results.append(0)  # released meanwhile (its entry is cancelled: not judged)
                continue
            try:
                results.append(lock._keepalive(lease))
            except Exception as exc:
                results.append(exc)
        return results


class _Renewer:
    """One per client: the watchdog's "server", so one round trip's keep-alives go together."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def pipeline(self, transaction: bool = False) -> _KeepAliveBatch:
        return _KeepAliveBatch()


def _renewer_for(client: Client) -> _Renewer:
    renewer: _Renewer | None = getattr(client, "_tasklock_renewer", None)
    if renewer is None:
        renewer = _Renewer(client)
        client._tasklock_renewer = renewer  # type: ignore[attr-defined]
    return renewer


def _judge_keepalive(results: list[Any], elapsed: float) -> Outcome:
    answer = results[0]
    if isinstance(answer, BaseException):
        return Outcome.UNREACHABLE
    return Outcome.RENEWED if answer else Outcome.LOST
