"""celery-once's behaviours on :mod:`tasklock.compat.celery_once`, under a real
``celery worker --pool=prefork``, and one test per bug of the original that it fixes.

What the original's own suite asserts, restated: ``AlreadyQueued`` at ``delay()`` with its
countdown and message, ``graceful`` returning an empty result, per-call timeouts, the key
format, the lock gone after the task, ``unlock_before_run``, retries not refused.
"""

from __future__ import annotations

import os
import pickle
import signal
import uuid

import pytest
import redis
from celery import Task

from tasklock.compat.celery_once import AlreadyQueued
from tests.integration.compat import compat_app
from tests.support.polling import eventually, holds_for

pytestmark = pytest.mark.slow


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def started(rc: redis.Redis, name: str) -> int:
    return int(eventually(lambda: rc.get(f"started:{name}"), timeout=30, what=f"{name} started"))


def test_already_queued_at_delay_with_countdown_and_graceful(rc: redis.Redis) -> None:
    name = unique("aq")
    first = compat_app.once_task.delay(name, 30)
    key = f"qo_c.once_hold-30_name-{name}"
    assert rc.get(key) == first.id.encode()  # the original's key, the task id as value
    with pytest.raises(AlreadyQueued) as caught:
        compat_app.once_task.delay(name, 30)
    assert 0 < caught.value.countdown <= 60
    assert "Expires in" in caught.value.message
    graceful = compat_app.once_task.apply_async((name, 30), once={"graceful": True})
    assert graceful.result is None
    started(rc, name)
    rc.set(f"go:{name}", 1)
    first.get(timeout=30)
    eventually(lambda: rc.get(key) is None, what="the marker cleared on success")
    compat_app.once_task.delay(name, 0).get(timeout=30)  # queued again once it finished


def test_per_call_timeout_and_eta_extend_the_marker(rc: redis.Redis) -> None:
    """celery-once #127: the marker outlives a countdown, instead of expiring before the run."""
    name = unique("eta")
    result = compat_app.once_task.apply_async((name,), countdown=20, once={"timeout": 5})
    key = f"qo_c.once_name-{name}"
    assert 20_000 < rc.pttl(key) <= 25_000
    result.revoke()
    rc.delete(key)


def test_timeout_counts_again_from_the_start_of_the_run(rc: redis.Redis) -> None:
    """celery-once #36/#127: a task whose wait in the queue (here its countdown) outlasts the
    timeout keeps its lock while it runs; the original's had expired by then."""
    name = unique("late")
    compat_app.once_short.apply_async((name, 30), countdown=2.5)  # timeout 2 s
    started(rc, name)
    key = f"qo_c.once_short_hold-30_name-{name}"
    with pytest.raises(AlreadyQueued):
        compat_app.once_short.delay(name, 30)
    assert 1_000 < rc.pttl(key) <= 2_000
    rc.set(f"go:{name}", 1)
    eventually(lambda: rc.get(key) is None, what="cleared after the run")


def test_failure_clears_the_marker(rc: redis.Redis) -> None:
    """celery-once #110: after a failure the task can be queued again at once."""
    name = unique("fail")
    result = compat_app.once_fail.delay(name)
    with pytest.raises(RuntimeError):
        result.get(timeout=30)
    eventually(lambda: rc.get(f"qo_c.once_fail_name-{name}") is None, what="cleared on failure")
    compat_app.once_fail.delay(name).revoke()


def test_killed_child_clears_the_marker(rc: redis.Redis) -> None:
    """celery-once #147: a pool child killed mid-task no longer leaves its lock for the TTL."""
    name = unique("kill")
    result = compat_app.once_task.delay(name, 30)
    os.kill(started(rc, name), signal.SIGKILL)
    eventually(lambda: result.state == "FAILURE", timeout=30)
    eventually(lambda: rc.get(f"qo_c.once_hold-30_name-{name}") is None, what="cleared")


def test_hard_time_limit_clears_the_marker(rc: redis.Redis) -> None:
    name = unique("hard")
    result = compat_app.once_hard.delay(name)
    started(rc, name)
    eventually(lambda: result.state == "FAILURE", timeout=30)
    eventually(lambda: rc.get(f"qo_c.once_hard_name-{name}") is None, what="cleared")


def test_retries_are_not_their_own_duplicates(rc: redis.Redis) -> None:
    name = unique("retry")
    assert compat_app.once_retry.delay(name).get(timeout=30) == 2
    eventually(lambda: rc.get(f"qo_c.once_retry_name-{name}") is None, what="cleared")


def test_tuple_and_int_keyed_dict_arguments_are_cleared_by_the_worker(rc: redis.Redis) -> None:
    """The original keyed ``(1, 2)`` and ``{1: 'a'}`` differently at enqueue than the worker
    (which gets ``[1, 2]`` and ``{'1': 'a'}``), so the lock stayed for its whole timeout."""
    pair, options = (1, uuid.uuid4().hex), {1: "a"}
    result = compat_app.once_tuple.delay(pair, options)
    key = compat_app.once_tuple.get_key((pair, options), {})
    assert key == f"qo_c.once_tuple_options-{{'1': 'a'}}_pair-[1, '{pair[1]}']"
    assert result.get(timeout=30) == 2
    eventually(lambda: rc.get(key) is None, what="the worker cleared the enqueue's key")


def test_unlock_before_run_lets_one_more_queue_while_it_runs(rc: redis.Redis) -> None:
    name = unique("ubr")
    first = compat_app.once_unlock.delay(name, 30)
    started(rc, name)
    second = compat_app.once_unlock.delay(name, 0)  # the marker went when the first started
    with pytest.raises(AlreadyQueued):
        compat_app.once_unlock.delay(name, 0)
    rc.set(f"go:{name}", 1)
    first.get(timeout=30)
    second.get(timeout=30)


def test_a_marker_of_the_original_library_excludes_and_is_cleared(rc: redis.Redis) -> None:
    """Rolling deploy: the original wrote a redis-py Lock token at the same key. A new producer
    is refused while it is there, and a new worker clears it when the run it stands for ends."""
    name = unique("legacy")
    key = f"qo_c.once_hold-0_name-{name}"
    rc.set(key, uuid.uuid1().hex, px=60_000)  # what the original's raise_or_lock writes
    with pytest.raises(AlreadyQueued):
        compat_app.once_task.delay(name, 0)
    # the old producer's message, as it sent it: through Celery's apply_async
    Task.apply_async(compat_app.once_task, (name, 0)).get(timeout=30)
    eventually(lambda: rc.get(key) is None, what="the original's marker cleared by a new worker")


def test_already_queued_pickles() -> None:
    error = pickle.loads(pickle.dumps(AlreadyQueued(12.5)))
    assert (error.countdown, error.message) == (12.5, "Expires in 12.5 seconds")


def test_duplicates_sent_at_once_queue_one(rc: redis.Redis) -> None:
    name = unique("burst")
    sent, refused = 0, 0
    for _ in range(10):
        try:
            compat_app.once_task.delay(name, 30)
            sent += 1
        except AlreadyQueued:
            refused += 1
    assert (sent, refused) == (1, 9)
    started(rc, name)
    holds_for(lambda: rc.get(f"qo_c.once_hold-30_name-{name}"), 0.2)
    rc.set(f"go:{name}", 1)
    eventually(lambda: rc.get(f"qo_c.once_hold-30_name-{name}") is None, what="cleared")
