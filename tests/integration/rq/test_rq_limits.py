"""``dedupe_enqueue="until_start"`` with RQ: "one running + one queued" in forking ``rq worker``
subprocesses (the queued run is rescheduled through RQ's scheduler while the first one runs), and
a run that RQ retries after it started being the pending run again (in-process worker).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue, Retry
from rq.job import Job, JobStatus

from tasklock.rq import META_KEY
from tests.integration.rq import limit_jobs
from tests.integration.rq.support import drain, rq_workers, status, wait_status
from tests.support.history import HistoryLog, assert_no_overlap
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


@pytest.mark.slow
def test_until_start_runs_exactly_one_more_after_the_running_one(
    r: redis.Redis, redis_server: RedisServer, queue: Queue, tmp_path: Path
) -> None:
    history = tmp_path / "history.jsonl"
    HistoryLog(history)
    job, call = limit_jobs.coalesced, ("n1", str(history))
    started = "started:coalesced:n1"
    marker = job.tasklock.guard.pending_key(call, {})
    with rq_workers(redis_server.url, 2, tmp_path, scheduler=True) as workers:
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
        for each in (first, queued):
            final = wait_status(each, JobStatus.FINISHED, JobStatus.FAILED, timeout=30)
            assert final is JobStatus.FINISHED, workers[0].log()
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
