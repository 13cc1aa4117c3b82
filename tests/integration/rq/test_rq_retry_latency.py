"""``on_duplicate="retry"`` with forking `rq worker` processes and RQ's scheduler: a duplicate job
that meets a short-lived holder runs within seconds of the release, not a TTL later.

The holder's TTL is 60 s and the watchdog keeps its TTL left between 40 and 60 s: a duplicate
rescheduled after "the holder's TTL left" (the old rule) cannot finish before this test's 25 s
timeout.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus

from tasklock.rq import META_KEY
from tests.integration.rq import latency_jobs
from tests.integration.rq.support import rq_workers, wait_status
from tests.support.polling import eventually
from tests.support.servers import RedisServer

pytestmark = [pytest.mark.slow, pytest.mark.timeout(25)]


def record(job: Job) -> dict[str, Any]:
    job.refresh()
    found = job.meta.get(META_KEY)
    return found if isinstance(found, dict) else {}


def test_a_duplicate_job_runs_within_seconds_of_a_short_holders_release(
    r: redis.Redis, redis_server: RedisServer, queue: Queue, tmp_path: Path
) -> None:
    """The issue's timeline: the holder is done 2 s after its duplicate arrived."""
    with rq_workers(redis_server.url, 2, tmp_path, scheduler=True) as workers:
        holder = queue.enqueue(latency_jobs.settle, 1, "holder", hold=2.0)
        assert r.blpop(["entered:1"], timeout=10), workers[0].log()
        twin = queue.enqueue(latency_jobs.settle, 1, "twin")
        eventually(lambda: record(twin).get("retries"), timeout=10, what="the twin meeting it")
        first = record(twin)
        assert first["outcome"] == "retry"
        assert first["retry_in"] == 1  # 0.5-1 s, in RQ's whole seconds (it was 41-67 s)
        r.rpush("go:1", 1)  # the holder works 2 s more, then releases
        assert wait_status(twin, JobStatus.FINISHED, JobStatus.FAILED, timeout=15) is (
            JobStatus.FINISHED
        ), workers[1].log()
        assert wait_status(holder, JobStatus.FINISHED, JobStatus.FAILED) is JobStatus.FINISHED
    ran, held = twin.return_value(), holder.return_value()
    assert ran["start"] >= held["end"]
    assert ran["fence"] > held["fence"]
    final = record(twin)
    assert final["outcome"] == "ran"
    # Retries after 1 s, then 1-2 s, then 2-4 s (plus up to a second for the scheduler's poll):
    # the third at the latest finds the lock free.
    assert 1 <= final["retries"] <= 4
