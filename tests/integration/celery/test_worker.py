"""SingletonTask in a real (in-process) Celery worker: Redis broker and result backend on the
module's own redis-server, the threads pool so that twins really run at the same time.

Task bodies synchronise with the tests through :class:`Gates` (threading events: the worker is a
thread of this process), never through sleeps.
"""

from __future__ import annotations

import datetime
import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery, chord, group
from celery.exceptions import ChordError, Ignore, Reject
from celery.result import AsyncResult
from kombu.exceptions import OperationalError

from tasklock import stats
from tasklock.celery import DUPLICATE, singleton_task
from tasklock.core.keys import wake_channel
from tasklock.errors import BackendUnavailable, DuplicateTask, KeyEncodingError
from tests.integration.celery.support import (
    Gates,
    clear_tasklock_keys,
    configure,
    in_process_worker,
)
from tests.support.polling import eventually
from tests.support.servers import RedisServer, free_port

app = Celery("tl_worker_tests", set_as_current=False)
DEAD_URL = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there


GATES = Gates()
RUNS: list[dict[str, Any]] = []  # every body that ran: task, args, fence, start/end


def body(task: str, account: int, gate: str | None, fence_token: int | None) -> int | None:
    run = {"task": task, "account": account, "fence": fence_token, "start": time.monotonic_ns()}
    RUNS.append(run)
    if gate:
        GATES[f"{gate}:entered"].set()
        assert GATES[f"{gate}:finish"].wait(30), "the test never let the body finish"
    run["end"] = time.monotonic_ns()
    return fence_token


def runs(task: str, account: int) -> list[dict[str, Any]]:
    return [r for r in RUNS if r["task"] == task and r["account"] == account]


def policy_task(name: str, **options: Any) -> Any:
    @singleton_task(app=app, name=name, key=["account"], fencing=True, **options)
    def task(account: int, gate: str | None = None, fence_token: int | None = None) -> Any:
        return body(name, account, gate, fence_token)

    return task


skip_task = policy_task("w.skip")
quiet_skip_task = policy_task("w.quiet_skip", ignore_result=True)
raise_task = policy_task("w.raise", on_duplicate="raise")
retry_task = policy_task("w.retry", on_duplicate="retry", ttl=1, max_retries=50)
wait_task = policy_task("w.wait", on_duplicate="wait", wait_timeout=20)
short_wait_task = policy_task("w.short_wait", on_duplicate="wait", wait_timeout=0.3)
deduped = policy_task("w.deduped", dedupe_enqueue=True)
deduped_soon = policy_task("w.deduped_soon", dedupe_enqueue=True, pending_ttl=2)


@singleton_task(app=app, name="w.bound", bind=True, fencing="token", on_duplicate="raise")
def bound_task(self: Any, account: int, token: int | None = None) -> list[Any]:
    return [token, self.request.fence_token, self.request.id]


@singleton_task(
    app=app, name="w.retries_itself", bind=True, on_duplicate="raise", dedupe_enqueue=True
)
def retries_itself(self: Any, account: int) -> int:
    """Retries once, and keeps its first attempt's lock until the retry waits on it."""
    guard = self.tasklock_guard
    marker = guard._client().get(guard.pending_key((account,), {}))
    RUNS.append(
        {"task": "w.retries_itself", "account": account, "retries": self.request.retries,
         "marker": marker}
    )  # fmt: skip
    if self.request.retries == 0:
        retry = self.retry(countdown=0, throw=False)
        channel = wake_channel(guard.lock_key((account,), {}))
        client = guard._client()
        eventually(
            lambda: client.pubsub_numsub(channel)[0][1] > 0,
            timeout=20,
            what="the retry waiting for this attempt's lock",
        )
        raise retry
    return self.request.retries  # type: ignore[no-any-return]


