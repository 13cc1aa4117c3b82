"""The etcd lock: a lease and a key created only if absent; the key's revision is the fence.

* Acquire: grant a lease with the TTL (whole seconds, rounded up), then one transaction: if the
  key's create revision is 0 (absent) and no permit of a :class:`tasklock.etcd.Semaphore` of the
  same name exists (no key in [``<name>:permit:``, ``<name>:permit;``), compared in the same
  transaction), put it with the holder's description on that lease, else read it and count the
  permits. The hold's fence is the transaction's revision, which is the key's create revision:
  etcd's store revision, strictly increasing for every holder and kept across restarts.
* A failed attempt revokes its lease. A waiter then watches the key (or, while permits hold the
  name, the permit range) for a delete from the revision it read (so a release between its read
  and its watch is not missed), and re-checks by itself only when the holder's lease would have
  run out.
* ``locked()`` and ``peek()`` see the permits of a semaphore of the same name as holders too.
* Release: delete the key only while it is on this hold's lease, then revoke the lease.
* Renewal (watchdog, ``reacquire``) is a lease keep-alive; a lease that etcd no longer knows is
  a lost lock. ``extend`` moves the key to a new lease of the longer TTL (etcd cannot change a
  lease's TTL); the key keeps its create revision, so the fence does not change.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tasklock.core.base import Attempt, BaseLock, _Waiter
from tasklock.core.batches import HoldScript, judge_hold, sync_renewer
from tasklock.core.watchdog import Renewal
from tasklock.etcd.client import Client, as_client
from tasklock.etcd.steps import LockSteps, WatchWaiter, drive

__all__ = ["Lock"]


class Lock(LockSteps[Client, BaseLock], BaseLock):
    """A lock on etcd with the API of :class:`tasklock.Lock`.

    ``endpoints_or_client``: ``"etcd://h1:2379,h2:2379"`` (``etcds://`` for TLS), a list of
    ``http(s)://host:port`` URLs, or a :class:`tasklock.etcd.client.Client` to share between
    locks. The other parameters mean what they mean for :class:`tasklock.Lock`, except:

    * ``timeout`` is rounded up to whole seconds (etcd's lease unit) and must be at least 1 s.
    * No ``fence_key``: the fence is the lock key's create revision, which etcd itself keeps
      strictly increasing (across restarts too); there is no counter to share.
    * No ``fair``: waiters watch the key and race when it is deleted (etcd wakes them all, at
      the cost of one watch event each; no queue to maintain).

    The steps (requests and what they decide) are :class:`tasklock.etcd.steps.LockSteps`,
    shared with :class:`tasklock.asyncio.etcd.Lock`; this class only runs them.
    """

    def _as_client(self, endpoints_or_client: Any) -> Client:
        return as_client(endpoints_or_client)

    # -- the hooks of BaseLock, each one step run by the blocking driver ---------------------
    def _attempt(self, token: str, waiting: bool = False) -> Attempt:
        return drive(self.client, self._attempt_steps(token, waiting))

    def _waiter(self, token: str) -> _Waiter:
        return _WatchWaiter(self, token)

    def _release_value(self, value: bytes) -> bool:
        return drive(self.client, self._release_steps(value))

    def _keepalive(self, lease: int) -> int:
        return drive(self.client, self._keepalive_steps(lease))

    def _extend_value(self, value: bytes, seconds: float, replace: bool) -> bool:
        return drive(self.client, self._extend_steps(value, seconds, replace))

    def _renewal(self, value: bytes, on_lost: Callable[[str], None]) -> Renewal:
        call = (sync_renewer(self.client, _keepalive_hold), _KEEPALIVE, (self.name,), (self, value))
        return Renewal(self.name, self.ttl, [call], judge_hold, on_lost)

    def locked(self) -> bool:
        return drive(self.client, self._locked_steps())

    def _stored_value_is(self, value: bytes) -> bool:
        return drive(self.client, self._stored_value_is_steps(value))

    def _peek(self) -> tuple[bytes | None, int | None]:
        return drive(self.client, self._peek_steps())


class _WatchWaiter(WatchWaiter):
    """Waits for the lock key's delete (or a permit's, while a semaphore of the same name holds
    permits) with a watch from the revision the last attempt read."""

    _lock: Lock

    def wait(self, timeout: float) -> bool:
        target = self._target(timeout)
        if target is None:
            return False
        try:
            return self._lock.client.wait_for_delete(
                target.key, target.start, timeout, **target.options()
            )
        except Exception:
            # No watch (etcd going away): back off for ``sleep``, then the next attempt says
            # what is wrong.
            threading.Event().wait(min(timeout, float(self._lock.sleep)))
            return False


# -- watchdog ----------------------------------------------------------------------------------
# The thread watchdog renews etcd holds with one lease keep-alive each, through the per-hold
# batches of tasklock.core.batches (the same scheduling, deadlines, late warnings and lost
# verdicts as Redis holds).

_KEEPALIVE = HoldScript("etcd lease keep-alive", "-- tasklock.etcd keep-alive")


def _keepalive_hold(lock: Lock, value: bytes) -> int:
    """Keep the hold's lease alive: its TTL back, or 0 when it was released meanwhile."""
    lease = lock._leases.get(value)
    return 0 if lease is None else lock._keepalive(lease)
