"""tasklock on etcd: the same :class:`Lock` API, on a consensus store.

Every Redis lock, Redlock included, is a lease whose safety rests on timing. etcd replicates
each write through Raft before it answers, so a lock held there survives the loss of a minority
of the cluster, and its fencing token is etcd's own store revision: the lock key's create
revision, strictly increasing across every holder and across restarts of the cluster.

::

    from tasklock.etcd import Lock

    with Lock("etcd://10.0.0.1:2379,10.0.0.2:2379,10.0.0.3:2379", "ledger:42") as lock:
        ledger.write(..., fence=lock.fence)

Semantics (see :mod:`tasklock.etcd.lock`): a lease with the TTL and a transaction that creates
the key only if absent; waiters watch the key for its delete instead of polling; release deletes
the key only while it is on this hold's lease; the watchdog renews with lease keep-alives, and a
keep-alive that finds the lease gone marks the hold lost (``lock.lost``, ``on_lost``).

:class:`Semaphore` (:mod:`tasklock.etcd.semaphore`) lets ``limit`` holders in at once, each on a
permit key ``<name>:permit:<i>`` of its own lease; a Lock and a Semaphore of the same name exclude
each other, so a task whose limit moves between 1 and N stays exclusive.

Why etcd's JSON gateway over httpx, not a gRPC client library. etcd (3.4 and later) serves its
v3 API as JSON over HTTP on the client port (``/v3/kv/txn``, ``/v3/lease/keepalive``,
``/v3/watch`` as a stream, ...). Talking to that through httpx lets one sans-I/O layer
(:mod:`tasklock.etcd.protocol`: endpoints, request bodies, replies, errors) serve the blocking
client (``httpx.Client``, :mod:`tasklock.etcd.client`) and the asyncio one
(``httpx.AsyncClient``, :mod:`tasklock.etcd.aclient`, used by :mod:`tasklock.asyncio.etcd`)
with no second copy of the protocol. The alternatives each fail one of those needs:
python-etcd3 has had no release since 2020 and breaks on current protobuf; etcd3gw is sync-only
(requests); aetcd is asyncio-only. Keys and values are base64 in the gateway's JSON.

httpx is optional (``pip install 'tasklock[etcd]'``): ``import tasklock`` does not import it,
only ``import tasklock.etcd`` does.
"""

from __future__ import annotations

from tasklock.etcd.client import Client
from tasklock.etcd.lock import Lock
from tasklock.etcd.semaphore import Semaphore

__all__ = ["Client", "Lock", "Semaphore"]
