"""Fair waiting in tasklock.asyncio (issue 13): arrival order, and a cancelled or timed-out
waiter leaves the queue."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from tasklock.asyncio import Lock, Semaphore
from tasklock.core.keys import queue_keys_for
from tests.integration.asyncio.test_async_lock import eventually

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("resp")]


async def queued(r: aioredis.Redis, name: str) -> int:
    return int(await r.llen(queue_keys_for(name)[0]))


async def test_tasks_are_served_in_arrival_order(ar: aioredis.Redis) -> None:
    holder = Lock(ar, "a:fifo", timeout=30)
    assert await holder.acquire()
    order: list[int] = []

    async def wait(i: int) -> None:
        lock = Lock(ar, "a:fifo", timeout=30)
        assert await lock.acquire(blocking_timeout=30)
        order.append(i)
        await lock.release()

    tasks = []
    for i in range(4):
        tasks.append(asyncio.create_task(wait(i)))
        await eventually(lambda i=i: _is(queued(ar, "a:fifo"), i + 1), f"waiter {i} queued")
    await holder.release()
    await asyncio.gather(*tasks)
    assert order == [0, 1, 2, 3]


async def _is(count: object, n: int) -> bool:
    return await count == n  # type: ignore[misc]


async def test_a_cancelled_or_timed_out_waiter_leaves_the_queue(ar: aioredis.Redis) -> None:
    holder = Semaphore(ar, "a:leave", 1, timeout=30)
    assert await holder.acquire()
    waiting = asyncio.create_task(Semaphore(ar, "a:leave", 1, timeout=30).acquire())
    await eventually(lambda: _is(queued(ar, "a:leave"), 1), "the waiter queued")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await eventually(lambda: _is(queued(ar, "a:leave"), 0), "the cancelled waiter left")
    assert not await Lock(ar, "a:leave", timeout=30).acquire(blocking_timeout=0.3)
    assert await queued(ar, "a:leave") == 0  # gave up: left at once
    await holder.release()