@singleton_task(app=app, name="w.keyed", bind=True, dedupe_enqueue=True)
def keyed(self: Any, a: int, b: Any = (1, 2), *, c: Any = None) -> bool:
    # True when the lock held right now is the one the producer's key names.
    expected = EXPECTED_KEYS[self.request.id]
    return bool(self.tasklock_guard._client().exists(expected))


EXPECTED_KEYS: dict[str, str] = {}


@singleton_task(app=app, name="w.raises", key=["kind"])
def raises(kind: str) -> None:
    RUNS.append({"task": "w.raises", "account": 0, "kind": kind})
    if kind == "error":
        raise ValueError("boom")
    if kind == "ignore":
        raise Ignore()
    if kind == "reject":
        raise Reject("no", requeue=False)


@singleton_task(app=app, name="w.failing", dedupe_enqueue=True)
def failing(account: int) -> None:
    raise ValueError("for good")


@singleton_task(app=app, name="w.down_raise", url=DEAD_URL)
def down_raise(account: int) -> int:
    RUNS.append({"task": "w.down_raise", "account": account})
    return account


@singleton_task(app=app, name="w.down_run", url=DEAD_URL, on_backend_error="run")
def down_run(account: int) -> int:
    RUNS.append({"task": "w.down_run", "account": account})
    return account


@app.task(name="w.collect")
def collect(results: list[Any]) -> list[Any]:
    return results


@singleton_task(app=app, name="w.nan")
def nan_arg(value: float) -> None: ...


@pytest.fixture(scope="module")
def worker(redis_server: RedisServer) -> Iterator[Any]:
    configure(app, redis_server.url, task_default_queue="tl_worker_tests")
    with in_process_worker(app) as running:
        yield running


@pytest.fixture
def rc(redis_server: RedisServer, worker: Any) -> Iterator[redis.Redis]:
    client = redis_server.client()
    clear_tasklock_keys(client)
    RUNS.clear()
    yield client
    client.close()


def finish(gate: str) -> None:
    GATES[f"{gate}:finish"].set()


def start_holder(task: Any, account: int, gate: str) -> AsyncResult[Any]:
    """Send a call that holds its lock until ``finish(gate)``; return once its body runs."""
    result = task.delay(account, gate=gate)
    assert GATES[f"{gate}:entered"].wait(20), "the holder never started"
    return result


def state_becomes(result: AsyncResult[Any], state: str) -> None:
    eventually(lambda: result.state == state, timeout=20, what=f"{result.id} in state {state}")


