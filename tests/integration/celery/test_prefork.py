"""SingletonTask under a real ``celery worker --pool=prefork --concurrency=3`` subprocess: true
parallelism, crashes, time limits, acks_late redelivery and long tasks kept by the watchdog.

One worker serves the whole module (its pool replaces children that tests kill). Every test uses
its own keys, so nothing is flushed between tests (kombu keeps its bindings in the same Redis).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery.exceptions import TimeLimitExceeded

from tasklock.celery import DUPLICATE
from tasklock.core.owner import parse_value
from tests.integration.celery import worker_app
from tests.integration.celery.support import WorkerProcess
from tests.support.history import (
    FencedRegister,
    HistoryLog,
    assert_fences_increase,
    assert_no_overlap,
)
from tests.support.polling import eventually, holds_for
from tests.support.servers import RedisServer

pytestmark = pytest.mark.slow

app = worker_app.app


@pytest.fixture(scope="module")
def lock_server() -> Iterator[RedisServer]:
    """A second redis-server that holds only acks_late_task's locks (the test stops it)."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="module")
def worker(
    redis_server: RedisServer, lock_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    directory = tmp_path_factory.mktemp("prefork")
    env = {"TL_TEST_URL": redis_server.url, "TL_TEST_LOCK_URL": lock_server.url,
           "TL_TEST_DIR": str(directory)}  # fmt: skip
    app.conf.update(broker_url=redis_server.url, result_backend=redis_server.url)
    process = WorkerProcess(
        "tests.integration.celery.worker_app", env, directory / "worker.log", concurrency=3
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


def lock_value(rc: redis.Redis, task: Any, *args: Any) -> bytes | None:
    return rc.get(task.tasklock_guard.lock_key(args, {}))  # type: ignore[no-any-return]


def test_parallel_duplicates_never_overlap(rc: redis.Redis, directory: Path) -> None:
    calls = [worker_app.critical_wait.delay(account) for account in (1, 2) for _ in range(10)]
    fences = [result.get(timeout=60) for result in calls]
    holds = HistoryLog(directory / "history.log").holds()
    mine = [h for h in holds if h.name in ("p.wait:1", "p.wait:2")]
    assert len(mine) == 20
    assert len({h.pid for h in mine}) > 1  # really spread over the pool's children
    assert_no_overlap(mine)
    assert_fences_increase(mine)
    assert len(set(fences)) == 20
    register = FencedRegister(directory / "register.db")
    register.assert_consistent()
    assert all(w["accepted"] for w in register.writes() if w["name"].startswith("p.wait:"))


def test_parallel_skips_run_once_at_a_time(rc: redis.Redis, directory: Path) -> None:
    calls = [worker_app.critical_skip.delay(3, call) for call in range(12)]
    eventually(lambda: all(r.state in ("SUCCESS", DUPLICATE) for r in calls), timeout=60)
    ran = [r for r in calls if r.state == "SUCCESS"]
    skipped = [r for r in calls if r.state == DUPLICATE]
    assert ran
    assert skipped
    assert len(ran) + len(skipped) == 12
    holds = [h for h in HistoryLog(directory / "history.log").holds() if h.name == "p.skip:3"]
    assert len(holds) == len(ran)
    assert_no_overlap(holds)
    assert all(r.info["holder"] for r in skipped)


def test_paused_holder_loses_its_lock_and_its_stale_write(rc: redis.Redis, directory: Path) -> None:
    """SIGSTOP a holder past its TTL: the next holder gets a higher fence, the old one's write is
    rejected by the fenced register when it wakes up."""
    first = worker_app.paused_writer.delay(4, "A")
    pid_a = int(eventually(lambda: rc.get("pid:A"), timeout=30))
    os.kill(pid_a, signal.SIGSTOP)
    try:
        eventually(lambda: lock_value(rc, worker_app.paused_writer, 4, "A") is None, timeout=10,
                   what="A's lock expired (ttl=1) while A is stopped")  # fmt: skip
        second = worker_app.paused_writer.delay(4, "B")
        eventually(lambda: rc.get("pid:B"), timeout=30)
        rc.set("go:B", 1)
        b = second.get(timeout=30)
        rc.set("go:A", 1)
    finally:
        os.kill(pid_a, signal.SIGCONT)
    a = first.get(timeout=30)
    assert b["fence"] > a["fence"]
    assert (a["accepted"], b["accepted"]) == (False, True)
    FencedRegister(directory / "register.db").assert_consistent()


def test_sigkill_of_a_child_frees_the_lock_within_one_ttl(rc: redis.Redis) -> None:
    victim = worker_app.killed.delay("k1")
    pid = int(eventually(lambda: rc.get("pid:k1"), timeout=30))
    holder = parse_value(eventually(lambda: lock_value(rc, worker_app.killed, "k1")))
    assert holder.meta["pid"] == pid
    os.kill(pid, signal.SIGKILL)
    # No finally ran: only the TTL (1 s; nothing renews it now) frees the lock.
    eventually(lambda: lock_value(rc, worker_app.killed, "k1") is None, timeout=1.0 + 2.0)
    eventually(lambda: victim.state == "FAILURE", timeout=30)
    # The pending marker (dedupe_enqueue) is cleared by the main process's task_failure signal,
    # which Celery sends right after storing the FAILURE.
    marker = worker_app.killed.tasklock_guard.pending_key(("k1",), {})
    eventually(lambda: not rc.exists(marker), what="marker cleared by the main process")
    assert worker_app.killed.delay("k1", block=False).get(timeout=30) == "ran"


def test_redelivered_task_waits_for_its_killed_attempts_lock(rc: redis.Redis) -> None:
    """acks_late + reject_on_worker_lost: the message of a SIGKILLed child comes back with the
    same task id while the dead attempt's lock still has up to one TTL to live. It must wait for
    that lock, not be taken for a duplicate of itself (on_duplicate="raise" would fail it)."""
    result = worker_app.redelivered.delay("r1")
    pid = int(eventually(lambda: rc.get("pid:r1"), timeout=30))
    holder = parse_value(eventually(lambda: lock_value(rc, worker_app.redelivered, "r1")))
    assert holder.meta["task"] == result.id
    os.kill(pid, signal.SIGKILL)
    assert result.get(timeout=30) == 2


def test_soft_time_limit_releases_in_finally(rc: redis.Redis) -> None:
    result = worker_app.soft_limited.delay("s1")
    eventually(lambda: result.state == "FAILURE", timeout=30)
    assert rc.get("soft:s1")  # the body saw SoftTimeLimitExceeded
    # ttl=30 and the worker is alive: only the release in finally explains a free lock now.
    assert lock_value(rc, worker_app.soft_limited, "s1") is None


def test_hard_time_limit_frees_the_lock_within_one_ttl(rc: redis.Redis) -> None:
    result = worker_app.hard_limited.delay("h1")
    with pytest.raises(TimeLimitExceeded):
        result.get(timeout=30)
    marker = worker_app.hard_limited.tasklock_guard.pending_key(("h1",), {})
    eventually(lambda: not rc.exists(marker), what="marker cleared by the main process")
    eventually(lambda: lock_value(rc, worker_app.hard_limited, "h1") is None, timeout=2.0 + 2.0)


def test_long_task_keeps_its_lock_over_many_ttls(rc: redis.Redis) -> None:
    result = worker_app.long_task.delay("l1", 5.5)
    value = eventually(lambda: lock_value(rc, worker_app.long_task, "l1"), timeout=30)
    duplicate = worker_app.long_task.delay("l1")
    # ttl=1.5: the watchdog renews it; the same hold stays for more than three TTLs.
    checks = holds_for(lambda: lock_value(rc, worker_app.long_task, "l1") == value, 4.6)
    assert checks > 10
    assert duplicate.state == DUPLICATE
    assert result.get(timeout=30) == 5.5


def test_acks_late_task_is_redelivered_while_lock_redis_is_down(
    rc: redis.Redis, lock_server: RedisServer, worker: WorkerProcess
) -> None:
    lock_server.stop()
    try:
        result = worker_app.acks_late_task.delay("a1")
        # Fail closed: the message goes back to the queue again and again, nothing runs...
        requeued = f"[{result.id}]: Redis for the lock is unreachable; the message is requeued"
        eventually(lambda: worker.log().count(requeued) >= 2, timeout=30,
                   what="the message handed back to the queue twice")  # fmt: skip
        assert result.state == "PENDING"
        assert rc.get("ran:a1") is None
    finally:
        lock_server.start()
    # ... and runs once Redis answers again: nothing lost, nothing run twice.
    assert result.get(timeout=60) == 1
    assert rc.get("ran:a1") == b"1"
