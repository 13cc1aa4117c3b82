"""Fleet-wide rate limits (``rate=``) with real forking ``rq worker --with-scheduler`` processes:
a burst is spread at the rate with no backoff tail, an unlimited job enqueued during it is not
held up until its end, a call further away than a work horse sleeps is rescheduled through RQ's
scheduler and comes back for its slot, ``on_rate_limit="skip"``, and a deferral with no
scheduler to serve it fails saying so.

Two workers (one holds the scheduler) serve the module; every test uses its own batch, so the
server is never flushed under them. Starts are recorded on the server's clock (``TIME``), the
clock the limit counts on.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.results import Result

from tasklock.rq import META_KEY
from tests.integration.rq import rate_jobs
from tests.integration.rq.support import (
    ROOT,
    RQ_CLI,
    WorkerProcess,
    rq_workers,
    status,
    wait_status,
)
from tests.support.polling import eventually
from tests.support.servers import RedisServer
from tests.support.starts import most_in_a_second, starts

pytestmark = pytest.mark.slow

QUEUE = "tasklock-rates"
#: No worker with a scheduler ever listens here.
UNSCHEDULED = "tasklock-rates-unscheduled"
#: The burst: this many calls of a "5/s" job.
BURST, PER_SECOND = 12, 5
#: A recorded start lags its slot by the time from the rate script to the body's TIME call: the
#: first start of a burst may be this late, so the spread of a burst may be this much shorter.
START_LAG = 0.1


@pytest.fixture(scope="module")
def workers(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[WorkerProcess]]:
    with rq_workers(
        redis_server.url, 2, tmp_path_factory.mktemp("rq-rates"), queue=QUEUE, scheduler=True
    ) as started:
        yield started


@pytest.fixture
def rc(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def queue(rc: redis.Redis, workers: list[WorkerProcess]) -> Queue:
    return Queue(QUEUE, connection=rc)


@pytest.fixture
def batch() -> str:
    return uuid.uuid4().hex[:10]


def finished(*jobs: Job, timeout: float = 30) -> None:
    for job in jobs:
        final = wait_status(job, JobStatus.FINISHED, JobStatus.FAILED, timeout=timeout)
        assert final is JobStatus.FINISHED, job.latest_result()


def rescheduled(job: Job) -> int:
    """How many times RQ rescheduled the job (each a RETRIED result)."""
    return sum(result.type is Result.Type.RETRIED for result in job.results())


def test_a_burst_runs_at_the_rate_without_a_tail(rc: redis.Redis, queue: Queue, batch: str) -> None:
    jobs = [queue.enqueue(rate_jobs.burst, batch, index) for index in range(BURST)]
    eventually(lambda: starts(rc, "burst", batch), timeout=30, what="the burst began")
    unlimited = queue.enqueue(rate_jobs.free, batch, "during-the-burst")
    finished(*jobs, unlimited)

    runs = starts(rc, "burst", batch)
    assert sorted(int(label) for label, _, _ in runs) == list(range(BURST))  # each exactly once
    times = sorted(at for _, at, _ in runs)
    # Spread from the first start: it cannot be faster than the rate (a slower machine only
    # widens it). And no backoff tail: each job is rescheduled at most once, for the slot it
    # reserved, however late RQ's scheduler (whole seconds) brings it back.
    spread = times[-1] - times[0]
    least = (BURST - 1) / PER_SECOND
    assert least - START_LAG <= spread, times
    resent = {job.id: rescheduled(job) for job in jobs}
    assert all(times_resent <= 1 for times_resent in resent.values()), resent
    # The unlimited job, enqueued behind the burst, is taken when a worker is next free: each
    # worker sleeps in its horse until its call's slot (within RATE_NEAR), so the queue drains
    # at the rate. What holds on any machine: it ran once, at once when a worker took it, never
    # deferred to a slot of the burst's. How soon a worker takes it (about two slots before the
    # burst's last start here; a fork on a loaded machine once took it 0.27 s after) measures
    # the machine, not the limit.
    assert len(starts(rc, "free", batch)) == 1
    assert rescheduled(unlimited) == 0
    # Never more than the rate in a rolling second (one more where a window meets a boundary).
    relative = [round(t - times[0], 3) for t in times]
    assert most_in_a_second(times) <= PER_SECOND + 1, f"starts (s after the first): {relative}"


def test_a_call_further_than_a_horse_sleeps_is_rescheduled_for_its_slot(
    rc: redis.Redis, queue: Queue, batch: str
) -> None:
    """``rate="2/3s"`` (one per 1.5 s), five calls, two workers: the later calls are too far
    from their slots for a work horse to sleep, and go through the scheduler (whole seconds,
    polled once a second). Each starts at its slot or, when the scheduler brought it back late,
    at the next start the limit admits: never early, never closer than the rate's spacing."""
    jobs = [queue.enqueue(rate_jobs.spaced, batch, index) for index in range(5)]
    finished(*jobs, timeout=40)
    assert sum(rescheduled(job) > 0 for job in jobs) >= 2
    runs = starts(rc, "spaced", batch)
    assert sorted(int(label) for label, _, _ in runs) == list(range(5))
    times = sorted(at for _, at, _ in runs)
    relative = [round(t - times[0], 3) for t in times]
    # The k-th start is at the k-th slot or after it: never earlier (the rate), spaced at least
    # 1.5 s apart, and late by no more than the scheduler's whole seconds and one poll (2 s).
    assert all(1.5 * k - START_LAG <= at < 1.5 * k + 2.0 for k, at in enumerate(relative)), relative
    assert all(b - a >= 1.5 - START_LAG for a, b in itertools.pairwise(relative)), relative
    # Never more than the rate in a rolling period (one more where a window meets a boundary).
    assert max(sum(1 for u in times if t <= u < t + 3.0) for t in times) <= 2 + 1, relative


