"""@singleton_job with a real RQ SimpleWorker in this process, against a real redis-server.

Fast scenarios: the lock around the body, every on_duplicate policy, fencing, key equivalence
between producer and worker, dedupe_enqueue and its marker's life, Redis unreachable, and the
errors that must name what is wrong.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import redis
from rq import Queue, Retry
from rq.job import Job, JobStatus
from rq.timeouts import JobTimeoutException

import tasklock
from tasklock import stats
from tasklock.core.base import BaseLock
from tasklock.errors import ConfigurationError, KeyEncodingError
from tasklock.guard import reset_all
from tasklock.rq import META_KEY
from tests.integration.rq import jobs
from tests.integration.rq.support import drain, hold, status
from tests.support.polling import eventually
from tests.support.servers import free_port

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = pytest.mark.usefixtures("resp")


def meta(job: Job) -> dict[str, Any]:
    job.refresh()
    record = job.meta.get(META_KEY)
    assert isinstance(record, dict), f"no tasklock record in job.meta: {job.meta}"
    return record


def failure(job: Job) -> str:
    job.refresh()
    assert status(job) is JobStatus.FAILED, f"job {job.id} is {status(job)}, not failed"
    result = job.latest_result()
    assert result is not None
    assert result.exc_string
    return str(result.exc_string)


def ran(r: redis.Redis, name: str) -> list[str]:
    return [v.decode() for v in r.lrange(f"ran:{name}", 0, -1)]


def dead_url() -> str:
    return f"redis://127.0.0.1:{free_port()}/0"


# -- the lock around the body ----------------------------------------------------------------
def test_body_runs_under_its_lock_which_is_gone_afterwards(r: redis.Redis, queue: Queue) -> None:
    job = queue.enqueue(jobs.settle, 42, "2026-11-21")
    assert drain(queue)
    assert status(job) is JobStatus.FINISHED
    assert job.return_value()["held"] is True
    key = jobs.settle.tasklock.guard.lock_key((42, "2026-11-21"), {})
    assert not r.exists(key)
    assert stats.snapshot()["acquired:tests.integration.rq.jobs.settle"] == 1


def test_lock_key_is_the_task_name_and_call(r: redis.Redis, queue: Queue) -> None:
    key = jobs.settle.tasklock.guard.lock_key((42, "d"), {})
    assert key.startswith("tasklock:{tests.integration.rq.jobs.settle}:lock:")
    # key=["account_id"]: the day is not part of the key
    assert key == jobs.settle.tasklock.guard.lock_key((42, "other day"), {})


def test_bare_decorator_and_wrapper_keep_the_function_identity(queue: Queue) -> None:
    assert jobs.bare.__name__ == "bare"
    assert jobs.bare.__module__ == "tests.integration.rq.jobs"
    assert jobs.bare.__wrapped__.__name__ == "bare"  # type: ignore[attr-defined]
    job = jobs.bare.enqueue(queue, "x")
    assert job.func_name == "tests.integration.rq.jobs.bare"
    assert drain(queue)
    assert job.return_value() == "x"


# -- key equivalence: the producer and the worker compute one key ----------------------------
@pytest.mark.parametrize(
    ("args", "kwargs"),
    [((42, "d"), {}), ((), {"account_id": 42, "day": "d"}), ((42,), {"day": "d"})],
    ids=["positional", "keywords", "mixed"],
)
def test_worker_key_equals_producer_key(
    r: redis.Redis, queue: Queue, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    producer_key = jobs.settle.tasklock.guard.lock_key((42, "d"), {})
    holder = hold(r, jobs.settle, 42, "d")
    try:
        job = queue.enqueue(jobs.settle, *args, **kwargs)
        assert drain(queue)
    finally:
        holder.release()
    record = meta(job)
    assert record["outcome"] == "skipped"
    assert record["duplicate"]["key"] == producer_key
    assert ran(r, "settle") == []


def test_tuple_and_list_and_defaults_key_alike(r: redis.Redis, queue: Queue) -> None:
    holder = hold(r, jobs.tally, [1, 2, 3])  # mode defaults to "sum"
    try:
        job = queue.enqueue(jobs.tally, (1, 2, 3), mode="sum")  # a tuple survives RQ's pickle
        assert drain(queue)
    finally:
        holder.release()
    assert meta(job)["outcome"] == "skipped"
    other = queue.enqueue(jobs.tally, (1, 2, 3), mode="len")
    assert drain(queue)
    assert other.return_value() == 3


# -- on_duplicate ----------------------------------------------------------------------------
def test_skip_finishes_without_the_body_logged_counted_and_in_meta(
    r: redis.Redis, queue: Queue, caplog: pytest.LogCaptureFixture
) -> None:
    holder = hold(r, jobs.settle, 7, "d")
    try:
        with caplog.at_level(logging.INFO, logger="tasklock"):
            job = jobs.settle.enqueue(queue, 7, "d")
            assert drain(queue)
    finally:
        holder.release()
    assert status(job) is JobStatus.FINISHED
    assert job.return_value() is None
    assert ran(r, "settle") == []
    record = meta(job)
    assert record["outcome"] == "skipped"
    assert "test-holder" in record["duplicate"]["holder"]
    assert record["duplicate"]["holder_ttl"] > 0
    key = jobs.settle.tasklock.guard.lock_key((7, "d"), {})
    assert any(key in m and "skip" in m for m in caplog.messages), caplog.messages
    assert stats.snapshot()["duplicate_skip:tests.integration.rq.jobs.settle"] == 1


def test_raise_fails_the_job_with_duplicate_job(r: redis.Redis, queue: Queue) -> None:
    holder = hold(r, jobs.strict, "s")
    try:
        job = queue.enqueue(jobs.strict, "s")
        assert drain(queue)
    finally:
        holder.release()
    text = failure(job)
    key = jobs.strict.tasklock.guard.lock_key(("s",), {})
    assert "tasklock.errors.DuplicateJob" in text
    assert "a call with the same key is running" in text
    assert key in text
    assert "test-holder" in text
    assert meta(job)["outcome"] == "duplicate"
    assert ran(r, "strict") == []


def test_retry_without_a_scheduler_fails_clearly(r: redis.Redis, queue: Queue) -> None:
    holder = hold(r, jobs.patient, "p")
    try:
        job = jobs.patient.enqueue(queue, "p")
        assert drain(queue, with_scheduler=True)  # a burst worker's scheduler does not stay
    finally:
        holder.release()
    text = failure(job)
    assert "ConfigurationError" in text
    assert "--with-scheduler" in text
    assert "tasklock-test" in text
    assert ran(r, "patient") == []
    # failed for good: the dedupe marker is gone, a new enqueue is a new job
    assert jobs.patient.enqueue(queue, "p").id != job.id


def test_wait_runs_once_the_holder_releases(r: redis.Redis, queue: Queue) -> None:
    holder = hold(r, jobs.waiter, "w")
    job = queue.enqueue(jobs.waiter, "w")

    def release_when_the_job_waits() -> None:
        eventually(lambda: status(job) is JobStatus.STARTED, what="the job waiting for the lock")
        holder.release()

    releaser = threading.Thread(target=release_when_the_job_waits)
    releaser.start()
    try:
        assert drain(queue)
    finally:
        releaser.join(30)
    assert status(job) is JobStatus.FINISHED
    assert job.return_value() == {"name": "w", "held": True}


def test_wait_timeout_then_raises(r: redis.Redis, queue: Queue) -> None:
    holder = hold(r, jobs.impatient, "i")
    try:
        job = queue.enqueue(jobs.impatient, "i")
        assert drain(queue)
    finally:
        holder.release()
    text = failure(job)
    assert "DuplicateJob" in text
    assert "after waiting" in text
    assert ran(r, "impatient") == []


# -- fencing ---------------------------------------------------------------------------------
def test_fence_token_is_passed_in_and_stored_in_meta(queue: Queue) -> None:
    first = queue.enqueue(jobs.settle, 1, "d")
    second = queue.enqueue(jobs.settle, 1, "d")
    assert drain(queue)
    fences = [job.return_value()["fence"] for job in (first, second)]
    assert all(isinstance(f, int) for f in fences)
    assert fences[1] > fences[0]
    assert [meta(job)["fence"] for job in (first, second)] == fences
    assert meta(first)["outcome"] == "ran"


# -- dedupe_enqueue --------------------------------------------------------------------------
def test_dedupe_returns_the_queued_twin(r: redis.Redis, queue: Queue) -> None:
    first = jobs.deduped.enqueue(queue, "a")
    again = jobs.deduped.enqueue(queue, "a")
    keyword = jobs.deduped.enqueue(queue, name="a", fail=False)
    other = jobs.deduped.enqueue(queue, "b")
    assert again.id == keyword.id == first.id
    assert other.id != first.id
    assert queue.count == 2
    assert stats.snapshot()["deduplicated:tests.integration.rq.jobs.deduped"] == 2
    marker = jobs.deduped.tasklock.guard.pending_key(("a",), {})
    assert r.get(marker) == first.id.encode()
    assert drain(queue)
    assert ran(r, "deduped") == ["a", "b"]
    assert not r.exists(marker)  # cleared on success
    assert jobs.deduped.enqueue(queue, "a").id != first.id


def test_dedupe_returns_the_running_twin(queue: Queue) -> None:
    job = jobs.enqueues_twin.enqueue(queue, "t")
    assert drain(queue)
    result = job.return_value()
    assert result["twin"] == result["self"] == job.id
    assert queue.count == 0


def test_dedupe_marker_cleared_when_the_job_fails_for_good(r: redis.Redis, queue: Queue) -> None:
    job = jobs.deduped.enqueue(queue, "f", fail=True)
    assert drain(queue)
    assert "failed on purpose" in failure(job)
    assert not r.exists(jobs.deduped.tasklock.guard.pending_key(("f",), {"fail": True}))
    assert jobs.deduped.enqueue(queue, "f", fail=True).id != job.id


def test_dedupe_marker_survives_rq_retries(r: redis.Redis, queue: Queue) -> None:
    job = jobs.flaky.enqueue(queue, "x", retry=Retry(max=1))
    assert drain(queue, max_jobs=1)  # the first attempt fails; RQ requeues the same job
    assert status(job) is JobStatus.QUEUED
    assert jobs.flaky.enqueue(queue, "x").id == job.id
    assert drain(queue)
    assert job.return_value() == "x"
    assert not r.exists(jobs.flaky.tasklock.guard.pending_key(("x",), {}))


@pytest.mark.parametrize("how", ["cancel", "delete"])
def test_dedupe_marker_of_a_cancelled_or_deleted_job_is_replaced(
    r: redis.Redis, queue: Queue, how: str
) -> None:
    job = jobs.deduped.enqueue(queue, "c")
    getattr(job, how)()
    replacement = jobs.deduped.enqueue(queue, "c")
    assert replacement.id != job.id
    marker = jobs.deduped.tasklock.guard.pending_key(("c",), {})
    assert r.get(marker) == replacement.id.encode()
    assert drain(queue)
    assert ran(r, "deduped") == ["c"]


def test_dedupe_honours_an_explicit_job_id_and_rq_options(r: redis.Redis, queue: Queue) -> None:
    job = jobs.deduped.enqueue(queue, "o", job_id="my-own-id", meta={"mine": 1}, result_ttl=60)
    assert job.id == "my-own-id"
    assert jobs.deduped.enqueue(queue, "o").id == "my-own-id"
    assert r.get(jobs.deduped.tasklock.guard.pending_key(("o",), {})) == b"my-own-id"
    assert drain(queue)
    job.refresh()
    assert job.meta["mine"] == 1
    assert job.result_ttl == 60


# -- bad arguments and misuse -----------------------------------------------------------------
def test_unencodable_argument_fails_at_enqueue_naming_it(queue: Queue) -> None:
    with pytest.raises(KeyEncodingError, match=r"argument 'account_id' has type Opaque"):
        jobs.settle.enqueue(queue, jobs.Opaque(), "d")
    with pytest.raises(KeyEncodingError, match=r"argument 'name' has type Opaque"):
        jobs.deduped.enqueue(queue, jobs.Opaque())
    assert queue.count == 0


def test_unencodable_argument_enqueued_directly_fails_the_job_naming_it(queue: Queue) -> None:
    job = queue.enqueue(jobs.settle, jobs.Opaque(), "d")
    assert drain(queue)
    text = failure(job)
    assert "KeyEncodingError" in text
    assert "argument 'account_id' has type Opaque" in text


def test_enqueue_needs_the_queue_first(queue: Queue) -> None:
    with pytest.raises(TypeError, match=r"settle\.enqueue\(queue, \*args, \*\*kwargs\)"):
        jobs.settle.enqueue(42, "d")


def test_a_wrapper_bound_to_another_name_is_refused_at_enqueue(queue: Queue) -> None:
    with pytest.raises(ConfigurationError, match="WITHOUT the lock"):
        jobs.misbound.enqueue(queue, 1, 2)
    assert queue.count == 0


# -- direct calls ------------------------------------------------------------------------------
def test_direct_call_takes_the_same_lock(
    r: redis.Redis, redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigurationError, match="no Redis configured"):
        jobs.tally([1])
    monkeypatch.setenv("TASKLOCK_URL", redis_server.url)
    reset_all()
    assert jobs.tally([1, 2]) == 3
    holders = [hold(r, jobs.tally, [1, 2]), hold(r, jobs.strict, "s"), hold(r, jobs.patient, "p")]
    try:
        assert jobs.tally([1, 2]) is None  # skipped, as in a worker
        with pytest.raises(tasklock.DuplicateJob, match="a call with the same key is running"):
            jobs.strict("s")
        with pytest.raises(tasklock.DuplicateJob, match="this was a direct call"):
            jobs.patient("p")
    finally:
        for holder in holders:
            holder.release()


# -- Redis unreachable -------------------------------------------------------------------------
def test_unreachable_lock_redis_fails_the_job_closed(
    r: redis.Redis, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = dead_url()
    monkeypatch.setenv("TASKLOCK_URL", url)
    reset_all()
    job = queue.enqueue(jobs.bare, "x")
    assert drain(queue)
    text = failure(job)
    assert "BackendUnavailable" in text
    assert f"127.0.0.1:{url.split(':')[2].split('/')[0]}" in text
    assert ran(r, "bare") == []


def test_unreachable_lock_redis_with_run_runs_unlocked_and_warns(
    r: redis.Redis, queue: Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TASKLOCK_URL", dead_url())
    reset_all()
    job = queue.enqueue(jobs.fail_open, "x")
    with caplog.at_level(logging.WARNING, logger="tasklock"):
        assert drain(queue)
    assert job.return_value() == "x"
    assert ran(r, "fail_open") == ["x"]
    assert any("WITHOUT the lock" in m for m in caplog.messages)


def test_unreachable_marker_redis_at_enqueue(
    queue: Queue, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TASKLOCK_URL", dead_url())
    reset_all()
    with pytest.raises(tasklock.BackendUnavailable, match="marking"):
        jobs.deduped.enqueue(queue, "x")
    assert queue.count == 0
    with caplog.at_level(logging.WARNING, logger="tasklock"):
        job = jobs.fail_open_deduped.enqueue(queue, "x")
    assert queue.count == 1
    assert job.id in queue.job_ids
    assert any("WITHOUT deduplication" in m for m in caplog.messages)


def test_job_timeout_landing_right_after_the_acquire_still_releases(
    r: redis.Redis, queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RQ's timeout is asynchronous: it can arrive between the acquire script and the body. The
    fault is injected at that exact point (the real acquire ran, then the exception)."""
    original = BaseLock._start_hold

    def start_hold_then_time_out(
        self: BaseLock, value: bytes, fence: int | None, sent: float | None = None
    ) -> None:
        original(self, value, fence, sent)
        raise JobTimeoutException("Task exceeded maximum timeout value (injected)")

    monkeypatch.setattr(BaseLock, "_start_hold", start_hold_then_time_out)
    job = queue.enqueue(jobs.bare, "late")
    assert drain(queue)
    monkeypatch.undo()
    assert "JobTimeoutException" in failure(job)
    assert not r.exists(jobs.bare.tasklock.guard.lock_key(("late",), {}))
    assert ran(r, "bare") == []
