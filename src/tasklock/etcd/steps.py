"""Every step of the etcd lock, written once: generators of requests, run by a sync or an
asyncio driver.

The blocking lock (:mod:`tasklock.etcd.lock`) and its asyncio twin (:mod:`tasklock.asyncio.etcd`)
take the same steps on the wire: an acquire attempt (grant a lease, one transaction, revoke the
lease if it failed), a release, an extend that moves the key to a new lease, a keep-alive, the
reads behind ``locked``/``owned``/``peek``. Each step here is a generator that *yields* the
requests it needs (:class:`Call`: a gateway path, a body and what it is doing, for the error
message; :class:`Revoke`: a lease to revoke) and receives each reply, returning the step's
result. The drivers only send: :func:`drive` with :class:`tasklock.etcd.client.Client`,
:func:`drive_async` with :class:`tasklock.etcd.aclient.AsyncClient`. A request that fails is
thrown back into its step, so a step's own ``try``/``except`` undoes what it had done (a lease
granted for a failed transaction is revoked) with the very same code on both sides.

This is the pattern of :mod:`tasklock.fencing.sqlalchemy` (one rule, two drivers); the request
bodies and reply parsing stay in :mod:`tasklock.etcd.protocol`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from tasklock.core.lease import Attempt, LeaseCore, Number
from tasklock.core.owner import token_id
from tasklock.etcd import protocol

if TYPE_CHECKING:
    from tasklock.etcd.aclient import AsyncClient
    from tasklock.etcd.client import Client

__all__ = [
    "Call",
    "LockSteps",
    "Revoke",
    "Steps",
    "WatchTarget",
    "WatchWaiter",
    "drive",
    "drive_async",
]

T = TypeVar("T")
#: The client a lock sends through: :class:`Client` or :class:`AsyncClient`.
C = TypeVar("C")
#: The lock base its ``on_lost`` callback is given (the sync or the asyncio one).
L = TypeVar("L")


@dataclass(frozen=True, slots=True)
class Call:
    """POST ``body`` to the gateway ``path``; the step receives the parsed reply. ``what`` is
    what the step is doing, for the error a failure raises."""

    path: str
    body: dict[str, Any]
    what: str


@dataclass(frozen=True, slots=True)
class Revoke:
    """Revoke ``lease`` (one already gone is fine); the step receives None."""

    lease: int
    what: str


#: A step: yields requests, receives their replies, returns its result.
Steps = Generator[Call | Revoke, Any, T]


def drive(client: Client, steps: Steps[T]) -> T:
    """Run ``steps`` with blocking requests; a failed request is raised inside the step."""
    try:
        request = next(steps)
        while True:
            try:
                if isinstance(request, Call):
                    reply: Any = client.call(request.path, request.body, request.what)
                else:
                    client.revoke(request.lease, request.what)
                    reply = None
            except BaseException as exc:
                request = steps.throw(exc)
            else:
                request = steps.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result


async def drive_async(client: AsyncClient, steps: Steps[T]) -> T:
    """Run ``steps`` with awaited requests; a failed (or cancelled) request is raised inside the
    step."""
    try:
        request = next(steps)
        while True:
            try:
                if isinstance(request, Call):
                    reply: Any = await client.call(request.path, request.body, request.what)
                else:
                    await client.revoke(request.lease, request.what)
                    reply = None
            except BaseException as exc:
                request = steps.throw(exc)
            else:
                request = steps.send(reply)
    except StopIteration as done:
        result: T = done.value
        return result


@dataclass(frozen=True, slots=True)
class WatchTarget:
    """What a waiter watches for a delete: ``key`` (or the range [key, range_end)), from
    ``start`` (one past the revision its last attempt read, so nothing in between is missed)."""

    key: bytes
    start: int
    range_end: bytes | None = None

    def options(self) -> dict[str, Any]:
        """The keyword arguments of ``wait_for_delete`` beyond (key, start, timeout)."""
        return {} if self.range_end is None else {"range_end": self.range_end}


class LockSteps(LeaseCore, Generic[C, L]):
    """The etcd lock's state and steps, shared by the sync and the asyncio lock.

    Mixed in before the driver's base (:class:`tasklock.core.base.BaseLock` or
    :class:`tasklock.asyncio._base.AsyncBaseLock`); the subclass turns each ``_*_steps``
    generator into the hook its base calls, with :func:`drive` or :func:`drive_async`.
    """

    client: C
    #: The word messages use for what is held ("lock", "semaphore").
    _kind = "lock"

    def __init__(
        self,
        endpoints_or_client: str | Sequence[str] | C,
        name: str,
        timeout: Number | None = None,
        sleep: Number = 0.1,
        blocking: bool = True,
        blocking_timeout: Number | None = None,
        thread_local: bool = True,
        raise_on_release_error: bool = True,
        *,
        watchdog: bool | None = None,
        on_lost: Callable[[L], Any] | None = None,
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
        self.client = self._as_client(endpoints_or_client)
        self._key = self.name.encode()
        #: The lease of each hold (by its hold value); extend swaps it.
        self._leases: dict[bytes, int] = {}
        #: What a waiting acquire watches, set by its last failed attempt.
        self._watch_from: dict[str, WatchTarget] = {}
        # A waiter re-checks on its own no sooner than the holder's lease would run out (the
        # attempt reports how long that is): the watch is what wakes it.
        self._renew_every = float(self._lease_ttl)
        self._granted_ttl = self._lease_ttl
        self._acquiring = f"acquiring {self._kind} {self.name!r}"

    def _as_client(self, endpoints_or_client: Any) -> C:
        """The client from what the constructor was given (the driver's kind)."""
        raise NotImplementedError

    def _key_of(self, value: bytes) -> bytes:
        """The key a hold is stored at: the lock's name (a semaphore's permit key differs)."""
        return self._key

    # -- acquire -------------------------------------------------------------------------------
    def _grant_steps(self) -> Steps[int]:
        """A lease with the TTL for an acquire attempt."""
        grant = yield Call(protocol.GRANT, {"TTL": str(self._lease_ttl)}, self._acquiring)
        # What etcd granted: at least its minimum TTL (2 s with the default election timeout).
        self._granted_ttl = int(grant.get("TTL", self._lease_ttl))
        return protocol.lease_id(grant)

    def _attempt_steps(self, token: str, waiting: bool) -> Steps[Attempt]:
        lease = yield from self._grant_steps()
        try:
            body = protocol.acquire_txn(self._key, token.encode(), lease)
            reply = yield Call(protocol.TXN, body, self._acquiring)
        except GeneratorExit:
            raise
        except BaseException:
            yield from self._revoke_quietly(lease)  # frees the key too, had the put been applied
            raise
        revision = protocol.reply_revision(reply)
        if reply.get("succeeded"):
            value = f"{token}#{revision}".encode()
            self._leases[value] = lease
            return Attempt(True, value, revision)
        yield Revoke(lease, self._acquiring)
        holder_ttl: float | None = None
        if waiting:
            holder = protocol.holder_of(reply)
            if holder is None and protocol.permit_count(reply):
                # A semaphore of the same name holds permits: wait for one of them to go.
                start, end = protocol.permit_range(self._key)
                self._watch_from[token_id(token)] = WatchTarget(start, revision + 1, end)
            else:
                self._watch_from[token_id(token)] = WatchTarget(self._key, revision + 1)
            if holder is not None and holder.lease:
                holder_ttl = yield from self._lease_left_steps(holder.lease)
        return Attempt(False, holder_ttl=holder_ttl)

    def _lease_left_steps(self, lease: int) -> Steps[float | None]:
        """Seconds ``lease`` has left, or None when etcd no longer knows it."""
        what = f"reading {self._kind} {self.name!r}"
        reply = yield Call(protocol.TIMETOLIVE, {"ID": str(lease)}, what)
        ttl = int(reply.get("TTL", -1))
        return float(ttl) if ttl >= 0 else None

    def _revoke_quietly(self, lease: int) -> Steps[None]:
        with contextlib.suppress(Exception):  # (it expires by itself)
            yield Revoke(lease, f"revoking a lease of {self._kind} {self.name!r}")

    def _watch_target(self, token: str) -> WatchTarget | None:
        """What a waiting acquire of ``token`` watches, or None before its first failed attempt."""
        return self._watch_from.get(token_id(token))

    # -- release / extend ----------------------------------------------------------------------
    def _release_steps(self, value: bytes) -> Steps[bool]:
        """Delete the hold's key only while it is on the hold's lease, then revoke the lease."""
        lease = self._leases.pop(value, None)
        if lease is None:
            return False
        what = f"releasing {self._kind} {self.name!r}"
        try:
            reply = yield Call(protocol.TXN, protocol.release_txn(self._key_of(value), lease), what)
        except GeneratorExit:
            raise
        except BaseException:
            yield from self._revoke_quietly(lease)
            raise
        yield from self._revoke_quietly(lease)
        return bool(reply.get("succeeded"))

    def _keepalive_steps(self, lease: int) -> Steps[int]:
        """Renew ``lease``: the TTL it was renewed to, 0 when it was gone."""
        what = f"renewing {self._kind} {self.name!r}"
        reply = yield Call(protocol.KEEPALIVE, {"ID": str(lease)}, what)
        return protocol.keepalive_ttl(reply)

    def _extend_steps(self, value: bytes, seconds: float, replace: bool) -> Steps[bool]:
        """Renew the hold's lease when that gives the TTL asked for; else move the key to a new
        lease of that TTL (etcd cannot change a lease's TTL). A put keeps the key's create
        revision, so the fence does not change."""
        lease = self._leases.get(value)
        if lease is None:
            return False
        if replace and protocol.lease_ttl(seconds) == self._lease_ttl:
            renewed = yield from self._keepalive_steps(lease)
            if renewed <= 0:
                return False
            if renewed == self._granted_ttl:
                return True
            # (an earlier extend moved the key to a lease of another TTL: swap back)
        if replace:
            ttl = protocol.lease_ttl(seconds)
        else:
            left = yield from self._lease_left_steps(lease)
            if left is None:
                return False
            ttl = protocol.lease_ttl(left + seconds)
        what = f"extending {self._kind} {self.name!r}"
        new = protocol.lease_id((yield Call(protocol.GRANT, {"TTL": str(ttl)}, what)))
        token = value.rpartition(b"#")[0]
        try:
            body = protocol.swap_lease_txn(self._key_of(value), token, lease, new)
            reply = yield Call(protocol.TXN, body, what)
        except GeneratorExit:
            raise
        except BaseException:
            yield from self._revoke_quietly(new)
            raise
        if not reply.get("succeeded"):
            yield from self._revoke_quietly(new)
            return False
        self._leases[value] = new
        yield from self._revoke_quietly(lease)
        return True

    # -- reads ---------------------------------------------------------------------------------
    def _read_steps(self, key: bytes) -> Steps[protocol.Holder | None]:
        what = f"reading {self._kind} {self.name!r}"
        reply = yield Call(protocol.RANGE, {"key": protocol.b64(key)}, what)
        return protocol.holder_of(reply)

    def _state_steps(self) -> Steps[tuple[protocol.Holder | None, list[protocol.Holder]]]:
        """Who holds the name: the lock key's holder, and the permits of a semaphore of the same
        name (a deployment may move a name between the two), read in one revision."""
        what = f"reading {self._kind} {self.name!r}"
        return protocol.holders_of((yield Call(protocol.TXN, protocol.read_txn(self._key), what)))

    def _locked_steps(self) -> Steps[bool]:
        """Held by anyone: the lock key, or any permit of a semaphore of the same name."""
        lock, permits = yield from self._state_steps()
        return lock is not None or bool(permits)

    def _holders_steps(self) -> Steps[list[tuple[bytes, int]]]:
        """Every holder of the name as (stored value, ms left), the first to free first (-1: a
        key on no lease, or one whose lease etcd no longer knows, last)."""
        lock, permits = yield from self._state_steps()
        found: list[tuple[bytes, int]] = []
        for holder in ([lock] if lock is not None else []) + permits:
            left = (yield from self._lease_left_steps(holder.lease)) if holder.lease else None
            value = holder.value + b"#%d" % holder.create_revision
            found.append((value, int(left * 1000) if left is not None else -1))
        found.sort(key=lambda item: item[1] if item[1] >= 0 else float("inf"))
        return found

    def _stored_value_is_steps(self, value: bytes) -> Steps[bool]:
        """Whether ``value``'s hold still has its key, on its lease."""
        lease = self._leases.get(value)
        if lease is None:
            return False
        holder = yield from self._read_steps(self._key_of(value))
        return (
            holder is not None
            and holder.lease == lease
            and value == holder.value + b"#%d" % holder.create_revision
        )

    def _peek_steps(self) -> Steps[tuple[bytes | None, int | None]]:
        """The holder that frees first (a lock has one; a semaphore's permits may be several)."""
        holders = yield from self._holders_steps()
        if not holders:
            return None, None
        return holders[0]


class WatchWaiter:
    """What the sync and asyncio waiters share: a waiting acquire watches what its last failed
    attempt named, from the revision that attempt read, so nothing can be missed between the
    attempt and the watch (``arm`` has nothing to do). Subclasses do the watching (``wait``)."""

    def __init__(self, lock: LockSteps[Any, Any], token: str) -> None:
        self._lock = lock
        self._token = token

    def arm(self) -> None:
        pass

    def _target(self, timeout: float) -> WatchTarget | None:
        return None if timeout <= 0 else self._lock._watch_target(self._token)

    def close(self) -> None:
        self._lock._watch_from.pop(token_id(self._token), None)
