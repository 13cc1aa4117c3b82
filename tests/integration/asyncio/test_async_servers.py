"""tasklock.asyncio.Lock where the event loop or the server differs: uvloop's loop, and a real
3-master Redis Cluster through ``redis.asyncio.RedisCluster`` (locks on every node, a waiter
woken across nodes, renewals routed per key)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from redis.asyncio.cluster import ClusterNode, RedisCluster

from tasklock.asyncio import Lock
from tasklock.asyncio.watchdog import get_async_watchdog
from tests.integration.asyncio import test_async_lock as contract
from tests.integration.asyncio.test_async_lock import eventually
from tests.support.servers import HOST, RedisClusterServers

pytestmark = pytest.mark.timeout(60)

uvloop = pytest.importorskip("uvloop", reason="uvloop is not installed (the test extra has it)")


@pytest.mark.uvloop
class TestOnUvloop:
    """The same contract on uvloop's event loop (contexts, cancellation, timeouts differ in C)."""

    async def test_the_loop_is_uvloop(self) -> None:
        assert isinstance(asyncio.get_running_loop(), uvloop.Loop)

    test_cycle = staticmethod(contract.test_acquire_release_fence_and_the_stored_value)
    test_holds_per_task = staticmethod(
        contract.test_a_hold_belongs_to_its_task_and_the_tasks_it_starts
    )
    test_wake_up = staticmethod(contract.test_a_waiter_is_woken_by_the_release)
    test_cancelled_release = staticmethod(contract.test_release_cancellation_preserves_lock_state)
    test_watchdog = staticmethod(contract.test_the_watchdog_renews_and_reports_a_lost_hold)


@pytest.fixture
async def cluster(redis_cluster: RedisClusterServers) -> AsyncIterator[RedisCluster]:
    client = RedisCluster(
        startup_nodes=[ClusterNode(HOST, node.port) for node in redis_cluster.nodes],
        socket_timeout=5,
    )
    await client.initialize()
    yield client
    await client.aclose()


async def test_locks_on_every_node_of_a_cluster(cluster: RedisCluster) -> None:
    names = [f"c:{i}" for i in range(24)]
    owners = {cluster.get_node_from_key(name).port for name in names}
    assert len(owners) == 3, "the names spread over the three masters"
    fences = []
    for name in names:
        async with Lock(cluster, name, timeout=10) as lock:
            assert await lock.owned()
            fences.append(lock.fence)
        assert not await cluster.exists(name)
    assert all(fence is not None for fence in fences)


async def test_a_waiter_is_woken_and_renewals_run_on_a_cluster(cluster: RedisCluster) -> None:
    holder = Lock(cluster, "c:long", timeout=0.3, watchdog=True)
    assert await holder.acquire()
    watchdog = get_async_watchdog()
    before = watchdog.calls
    await eventually(lambda: watchdog.calls >= before + 3, "renewed three times")
    assert await cluster.pttl("c:long") > 0
    waiter = Lock(cluster, "c:long", timeout=10, sleep=30.0)
    acquired = asyncio.Event()

    async def wait_then_release() -> None:
        assert await waiter.acquire(blocking_timeout=25)
        acquired.set()
        await waiter.release()

    waiting = asyncio.create_task(wait_then_release())
    await eventually(lambda: waiter_subscribed(cluster), "the waiter subscribed")
    await holder.release()
    async with asyncio.timeout(10):  # far below the waiter's 15-30 s fallback poll
        await acquired.wait()
    await waiting


async def waiter_subscribed(cluster: RedisCluster) -> bool:
    for node in cluster.get_primaries():
        counts = await cluster.pubsub_numsub("tasklock:wake:c:long", target_nodes=node)
        if any(int(count) for _, count in counts):
            return True
    return False
