"""RQ workflows: a job that ``depends_on`` a singleton job which met its running twin.

RQ releases a dependent when the job it depends on ends. A duplicate ends at once (skipped, or
failed with ``on_duplicate="raise"``) while its twin is still doing the work, so its dependents
must also wait for the twin, and fail loudly where that cannot be arranged: "email the report
after the rebuild" must never email before the rebuild is done.

What ran, and in which order, is read from events the jobs append to one Redis list with the
server's clock (:func:`jobs.record_event`), never from sleeps. The scenario from the issue runs in
forking ``rq worker`` processes with a twin that really runs; the other cases use the in-process
worker, where the running twin is a job on a queue of its own that the test drains later while
the test holds the lock in that job's name, as the job would while running.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue
from rq.job import Dependency, Job, JobStatus

from tasklock.rq import META_KEY
from tests.integration.rq import jobs
from tests.integration.rq.support import drain, hold, rq_workers, status, wait_status
from tests.support.polling import eventually
from tests.support.servers import RedisServer

TWIN_QUEUE = "tasklock-twin"


@pytest.fixture
def twin_queue(r: redis.Redis) -> Queue:
    """Where the in-process tests keep the twin until it is its turn to run."""
    return Queue(TWIN_QUEUE, connection=r)


def events(r: redis.Redis, name: str) -> list[tuple[str, str]]:
    """(event, job id) in the order the jobs recorded them; the server clock agrees."""
    recorded = [json.loads(v) for v in r.lrange(f"events:{name}", 0, -1)]
    stamps = [e["at"] for e in recorded]
    assert stamps == sorted(stamps), f"events out of clock order: {recorded}"
    return [(e["event"], e["job"]) for e in recorded]


def meta(job: Job) -> dict[str, Any]:
    job.refresh()
    record = job.meta.get(META_KEY)
    assert isinstance(record, dict), f"no tasklock record in job.meta: {job.meta}"
    return record


def failure(job: Job) -> str:
    assert status(job) is JobStatus.FAILED, f"job {job.id} is {status(job)}, not failed"
    result = job.latest_result()
    assert result is not None
    return str(result.exc_string)


def dependencies(job: Job) -> set[str]:
    """The jobs RQ waits for before it releases ``job`` (its dependencies set in Redis)."""
    return set(job.dependency_ids)


# -- the scenario, in forking workers ---------------------------------------------------
@pytest.mark.slow
@pytest.mark.timeout(90)
def test_dependent_of_a_skipped_duplicate_runs_after_the_twins_work(
    r: redis.Redis, redis_server: RedisServer, queue: Queue, tmp_path: Path
) -> None:
    """a runs; b (its duplicate) is skipped; d = enqueue(email, depends_on=b) waits for a."""
    gate = "gate:report"
    with rq_workers(redis_server.url, 2, tmp_path) as workers:
        a = queue.enqueue(jobs.rebuild, "report", gate)
        eventually(
            lambda: events(r, "report") == [("rebuild-start", a.id)],
            timeout=20,
            what="the first rebuild running in a work horse",
        )
        # As in the issue, d depends on b before a worker takes b: b is saved, d is deferred on
        # it, then b is queued (two plain enqueues would race the idle worker for that order).
        b = queue.create_job(jobs.rebuild, args=("report", gate))
        b.save()
        d = queue.enqueue(jobs.email_report, "report", depends_on=b)
        assert status(d) is JobStatus.DEFERRED
        queue.enqueue_job(b)

        assert wait_status(b, JobStatus.FINISHED, JobStatus.FAILED) is JobStatus.FINISHED, workers[
            1
        ].log()
        # b is finished and the rebuild is still running: d must still be waiting, now for a too.
        assert status(d) is JobStatus.DEFERRED
        assert dependencies(d) == {b.id, a.id}
        record = meta(b)
        assert record["outcome"] == "skipped"
        assert record["duplicate"]["holder"].split().count(f"task={a.id}") == 1
        assert record["dependents"] == {"after": a.id, "jobs": [d.id]}

        r.rpush(gate, "open")
        assert wait_status(a, JobStatus.FINISHED, JobStatus.FAILED) is JobStatus.FINISHED
        assert wait_status(d, JobStatus.FINISHED, JobStatus.FAILED) is JobStatus.FINISHED
    assert events(r, "report") == [
        ("rebuild-start", a.id),
        ("rebuild-end", a.id),
        ("email", d.id),
    ]
    assert not r.keys("tasklock:*:lock:*")


# -- the other policies and outcomes, in-process --------------------------------------------------
def test_dependent_allowing_failure_of_a_raised_duplicate_waits_for_the_twin(
    r: redis.Redis, queue: Queue, twin_queue: Queue
) -> None:
    """on_duplicate="raise" fails b, and RQ releases a dependent that allows failures at once."""
    a = twin_queue.enqueue(jobs.rebuild_strict, "r")
    holder = hold(r, jobs.rebuild_strict, "r", task=a.id)  # a is running
    try:
        b = queue.enqueue(jobs.rebuild_strict, "r")
        d = queue.enqueue(jobs.email_report, "r", depends_on=Dependency([b], allow_failure=True))
        assert drain(queue)
        assert "DuplicateJob" in failure(b)
        assert status(d) is JobStatus.DEFERRED
        assert meta(b)["dependents"] == {"after": a.id, "jobs": [d.id]}
    finally:
        holder.release()
    assert drain(twin_queue)  # a's turn: it does the work, then RQ releases d
    assert drain(queue)
    assert status(d) is JobStatus.FINISHED
    assert events(r, "r") == [("rebuild-start", a.id), ("rebuild-end", a.id), ("email", d.id)]


@pytest.mark.parametrize("allow_failure", [False, True], ids=["plain", "allow_failure"])
def test_dependent_of_a_skipped_duplicate_follows_the_twins_outcome(
    r: redis.Redis, queue: Queue, twin_queue: Queue, allow_failure: bool
) -> None:
    """The work failed in the twin: d behaves as if it depended on the twin itself."""
    a = twin_queue.enqueue(jobs.rebuild, "r", fail=True)
    holder = hold(r, jobs.rebuild, "r", task=a.id)
    try:
        b = queue.enqueue(jobs.rebuild, "r")
        d = queue.enqueue(
            jobs.email_report, "r", depends_on=Dependency([b], allow_failure=allow_failure)
        )
        assert drain(queue)
        assert status(b) is JobStatus.FINISHED
        assert status(d) is JobStatus.DEFERRED
    finally:
        holder.release()
    assert drain(twin_queue)
    assert "failed on purpose" in failure(a)
    drain(queue)
    expected = [("rebuild-start", a.id), ("rebuild-end", a.id)]
    if allow_failure:
        assert status(d) is JobStatus.FINISHED
        expected.append(("email", d.id))
    else:
        assert status(d) is JobStatus.DEFERRED  # as RQ keeps the dependent of a failed job
    assert events(r, "r") == expected


def test_twin_that_finished_meanwhile_leaves_the_dependent_to_the_duplicate(
    r: redis.Redis, queue: Queue, twin_queue: Queue
) -> None:
    """b saw a holding the lock, and a finished before b attached d to it: b releases d."""
    a = twin_queue.enqueue(jobs.rebuild, "r")
    assert drain(twin_queue)
    assert status(a) is JobStatus.FINISHED
    holder = hold(r, jobs.rebuild, "r", task=a.id)  # the lock as b found it
    try:
        b = queue.enqueue(jobs.rebuild, "r")
        d = queue.enqueue(jobs.email_report, "r", depends_on=b)
        assert drain(queue)
    finally:
        holder.release()
    assert meta(b)["outcome"] == "skipped"
    assert status(d) is JobStatus.FINISHED
    assert dependencies(d) == {b.id, a.id}
    assert events(r, "r") == [("rebuild-start", a.id), ("rebuild-end", a.id), ("email", d.id)]
    # a's dependents set, made again after a's run, expires with a instead of staying for ever
    assert r.pttl(Job.dependents_key_for(a.id)) > 0


@pytest.mark.parametrize("task", [None, "job-of-another-redis"], ids=["no-job", "unknown-job"])
def test_skipped_duplicate_whose_dependents_cannot_follow_the_twin_fails(
    r: redis.Redis, queue: Queue, task: str | None
) -> None:
    """The holder is no RQ job of this Redis (a direct call, another RQ Redis sharing the lock
    server): nothing in RQ ends with its work, so b fails visibly and d stays deferred."""
    holder = hold(r, jobs.rebuild, "r", task=task)
    try:
        b = queue.enqueue(jobs.rebuild, "r")
        d = queue.enqueue(jobs.email_report, "r", depends_on=b)
        assert drain(queue)
    finally:
        holder.release()
    text = failure(b)
    assert "tasklock.errors.DuplicateJob" in text
    assert "a call with the same key is running" in text
    assert d.id in text
    assert "cannot be ordered after" in text
    record = meta(b)
    assert record["outcome"] == "duplicate"
    assert record["dependents"]["jobs"] == [d.id]
    assert "not_ordered" in record["dependents"]
    assert status(d) is JobStatus.DEFERRED
    assert events(r, "r") == []


def test_skipped_duplicate_without_dependents_still_finishes_at_once(
    r: redis.Redis, queue: Queue
) -> None:
    """Nothing changes for a duplicate nobody depends on, whoever holds the lock."""
    holder = hold(r, jobs.rebuild, "r")
    try:
        b = queue.enqueue(jobs.rebuild, "r")
        assert drain(queue)
    finally:
        holder.release()
    assert status(b) is JobStatus.FINISHED
    record = meta(b)
    assert record["outcome"] == "skipped"
    assert "dependents" not in record


def test_depends_on_a_deduplicated_submission_is_depends_on_the_twin(
    r: redis.Redis, queue: Queue
) -> None:
    """With dedupe_enqueue the handle of a duplicate submission is the twin itself, so a
    dependent added at any time waits for the real work."""
    a = jobs.rebuild_deduped.enqueue(queue, "r")
    b = jobs.rebuild_deduped.enqueue(queue, "r")
    assert b.id == a.id
    d = queue.enqueue(jobs.email_report, "r", depends_on=b)
    assert drain(queue)
    assert status(d) is JobStatus.FINISHED
    assert events(r, "r") == [("rebuild-start", a.id), ("rebuild-end", a.id), ("email", d.id)]
