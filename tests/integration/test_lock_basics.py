"""tasklock.Lock against a real redis-server: acquire, release, extend, ownership, fences."""

from __future__ import annotations

import threading

import pytest
import redis

import tasklock
from tasklock.core.owner import parse_value

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = pytest.mark.usefixtures("resp")


def test_acquire_release_cycle_and_fence(r: redis.Redis) -> None:
    lock = tasklock.Lock(r, "cycle")
    assert lock.acquire()
    assert lock.owned()
    assert lock.locked()
    first = lock.fence
    assert isinstance(first, int)
    holder = parse_value(r.get("cycle"))
    assert holder.fence == first
    assert holder.meta["pid"] > 0
    lock.release()
    assert not lock.locked()
    assert lock.acquire()
    assert lock.fence > first
    lock.release()


def test_key_is_exactly_the_name_and_ttl_is_default(r: redis.Redis) -> None:
    with tasklock.Lock(r, "exact:name"):
        assert r.exists("exact:name")
        assert 29_000 < r.pttl("exact:name") <= 30_000
    assert r.keys("*") == [b"{exact:name}:fence"]


def test_works_as_redis_lock_class(r: redis.Redis) -> None:
    lock = r.lock("via-redis", timeout=5, lock_class=tasklock.Lock)
    assert isinstance(lock, tasklock.Lock)
    with lock:
        assert 4000 < r.pttl("via-redis") <= 5000
    assert not r.exists("via-redis")


def test_non_blocking_second_acquire_fails(r: redis.Redis) -> None:
    a = tasklock.Lock(r, "busy")
    b = tasklock.Lock(r, "busy")
    assert a.acquire()
    assert b.acquire(blocking=False) is False
    assert b.acquire(blocking_timeout=0.2) is False
    a.release()
    assert b.acquire(blocking=False)
    b.release()


def test_release_twice_and_release_unowned_raise(r: redis.Redis) -> None:
    lock = tasklock.Lock(r, "twice")
    with pytest.raises(tasklock.LockError):
        lock.release()
    lock.acquire()
    r.delete("twice")
    with pytest.raises(tasklock.LockNotOwnedError):
        lock.release()
    lock.acquire()
    r.set("twice", "someone-else")
    with pytest.raises(redis.exceptions.LockNotOwnedError):  # redis-py's class catches ours too
        lock.release()


def test_extend_adds_and_replaces(r: redis.Redis) -> None:
    lock = tasklock.Lock(r, "ext", timeout=10)
    lock.acquire()
    assert lock.extend(10)
    assert 19_000 < r.pttl("ext") <= 20_000
    assert lock.extend(3, replace_ttl=True)
    assert 2_000 < r.pttl("ext") <= 3_000
    assert lock.reacquire()
    assert 9_000 < r.pttl("ext") <= 10_000
    lock.release()
    with pytest.raises(tasklock.LockError):
        lock.extend(1)


def test_expired_lock_cannot_be_extended(r: redis.Redis) -> None:
    lock = tasklock.Lock(r, "short", timeout=0.05)
    lock.acquire()
    other = tasklock.Lock(r, "short")
    assert other.acquire(blocking_timeout=5)  # wakes when the key expires
    with pytest.raises(tasklock.LockNotOwnedError):
        lock.extend(1)
    other.release()


def test_thread_local_tokens(r: redis.Redis) -> None:
    lock = tasklock.Lock(r, "tl", timeout=5)
    lock.acquire()
    seen: list[object] = []

    def other_thread() -> None:
        seen.append(lock.owned())
        try:
            lock.release()
        except tasklock.LockError as exc:
            seen.append(type(exc))

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert seen == [False, tasklock.LockError]
    lock.release()


def test_thread_local_false_shares_the_hold(r: redis.Redis) -> None:
    lock = tasklock.Lock(r, "shared", timeout=5, thread_local=False)
    lock.acquire()
    t = threading.Thread(target=lock.release)
    t.start()
    t.join()
    assert not r.exists("shared")


