"""celery-singleton's behaviours on :mod:`tasklock.compat.celery_singleton`, under a real
``celery worker --pool=prefork``, and one test per bug of the original that it fixes.

What the original's own suite asserts, restated: duplicates return the same task id, distinct
calls different ones, a new id after success and after failure, ``raise_on_duplicate`` with the
twin's id, ``clear_locks``, the lock cleared when publishing fails.
"""

from __future__ import annotations

import os
import pickle
import signal
import uuid

import pytest
import redis
from celery import Celery

from tasklock.compat.celery_singleton import DuplicateTaskError, Singleton, clear_locks
from tests.integration.compat import compat_app
from tests.support.polling import eventually
from tests.support.servers import RedisServer

pytestmark = pytest.mark.slow


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def started(rc: redis.Redis, name: str) -> int:
    return int(eventually(lambda: rc.get(f"started:{name}"), timeout=30, what=f"{name} started"))


def lock_of(task: Singleton, *args: object) -> str:
    return task.generate_lock(task.name, list(args), {})


def test_duplicates_return_the_running_twin_and_a_new_id_after_success(rc: redis.Redis) -> None:
    name = unique("dup")
    calls = [compat_app.single_task.delay(name, 30) for _ in range(10)]
    assert {c.id for c in calls} == {calls[0].id}
    assert rc.get(lock_of(compat_app.single_task, name, 30)) == calls[0].id.encode()
    other = compat_app.single_task.delay(unique("other"), 0)
    assert other.id != calls[0].id
    started(rc, name)
    rc.set(f"go:{name}", 1)
    calls[0].get(timeout=30)
    other.get(timeout=30)
    eventually(lambda: rc.get(lock_of(compat_app.single_task, name, 30)) is None, what="cleared")
    again = compat_app.single_task.delay(name, 0)
    assert again.id != calls[0].id
    again.get(timeout=30)


def test_raise_on_duplicate_names_the_twin(rc: redis.Redis) -> None:
    name = unique("raise")
    first = compat_app.single_raise.delay(name, 30)
    with pytest.raises(DuplicateTaskError) as caught:
        compat_app.single_raise.delay(name, 30)
    assert caught.value.task_id == first.id
    rc.set(f"go:{name}", 1)
    first.get(timeout=30)


def test_revoked_task_does_not_block_for_ever(rc: redis.Redis) -> None:
    """celery-singleton #29: a task revoked before it ran (state REVOKED) kept its lock, so every
    later delay() returned the revoked task's id, for ever (the lock had no expiry)."""
    name = unique("revoke")
    first = compat_app.single_task.apply_async((name, 0), countdown=0.5)
    first.revoke()
    eventually(lambda: first.state == "REVOKED", timeout=30, what="discarded by the worker")
    second = compat_app.single_task.delay(name, 0)
    assert second.id != first.id
    second.get(timeout=30)


def test_terminated_task_clears_the_lock(rc: redis.Redis) -> None:
    name = unique("terminate")
    first = compat_app.single_task.delay(name, 30)
    started(rc, name)
    first.revoke(terminate=True, signal="SIGKILL")
    eventually(lambda: first.state == "REVOKED", timeout=30)
    eventually(lambda: rc.get(lock_of(compat_app.single_task, name, 30)) is None, what="cleared")


def test_hard_time_limit_clears_the_lock(rc: redis.Redis) -> None:
    """celery-singleton #40: a task killed by its hard time limit kept its lock."""
    name = unique("hard")
    first = compat_app.single_hard.delay(name)
    started(rc, name)
    eventually(lambda: first.state == "FAILURE", timeout=30)
    eventually(lambda: rc.get(lock_of(compat_app.single_hard, name)) is None, what="cleared")
    assert compat_app.single_hard.delay(name).id != first.id


def test_killed_child_clears_the_lock(rc: redis.Redis) -> None:
    name = unique("kill")
    first = compat_app.single_task.delay(name, 30)
    os.kill(started(rc, name), signal.SIGKILL)
    eventually(lambda: first.state == "FAILURE", timeout=30)
    eventually(lambda: rc.get(lock_of(compat_app.single_task, name, 30)) is None, what="cleared")


def test_retries_are_not_dropped_as_duplicates(rc: redis.Redis) -> None:
    """celery-singleton #10/#20: self.retry() re-sent the task under its own id, found its own
    lock and was 'deduplicated' into nothing; the task never ran again."""
    name = unique("retry")
    assert compat_app.single_retry.delay(name).get(timeout=30) == 2
    eventually(lambda: rc.get(lock_of(compat_app.single_retry, name)) is None, what="cleared")


def test_duplicate_error_survives_autoretry_and_the_worker(rc: redis.Redis) -> None:
    """celery-singleton #55: DuplicateTaskError could not be unpickled, and a task retrying on
    it killed the worker ("Unrecoverable error: TypeError(__init__() missing ... task_id)")."""
    name = unique("auto")
    result = compat_app.single_autoretry.delay(name)
    with pytest.raises(DuplicateTaskError) as caught:
        result.get(timeout=30, propagate=True)
    assert caught.value.task_id
    rc.set(f"go:{name}", 1)
    assert compat_app.single_task.delay(unique("alive"), 0).get(timeout=30)  # worker still up


def test_uuid_arguments_and_their_text_are_one_call(rc: redis.Redis) -> None:
    """celery-singleton #36/#42: a UUID argument raised TypeError at delay()."""
    ident = uuid.uuid4()
    first = compat_app.single_uuid.delay(ident, 30)
    assert compat_app.single_uuid.delay(str(ident), 30).id == first.id
    started(rc, f"uuid-{ident}")
    rc.set(f"go:uuid-{ident}", 1)
    assert first.get(timeout=30) == str(ident)


def test_a_lock_of_the_original_library_excludes(rc: redis.Redis) -> None:
    """Rolling deploy: the original's lock (same key, the task id as value, SET NX) is a twin
    for a new producer, and a new producer's lock is the same for an old one."""
    name = unique("legacy")
    key = lock_of(compat_app.single_task, name, 0)
    old_id = str(uuid.uuid4())
    rc.set(key, old_id, nx=True)  # what the original's RedisBackend.lock writes
    assert compat_app.single_task.delay(name, 0).id == old_id
    rc.delete(key)


def test_failed_publish_clears_the_lock(compat_server: RedisServer) -> None:
    broken = Celery("tl_compat_broken", broker="redis://127.0.0.1:1/0", backend=None)
    broken.conf.update(singleton_backend_url=compat_server.url, broker_connection_timeout=0.5)

    @broken.task(name="c.broken", base=Singleton)
    def broken_task(name: str) -> None: ...

    name = unique("publish")
    with pytest.raises(Exception):  # noqa: B017 (kombu's OperationalError, whatever its form)
        broken_task.apply_async((name,), retry=False)
    client = compat_server.client()
    assert client.get(broken_task.generate_lock("c.broken", [name], {})) is None
    clear_locks(broken)
    client.close()


def test_duplicate_task_error_pickles() -> None:
    error = pickle.loads(pickle.dumps(DuplicateTaskError("a duplicate", task_id="abc")))
    assert (str(error), error.task_id) == ("a duplicate", "abc")
