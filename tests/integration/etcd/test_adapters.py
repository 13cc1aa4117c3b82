"""Celery and RQ with their locks on etcd: the broker and the job store stay on Redis (they are
the framework's), ``tasklock_url`` / ``TASKLOCK_URL`` name etcd, and every option works there:
``on_duplicate``, ``dedupe_enqueue`` markers and fencing (``limit`` is in test_semaphore's
task-level tests when the etcd Semaphore is present)."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from celery import Celery
from rq import Queue
from rq.job import JobStatus

from tasklock import stats
from tasklock.celery import DUPLICATE, singleton_task
from tasklock.guard import reset_all
from tasklock.rq import META_KEY
from tests.integration.celery.support import Gates, configure, in_process_worker
from tests.integration.etcd.conftest import EtcdServer
from tests.integration.rq import jobs
from tests.integration.rq.support import QUEUE, drain, status
from tests.support.polling import eventually
from tests.support.servers import RedisServer

GATES = Gates()
app = Celery("tl_etcd_tests", set_as_current=False)


@singleton_task(app=app, name="etcd.settle", key=["account"], fencing=True)
def settle(account: int, gate: str | None = None, fence_token: int | None = None) -> int | None:
    if gate:
        GATES[f"{gate}:entered"].set()
        assert GATES[f"{gate}:finish"].wait(30), "the test never let the body finish"
    return fence_token


@singleton_task(app=app, name="etcd.deduped", key=["account"], dedupe_enqueue=True)
def deduped(account: int, gate: str | None = None) -> int:
    if gate:
        GATES[f"{gate}:entered"].set()
        assert GATES[f"{gate}:finish"].wait(30), "the test never let the body finish"
    return account


def etcd_url(etcd: EtcdServer) -> str:
    return "etcd://" + etcd.url.removeprefix("http://")


def etcd_has(etcd: EtcdServer, key: str) -> bool:
    reply = httpx.post(
        f"{etcd.url}/v3/kv/range",
        json={"key": base64.b64encode(key.encode()).decode(), "count_only": True},
    ).json()
    return int(reply.get("count", 0)) > 0


@pytest.fixture(scope="module")
def worker(redis_server: RedisServer, etcd: EtcdServer) -> Iterator[Any]:
    configure(app, redis_server.url, tasklock_url=etcd_url(etcd))
    with in_process_worker(app) as running:
        yield running
    reset_all()


def test_celery_skips_a_duplicate_with_increasing_fences_on_etcd(
    worker: Any, redis_server: RedisServer, etcd: EtcdServer
) -> None:
    first = settle.delay(1, "c1")
    assert GATES["c1:entered"].wait(30)
    lock_key = settle.tasklock_guard.lock_key((1,), {})
    assert etcd_has(etcd, lock_key)
    assert not redis_server.client().keys("tasklock:*")  # nothing of tasklock's on Redis
    duplicate = settle.delay(1)
    eventually(lambda: duplicate.state == DUPLICATE, timeout=30, what="the twin skipped")
    GATES["c1:finish"].set()
    fence = first.get(timeout=30)
    assert isinstance(fence, int)
    assert fence > 0
    assert not etcd_has(etcd, lock_key)
    assert settle.delay(1).get(timeout=30) > fence


def test_celery_dedupes_enqueue_with_markers_on_etcd(worker: Any, etcd: EtcdServer) -> None:
    first = deduped.delay(2, "c2")
    assert GATES["c2:entered"].wait(30)
    marker = deduped.tasklock_guard.pending_key((2,), {})
    assert etcd_has(etcd, marker)
    assert deduped.delay(2).id == first.id  # held until the run ends (dedupe_enqueue=True)
    GATES["c2:finish"].set()
    assert first.get(timeout=30) == 2
    eventually(lambda: not etcd_has(etcd, marker), timeout=30, what="the marker cleared")
    assert deduped.delay(2).id != first.id


# -- RQ ------------------------------------------------------------------------------------------
@pytest.fixture
def queue(
    redis_server: RedisServer, etcd: EtcdServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Queue]:
    monkeypatch.setenv("TASKLOCK_URL", etcd_url(etcd))
    reset_all()
    stats.reset()
    client = redis_server.client()
    client.flushdb()
    yield Queue(QUEUE, connection=client)
    reset_all()
    client.close()


def test_rq_runs_fenced_and_skips_a_duplicate_on_etcd(queue: Queue, etcd: EtcdServer) -> None:
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
        assert holder.__class__.__module__ == "tasklock.etcd.lock"
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


def test_rq_dedupe_enqueue_markers_live_on_etcd(
    queue: Queue, etcd: EtcdServer, redis_server: RedisServer
) -> None:
    first = jobs.deduped.enqueue(queue, "e")
    assert jobs.deduped.enqueue(queue, "e").id == first.id
    marker = jobs.deduped.tasklock.guard.pending_key(("e",), {})
    assert etcd_has(etcd, marker)
    assert not redis_server.client().exists(marker)
    assert drain(queue)
    assert not etcd_has(etcd, marker)
    assert jobs.deduped.enqueue(queue, "e").id != first.id