def test_shared_fence_key(r: redis.Redis) -> None:
    a = tasklock.Lock(r, "{fam}:a", fence_key="{fam}:fence")
    b = tasklock.Lock(r, "{fam}:b", fence_key="{fam}:fence")
    with a, b:
        assert a.fence is not None
        assert b.fence > a.fence
        last = b.fence
    assert r.get("{fam}:fence") == str(last).encode()


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"timeout": 0}, "timeout"),
        ({"timeout": -1}, "timeout"),
        ({"timeout": "10"}, "timeout"),
        ({"timeout": True}, "timeout"),
        ({"blocking_timeout": -1}, "blocking_timeout"),
        ({"sleep": 0}, "sleep"),
        ({"fence_key": ""}, "fence_key"),
        ({"on_lost": 3}, "on_lost"),
    ],
)
def test_bad_arguments_are_named(r: redis.Redis, kwargs: dict[str, object], fragment: str) -> None:
    with pytest.raises(tasklock.ConfigurationError, match=fragment):
        tasklock.Lock(r, "bad", **kwargs)  # type: ignore[arg-type]


def test_bad_name_and_client(r: redis.Redis) -> None:
    with pytest.raises(tasklock.ConfigurationError, match="name"):
        tasklock.Lock(r, "")
    with pytest.raises(tasklock.ConfigurationError, match="redis-py client"):
        tasklock.Lock("redis://localhost", "x")


def test_dead_server_is_a_clear_error() -> None:
    from tests.support.servers import free_port

    port = free_port()
    client = redis.Redis(port=port, socket_connect_timeout=0.5)
    lock = tasklock.Lock(client, "nowhere")
    with pytest.raises(tasklock.BackendUnavailable, match=f"redis://localhost:{port}/0") as info:
        lock.acquire()
    assert "Check that redis-server is running" in str(info.value)
    assert isinstance(info.value.__cause__, redis.exceptions.ConnectionError)
    assert isinstance(info.value, redis.exceptions.ConnectionError)


def test_a_retried_acquire_finds_its_own_hold(r: redis.Redis) -> None:
    """redis-py retries a call whose answer was lost; the second run must not see "held"."""
    from tasklock.core.scripts import ACQUIRE

    keys = ("retried", "{retried}:fence")
    first = ACQUIRE(r, keys, ("owner-token", 5000, 60_000))
    assert first[0] == 1
    assert ACQUIRE(r, keys, ("owner-token", 5000, 60_000)) == first  # the same hold and fence
    assert ACQUIRE(r, keys, ("other-token", 5000, 60_000))[0] == 0
    assert ACQUIRE(r, keys, ("owner", 5000, 60_000))[0] == 0  # a prefix of the token is not it
    r.hset("a-hash", "x", 1)
    assert ACQUIRE(r, ("a-hash", "{a-hash}:fence"), ("t", 5000))[0] == 0  # foreign types: held


OWNERS = {
    "lock, fair": lambda r, name: tasklock.Lock(r, name, timeout=30),
    "lock, unfair": lambda r, name: tasklock.Lock(r, name, timeout=30, fair=False),
    "semaphore, fair": lambda r, name: tasklock.Semaphore(r, name, 1, timeout=30),
    "semaphore, unfair": lambda r, name: tasklock.Semaphore(r, name, 1, timeout=30, fair=False),
}


@pytest.mark.parametrize("action", ["release", "extend"])
@pytest.mark.parametrize("kind", sorted(OWNERS))
def test_release_and_extend_never_touch_another_owners_hold(
    r: redis.Redis, kind: str, action: str
) -> None:
    """The owner check of every release and extend script: the first holder's key is gone (as
    after its TTL ran out) and a second owner took the name; the first one's release or extend
    must fail and leave the second's hold as it was. A release that deleted without checking
    used to pass every lock test (only the CLI's noticed)."""
    name = f"owners:{kind.replace(', ', '-')}:{action}"
    first, second = OWNERS[kind](r, name), OWNERS[kind](r, name)
    assert first.acquire(blocking=False)
    r.delete(name)  # its key ran out (without the wait)
    assert second.acquire(blocking=False)
    stored, ttl = r.dump(name), r.pttl(name)
    act = first.release if action == "release" else lambda: first.extend(100)
    with pytest.raises(tasklock.LockNotOwnedError):
        act()
    assert r.dump(name) == stored  # untouched: the same holder, the same fence
    assert 0 < r.pttl(name) <= ttl  # and not extended
    assert second.owned()
    second.release()
    assert not r.exists(name)
