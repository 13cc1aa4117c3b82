"""Fleet counts (:mod:`tasklock.fleet`) through the framework-free guard, on a real redis-server:
what each decision adds, the keys' lifetimes and windows, and the batcher's promises (a count that
could not be written is written later; a forked child starts with nothing of its parent's). The
real-worker proofs (RQ work horses, Celery prefork children) are in the adapters' test modules."""

from __future__ import annotations

import os
import threading
from typing import Any

import pytest
import redis

from tasklock import fleet, observe, stats
from tasklock.errors import BackendUnavailable
from tasklock.guard import Guard
from tests.support.guarding import hold_in_thread, run_call
from tests.support.servers import RedisServer, free_port


def settle(account_id: int, fence_token: int | None = None) -> str:
    return f"settled {account_id}"


def run(guard: Guard, args: tuple[Any, ...], body: Any = None, task_id: str = "t1") -> Any:
    return run_call(guard, args, body or (lambda extra: settle(*args)), task_id)


@pytest.fixture(autouse=True)
def written_first() -> None:
    fleet.flush()  # counts other tests left behind go to their own servers, not these


def counts(r: redis.Redis, task: str, window: str = "total") -> dict[str, int]:
    fleet.flush()
    return fleet.read_counts(r, window=window).get(task, {})


def test_each_decision_is_counted_per_task_name(r: redis.Redis, redis_server: RedisServer) -> None:
    skip = Guard(settle, "fleet.skip", {"url": redis_server.url})
    waits = Guard(settle, "fleet.wait", {"url": redis_server.url, "on_duplicate": "wait"})
    retry = Guard(settle, "fleet.retry", {"url": redis_server.url, "on_duplicate": "retry"})
    for n in range(3):
        assert run(skip, (n,)) == f"settled {n}"
    done = hold_in_thread(skip, (1,))
    try:
        assert run(skip, (1,)) == "skipped"
        assert run(skip, (1,)) == "skipped"
    finally:
        done()
    done = hold_in_thread(retry, (1,))
    try:
        assert run(retry, (1,)) == "retry"
    finally:
        done()
    done = hold_in_thread(waits, (1,))
    threading.Timer(0.2, done).start()  # the holder finishes while the other call waits
    assert run(waits, (1,), task_id="waiter") == "settled 1"

    found = counts(r, "fleet.skip")
    assert found["ran"] == 4  # three calls and the holder
    assert (found["duplicates"], found["duplicates_skip"]) == (2, 2)
    assert found["waited"] == found["retries"] == found["lost"] == found["backend_errors"] == 0
    found = counts(r, "fleet.retry")
    assert (found["duplicates"], found["duplicates_retry"], found["retries"]) == (1, 1, 1)
    found = counts(r, "fleet.wait")
    assert (found["ran"], found["waited"], found["duplicates"]) == (2, 1, 0)
    assert found["wait_us"] > 0
    # The same counts in the rolling windows (this hour's slots), keyed per task name only.
    assert counts(r, "fleet.skip", "hour")["ran"] == counts(r, "fleet.skip", "day")["ran"] == 4
    assert set(fleet.read_counts(r)) >= {"fleet.skip", "fleet.retry", "fleet.wait"}
    assert not [k for k in r.keys("tasklock:{fleet.skip}:stats*") if b":lock:" in k]


