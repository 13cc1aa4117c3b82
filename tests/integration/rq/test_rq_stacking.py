"""@singleton_job stacked with RQ's and django-rq's ``@job``, in both orders."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
import redis
from rq import Queue

from tests.integration.rq.support import ROOT, drain, hold, status
from tests.support.servers import RedisServer


@pytest.fixture
def stacked(
    r: redis.Redis, redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ModuleType]:
    """The stacked-jobs module, (re)imported against this module's redis-server."""
    monkeypatch.setenv("TASKLOCK_RQ_TEST_URL", redis_server.url)
    from tests.integration.rq import stacked_jobs

    module = importlib.reload(stacked_jobs)
    yield module
    module.rq_connection.close()


def test_rq_job_outside_keeps_the_lock_in_the_worker(r: redis.Redis, stacked: ModuleType) -> None:
    func = stacked.rq_outside
    job = func.delay("a")  # RQ's delay: enqueues the wrapper by its dotted path
    assert job.func_name == "tests.integration.rq.stacked_jobs.rq_outside"
    queue = Queue(stacked.QUEUE, connection=r)
    holder = hold(r, func, "b")
    try:
        skipped = func.delay("b", value=5)  # key=["name"]: b is held
        assert drain(queue)
    finally:
        holder.release()
    assert job.return_value() == {"name": "a", "held": True}
    assert skipped.return_value() is None
    assert r.lrange("ran:rq_outside", 0, -1) == [b"a"]
    assert func.tasklock.name == "tests.integration.rq.stacked_jobs.rq_outside"


def test_rq_job_inside_deduplicates_delay_and_enqueue(r: redis.Redis, stacked: ModuleType) -> None:
    func = stacked.rq_inside
    queue = Queue(stacked.QUEUE, connection=r)
    first = func.delay("a")
    assert func.delay("a", value=1).id == first.id  # same key (name): deduplicated
    assert func.enqueue("a").id == first.id  # RQ's form of enqueue, without a queue
    assert func.enqueue(queue, "a").id == first.id  # tasklock's form, with a queue
    other = func.enqueue("b")
    assert queue.count == 2
    assert drain(queue)
    assert first.return_value() == {"name": "a", "held": True}
    assert other.return_value() == {"name": "b", "held": True}
    assert status(first).value == "finished"
    assert func.delay("a").id != first.id  # the marker was cleared when it finished


def test_django_rq_job_in_both_orders(redis_server: RedisServer) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DJANGO_SETTINGS_MODULE", None)
    completed = subprocess.run(
        [sys.executable, "-m", "tests.integration.rq.django_scenario", redis_server.url],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    outcome = json.loads(completed.stdout.strip().splitlines()[-1])
    assert outcome == {
        "outside": {"name": "a", "held": True},
        "outside_func": "tests.integration.rq.django_jobs.dj_outside",
        "inside": {"name": "b", "held": True},
        "inside_twin_same_job": True,
        "ran_inside": ["b"],
    }
