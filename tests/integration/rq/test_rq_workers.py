"""@singleton_job in forking `rq worker` subprocesses: every job runs in its own work horse.

Concurrency is checked from a recorded history (no two holds of a key overlap, fences increase,
the fenced register accepted every write); faults are real: RQ's job timeout (SIGALRM in the
horse) and SIGKILL of the horse; long jobs outlive many TTLs; retries go through RQ's scheduler.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import redis
from rq import Queue
from rq.job import JobStatus

from tasklock import fleet, stats
from tasklock.core.owner import parse_value
from tasklock.rq import META_KEY
from tests.integration.rq import jobs
from tests.integration.rq.support import hold, rq_workers, wait_status
from tests.support.history import (
    FencedRegister,
    HistoryLog,
    assert_fences_increase,
    assert_no_overlap,
)
from tests.support.polling import eventually
from tests.support.servers import RedisServer

pytestmark = pytest.mark.slow


def blpop(r: redis.Redis, key: str, timeout: int = 20) -> str:
    item = r.blpop([key], timeout=timeout)
    assert item is not None, f"nothing pushed to {key} within {timeout}s"
    return str(item[1].decode())


def test_concurrent_workers_never_overlap_and_fences_increase(
    r: redis.Redis, redis_server: RedisServer, queue: Queue, tmp_path: Path
) -> None:
    history, register = tmp_path / "history.jsonl", tmp_path / "register.sqlite"
    HistoryLog(history)
    FencedRegister(register)
    names = ["alpha", "beta", "gamma"]
    with rq_workers(redis_server.url, 3, tmp_path) as workers:
        # Twins side by side in the queue: the three workers take three of one name at once.
        enqueued = [
            queue.enqueue(jobs.critical, name, 0.03, str(history), str(register))
            for name in names
            for _ in range(8)
        ]
        for job in enqueued:
            final = wait_status(job, JobStatus.FINISHED, JobStatus.FAILED, timeout=60)
            assert final is JobStatus.FINISHED, workers[0].log()
        assert all(job.return_value() is True for job in enqueued)  # every fenced write accepted
    holds = HistoryLog(history).holds()
    assert len(holds) == len(enqueued)
    assert len({h.pid for h in holds}) > 1, "the jobs did not run in several work horses"
    assert_no_overlap(holds)
    assert_fences_increase(holds)
    writes = FencedRegister(register).writes()
    assert len(writes) == len(enqueued)
    assert all(w["accepted"] for w in writes)
    FencedRegister(register).assert_consistent()
    assert not r.keys("tasklock:*:lock:*")


def test_job_timeout_releases_the_lock_in_finally(
    r: redis.Redis, redis_server: RedisServer, queue: Queue, tmp_path: Path
) -> None:
    key = jobs.sleepy.tasklock.guard.lock_key(("t", 30), {})
    with rq_workers(redis_server.url, 1, tmp_path):
        job = queue.enqueue(jobs.sleepy, "t", 30, job_timeout=1)
        assert blpop(r, "started:t") == "1"  # the body ran under the lock
        assert r.pttl(key) > 50_000  # ttl=60: only a release can make it go away soon
        assert wait_status(job, JobStatus.FAILED, JobStatus.FINISHED) is JobStatus.FAILED
        result = job.latest_result()
        assert result is not None
        assert "JobTimeoutException" in str(result.exc_string)
        assert not r.exists(key)


def test_sigkilled_horse_frees_the_lock_within_one_ttl(
    r: redis.Redis, redis_server: RedisServer, queue: Queue, tmp_path: Path
) -> None:
    ttl = jobs.hang.tasklock.guard.options.ttl
    key = jobs.hang.tasklock.guard.lock_key(("k",), {})
    with rq_workers(redis_server.url, 1, tmp_path) as workers:
        job = queue.enqueue(jobs.hang, "k")
        horse = int(blpop(r, "pids:k"))
        assert horse != workers[0].process.pid  # the job runs in a forked work horse
        holder = parse_value(r.get(key))
        assert holder.meta["pid"] == horse
        assert holder.meta["task"] == job.id
        os.kill(horse, signal.SIGKILL)
        # Within one TTL, by the server's own clock: the key had at most a TTL left when the
        # horse died, and nothing renewed it after (each read finds less left), until it is gone.
        # (A bound on this machine's clock would measure its load, not the lock.)
        left = [r.pttl(key)]
        assert 0 < left[0] <= ttl * 1000

        def expired() -> bool:
            left.append(r.pttl(key))
            assert left[-1] <= left[-2] or left[-1] == -2, f"renewed after the kill: {left}"
            return left[-1] == -2

        eventually(expired, timeout=ttl * 3, what="the lock to expire")
        assert wait_status(job, JobStatus.FAILED, JobStatus.FINISHED) is JobStatus.FAILED


def test_watchdog_keeps_a_long_job_locked_across_many_ttls(
    r: redis.Redis, redis_server: RedisServer, queue: Queue, tmp_path: Path
) -> None:
    with rq_workers(redis_server.url, 2, tmp_path):
        long_job = queue.enqueue(jobs.long_hold, "l")
        fence = int(blpop(r, "started:l"))
        assert int(blpop(r, "past:l")) > 20  # three TTLs of checks have passed
        twin = queue.enqueue(jobs.long_hold, "l")  # the idle worker takes it: a duplicate
        assert wait_status(twin, JobStatus.FINISHED, JobStatus.FAILED) is JobStatus.FINISHED
        twin.refresh()
        assert twin.meta[META_KEY]["outcome"] == "skipped"
        assert twin.meta[META_KEY]["duplicate"]["holder"].endswith(f"fence={fence}")
        r.rpush("go:l", 1)
        assert wait_status(long_job, JobStatus.FINISHED, JobStatus.FAILED) is JobStatus.FINISHED
        result = long_job.return_value()
        assert result["misses"] == 0
        assert result["fence"] == fence
        assert not r.exists(jobs.long_hold.tasklock.guard.lock_key(("l",), {}))


def test_retry_reschedules_the_same_job_through_the_scheduler(
    r: redis.Redis, redis_server: RedisServer, queue: Queue, tmp_path: Path
) -> None:
    with rq_workers(redis_server.url, 1, tmp_path, scheduler=True):
        holder = hold(r, jobs.patient, "p", ttl=2)
        try:
            job = jobs.patient.enqueue(queue, "p")
            assert wait_status(job, JobStatus.SCHEDULED) is JobStatus.SCHEDULED
            job.refresh()
            record = job.meta[META_KEY]
            assert record["outcome"] == "retry"
            assert record["retries"] == 1
            assert 1 <= record["retry_in"] <= 3
            assert "test-holder" in record["duplicate"]["holder"]
            assert jobs.patient.enqueue(queue, "p").id == job.id  # still pending: deduplicated
        finally:
            holder.release()
        assert wait_status(job, JobStatus.FINISHED, JobStatus.FAILED) is JobStatus.FINISHED
        assert job.return_value() == "p"
        job.refresh()
        assert job.meta[META_KEY]["outcome"] == "ran"
        assert r.lrange("ran:patient", 0, -1) == [b"p"]
        assert not r.exists(jobs.patient.tasklock.guard.pending_key(("p",), {}))


def test_counts_from_work_horses_add_up_in_redis(
    r: redis.Redis, queue: Queue, redis_server: RedisServer, tmp_path: Path
) -> None:
    """Each job runs in a work horse that leaves with os._exit: its counts are written before
    that, so the fleet's counts in Redis have every run and every duplicate."""
    holder = hold(r, jobs.settle, 70, "d")
    try:
        with rq_workers(redis_server.url, 2, tmp_path):
            ran = [queue.enqueue(jobs.bare, f"fleet-{i}") for i in range(6)]
            skipped = [jobs.settle.enqueue(queue, 70, "d") for _ in range(3)]
            rated = [queue.enqueue(jobs.rate_only, f"rated-{i}") for i in range(3)]
            for job in ran + skipped + rated:
                assert wait_status(job, JobStatus.FINISHED, JobStatus.FAILED) is JobStatus.FINISHED
            counts = fleet.read_counts(r)
    finally:
        holder.release()
    bare, settle = counts[jobs.bare.tasklock.name], counts[jobs.settle.tasklock.name]
    assert (bare["ran"], bare["duplicates"]) == (6, 0)
    assert (settle["ran"], settle["duplicates"], settle["duplicates_skip"]) == (0, 3, 3)
    # limit=None (rate only): no execution lock, and its counts go to Redis all the same.
    assert counts.get(jobs.rate_only.tasklock.name, {}).get("ran") == 3
    assert stats.snapshot().get(f"ran:{jobs.bare.tasklock.name}", 0) == 0  # not this process's