def test_skip_finishes_the_job_without_its_body(rc: redis.Redis, queue: Queue, batch: str) -> None:
    finished(queue.enqueue(rate_jobs.skipped, batch, 0))
    skipped = queue.enqueue(rate_jobs.skipped, batch, 1)
    finished(skipped)
    skipped.refresh()
    record = skipped.meta[META_KEY]
    assert record["outcome"] == "rate_limited"
    assert record["rate"]["policy"] == "skip"
    assert 0 < record["rate"]["retry_after"] <= 60
    assert skipped.return_value() is None
    assert [label for label, _, _ in starts(rc, "skipped", batch)] == ["0"]


def test_a_deferral_without_a_scheduler_fails_naming_with_scheduler(
    rc: redis.Redis, redis_server: RedisServer, workers: list[WorkerProcess], batch: str
) -> None:
    """No worker with a scheduler serves the queue (a --burst worker runs none): the deferred
    call fails, saying what to do, instead of waiting unseen in the ScheduledJobRegistry."""
    unscheduled = Queue(UNSCHEDULED, connection=rc)
    first = unscheduled.enqueue(rate_jobs.per_minute, batch, 0)
    deferred = unscheduled.enqueue(rate_jobs.per_minute, batch, 1)
    burst = subprocess.run(
        [RQ_CLI, "worker", "--burst", "--url", redis_server.url, UNSCHEDULED],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, timeout=60,
    )  # fmt: skip
    assert burst.returncode == 0, burst.stdout + burst.stderr
    # The burst worker has exited: every job it took has its final status.
    assert status(first) is JobStatus.FINISHED
    assert status(deferred) is JobStatus.FAILED
    failure = deferred.latest_result()
    assert failure is not None
    assert failure.exc_string is not None
    assert "ConfigurationError" in failure.exc_string
    assert "--with-scheduler" in failure.exc_string
    assert not rc.zcard(unscheduled.scheduled_job_registry.key)
    assert [label for label, _, _ in starts(rc, "per_minute", batch)] == ["0"]
