"""What the adapter tests on a lock store other than Redis (etcd, ZooKeeper) check, written once.

Each store's ``test_adapters`` module runs the same scenarios: Celery and RQ with the broker and
the job store on Redis (they are the framework's) and ``tasklock_url`` / ``TASKLOCK_URL`` naming
the store. Only how a test asks the store whether a key is there (``has``) and which lock module
serves it differ, so the tasks, the RQ queue and the scenarios are here; each store's module keeps
its own test functions (and their names), its fixtures and its ``has``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import pytest
from celery import Celery
from rq import Queue
from rq.job import JobStatus

from tasklock import stats
from tasklock.celery import DUPLICATE, singleton_task
from tasklock.guard import reset_all
from tasklock.rq import META_KEY
from tests.integration.celery.support import Gates, configure, in_process_worker
from tests.integration.rq import jobs
from tests.integration.rq.support import QUEUE, drain, status
from tests.support.polling import eventually
from tests.support.servers import RedisServer

__all__ = [
    "StoreTasks",
    "celery_dedupes_enqueue",
    "celery_skips_a_duplicate",
    "celery_worker",
    "define_tasks",
    "rq_markers_live_on_the_store",
    "rq_queue",
    "rq_runs_fenced_and_skips_a_duplicate",
]

#: Whether a key is held or marked on the store under test.
Has = Callable[[str], bool]


class StoreTasks(NamedTuple):
    """A store's Celery tasks of the scenarios, and the gates their bodies wait on (one set per
    store: a gate another store's test already set would let a scenario run ahead)."""

    settle: Any
    deduped: Any
    gates: Gates


def define_tasks(app: Celery, prefix: str) -> StoreTasks:
    """The two Celery tasks of the scenarios on ``app``, named ``<prefix>.settle`` (fenced) and
    ``<prefix>.deduped`` (``dedupe_enqueue``); each waits on its own gates when given a gate."""
    gates = Gates()

    @singleton_task(app=app, name=f"{prefix}.settle", key=["account"], fencing=True)
    def settle(account: int, gate: str | None = None, fence_token: int | None = None) -> int | None:
        if gate:
            gates[f"{gate}:entered"].set()
            assert gates[f"{gate}:finish"].wait(30), "the test never let the body finish"
        return fence_token

    @singleton_task(app=app, name=f"{prefix}.deduped", key=["account"], dedupe_enqueue=True)
    def deduped(account: int, gate: str | None = None) -> int:
        if gate:
            gates[f"{gate}:entered"].set()
            assert gates[f"{gate}:finish"].wait(30), "the test never let the body finish"
        return account

    return StoreTasks(settle, deduped, gates)


def celery_worker(app: Celery, redis_server: RedisServer, url: str) -> Iterator[Any]:
    """The body of a module's ``worker`` fixture: an in-process worker of ``app`` with its broker
    on Redis and ``tasklock_url`` naming the store's ``url``."""
    configure(app, redis_server.url, tasklock_url=url)
    with in_process_worker(app) as running:
        yield running
    reset_all()


def celery_skips_a_duplicate(tasks: StoreTasks, redis_server: RedisServer, has: Has) -> None:
    """A twin of a running fenced task is skipped; the lock lives on the store, none on Redis,
    and the next run's fence is larger."""
    first = tasks.settle.delay(1, "c1")
    assert tasks.gates["c1:entered"].wait(30)
    lock_key = tasks.settle.tasklock_guard.lock_key((1,), {})
    assert has(lock_key)
    assert not redis_server.client().keys("tasklock:*")  # nothing of tasklock's on Redis
    duplicate = tasks.settle.delay(1)
    eventually(lambda: duplicate.state == DUPLICATE, timeout=30, what="the twin skipped")
    tasks.gates["c1:finish"].set()
    fence = first.get(timeout=30)
    assert isinstance(fence, int)
    assert fence > 0
    assert not has(lock_key)
    assert tasks.settle.delay(1).get(timeout=30) > fence


def celery_dedupes_enqueue(tasks: StoreTasks, has: Has) -> None:
    """The enqueue marker lives on the store until the run ends."""
    first = tasks.deduped.delay(2, "c2")
    assert tasks.gates["c2:entered"].wait(30)
    marker = tasks.deduped.tasklock_guard.pending_key((2,), {})
    assert has(marker)
    assert tasks.deduped.delay(2).id == first.id  # held until the run ends (dedupe_enqueue=True)
    tasks.gates["c2:finish"].set()
    assert first.get(timeout=30) == 2
    eventually(lambda: not has(marker), timeout=30, what="the marker cleared")
    assert tasks.deduped.delay(2).id != first.id


def rq_queue(
    redis_server: RedisServer, url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Queue]:
    """The body of a ``queue`` fixture: an RQ queue on a flushed Redis, ``TASKLOCK_URL`` set to
    the store's ``url``, and tasklock's guards and stats reset around the test."""
    monkeypatch.setenv("TASKLOCK_URL", url)
    reset_all()
    stats.reset()
    client = redis_server.client()
    client.flushdb()
    yield Queue(QUEUE, connection=client)
    reset_all()
    client.close()


def rq_runs_fenced_and_skips_a_duplicate(queue: Queue, lock_module: str) -> None:
    """An RQ job runs fenced; a twin held by ``lock_module``'s lock is skipped with its holder
    named, and a later run's fence is larger than the twin's."""
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
        assert holder.__class__.__module__ == lock_module
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


def rq_markers_live_on_the_store(queue: Queue, redis_server: RedisServer, has: Has) -> None:
    """An RQ job's enqueue marker is on the store, not on the job store's Redis."""
    first = jobs.deduped.enqueue(queue, "e")
    assert jobs.deduped.enqueue(queue, "e").id == first.id
    marker = jobs.deduped.tasklock.guard.pending_key(("e",), {})
    assert has(marker)
    assert not redis_server.client().exists(marker)
    assert drain(queue)
    assert not has(marker)
    assert jobs.deduped.enqueue(queue, "e").id != first.id
