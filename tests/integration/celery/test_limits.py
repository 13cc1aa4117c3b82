"""``limit=N`` and ``dedupe_enqueue="until_start"`` under a real ``celery worker --pool=prefork``
subprocess: N bodies at once per key (never more, and N did run at once), and "one running + one
queued", proven from the recorded holds and the task ids the submissions got.

One worker (4 children) serves the module; every test uses its own keys, so nothing is flushed
between tests (kombu keeps its bindings in the same Redis).
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.result import AsyncResult

from tasklock import fleet
from tasklock.celery import DUPLICATE
from tasklock.core.keys import wake_channel
from tests.integration.celery import limits_app
from tests.integration.celery.support import WorkerProcess
from tests.support.history import HistoryLog, Hold, assert_at_most, assert_no_overlap
from tests.support.polling import eventually
from tests.support.servers import RedisServer

pytestmark = pytest.mark.slow

app = limits_app.app


@pytest.fixture(scope="module")
def worker(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    directory = tmp_path_factory.mktemp("limits")
    env = {"TL_LIMITS_URL": redis_server.url, "TL_LIMITS_DIR": str(directory)}
    app.conf.update(broker_url=redis_server.url, result_backend=redis_server.url)
    process = WorkerProcess(
        "tests.integration.celery.limits_app", env, directory / "worker.log", concurrency=4
    )
    try:
        yield process.start(app)
    finally:
        process.stop()


@pytest.fixture
def rc(redis_server: RedisServer, worker: WorkerProcess) -> Iterator[redis.Redis]:
    client = redis_server.client()
    yield client
    client.close()


@pytest.fixture
def directory(worker: WorkerProcess) -> Path:
    return worker.log_path.parent


def submit(task: Any, name: str, count: int) -> set[str]:
    """``count`` submissions of one call from as many threads at once; the task ids they got."""
    with ThreadPoolExecutor(count) as pool:
        return set(pool.map(lambda _: task.delay(name).id, range(count)))


def holds_of(directory: Path, task: str, name: str) -> list[Hold]:
    holds = HistoryLog(directory / "history.log").holds()
    return sorted((h for h in holds if h.name == f"{task}:{name}"), key=lambda h: h.start)


def count_renewals(rc: redis.Redis, key: str, count: int) -> None:
    """Wait until ``key``'s TTL has gone up ``count`` times: only a renewal makes it go up."""
    seen, last = 0, rc.pttl(key)

    def renewed() -> bool:
        nonlocal seen, last
        now = rc.pttl(key)
        if now > last + 50:
            seen += 1
        last = now
        return seen >= count

    eventually(renewed, timeout=30, interval=0.01, what=f"{count} renewals of {key}")


def waiting_for_a_permit(rc: redis.Redis, task: Any, *args: Any) -> None:
    """Wait until a call of ``task`` waits for the key of this call (it listens for a release)."""
    channel = wake_channel(task.tasklock_guard.lock_key(args, {}))
    eventually(
        lambda: rc.pubsub_numsub(channel)[0][1] > 0,
        timeout=30,
        what=f"a call of {task.name} waiting for a permit",
    )


# -- limit=N --------------------------------------------------------------------------------------
def test_limit_with_wait_runs_n_at_a_time_and_the_rest_after(
    rc: redis.Redis, directory: Path
) -> None:
    task, started = limits_app.three_wait, "started:l.three_wait:t1"
    calls = [task.delay("t1", call) for call in range(8)]
    # Four pool children take four calls: three hold the permits, the fourth waits for one.
    eventually(lambda: rc.llen(started) >= 3, timeout=30, what="three bodies running")
    waiting_for_a_permit(rc, task, "t1", 0)
    assert rc.llen(started) == 3, "a fourth body began while three were running"

    rc.set("go:l.three_wait:t1", 1)
    fences = [call.get(timeout=60) for call in calls]
    assert len(set(fences)) == 8
    holds = holds_of(directory, "l.three_wait", "t1")
    assert len(holds) == 8
    assert len({h.pid for h in holds}) > 1  # really spread over the pool's children
    assert assert_at_most(holds, 3) == 3  # never more than three at once, and three did run
    assert not rc.exists(task.tasklock_guard.lock_key(("t1", 0), {}))  # every permit released