def test_keys_expire_so_nothing_grows_without_bound(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    run(Guard(settle, "fleet.ttl", {"url": redis_server.url}), (1,))
    fleet.flush()
    totals = fleet.totals_key("tasklock", "fleet.ttl")
    assert 0 < r.ttl(totals) <= fleet.TOTALS_TTL
    [bucket] = list(r.keys("tasklock:{fleet.ttl}:stats:*"))
    assert 0 < r.ttl(bucket) <= fleet.BUCKET_TTL
    assert 0 < r.ttl(fleet.registry_key("tasklock")) <= fleet.TOTALS_TTL


def test_enqueue_dedupes_backend_errors_and_unlocked_runs(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = Guard(settle, "fleet.dedupe", {"url": redis_server.url, "dedupe_enqueue": True})
    assert guard.claim_pending((1,), {}, "first") is None
    assert guard.claim_pending((1,), {}, "second") == "first"
    assert counts(r, "fleet.dedupe")["enqueue_dedupes"] == 1

    dead = f"redis://127.0.0.1:{free_port()}/0"
    failing = Guard(settle, "fleet.dead", {"url": dead})
    with pytest.raises(BackendUnavailable):
        run(failing, (1,))
    unlocked = Guard(settle, "fleet.dead_run", {"url": dead, "on_backend_error": "run"})
    assert run(unlocked, (1,)) == "settled 1"
    # Their counts go to the dead server: kept, and written once it answers (not here).
    assert "fleet.dead" not in counts(r, "fleet.dead")
    assert stats.snapshot()["backend_error:fleet.dead"] >= 1


def test_a_count_that_could_not_be_written_is_written_later(redis_server: RedisServer) -> None:
    client = redis_server.client()
    guard = Guard(settle, "fleet.later", {"url": redis_server.url})
    redis_server.pause()
    try:
        fleet.bind(
            "fleet.later", redis.Redis.from_url(redis_server.url, socket_timeout=0.2), "tasklock"
        )
        stats.increment("ran", "fleet.later")
        fleet.flush()  # times out against the paused server: the count is kept
    finally:
        redis_server.resume()
    fleet.flush()
    assert fleet.read_counts(client)["fleet.later"]["ran"] == 1
    run(guard, (1,))  # binds the guard's own client again
    assert fleet.read_counts(client)["fleet.later"]["ran"] >= 1


def test_a_forked_child_writes_only_its_own_counts(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = Guard(settle, "fleet.fork", {"url": redis_server.url})
    run(guard, (1,))
    stats.increment("ran", "fleet.fork")  # pending in the parent when it forks
    pid = os.fork()
    if pid == 0:  # the child: one run, written before it leaves with os._exit
        code = 1
        try:
            run(guard, (2,))
            fleet.flush()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert counts(r, "fleet.fork")["ran"] == 3  # parent 2, child 1: nothing counted twice


class _Recorder:
    """An observer that records what it is told."""

    def __init__(self) -> None:
        self.events: list[tuple[Any, ...]] = []

    def acquiring(self, task: str, lock: str) -> Any:
        recorder = self

        class Scope:
            def done(self, outcome: str, waited: float, fence: int | None) -> None:
                recorder.events.append(("done", task, outcome, fence is not None))

            def hold(self) -> Any:
                recorder.events.append(("hold", task))

                class Hold:
                    def done(self, error: BaseException | None) -> None:
                        recorder.events.append(("held", task, type(error).__name__))

                return Hold()

        return Scope()


def test_observers_see_each_acquire_and_hold(redis_server: RedisServer) -> None:
    recorder = _Recorder()
    observe.install(recorder)
    try:
        guard = Guard(settle, "fleet.observed", {"url": redis_server.url, "fencing": True})
        run(guard, (1,))
        with pytest.raises(ZeroDivisionError):
            run(guard, (2,), lambda extra: 1 / 0)
        done = hold_in_thread(guard, (3,))
        try:
            run(guard, (3,))
        finally:
            done()
    finally:
        observe.uninstall(recorder)
    mine = [e for e in recorder.events if e[1] == "fleet.observed"]
    assert mine[:6] == [
        ("done", "fleet.observed", "acquired", True),
        ("hold", "fleet.observed"),
        ("held", "fleet.observed", "NoneType"),
        ("done", "fleet.observed", "acquired", True),
        ("hold", "fleet.observed"),
        ("held", "fleet.observed", "ZeroDivisionError"),
    ]
    assert ("done", "fleet.observed", "duplicate_skip", False) in mine


def test_a_failing_observer_never_fails_the_task(redis_server: RedisServer) -> None:
    class Broken:
        def acquiring(self, task: str, lock: str) -> Any:
            raise RuntimeError("observer bug")

    broken = Broken()
    observe.install(broken)
    try:
        assert run(Guard(settle, "fleet.broken", {"url": redis_server.url}), (1,)) == "settled 1"
    finally:
        observe.uninstall(broken)


def test_a_redlock_task_writes_to_the_first_master_that_answers(
    nodes: list[RedisServer],
) -> None:
    urls = [server.url for server in nodes]
    guard = Guard(settle, "fleet.redlock", {"urls": urls})
    nodes[0].stop()  # the first master is down: the lock holds on the other four
    try:
        assert run(guard, (1,)) == "settled 1"
        fleet.flush()
        answers = [fleet.read_counts(server.client()) for server in nodes[1:]]
    finally:
        nodes[0].start()
    assert [bool(found) for found in answers] == [True, False, False, False]
    assert fleet.merge(answers)["fleet.redlock"]["ran"] == 1
