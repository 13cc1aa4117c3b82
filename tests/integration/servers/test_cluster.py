"""tasklock on a real 3-master Redis Cluster (the suite's redis-server, slots split evenly).

``tasklock.Lock(RedisCluster, name)`` with names whose keys hash to each of the three nodes:
acquire, extend, release and fencing (the fence counter shares the lock's slot, so the acquire
script runs on one node), a waiter woken by the release's PUBLISH whichever node its key and the
waker's subscription live on (a PUBLISH reaches every node of a cluster), the watchdog renewing
through cluster pipelines (also after SCRIPT FLUSH on every node: NOSCRIPT, SCRIPT LOAD on every
primary, retry), and the task layer (the framework-free guard, as the adapters use it) configured
with a ``redis+cluster://`` URL.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from redis.cluster import RedisCluster

import tasklock
from tasklock.core.keys import fence_key_for, wake_channel
from tasklock.core.wakeup import hub_for
from tasklock.errors import DuplicateTask
from tasklock.guard import Guard
from tests.support.polling import eventually, holds_for
from tests.support.servers import RedisClusterServers, RedisServer
from tests.support.waking import evalsha_calls as count_evalsha

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

BIG_SLEEP = 30.0  # a waiter's first poll would come 15-30 s after it went to sleep
WAKE_DEADLINE = 10.0
TTL = 0.5


@pytest.fixture
def rc(redis_cluster: RedisClusterServers) -> Iterator[RedisCluster]:
    """A cluster client; every node emptied (data and scripts) before the test."""
    for node in redis_cluster.nodes:
        if node.paused:
            node.resume()
    redis_cluster.flushall()
    client = redis_cluster.client()
    yield client
    client.close()


def evalsha_calls(node: RedisServer) -> int:
    client = node.client()
    try:
        return count_evalsha(client)
    finally:
        client.close()


def subscribers(cluster: RedisClusterServers, name: str) -> int:
    """Subscribers to ``name``'s wake channel, summed over the nodes (NUMSUB is per node)."""
    channel = wake_channel(name)
    total = 0
    for node in cluster.nodes:
        client = node.client()
        try:
            total += int(dict(client.pubsub_numsub(channel)).get(channel.encode(), 0))
        finally:
            client.close()
    return total


def test_a_lock_on_every_node(redis_cluster: RedisClusterServers, rc: RedisCluster) -> None:
    names = redis_cluster.names_on_every_node("job")
    assert len({redis_cluster.node_for(name).port for name in names}) == 3
    for name in names:
        node = redis_cluster.node_for(name)
        direct = node.client()
        try:
            fences: list[int] = []
            for _ in range(3):
                lock = tasklock.Lock(rc, name, timeout=10)
                assert lock.acquire(blocking=False), name
                assert isinstance(lock.fence, int)
                fences.append(lock.fence)
                # The lock and its fence counter are on the node that serves the name's slot.
                stored = direct.get(name)
                assert stored is not None
                assert stored.endswith(b"#%d" % lock.fence)
                assert direct.exists(fence_key_for(name))
                assert tasklock.Lock(rc, name, timeout=10).acquire(blocking=False) is False
                holder, ttl = tasklock.Lock(rc, name).peek()
                assert holder is not None
                assert ttl is not None
                assert holder.fence == lock.fence
                assert lock.extend(10)
                assert direct.pttl(name) > 10_000
                lock.release()
                assert not direct.exists(name)
            assert fences == sorted(set(fences)), f"{name}: {fences}"
        finally:
            direct.close()


def test_a_semaphore_on_every_node(redis_cluster: RedisClusterServers, rc: RedisCluster) -> None:
    """The permits and their fence counter share the name's slot (issue 12)."""
    for name in redis_cluster.names_on_every_node("sem"):
        node = redis_cluster.node_for(name)
        direct = node.client()
        try:
            sems = [tasklock.Semaphore(rc, name, 2, timeout=10) for _ in range(3)]
            assert [s.acquire(blocking=False) for s in sems] == [True, True, False]
            assert direct.type(name) == b"zset"
            assert direct.zcard(name) == 2
            assert direct.exists(fence_key_for(name))
            assert len(sems[0].holders()) == 2
            sems[0].release()
            assert sems[2].acquire(blocking=False)
            sems[1].release()
            sems[2].release()
            assert not direct.exists(name)
        finally:
            direct.close()


