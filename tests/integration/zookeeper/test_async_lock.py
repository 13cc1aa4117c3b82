"""``tasklock.asyncio.zookeeper``: the blocking lock's steps through a thread offload, with the
asyncio surface (holds per task, a waiter woken by its watch without holding a thread)."""

from __future__ import annotations

import asyncio
import uuid

from tasklock.asyncio.zookeeper import Lock, Semaphore


async def test_async_lock_excludes_wakes_and_fences(url: str) -> None:
    name = f"async:{uuid.uuid4().hex}"
    first, second = Lock(url, name), Lock(url, name, thread_local=False)
    assert await first.acquire()
    assert await first.owned()
    assert not await second.acquire(blocking=False)
    waiting = asyncio.create_task(second.acquire(blocking_timeout=10))
    await asyncio.sleep(0)  # (let it start: its node queues behind the holder's)
    fence = first.fence
    await first.release()
    assert await asyncio.wait_for(waiting, 10)
    assert second.fence is not None
    assert fence is not None
    assert second.fence > fence
    assert not second.lost
    await second.release()
    assert not await first.locked()


async def test_async_semaphore_and_watchdog(url: str) -> None:
    name = f"async-sem:{uuid.uuid4().hex}"
    a, b, c = (Semaphore(url, name, 2) for _ in range(3))
    async with a, b:
        assert not await c.acquire(blocking=False)
        assert len(await a.holders()) == 2
        await asyncio.sleep(1.5)  # past the 1 s ttl: the watchdog's confirmations keep it
        assert not a.lost
    assert await c.acquire(blocking=False)
    await c.release()
