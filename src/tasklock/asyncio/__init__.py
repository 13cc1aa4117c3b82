"""tasklock for asyncio: the same locks, awaited on ``redis.asyncio`` clients::

    import redis.asyncio as aioredis
    from tasklock.asyncio import Lock

    r = aioredis.Redis()
    async with Lock(r, "nightly-report") as lock:  # 30 s TTL, renewed while held
        await write_report(fence=lock.fence)

The rules are the sync locks' (one copy, in :mod:`tasklock.core.lease` and
:mod:`tasklock.core.renewal`); what is asyncio's own (holds per task, cancellation safety, the
per-loop watchdog and wake-up listener) is described in :mod:`tasklock.asyncio._base`.
"""

import importlib
from typing import Any

from tasklock.asyncio._base import AsyncLostFlag
from tasklock.asyncio.lock import Lock
from tasklock.asyncio.ratelimit import RateLimit
from tasklock.asyncio.redlock import Redlock
from tasklock.asyncio.semaphore import Semaphore

__all__ = ["AsyncLostFlag", "Lock", "RateLimit", "Redlock", "Semaphore"]


def __getattr__(name: str) -> Any:
    # tasklock.asyncio.etcd imports httpx, tasklock.asyncio.zookeeper kazoo (optional
    # dependencies): each loaded on first use only.
    if name in ("etcd", "zookeeper"):
        return importlib.import_module(f"tasklock.asyncio.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
