"""Celery and RQ with their locks on ZooKeeper: the broker and the job store stay on Redis (they
are the framework's), ``tasklock_url`` / ``TASKLOCK_URL`` name ZooKeeper, and ``on_duplicate``,
``dedupe_enqueue`` markers and fencing work there, under a real Celery worker and a real RQ
worker."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from celery import Celery
from rq import Queue
from rq.job import JobStatus

from tasklock import stats
from tasklock.celery import DUPLICATE, singleton_task
from tasklock.guard import reset_all
from tasklock.rq import META_KEY
from tasklock.zookeeper.client import client_for
from tasklock.zookeeper.lock import lock_directory
from tests.integration.celery.support import Gates, configure, in_process_worker
from tests.integration.rq import jobs
from tests.integration.rq.support import QUEUE, drain, status
from tests.support.polling import eventually
from tests.support.servers import RedisServer
from tests.support.zookeeper import ZooKeeperServer

GATES = Gates()
app = Celery("tl_zk_tests", set_as_current=False)


@singleton_task(app=app, name="zk.settle", key=["account"], fencing=True)
def settle(account: int, gate: str | None = None, fence_token: int | None = None) -> int | None:
    if gate:
        GATES[f"{gate}:entered"].set()
        assert GATES[f"{gate}:finish"].wait(30), "the test never let the body finish"
    return fence_token


@singleton_task(app=app, name="zk.deduped", key=["account"], dedupe_enqueue=True)
def deduped(account: int, gate: str | None = None) -> int:
    if gate:
        GATES[f"{gate}:entered"].set()
        assert GATES[f"{gate}:finish"].wait(30), "the test never let the body finish"
    return account


def zk_url(zookeeper: ZooKeeperServer) -> str:
    return zookeeper.url() + "?session_timeout=1"


def zk_has(zookeeper: ZooKeeperServer, key: str) -> bool:
    """Whether ``key`` is held (a lock directory with a node) or marked (a marker node)."""
    client = client_for(zk_url(zookeeper))
    directory = lock_directory(client, key)
    client.call("testing", "sync", "/")
    if client.call("testing", "exists", directory) is not None:
        return bool(client.call("testing", "get_children", directory))
    marker = client.path("tasklock", "markers", quote(key, safe=""))
    return client.call("testing", "exists", marker) is not None


@pytest.fixture(scope="module")
def worker(redis_server: RedisServer, zookeeper: ZooKeeperServer) -> Iterator[Any]:
    configure(app, redis_server.url, tasklock_url=zk_url(zookeeper))
    with in_process_worker(app) as running:
        yield running
    reset_all()


def test_celery_skips_a_duplicate_with_increasing_fences_on_zookeeper(
    worker: Any, redis_server: RedisServer, zookeeper: ZooKeeperServer
) -> None:
    first = settle.delay(1, "c1")
    assert GATES["c1:entered"].wait(30)
    lock_key = settle.tasklock_guard.lock_key((1,), {})
    assert zk_has(zookeeper, lock_key)
    assert not redis_server.client().keys("tasklock:*")  # nothing of tasklock's on Redis
    duplicate = settle.delay(1)
    eventually(lambda: duplicate.state == DUPLICATE, timeout=30, what="the twin skipped")
    GATES["c1:finish"].set()
    fence = first.get(timeout=30)
    assert isinstance(fence, int)
    assert fence > 0
    assert not zk_has(zookeeper, lock_key)
    assert settle.delay(1).get(timeout=30) > fence


def test_celery_dedupes_enqueue_with_markers_on_zookeeper(
    worker: Any, zookeeper: ZooKeeperServer
) -> None:
    first = deduped.delay(2, "c2")
    assert GATES["c2:entered"].wait(30)
    marker = deduped.tasklock_guard.pending_key((2,), {})
    assert zk_has(zookeeper, marker)
    assert deduped.delay(2).id == first.id  # held until the run ends (dedupe_enqueue=True)
    GATES["c2:finish"].set()
    assert first.get(timeout=30) == 2
    eventually(lambda: not zk_has(zookeeper, marker), timeout=30, what="the marker cleared")
    assert deduped.delay(2).id != first.id


# -- RQ ------------------------------------------------------------------------------------------
@pytest.fixture
def queue(
    redis_server: RedisServer, zookeeper: ZooKeeperServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Queue]:
    monkeypatch.setenv("TASKLOCK_URL", zk_url(zookeeper))
    reset_all()
    stats.reset()
    client = redis_server.client()
    client.flushdb()
    yield Queue(QUEUE, connection=client)
    reset_all()
    client.close()


def test_rq_runs_fenced_and_skips_a_duplicate_on_zookeeper(
    queue: Queue, zookeeper: ZooKeeperServer
) -> None:
    job = jobs.settle.enqueue(queue, 8, "d")
    assert drain(queue)
    assert status(job) is JobStatus.FINISHED
    fence = job.return_value()["fence"]
    assert isinstance(fence, int)
    assert fence > 0
    guard = jobs.settle.tasklock.guard
    holder = guard.lock_for(guard.lock_key((8, "d"), {}), "twin-job")  # as a running twin
    assert holder.acquire(blocking=False)
    held_fence = holder.fence
    try:
        assert holder.__class__.__module__ == "tasklock.zookeeper.lock"
        skipped = jobs.settle.enqueue(queue, 8, "d")
        assert drain(queue)
    finally:
        holder.release()
    assert status(skipped) is JobStatus.FINISHED
    record = skipped.get_meta(refresh=True)[META_KEY]
    assert record["outcome"] == "skipped"
    assert "task=twin-job" in record["duplicate"]["holder"]
    later = jobs.settle.enqueue(queue, 8, "d")
    assert drain(queue)
    assert later.return_value()["fence"] > held_fence > fence


def test_rq_dedupe_enqueue_markers_live_on_zookeeper(
    queue: Queue, zookeeper: ZooKeeperServer, redis_server: RedisServer
) -> None:
    first = jobs.deduped.enqueue(queue, "e")
    assert jobs.deduped.enqueue(queue, "e").id == first.id
    marker = jobs.deduped.tasklock.guard.pending_key(("e",), {})
    assert zk_has(zookeeper, marker)
    assert not redis_server.client().exists(marker)
    assert drain(queue)
    assert not zk_has(zookeeper, marker)
    assert jobs.deduped.enqueue(queue, "e").id != first.id
