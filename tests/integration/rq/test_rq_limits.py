"""``limit=N`` and ``dedupe_enqueue="until_start"`` with RQ: N bodies at once per key in forking
``rq worker`` subprocesses (each job in a work horse of its own), "one running + one queued" (the
queued run rescheduled through RQ's scheduler while the first one runs), and a run that RQ
retries after it started being the pending run again (in-process worker).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue, Retry
from rq.job import Job, JobStatus

from tasklock.core.keys import wake_channel
from tasklock.rq import META_KEY
from tests.integration.rq import limit_jobs
from tests.integration.rq.support import drain, rq_workers, status, wait_status
from tests.support.history import HistoryLog, assert_at_most, assert_no_overlap
from tests.support.polling import eventually
from tests.support.servers import RedisServer


def submit(queue: Queue, job: Any, count: int, *args: Any) -> set[str]:
    """``count`` enqueues of one call from as many threads at once; the job ids they got."""
    with ThreadPoolExecutor(count) as pool:
        return set(pool.map(lambda _: job.enqueue(queue, *args).id, range(count)))


def retries(job: Job) -> int:
    job.refresh()
    record = job.meta.get(META_KEY)
    return int(record.get("retries", 0)) if isinstance(record, dict) else 0


def finished(*jobs: Job) -> None:
    for job in jobs:
        final = wait_status(job, JobStatus.FINISHED, JobStatus.FAILED, timeout=30)
        assert final is JobStatus.FINISHED, job.latest_result()


# -- limit=N --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_limit_with_wait_runs_n_at_a_time_in_work_horses(
    r: redis.Redis, redis_server: RedisServer, queue: Queue, tmp_path: Path
) -> None:
    history = tmp_path / "history.jsonl"
    HistoryLog(history)
    job, started = limit_jobs.two_wait, "started:two_wait:t1"
    channel = wake_channel(job.tasklock.guard.lock_key(("t1", 0, str(history)), {}))
    with rq_workers(redis_server.url, 3, tmp_path):
        jobs = [queue.enqueue(job, "t1", call, str(history)) for call in range(6)]
        # Three workers take three jobs: two hold the permits, the third waits for one.
        eventually(lambda: r.llen(started) >= 2, timeout=30, what="two bodies running")
        eventually(
            lambda: r.pubsub_numsub(channel)[0][1] > 0,
            timeout=30,
            what="a third job waiting for a permit",
        )
        assert r.llen(started) == 2, "a third body began while two were running"
        r.set("go:two_wait:t1", 1)
        finished(*jobs)
    holds = HistoryLog(history).holds()
    assert len(holds) == 6
    assert len({h.pid for h in holds}) == 6  # every job in a work horse of its own
    assert assert_at_most(holds, 2) == 2  # never more than two at once, and two did run
    assert len({h.fence for h in holds}) == 6
    assert not r.keys("tasklock:*:lock:*")  # every permit released


@pytest.mark.slow
def test_limit_with_skip_finishes_a_job_while_n_run(
    r: redis.Redis, redis_server: RedisServer, queue: Queue, tmp_path: Path
) -> None:
    history = tmp_path / "history.jsonl"
    HistoryLog(history)
    job, started = limit_jobs.two_skip, "started:two_skip:t2"
    with rq_workers(redis_server.url, 3, tmp_path):
        running = [queue.enqueue(job, "t2", call, str(history)) for call in range(2)]
        eventually(lambda: r.llen(started) >= 2, timeout=30, what="two bodies running")
        skipped = queue.enqueue(job, "t2", 2, str(history))
        finished(skipped)
        skipped.refresh()
        record = skipped.meta[META_KEY]
        assert record["outcome"] == "skipped"
        assert record["duplicate"]["limit"] == 2
        assert r.llen(started) == 2
        r.set("go:two_skip:t2", 1)
        finished(*running)
        later = queue.enqueue(job, "t2", 3, str(history))  # a permit is free again: it runs
        finished(later)
        assert later.return_value() is not None
    holds = HistoryLog(history).holds()
    assert len(holds) == 3
    assert assert_at_most(holds, 2) == 2


# -- dedupe_enqueue="until_start" ----------------------------------------------------------------
@pytest.mark.slow
def test_until_start_runs_exactly_one_more_after_the_running_one(
    r: redis.Redis, redis_server: RedisServer, queue: Queue, tmp_path: Path
) -> None:
    history = tmp_path / "history.jsonl"
    HistoryLog(history)
    job, call = limit_jobs.coalesced, ("n1", str(history))
    started = "started:coalesced:n1"
    marker = job.tasklock.guard.pending_key(call, {})
    with rq_workers(redis_server.url, 2, tmp_path, scheduler=True):
        first = job.enqueue(queue, *call)
        eventually(lambda: r.llen(started) == 1, timeout=30, what="the first run started")
        assert not r.exists(marker), "the marker outlived the start of its run"

        queued_ids = submit(queue, job, 10, *call)
        assert len(queued_ids) == 1, f"10 enqueues during the run queued {len(queued_ids)} jobs"
        [queued_id] = queued_ids
        assert queued_id != first.id
        queued = Job.fetch(queued_id, connection=r)
        # The queued job meets the lock in the other worker and is rescheduled, twice: a job
        # waiting in the ScheduledJobRegistry is still the queued run.
        eventually(lambda: retries(queued) >= 2, timeout=30, what="two retries of the queued job")
        assert submit(queue, job, 5, *call) == {queued_id}
        assert r.llen(started) == 1, "the queued run began while the first one was running"

        r.set("go:coalesced:n1", 1)
        finished(first, queued)
        assert queued.return_value() > first.return_value()
        assert r.llen(started) == 2
        assert not r.exists(marker)
        later = job.enqueue(queue, *call)  # after the queued run started: new work
        assert later.id != queued_id
        assert wait_status(later, JobStatus.FINISHED, JobStatus.FAILED) is JobStatus.FINISHED

    holds = sorted(HistoryLog(history).holds(), key=lambda h: h.start)
    assert [h.fence for h in holds] == [first.return_value(), queued.return_value(),
                                        later.return_value()]  # fmt: skip
    assert len({h.pid for h in holds}) == 3  # each in a work horse of its own
    assert_no_overlap(holds)  # in particular, the queued run began after the first one ended


def test_a_started_run_that_rq_retries_is_the_pending_run_again(
    r: redis.Redis, queue: Queue
) -> None:
    job = limit_jobs.fails_once.enqueue(queue, "f1", retry=Retry(max=1, interval=60))
    drain(queue)
    assert status(job) is JobStatus.SCHEDULED  # failed once; RQ runs it again in a minute
    # Its marker was cleared when it started, and claimed again for the retry.
    assert r.get(limit_jobs.fails_once.tasklock.guard.pending_key(("f1",), {})) == job.id.encode()
    assert limit_jobs.fails_once.enqueue(queue, "f1").id == job.id