# -- on_duplicate ---------------------------------------------------------------------------------
def test_skip_is_a_distinct_state_logged_and_counted(
    rc: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    before = stats.snapshot().get("duplicate_skip:w.skip", 0)
    with caplog.at_level(logging.INFO, logger="tasklock"):
        holder = start_holder(skip_task, 1, "skip")
        try:
            twin = skip_task.delay(1)
            state_becomes(twin, DUPLICATE)
        finally:
            finish("skip")
        assert holder.get(timeout=20) == runs("w.skip", 1)[0]["fence"]
    info = twin.info
    assert info["reason"] == "duplicate"
    assert info["key"] == skip_task.tasklock_guard.lock_key((1,), {})
    assert holder.id in info["holder"]
    assert len(runs("w.skip", 1)) == 1
    assert stats.snapshot()["duplicate_skip:w.skip"] == before + 1
    assert any(
        info["key"] in r.getMessage() and holder.id in r.getMessage() for r in caplog.records
    )
    # No exception noise: Celery logs an ignored task at INFO, without a traceback.
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_skip_with_ignore_result_stores_nothing(rc: redis.Redis) -> None:
    before = stats.snapshot().get("duplicate_skip:w.quiet_skip", 0)
    holder = start_holder(quiet_skip_task, 2, "quiet")
    try:
        twin = quiet_skip_task.delay(2)
        eventually(lambda: stats.snapshot().get("duplicate_skip:w.quiet_skip", 0) == before + 1)
    finally:
        finish("quiet")
    eventually(lambda: not rc.keys("tasklock:{w.quiet_skip}:lock:*"))
    assert twin.state == "PENDING"  # ignore_result: no state is stored, not even DUPLICATE
    assert holder.state == "PENDING"


def test_skip_inside_a_chord_fails_the_chord_instead_of_leaving_it_waiting(
    rc: redis.Redis,
) -> None:
    """Celery's Ignore never reports a chord part, so a skipped member would leave the chord
    waiting for ever: inside a chord, a skip fails the member with DuplicateTask instead."""
    holder = start_holder(skip_task, 7, "chord")
    try:
        workflow = chord([skip_task.s(7), skip_task.s(8)], collect.s()).apply_async()
        # get() re-raises the failed member's error; the callback itself fails with ChordError.
        with pytest.raises(DuplicateTask, match="same key is running"):
            workflow.get(timeout=20)
        state_becomes(workflow, "FAILURE")
    finally:
        finish("chord")
    assert isinstance(workflow.result, ChordError)
    assert "DuplicateTask" in str(workflow.result)
    assert holder.get(timeout=20) == runs("w.skip", 7)[0]["fence"]
    assert len(runs("w.skip", 7)) == 1
    assert len(runs("w.skip", 8)) == 1


def test_raise_survives_the_result_backend(
    rc: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    holder = start_holder(raise_task, 3, "raise")
    try:
        twin = raise_task.delay(3)
        with pytest.raises(DuplicateTask) as info:
            twin.get(timeout=20)
    finally:
        finish("raise")
    error = info.value
    assert type(error) is DuplicateTask
    assert error.key == raise_task.tasklock_guard.lock_key((3,), {})
    assert holder.id in str(error.holder)
    assert "same key is running" in str(error)
    assert twin.state == "FAILURE"
    holder.get(timeout=20)
    # DuplicateTask is in the task's `throws`: logged as expected, without a traceback.
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_retry_waits_out_the_holder(rc: redis.Redis) -> None:
    holder = start_holder(retry_task, 4, "retry")
    try:
        twin = retry_task.delay(4)
        eventually(lambda: twin.state == "RETRY", timeout=20)
        assert isinstance(twin.result, DuplicateTask)
    finally:
        finish("retry")
    holder_fence = holder.get(timeout=20)
    assert twin.get(timeout=30) > holder_fence  # ran after the holder, with a later fence
    assert len(runs("w.retry", 4)) == 2


def test_own_retry_is_not_blocked_by_its_own_lock(rc: redis.Redis) -> None:
    result = retries_itself.delay(5)
    assert result.get(timeout=30) == 1  # on_duplicate="raise" would have failed it
    attempts = runs("w.retries_itself", 5)
    assert [a["retries"] for a in attempts] == [0, 1]
    # The dedupe marker names the task id in both attempts, and is gone afterwards.
    assert [a["marker"] for a in attempts] == [result.id.encode()] * 2
    eventually(lambda: not rc.keys("tasklock:{w.retries_itself}:pending:*"))


def test_wait_runs_after_the_release(rc: redis.Redis) -> None:
    holder = start_holder(wait_task, 6, "wait")
    twin = wait_task.delay(6)
    channel = wake_channel(wait_task.tasklock_guard.lock_key((6,), {}))
    eventually(lambda: rc.pubsub_numsub(channel)[0][1] > 0, what="the twin waiting")
    finish("wait")
    assert twin.get(timeout=20) > holder.get(timeout=20)
    first, second = runs("w.wait", 6)
    assert second["start"] >= first["end"]


def test_wait_timeout_follows_on_wait_timeout(rc: redis.Redis) -> None:
    holder = start_holder(short_wait_task, 7, "short")
    try:
        with pytest.raises(DuplicateTask, match="after waiting"):
            short_wait_task.delay(7).get(timeout=20)
    finally:
        finish("short")
    holder.get(timeout=20)


# -- fencing ---------------------------------------------------------------------------------------
def test_fence_tokens_increase_and_bound_tasks_see_them(rc: redis.Redis) -> None:
    tokens = [bound_task.delay(8).get(timeout=20) for _ in range(3)]
    fences = [t[0] for t in tokens]
    assert all(isinstance(f, int) for f in fences)
    assert fences == sorted(fences)
    assert len(set(fences)) == 3
    assert all(token == seen for token, seen, _ in tokens)  # request.fence_token
    assert all(task_id for _, _, task_id in tokens)


# -- dedupe_enqueue --------------------------------------------------------------------------------
def test_dedupe_returns_the_pending_twin_without_sending(rc: redis.Redis) -> None:
    parked = "tl_parked"  # no worker consumes this queue
    first = deduped.apply_async((9,), queue=parked)
    again = deduped.apply_async((9,), {"gate": None}, queue=parked)
    other = deduped.apply_async((10,), queue=parked)
    assert again.id == first.id
    assert other.id != first.id
    assert rc.llen(parked) == 2  # the twin sent no message
    marker = deduped.tasklock_guard.pending_key((9,), {})
    assert rc.get(marker) == first.id.encode()
    assert 0 < rc.pttl(marker) <= 3600 * 1000  # pending_ttl
    # pending_ttl=2 s, plus the time until a countdown/eta call is due.
    deduped_soon.apply_async((9,), queue=parked)
    assert 0 < rc.pttl(deduped_soon.tasklock_guard.pending_key((9,), {})) <= 2000
    deduped_soon.apply_async((10,), queue=parked, countdown=60)
    assert 60_000 < rc.pttl(deduped_soon.tasklock_guard.pending_key((10,), {})) <= 62_000
    eta = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=120)
    deduped_soon.apply_async((11,), queue=parked, eta=eta)
    assert 120_000 < rc.pttl(deduped_soon.tasklock_guard.pending_key((11,), {})) <= 122_000
    rc.delete(parked)


def test_dedupe_marker_cleared_on_success_and_final_failure(rc: redis.Redis) -> None:
    first = deduped.delay(11)
    assert first.get(timeout=20) is not None
    eventually(lambda: not rc.exists(deduped.tasklock_guard.pending_key((11,), {})))
    assert deduped.delay(11).id != first.id  # a new call after the first finished is sent
    failed = failing.delay(12)
    with pytest.raises(ValueError, match="for good"):
        failed.get(timeout=20)
    eventually(lambda: not rc.exists(failing.tasklock_guard.pending_key((12,), {})))


def test_dedupe_marker_cleared_on_revoke(rc: redis.Redis) -> None:
    result = deduped.apply_async((13,), countdown=1)
    marker = deduped.tasklock_guard.pending_key((13,), {})
    assert rc.get(marker) == result.id.encode()
    result.revoke()
    eventually(lambda: result.state == "REVOKED", timeout=20)
    eventually(lambda: not rc.exists(marker), what="marker cleared by task_revoked")
    assert not runs("w.deduped", 13)


def test_dedupe_marker_cleared_when_sending_fails(
    redis_server: RedisServer, rc: redis.Redis
) -> None:
    dead_broker = Celery("dead_broker", set_as_current=False)
    configure(dead_broker, DEAD_URL, tasklock_url=redis_server.url)
    dead_broker.conf.update(
        result_backend=redis_server.url,  # only the broker is unreachable
        broker_connection_retry=False,
        broker_connection_timeout=1,
        broker_transport_options={"max_retries": 0},
    )

    @singleton_task(app=dead_broker, name="w.unsendable", dedupe_enqueue=True, shared=False)
    def unsendable(account: int) -> None: ...

    with pytest.raises(OperationalError):
        unsendable.apply_async((14,), retry=False)
    assert not rc.keys("tasklock:{w.unsendable}:pending:*")


def test_dedupe_replaces_a_marker_whose_twin_is_over(rc: redis.Redis) -> None:
    finished = deduped.delay(15)
    finished.get(timeout=20)
    marker = deduped.tasklock_guard.pending_key((15,), {})
    eventually(lambda: not rc.exists(marker))
    rc.set(marker, finished.id)  # a clean-up that never happened (e.g. a worker killed outright)
    fresh = deduped.delay(15)
    assert fresh.id != finished.id
    fresh.get(timeout=20)


def test_dedupe_never_swallows_a_canvas_member(rc: redis.Redis) -> None:
    results = group(deduped.s(16), deduped.s(16)).apply_async()
    assert len({r.id for r in results.results}) == 2  # both sent, under their own ids
    # Both reach the worker: each runs, or is skipped there by the execution lock.
    eventually(lambda: all(r.state in ("SUCCESS", DUPLICATE) for r in results.results))
    skipped = [r for r in results.results if r.state == DUPLICATE]
    assert len(runs("w.deduped", 16)) + len(skipped) == 2


# -- keys ------------------------------------------------------------------------------------------
def test_producer_and_worker_compute_one_key(rc: redis.Redis) -> None:
    calls = [((1,), {}), ((), {"a": 1}), ((1, [1, 2]), {"c": None}), ((1, (1, 2)), {})]
    parked = "tl_parked_keys"
    ids = {keyed.apply_async(args, kwargs, queue=parked).id for args, kwargs in calls}
    assert len(ids) == 1  # one pending call for all four shapes
    rc.delete(parked)
    clear_tasklock_keys(rc)
    for number, (args, kwargs) in enumerate(calls):
        task_id = f"keyed-{number}"
        EXPECTED_KEYS[task_id] = keyed.tasklock_guard.lock_key(args, kwargs)
        assert keyed.apply_async(args, kwargs, task_id=task_id).get(timeout=20) is True


def test_unencodable_arguments_are_named(rc: redis.Redis) -> None:
    with pytest.raises(KeyEncodingError, match="argument 'account'"):
        deduped.delay(object())  # at the producer, before anything is sent
    failed = nan_arg.delay(math.nan)  # JSON sends NaN; the worker cannot key it
    with pytest.raises(KeyEncodingError, match=r"argument 'value' is nan \(a float\): NaN"):
        failed.get(timeout=20)


# -- release ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["error", "ignore", "reject", "ok"])
def test_lock_released_whatever_the_body_ends_with(rc: redis.Redis, kind: str) -> None:
    result = raises.delay(kind)
    eventually(lambda: runs("w.raises", 0), what="the body ran")
    eventually(lambda: not rc.keys("tasklock:{w.raises}:lock:*"), what="the lock released")
    if kind in ("error", "reject"):
        state_becomes(result, "FAILURE")


def test_send_task_goes_through_the_execution_lock(rc: redis.Redis) -> None:
    holder = start_holder(skip_task, 17, "send_task")
    try:
        twin = app.send_task("w.skip", (17,))
        state_becomes(twin, DUPLICATE)
    finally:
        finish("send_task")
    holder.get(timeout=20)
    assert len(runs("w.skip", 17)) == 1


# -- Redis unreachable ---------------------------------------------------------------------------
def test_backend_error_raise_fails_closed(rc: redis.Redis) -> None:
    result = down_raise.delay(18)
    with pytest.raises(BackendUnavailable, match="did not answer"):
        result.get(timeout=30)
    assert not runs("w.down_raise", 18)


def test_backend_error_run_runs_unlocked_and_warns(
    rc: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    before = stats.snapshot().get("ran_unlocked:w.down_run", 0)
    with caplog.at_level(logging.WARNING, logger="tasklock"):
        assert down_run.delay(19).get(timeout=30) == 19
    assert runs("w.down_run", 19)
    assert stats.snapshot()["ran_unlocked:w.down_run"] == before + 1
    assert any("WITHOUT the lock" in r.getMessage() for r in caplog.records)
