"""tasklock on ZooKeeper: the same :class:`Lock` API, on the classic lock service, through kazoo.

::

    from tasklock.zookeeper import Lock

    with Lock("zookeeper://zk1:2181,zk2:2181,zk3:2181/tasklock", "ledger:42") as lock:
        ledger.write(..., fence=lock.fence)

Built on kazoo's basic calls (create an ephemeral sequential node, get_children, exists with a
watch, delete with a version), not on kazoo's ``Lock`` recipe: an ephemeral node per contender,
the first in sequence holds, each waiter watches only its predecessor, release deletes the
holder's own node by version, and the fence is the node's creation zxid (ZooKeeper's own order
of writes: no clock, never goes back). See :mod:`tasklock.zookeeper.lock` for what ``ttl``, the
watchdog and ``extend`` mean on a session store, and ``docs/zookeeper.md``.

kazoo is optional (``pip install 'tasklock[zookeeper]'``): ``import tasklock`` does not import
it, only ``import tasklock.zookeeper`` does. asyncio code runs these locks through a thread
offload (``await asyncio.to_thread(lock.acquire)``): kazoo is a threaded client, and aiozk, the
asyncio one, has too few users and releases to carry locks.
"""

from __future__ import annotations

from tasklock.zookeeper.client import Client
from tasklock.zookeeper.lock import Lock, Semaphore

__all__ = ["Client", "Lock", "Semaphore"]