def test_acquire_loads_the_scripts_on_noscript(
    redis_cluster: RedisClusterServers, rc: RedisCluster
) -> None:
    names = redis_cluster.names_on_every_node("flushed")
    for name in names:
        with tasklock.Lock(rc, name, timeout=5):
            pass
    for node in redis_cluster.nodes:
        client = node.client()
        client.script_flush()
        client.close()
    for name in names:
        with tasklock.Lock(rc, name, timeout=5) as lock:
            assert lock.owned()
        assert not rc.exists(name)


def handoff(cluster: RedisClusterServers, rc: RedisCluster, name: str) -> bool:
    """A holder here, a waiter (first poll 15-30 s away) in a thread; True when the waiter got
    the lock within WAKE_DEADLINE of the holder's release. (fair=False: a queued waiter would
    try every second to keep its place, and the EVALSHA count below proves no poll.)"""
    holder = tasklock.Lock(rc, name, timeout=300, fair=False)
    assert holder.acquire()
    waiter = tasklock.Lock(rc, name, timeout=30, sleep=BIG_SLEEP, fair=False)
    node = cluster.node_for(name)
    direct = node.client()
    direct.config_resetstat()  # from here: the waiter's tries and the release
    direct.close()
    outcome: list[bool] = []
    acquired = threading.Event()

    def wait() -> None:
        outcome.append(waiter.acquire(blocking_timeout=25))
        acquired.set()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    eventually(lambda: subscribers(cluster, name) >= 1, what="the waiter subscribed")
    eventually(lambda: evalsha_calls(node) >= 2, what="the waiter tried twice, then slept")
    holder.release()
    woken = acquired.wait(WAKE_DEADLINE)
    thread.join(5)
    return woken and outcome == [True]


def test_waiters_are_woken_by_the_release_on_every_node(
    redis_cluster: RedisClusterServers, rc: RedisCluster
) -> None:
    names = redis_cluster.names_on_every_node("handoff")
    for name in names:  # the scripts are loaded: no NOSCRIPT round trips counted below
        with tasklock.Lock(rc, name, timeout=5, fair=False):
            pass
    for name in names:
        node = redis_cluster.node_for(name)
        assert handoff(redis_cluster, rc, name), f"{name}: not woken by the release"
        assert evalsha_calls(node) == 4, f"{name}: two tries, the release, one more: no polls"
    # One hub for the cluster client: its one subscription lives on one node, and the releases
    # on the two others reached it too.
    assert hub_for(rc) is hub_for(rc)


def test_the_watchdog_renews_on_every_node(
    redis_cluster: RedisClusterServers, rc: RedisCluster
) -> None:
    names = redis_cluster.names_on_every_node("long")
    locks = [tasklock.Lock(rc, name, timeout=TTL, watchdog=True) for name in names]
    for lock in locks:
        assert lock.acquire()
    for node in redis_cluster.nodes:  # the renewals meet NOSCRIPT, load, and go on
        client = node.client()
        client.script_flush()
        client.close()
    holds_for(
        lambda: all(rc.pttl(name) > 0 for name in names) and not any(lock.lost for lock in locks),
        4 * TTL,
        what="every lock held past its TTL",
    )
    for lock in locks:
        renewal = lock.local.hold.renewal
        assert renewal is not None
        assert renewal.renewals >= 4
    for lock in locks:
        lock.release()
    assert not any(rc.exists(name) for name in names)


def test_each_cluster_client_has_its_own_wakeup_hub(redis_cluster: RedisClusterServers) -> None:
    """A cluster client has no connection pool of its own: its hub must not be shared with
    another cluster's (or a Sentinel-managed client's), which would listen on the wrong servers."""
    first, second = redis_cluster.client(), redis_cluster.client()
    plain = redis_cluster.nodes[0].client()
    try:
        assert hub_for(first) is hub_for(first)
        assert hub_for(first) is not hub_for(second)
        assert hub_for(plain) is not hub_for(first)
    finally:
        for client in (first, second, plain):
            client.close()


