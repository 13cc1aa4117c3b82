"""tasklock.asyncio.Semaphore on a real redis-server: the sync Semaphore's contract, awaited, with
asyncio's own parts (holds per task, cancellation while waiting, wake-up on release)."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

import tasklock
from tasklock.asyncio import Lock, Semaphore
from tests.integration.asyncio.test_async_lock import (
    BIG_SLEEP,
    WAKE_DEADLINE,
    eventually,
    subscribers,
)

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("resp")]


async def test_limit_holders_then_the_next_waits(ar: aioredis.Redis) -> None:
    sems = [Semaphore(ar, "a:sem", 2, timeout=10) for _ in range(3)]
    assert await sems[0].acquire(blocking=False)
    assert await sems[1].acquire(blocking=False)
    assert not await sems[2].acquire(blocking=False)
    assert await sems[2].locked()
    assert len(await sems[0].holders()) == 2
    assert await sems[0].owned()
    await sems[0].release()
    assert await sems[2].acquire(blocking=False)
    assert sems[2].fence is not None
    assert sems[1].fence is not None
    assert sems[2].fence > sems[1].fence
    await sems[1].release()
    await sems[2].release()
    assert not await ar.exists("a:sem")


async def test_tasks_sharing_one_object_each_take_a_permit(ar: aioredis.Redis) -> None:
    sem = Semaphore(ar, "a:tasks", 3, timeout=10)
    inside, peak = 0, 0

    async def work() -> None:
        nonlocal inside, peak
        for _ in range(4):
            async with sem:
                inside += 1
                peak = max(peak, inside)
                await asyncio.sleep(0.005)  # the body's work
                inside -= 1

    await asyncio.gather(*(work() for _ in range(8)))
    assert peak == 3


async def test_a_release_wakes_a_waiter_and_a_cancelled_waiter_takes_nothing(
    ar: aioredis.Redis,
) -> None:
    holder = Semaphore(ar, "a:sem-wake", 1, timeout=300)
    assert await holder.acquire()
    before = await _evalsha_calls(ar)
    cancelled = asyncio.create_task(Semaphore(ar, "a:sem-wake", 1, sleep=BIG_SLEEP).acquire())
    waiter = Semaphore(ar, "a:sem-wake", 1, timeout=30, sleep=BIG_SLEEP)

    async def wait_then_release() -> None:
        assert await waiter.acquire(blocking_timeout=25)
        await waiter.release()

    waiting = asyncio.create_task(wait_then_release())
    await eventually(lambda: _at_least(subscribers(ar, "a:sem-wake"), 1), "the waiters subscribed")
    await eventually(
        lambda: _at_least(_evalsha_calls(ar), before + 4), "both waiters tried twice, then slept"
    )
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    await holder.release()
    async with asyncio.timeout(WAKE_DEADLINE):
        await waiting
    assert not await ar.exists("a:sem-wake")


async def _evalsha_calls(r: aioredis.Redis) -> int:
    return int((await r.info("commandstats")).get("cmdstat_evalsha", {}).get("calls", 0))


async def _at_least(count: object, n: int) -> bool:
    return int(await count) >= n  # type: ignore[misc]


async def test_a_lock_on_the_same_name_holds_every_permit(ar: aioredis.Redis) -> None:
    lock = Lock(ar, "a:moving", timeout=10)
    sem = Semaphore(ar, "a:moving", 4, timeout=10)
    assert await lock.acquire()
    assert not await sem.acquire(blocking=False)
    assert await sem.locked()
    await lock.release()
    assert await sem.acquire(blocking=False)
    assert not await lock.acquire(blocking=False)
    await sem.release()


async def test_a_bad_limit_is_refused(ar: aioredis.Redis) -> None:
    with pytest.raises(tasklock.ConfigurationError, match="limit"):
        Semaphore(ar, "a:bad", 0)
