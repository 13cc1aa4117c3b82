"""The etcd semaphore: ``limit`` permit keys, each a lock of its own, on one name.

Layout, for a semaphore named ``name`` (the task layer and the CLI read it as it is):

* permit ``i`` (0 <= i < limit) is the key ``<name>:permit:<i>``, holding the holder's owner
  token (the value a :class:`tasklock.etcd.Lock` stores) on a lease of its own with the TTL. Its
  fence is that key's create revision: etcd's store revision, strictly increasing across every
  permit, every lock and every restart of the cluster.
* A plain :class:`tasklock.etcd.Lock` of the same name is the key ``<name>``, and the two exclude
  each other (a deployment that moves a task's limit between 1 and N stays exclusive): a permit
  is created only while ``<name>`` does not exist, and the lock only while no key exists in
  [``<name>:permit:``, ``<name>:permit;``). Both checks are in the creating transaction, so
  neither side can slip in between a read and a write.

Acquire: grant a lease, then one transaction per try: create the chosen permit if it and the lock
key are absent, else list the permit keys (and count the lock key). A try that lost a race picks
a slot the failure showed free; usually the first try succeeds (the slot is picked at random
among those this object last saw free, so contending acquirers rarely pick the same one), and at
most :data:`MAX_TRIES` are made before the attempt counts as failed. All slots taken, or the lock
key held: not acquired; a waiter then watches the permits (or the lock key) for a delete from
the revision it read, as the lock's waiter watches its key.

Release, extend, renewal (lease keep-alives), ``lost``/``on_lost``, ``owned`` and the errors are
the lock's own steps (:class:`tasklock.etcd.steps.LockSteps`), on the hold's permit key. What
differs is here, as generator steps (:class:`PermitSteps`) like the lock's, so an asyncio
semaphore would only need the asyncio driver.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tasklock.core.base import BaseLock
from tasklock.core.lease import Attempt, Number
from tasklock.core.owner import Holder, parse_value, token_id
from tasklock.core.permits import check_limit
from tasklock.etcd import protocol
from tasklock.etcd.client import Client
from tasklock.etcd.lock import Lock
from tasklock.etcd.steps import C, Call, L, LockSteps, Revoke, Steps, WatchTarget, drive

__all__ = ["MAX_TRIES", "PermitSteps", "Semaphore"]

#: Transactions one acquire attempt makes at most. Each failed one names the free slots, so a
#: second try loses only to an acquirer that took that very slot meanwhile.
MAX_TRIES = 4

#: Which free slot a try picks: a generator of its own (reseeded after a fork, so that children
#: do not all pick alike), leaving the random module's state to the application.
_pick = random.Random()
os.register_at_fork(after_in_child=_pick.seed)


class PermitSteps(LockSteps[C, L]):
    """The semaphore's steps, for any driver: the lock's, with the hold on a permit key."""

    _kind = "semaphore"

    def __init__(
        self,
        endpoints_or_client: str | Sequence[str] | C,
        name: str,
        limit: int,
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
        #: How many may hold at once.
        self.limit = check_limit(limit)
        super().__init__(
            endpoints_or_client,
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
        #: The permit key of each hold (by its hold value).
        self._permit_keys: dict[bytes, bytes] = {}
        #: The slots the last failed try saw taken: where the next first try does not look.
        self._taken: frozenset[int] = frozenset()

    def _key_of(self, value: bytes) -> bytes:
        return self._permit_keys.get(value, self._key)

    def _pick_slot(self, taken: frozenset[int] | set[int]) -> int | None:
        free = [slot for slot in range(self.limit) if slot not in taken]
        return _pick.choice(free) if free else None

    # -- acquire -------------------------------------------------------------------------------
    def _attempt_steps(self, token: str, waiting: bool) -> Steps[Attempt]:
        lease = yield from self._grant_steps()
        slot = self._pick_slot(self._taken)
        if slot is None:  # every slot was taken at the last look: look again anyway
            slot = _pick.randrange(self.limit)
        lock_held, taken = False, set[int]()
        reply: dict[str, Any] = {}
        revision = 0
        try:
            for _ in range(MAX_TRIES):
                body = protocol.permit_txn(self._key, slot, token.encode(), lease)
                reply = yield Call(protocol.TXN, body, self._acquiring)
                revision = protocol.reply_revision(reply)
                if reply.get("succeeded"):
                    break
                lock_held, taken = protocol.permit_slots(reply, self._key)
                self._taken = frozenset(taken)
                free = self._pick_slot(taken)
                if lock_held or free is None:
                    break
                slot = free
        except GeneratorExit:
            raise
        except BaseException:
            yield from self._revoke_quietly(lease)  # frees the permit too, had the put applied
            raise
        if reply.get("succeeded"):
            value = f"{token}#{revision}".encode()
            self._leases[value] = lease
            self._permit_keys[value] = protocol.permit_key(self._key, slot)
            self._taken |= {slot}  # (threads sharing this object then look elsewhere first)
            return Attempt(True, value, revision)
        yield Revoke(lease, self._acquiring)
        if not lock_held and self._pick_slot(taken) is not None:
            # Lost every race for a free slot: no delete to wait for, so try again at once.
            self._watch_from.pop(token_id(token), None)
            return Attempt(False, holder_ttl=0.0)
        if waiting:
            if lock_held:
                self._watch_from[token_id(token)] = WatchTarget(self._key, revision + 1)
            else:
                start, end = protocol.permit_range(self._key)
                self._watch_from[token_id(token)] = WatchTarget(start, revision + 1, end)
        return Attempt(False)

    # -- release -------------------------------------------------------------------------------
    def _release_steps(self, value: bytes) -> Steps[bool]:
        try:
            return (yield from super()._release_steps(value))
        finally:
            key = self._permit_keys.pop(value, None)
            if key is not None:
                self._taken -= {int(key.rpartition(b":")[2])}

    # -- reads ---------------------------------------------------------------------------------
    def _locked_steps(self) -> Steps[bool]:
        """True when no permit can be taken now: every slot below ``limit`` is held, or a lock
        of the same name is."""
        lock, permits = yield from self._state_steps()
        if lock is not None:
            return True
        start = len(protocol.permit_range(self._key)[0])
        held = {holder.key[start:] for holder in permits}
        return all(b"%d" % slot in held for slot in range(self.limit))


class Semaphore(PermitSteps[Client, BaseLock], Lock):
    """An etcd semaphore: at most ``limit`` holders of ``name`` at once, fleet-wide.

    The surface of :class:`tasklock.etcd.Lock` (``acquire(blocking, blocking_timeout)``,
    ``release``, ``extend``, ``reacquire``, ``owned``, ``with``, ``fence``, ``lost``/``on_lost``,
    ``watchdog``, ``owner_info``, ``peek``), with ``limit`` after the name, and what
    :class:`tasklock.Semaphore` adds: ``locked()`` is True when no permit is free (as
    :meth:`asyncio.Semaphore.locked`), and :meth:`holders` lists who holds the permits. Each
    permit has its own lease (30 s renewed by the watchdog with ``timeout=None``), so a crashed
    holder's permit comes back within its TTL, and its delete wakes the waiters. ``fence`` is
    strictly increasing per name across all permits (and across the lock of the same name).

    A :class:`tasklock.etcd.Lock` of the same name counts as holding every permit, and a Lock
    sees the permits as held (``locked()``, ``peek()``), so code that moves a name between the
    two stays exclusive. The limit bounds the slots a new holder may take: after a deployment
    lowers it, holders of slots past the new limit keep them until they release (the Redis
    semaphore instead lets nobody in until fewer than the new limit hold).

    One object holds one permit per thread (a second ``acquire`` in the same thread raises, as
    for a Lock); threads sharing one object each take their own.
    """

    def holders(self) -> list[tuple[Holder, float | None]]:
        """Who holds the permits now (or the lock of the same name), and for how many more
        seconds each, the first to free first."""
        return [
            (parse_value(value), ms / 1000 if ms >= 0 else None)
            for value, ms in drive(self.client, self._holders_steps())
        ]

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name!r} limit={self.limit} ttl={self.ttl} "
            f"fence={self.fence}>"
        )