def test_limit_with_skip_skips_a_call_while_n_run(rc: redis.Redis, directory: Path) -> None:
    task, started = limits_app.two_skip, "started:l.two_skip:t2"
    running = [task.delay("t2", call) for call in range(2)]
    eventually(lambda: rc.llen(started) >= 2, timeout=30, what="two bodies running")

    skipped = task.delay("t2", 2)
    eventually(lambda: skipped.state == DUPLICATE, timeout=30, what="the third call skipped")
    info = skipped.info
    assert (info["reason"], info["limit"]) == ("duplicate", 2)
    assert "l.two_skip" in info["holder"]  # the permit that frees first
    assert rc.llen(started) == 2

    rc.set("go:l.two_skip:t2", 1)
    assert all(call.get(timeout=30) is not None for call in running)
    assert task.delay("t2", 3).get(timeout=30) is not None  # a permit is free again: it runs
    holds = holds_of(directory, "l.two_skip", "t2")
    assert len(holds) == 3
    assert assert_at_most(holds, 2) == 2
    # The prefork children's counts, each written by its own process, add up in Redis.
    assert len({hold.pid for hold in holds}) >= 2
    expected = {"ran": 3, "duplicates": 1, "duplicates_skip": 1, "lost": 0, "backend_errors": 0}

    def counted() -> dict[str, int]:
        found = fleet.read_counts(rc).get("l.two_skip", {})
        return found if all(found.get(k) == v for k, v in expected.items()) else {}

    eventually(counted, timeout=30, what=f"fleet counts {expected} (have {counted()})")


# -- dedupe_enqueue="until_start" ----------------------------------------------------------------
def one_running_one_queued(
    rc: redis.Redis, directory: Path, task: Any, name: str, *, while_queued: Any
) -> None:
    """A long run, a burst of submissions during it: exactly one more run, after the first;
    every submission but the first of the burst got that queued run's id."""
    started = f"started:{task.name}:{name}"
    marker = task.tasklock_guard.pending_key((name,), {})
    first = task.delay(name)
    eventually(lambda: rc.llen(started) == 1, timeout=30, what="the first run started")
    assert not rc.exists(marker), "the marker outlived the start of its run"

    queued = submit(task, name, 10)
    assert len(queued) == 1, f"10 submissions during the run queued {len(queued)} runs"
    [queued_id] = queued
    assert queued_id != first.id
    assert rc.get(marker) == queued_id.encode()

    while_queued(queued_id, marker)  # the queued run meets the lock in a worker, for a while
    assert submit(task, name, 5) == {queued_id}  # still the same queued run
    assert rc.llen(started) == 1, "the queued run began while the first one was running"

    rc.set(f"go:{task.name}:{name}", 1)
    first_fence = first.get(timeout=30)
    assert AsyncResult(queued_id, app=app).get(timeout=30) > first_fence
    assert rc.llen(started) == 2
    assert not rc.exists(marker)
    # A submission after the queued run started is new work.
    later = task.delay(name)
    assert later.id != queued_id
    later.get(timeout=30)

    holds = holds_of(directory, task.name, name)
    assert [h.fence for h in holds] == sorted(h.fence for h in holds if h.fence is not None)
    assert len(holds) == 3
    assert_no_overlap(holds)  # in particular, the queued run began after the first one ended


def test_until_start_with_wait_runs_exactly_one_more_after_the_running_one(
    rc: redis.Redis, directory: Path
) -> None:
    def while_queued(queued_id: str, marker: str) -> None:
        # The queued run blocks in a worker; it renews its marker while it waits, so the marker
        # outlives pending_ttl (1.5 s: three renewals at a third of it take as long).
        count_renewals(rc, marker, 3)

    one_running_one_queued(
        rc, directory, limits_app.coalesced_wait, "w1", while_queued=while_queued
    )


def test_until_start_with_retry_is_never_out_of_retries_nor_lets_a_third_in(
    rc: redis.Redis, directory: Path, worker: WorkerProcess
) -> None:
    def while_queued(queued_id: str, marker: str) -> None:
        # max_retries=0, and the queued run retries three times (at least 2.5 s: longer than the
        # marker's pending_ttl of 1.5 s, which each retry renews).
        eventually(
            lambda: worker.log().count(f"[{queued_id}] retry:") >= 3,
            timeout=30,
            what="the queued run retried three times",
        )

    one_running_one_queued(
        rc, directory, limits_app.coalesced_retry, "r1", while_queued=while_queued
    )


def test_a_started_run_that_retries_is_the_pending_run_again(
    rc: redis.Redis, worker: WorkerProcess
) -> None:
    task = limits_app.retries_itself
    first = task.delay("b1")
    eventually(
        lambda: f"[{first.id}] retry:" in worker.log(), timeout=30, what="the body asked to retry"
    )
    # Its marker was cleared when it started, and claimed again for the retry (a minute away).
    assert rc.get(task.tasklock_guard.pending_key(("b1",), {})) == first.id.encode()
    assert submit(task, "b1", 5) == {first.id}


def test_a_rate_only_task_is_counted_in_the_fleet_counts(
    worker: WorkerProcess, rc: redis.Redis
) -> None:
    """``limit=None`` tasks (rate only) ran without binding their counts to a Redis: the process's
    own stats had them, ``tasklock stats``, the exporter and the admin page did not."""
    assert [limits_app.rate_only.delay(n).get(timeout=30) for n in range(3)] == [0, 1, 2]

    def counted() -> dict[str, int]:
        found = fleet.read_counts(rc).get("l.rate_only", {})
        return found if found.get("ran") == 3 else {}

    eventually(counted, timeout=30, what="the rate-only task's 3 runs in the fleet counts")