def test_a_stalled_node_does_not_cost_the_locks_on_other_nodes(
    redis_cluster: RedisClusterServers,
) -> None:
    client = redis_cluster.client(socket_timeout=0.5)
    healthy_name, stalled_name, _ = redis_cluster.names_on_every_node("stall")
    stalled_node = redis_cluster.node_for(stalled_name)
    healthy = tasklock.Lock(client, healthy_name, timeout=1.0, watchdog=True)
    stalled = tasklock.Lock(client, stalled_name, timeout=1.0, watchdog=True)
    assert healthy.acquire()
    assert stalled.acquire()
    stalled_node.pause()
    try:
        # Well under the cluster's node timeout (5 s): the cluster itself stays ok.
        holds_for(lambda: not healthy.lost, 2.0, what="the healthy node's lock is kept")
    finally:
        stalled_node.resume()
        redis_cluster.wait_until_ok()
        for lock in (healthy, stalled):
            with contextlib.suppress(tasklock.LockError):
                lock.release()
        client.close()


# -- the task layer ------------------------------------------------------------------------------


def settle(account_id: int, fence_token: int | None = None) -> str:
    return f"settled {account_id} {fence_token}"


def run(guard: Guard, args: tuple[Any, ...], body: Any) -> Any:
    return guard.run(
        args,
        {},
        body,
        task_id=None,
        on_skip=lambda d: ("skipped", d),
        on_retry=lambda d: ("retry", d),
        duplicate_error=DuplicateTask,
    )


def test_a_singleton_on_a_cluster_url_excludes_a_duplicate(
    redis_cluster: RedisClusterServers, rc: RedisCluster
) -> None:
    guard = Guard(settle, "cluster.settle", {"url": redis_cluster.url, "fencing": True})
    entered, finish = threading.Event(), threading.Event()
    results: list[Any] = []

    def long_body(extra: dict[str, Any]) -> str:
        entered.set()
        assert finish.wait(30)
        return settle(1, **extra)

    thread = threading.Thread(target=lambda: results.append(run(guard, (1,), long_body)))
    thread.start()
    try:
        assert entered.wait(10)
        # The duplicate meets the running twin: skipped, naming the holder.
        skipped = run(guard, (1,), lambda extra: pytest.fail("a duplicate ran"))
        assert skipped[0] == "skipped"
        assert "pid" in skipped[1].holder
        # Another call (another key, maybe another node) runs meanwhile.
        assert run(guard, (2,), lambda extra: settle(2, **extra)).startswith("settled 2 ")
    finally:
        finish.set()
        thread.join(30)
    assert results[0].startswith("settled 1 ")
    # Every key of the task sits in the task's slot (the {task name} hash tag): one node.
    key = guard.lock_key((1,), {})
    assert redis_cluster.node_for(key) is redis_cluster.node_for(guard.fence_key)
    assert not rc.exists(key)
    again = run(guard, (1,), lambda extra: extra["fence_token"])
    first = int(results[0].split()[-1])
    assert again > first


def test_a_celery_singleton_on_a_cluster_url(
    redis_cluster: RedisClusterServers, rc: RedisCluster
) -> None:
    from celery import Celery

    from tasklock.celery import singleton_task

    app = Celery("cluster-tasks", set_as_current=False, broker="memory://")

    @singleton_task(app=app, shared=False, fencing=True, url=redis_cluster.url)
    def settle(account_id: int, fence_token: int | None = None) -> tuple[int | None, str]:
        # A twin submitted while this one runs meets the lock (on the cluster) and is skipped.
        twin = settle.apply((account_id,))
        return fence_token, twin.state

    first_fence, twin_state = settle.apply((1,)).get()
    assert twin_state == "IGNORED"  # Celery's eager state for a skipped call
    second_fence, _ = settle.apply((1,)).get()
    assert second_fence > first_fence
    assert not rc.exists(settle.tasklock_guard.lock_key((1,), {}))
