"""The guard with ``limit=N`` against a real redis-server: N permits per key, the duplicate policy
when all are taken, a retry of the same task id that holds one of them, and a deployment that moves
a task's limit between 1 and N while workers of both kinds run."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import redis

import tasklock
from tasklock.core.keys import queue_keys_for
from tasklock.errors import DuplicateTask
from tasklock.guard import Duplicate, Guard
from tests.support.polling import eventually
from tests.support.servers import RedisServer

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = pytest.mark.usefixtures("resp")


def export(tenant_id: int, call: int = 0, fence_token: int | None = None) -> int | None:
    return fence_token


def make_guard(server: RedisServer, **options: Any) -> Guard:
    return Guard(export, "app.export", {"url": server.url, "key": ["tenant_id"], **options})


def run(guard: Guard, args: tuple[Any, ...], body: Any = None, task_id: str | None = None) -> Any:
    return guard.run(
        args,
        {},
        body or (lambda extra: ("ran", extra)),
        task_id=task_id,
        on_skip=lambda d: ("skipped", d),
        on_retry=lambda d: ("retry", d),
        duplicate_error=DuplicateTask,
    )


class Holders:
    """Bodies of one guard held open in threads until :meth:`finish`."""

    def __init__(self, guard: Guard) -> None:
        self.guard = guard
        self.finish = threading.Event()
        self.threads: list[threading.Thread] = []
        self.results: list[Any] = []

    def hold(self, call: int, task_id: str | None = None) -> None:
        entered = threading.Event()

        def body(extra: dict[str, Any]) -> str:
            entered.set()
            assert self.finish.wait(30)
            return "held"

        def target() -> None:
            self.results.append(run(self.guard, (7, call), body, task_id))

        thread = threading.Thread(target=target)
        thread.start()
        self.threads.append(thread)
        assert entered.wait(10), "the holder's body did not start"

    def release(self) -> list[Any]:
        self.finish.set()
        for thread in self.threads:
            thread.join(10)
        return self.results


def test_n_calls_run_at_once_and_the_next_is_a_duplicate_naming_the_limit(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = make_guard(redis_server, limit=3, fencing=True)
    holders = Holders(guard)
    for call in range(3):
        holders.hold(call)
    key = guard.lock_key((7,), {})
    assert r.type(key) == b"zset"
    assert r.zcard(key) == 3

    outcome, duplicate = run(guard, (7, 3))
    assert outcome == "skipped"
    assert isinstance(duplicate, Duplicate)
    assert duplicate.limit == 3
    assert "all 3 calls allowed at once with the same key are running" in duplicate.message()
    assert duplicate.as_meta()["limit"] == 3
    assert "name=app.export" in duplicate.holder
    assert run(guard, (8, 0))[0] == "ran"  # another key has permits of its own

    assert holders.release() == ["held"] * 3
    assert not r.exists(key)
    outcome, extra = run(guard, (7, 4))
    assert outcome == "ran"
    assert isinstance(extra["fence_token"], int)


def test_a_duplicate_with_limit_one_keeps_its_message_and_meta(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    guard = make_guard(redis_server)
    holders = Holders(guard)
    holders.hold(0)
    _, duplicate = run(guard, (7, 1))
    assert duplicate.limit == 1
    assert "a call with the same key is running" in duplicate.message()
    assert "limit" not in duplicate.as_meta()
    assert r.type(guard.lock_key((7,), {})) == b"string"  # limit=1 is the Lock, as before
    holders.release()


def test_a_retry_whose_earlier_attempt_holds_a_permit_waits_for_it(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    """All permits taken, one of them by this task id's earlier attempt (Celery sends a retry
    before the attempt's finally runs): the retry waits for that permit, it is no duplicate of
    itself, though the permit that frees first is someone else's."""
    guard = make_guard(redis_server, limit=2)
    holders = Holders(guard)
    holders.hold(0, task_id="other")  # its permit frees first
    taken = threading.Event()
    # The retry waits in the permits' queue. (Not "someone subscribes to the wake channel": the
    # process's one listener keeps a channel it no longer needs for a while, so in a second run
    # of this test, under the other RESP version, it was subscribed before the retry began.)
    queue, _waiters = queue_keys_for(guard.lock_key((7,), {}))

    def earlier_attempt() -> None:
        own = guard.lock_for(guard.lock_key((7,), {}), "t1")
        assert own.acquire(blocking=False)
        taken.set()
        eventually(lambda: r.llen(queue) > 0, what="the retry waiting in the queue")
        own.release()

    attempt = threading.Thread(target=earlier_attempt)
    attempt.start()
    assert taken.wait(10)
    outcome, _ = run(guard, (7, 1), task_id="t1")
    attempt.join(10)
    assert outcome == "ran"
    assert holders.release() == ["held"]


@pytest.mark.parametrize(("old", "new"), [(1, 3), (3, 1)])
def test_a_deployment_moving_the_limit_between_one_and_n_stays_exclusive(
    r: redis.Redis, redis_server: RedisServer, old: int, new: int
) -> None:
    """Workers with the old limit still run while the new ones start: a Lock counts as every
    permit taken, permits count as the Lock taken; the new workers' calls are duplicates (named,
    not a WRONGTYPE error), and run once the old holds are gone."""
    old_guard, new_guard = make_guard(redis_server, limit=old), make_guard(redis_server, limit=new)
    holders = Holders(old_guard)
    holders.hold(0)
    outcome, duplicate = run(new_guard, (7, 1))
    assert outcome == "skipped"
    assert "name=app.export" in duplicate.holder
    holders.release()
    assert run(new_guard, (7, 2))[0] == "ran"


def test_a_lock_waits_for_permits_and_permits_wait_for_a_lock(
    r: redis.Redis, redis_server: RedisServer
) -> None:
    key = make_guard(redis_server).lock_key((7,), {})
    semaphore = tasklock.Semaphore(r, key, 3, thread_local=False)
    assert semaphore.acquire(blocking=False)
    waiting = make_guard(redis_server, on_duplicate="wait", wait_timeout=20)
    timer = threading.Timer(0.2, semaphore.release)
    timer.start()
    assert run(waiting, (7, 1))[0] == "ran"  # woken by the semaphore's release
    timer.join()
