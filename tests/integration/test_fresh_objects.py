"""A lock object made per use (``with tasklock.Lock(r, name):``), as most programs write it.

What such an object shares with earlier ones (the encoded script calls, the layout, the wake-up
hub) is shared by value, never by state: a new object on the same name behaves as the first did,
what it leaves behind is freed by reference counting alone (no cycles for the garbage collector,
whatever the options), and what is kept for reuse stays bounded however many names a process uses.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import redis

import tasklock
from tasklock.core.lanes import ENCODED_LIMIT, lane_for
from tasklock.core.layouts import LAYOUT_CACHE_SIZE, lock_layout
from tasklock.errors import ConfigurationError
from tests.support.garbage import cyclic_garbage

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = pytest.mark.usefixtures("resp")


def blocking_variants(r: redis.Redis) -> dict[str, Callable[[], Any]]:
    return {
        "timeout": lambda: tasklock.Lock(r, "fresh:a", timeout=10),
        "watchdog": lambda: tasklock.Lock(r, "fresh:b"),
        "unfair": lambda: tasklock.Lock(r, "fresh:c", fair=False, watchdog=True),
        "shared": lambda: tasklock.Lock(r, "fresh:d", thread_local=False),
        "semaphore": lambda: tasklock.Semaphore(r, "fresh:e", 2),
    }


def test_a_lock_made_per_use_is_freed_without_the_garbage_collector(r: redis.Redis) -> None:
    for label, make in blocking_variants(r).items():
        for _ in range(3):  # connections, script loads: made once, kept
            with make():
                pass
        with cyclic_garbage() as found:
            for _ in range(20):
                with make() as lock:
                    assert lock.fence is not None
                    assert not lock.lost
                assert not lock.lost  # (the flag of an ended hold, asked after the release)
        assert found == [], f"{label}: {sorted(set(found))} were left in reference cycles"


def test_fresh_objects_on_one_name_take_turns_and_fences_rise(r: redis.Redis) -> None:
    fences = []
    for _ in range(5):
        with tasklock.Lock(r, "fresh:turns", timeout=10) as lock:
            assert not tasklock.Lock(r, "fresh:turns", timeout=10).acquire(blocking=False)
            fences.append(lock.fence)
    assert fences == sorted(fences)
    assert len(set(fences)) == 5


def test_what_is_kept_for_reuse_stays_bounded(r: redis.Redis) -> None:
    lane = lane_for(r)
    assert lane is not None
    for i in range(ENCODED_LIMIT + 50):  # more names than the lane keeps
        tasklock.Lock(r, f"fresh:name:{i}", timeout=10)
        assert len(lane.encoded) <= ENCODED_LIMIT
    with tasklock.Lock(r, "fresh:name:0", timeout=10) as lock:  # one dropped: encoded again
        assert lock.fence is not None
    lock_layout.cache_clear()
    for i in range(LAYOUT_CACHE_SIZE + 50):
        lock_layout(f"fresh:layout:{i}", "fence", 10.0, True)
    assert lock_layout.cache_info().currsize <= LAYOUT_CACHE_SIZE


def _state(lock: Any) -> dict[str, Any]:
    """What a lock object is, apart from its holds and its prepared calls' identity."""
    state = {k: v for k, v in vars(lock).items() if k not in ("local", "_hub_cache")}
    for name in ("_acquire_script", "_release_script"):
        bound = state.pop(name)
        state[name] = (bound.script, bound.keys, bound.tail, bound._head, bound._tail)
    return state


def test_for_name_makes_what_the_constructor_makes(r: redis.Redis) -> None:
    def on_lost(lock: Any) -> None:
        pass

    made: list[tuple[Any, Any]] = []
    for kind, extra in ((tasklock.Lock, ()), (tasklock.Semaphore, (1,))):
        for options in (
            {"timeout": 7, "fence_key": "{fresh}:fence", "on_lost": on_lost},
            {"watchdog": True, "fair": False, "owner_info": {"job": "a"}},
        ):
            template = kind(r, "fresh:template", *extra, **options)
            other = template.for_name("fresh:other", owner_info={"task": "t1"})
            built = kind(r, "fresh:other", *extra, **{**options, "owner_info": {"task": "t1"}})
            assert _state(other) == _state(built)
            assert type(other) is kind
            made.append((other, built))
    for other, built in made:  # and it locks what the constructor's object locks
        assert other.acquire(blocking=False)
        assert not built.acquire(blocking=False)
        assert not template.owned()
        other.release()
        assert built.acquire(blocking=False)
        built.release()


def test_for_name_refuses_a_bad_name(r: redis.Redis) -> None:
    template = tasklock.Lock(r, "fresh:template", timeout=5)
    for bad in ("", None, 5):
        with pytest.raises(ConfigurationError, match="name must be a non-empty string"):
            template.for_name(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="owner_info must be a dict"):
        template.for_name("fresh:x", owner_info=["job"])  # type: ignore[arg-type]
    assert template.for_name(b"fresh:bytes").name == "fresh:bytes"  # as the constructor takes it
