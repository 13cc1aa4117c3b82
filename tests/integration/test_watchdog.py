"""The watchdog against real redis-servers: renewal, loss, release, outages, NOSCRIPT, batching.

TTLs are short (0.5 s) so that "several TTLs" takes a couple of seconds; every wait is a poll with
a deadline, never a sleep standing in for synchronisation.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis

import tasklock
import tasklock.core.watchdog as watchdog_module
from tasklock.core.base import BaseLock
from tasklock.core.scripts import EXTEND
from tasklock.core.watchdog import Renewal, Watchdog
from tests.support.polling import eventually, holds_for
from tests.support.servers import RedisServer, start_servers

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = pytest.mark.usefixtures("resp")

TTL = 0.5


@pytest.fixture
def watchdog() -> Iterator[Watchdog]:
    """A fresh process watchdog for the test, so its counters count only this test's work."""
    previous = watchdog_module._watchdog
    fresh = watchdog_module._watchdog = Watchdog()
    yield fresh
    watchdog_module._watchdog = previous


@pytest.fixture(scope="module")
def second_server() -> Iterator[RedisServer]:
    with start_servers(1) as servers:
        yield servers[0]


def renewal_of(lock: BaseLock) -> Renewal:
    renewal = lock.local.hold.renewal
    assert isinstance(renewal, Renewal)
    return renewal


class LostRecorder:
    """An ``on_lost`` callback that remembers its calls and lets a test wait for one."""

    def __init__(self) -> None:
        self.calls: list[BaseLock] = []
        self.seen: list[tuple[bool, str | None]] = []  # lock.lost, as the callback saw it
        self.event = threading.Event()

    def __call__(self, lock: BaseLock) -> None:
        self.calls.append(lock)
        self.seen.append((bool(lock.lost), lock.lost.reason))
        self.event.set()


def test_renews_past_several_ttls(r: redis.Redis, watchdog: Watchdog) -> None:
    lock = tasklock.Lock(r, "long-task", timeout=TTL, watchdog=True)
    assert lock.acquire()
    checks = holds_for(
        lambda: r.pttl("long-task") > 0 and lock.owned(), 5 * TTL, what="held and PTTL > 0"
    )
    assert checks > 20
    assert renewal_of(lock).renewals >= 4, "5 TTLs need several renewals"
    assert not lock.lost
    lock.release()
    assert not r.exists("long-task")


def test_default_timeout_is_renewed_by_default(r: redis.Redis, watchdog: Watchdog) -> None:
    lock = tasklock.Lock(r, "default-ttl")
    assert lock.watchdog is True
    explicit = tasklock.Lock(r, "explicit-ttl", timeout=5)
    assert explicit.watchdog is False
    with lock, explicit:
        assert watchdog.held() == 1
        assert explicit.local.hold.renewal is None


@pytest.mark.parametrize("how", ["deleted", "overwritten"])
def test_lost_lock_is_detected(r: redis.Redis, watchdog: Watchdog, how: str) -> None:
    on_lost = LostRecorder()
    lock = tasklock.Lock(r, "victim", timeout=TTL, watchdog=True, on_lost=on_lost)
    assert lock.acquire()
    if how == "deleted":
        r.delete("victim")
    else:
        r.set("victim", "someone-else", px=60_000)
    assert on_lost.event.wait(10), "on_lost was not called"
    assert on_lost.calls == [lock]
    assert lock.lost
    assert lock.lost.reason is not None
    assert "gone or held by another owner" in lock.lost.reason
    # The callback runs on the watchdog thread; a thread-local lock shows it the lost hold too.
    assert on_lost.seen == [(True, lock.lost.reason)]
    assert not lock.owned()
    with pytest.raises(tasklock.LockLostError, match="lost while held"):
        lock.release()
    if how == "overwritten":
        assert r.get("victim") == b"someone-else", "the other owner's value must survive"
    assert watchdog.held() == 0


def test_no_renewal_after_release(r: redis.Redis, watchdog: Watchdog) -> None:
    on_lost = LostRecorder()
    lock = tasklock.Lock(r, "released", timeout=TTL, watchdog=True, on_lost=on_lost)
    pacer = tasklock.Lock(r, "pacer", timeout=TTL, watchdog=True)  # keeps the watchdog ticking
    assert pacer.acquire()
    assert lock.acquire()
    entry = renewal_of(lock)
    eventually(lambda: entry.renewals >= 1, what="the lock was being renewed")
    lock.release()
    renewed = entry.renewals

    # Nobody holds it: over several would-be renewal periods it stays absent.
    ticks = watchdog.ticks
    holds_for(lambda: not r.exists("released"), 3 * TTL / 3 + 0.1)
    eventually(lambda: watchdog.ticks >= ticks + 3, what="three more watchdog ticks")

    # Someone else holds it: no renewal of ours touches their TTL, and ours is not "lost".
    other = tasklock.Lock(r, "released", timeout=60)
    assert other.acquire(blocking=False)
    ticks = watchdog.ticks
    eventually(lambda: watchdog.ticks >= ticks + 4, what="four more watchdog ticks")
    assert r.pttl("released") > 55_000, "a renewal after release would have set 500 ms"
    assert entry.renewals == renewed
    assert on_lost.calls == []
    assert not lock.lost
    assert watchdog.held() == 1  # only the pacer
    other.release()
    pacer.release()


def test_unreachable_redis_marks_lock_lost(
    redis_server: RedisServer, r: redis.Redis, watchdog: Watchdog
) -> None:
    on_lost = LostRecorder()
    lock = tasklock.Lock(r, "outage", timeout=TTL, watchdog=True, on_lost=on_lost)
    assert lock.acquire()
    eventually(lambda: renewal_of(lock).renewals >= 1)
    redis_server.stop()  # SIGKILL: connections are refused from now on
    try:
        assert on_lost.event.wait(30), "a lock that cannot be renewed must be reported lost"
        assert lock.lost.reason is not None
        assert "unreachable" in lock.lost.reason
        with pytest.raises(tasklock.BackendUnavailable, match="releasing lock 'outage'"):
            lock.release()
    finally:
        redis_server.start()


def test_stalled_server_does_not_stall_other_locks(
    redis_server: RedisServer, second_server: RedisServer, r: redis.Redis, watchdog: Watchdog
) -> None:
    """A paused server (socket open, no answer, and redis-py's default of no socket timeout)
    must neither hide the loss of its own lock nor stop renewals of locks elsewhere."""
    stalled_client = redis.Redis(host="127.0.0.1", port=redis_server.port)  # no socket_timeout
    healthy_client = second_server.client()
    healthy_client.flushall()
    on_lost = LostRecorder()
    stuck = tasklock.Lock(stalled_client, "on-stalled", timeout=TTL, watchdog=True, on_lost=on_lost)
    fine = tasklock.Lock(healthy_client, "on-healthy", timeout=TTL, watchdog=True)
    assert stuck.acquire()
    assert fine.acquire()
    redis_server.pause()
    try:
        holds_for(
            lambda: healthy_client.pttl("on-healthy") > 0 and not fine.lost,
            6 * TTL,
            what="the lock on the healthy server stays renewed",
        )
        assert on_lost.event.wait(5), "the lock on the stalled server must be reported lost"
        assert stuck.lost.reason is not None
        assert "unreachable" in stuck.lost.reason
        assert fine.owned()
    finally:
        redis_server.resume()
    fine.release()
    with pytest.raises(tasklock.LockLostError):
        stuck.release()
    stalled_client.close()
    healthy_client.close()


def test_noscript_recovery(r: redis.Redis, watchdog: Watchdog) -> None:
    lock = tasklock.Lock(r, "flushed", timeout=5)
    r.script_flush()
    assert lock.acquire()
    r.script_flush()
    assert lock.extend(1)
    r.script_flush()
    assert lock.reacquire()
    r.script_flush()
    lock.release()
    assert not r.exists("flushed")

    renewed = tasklock.Lock(r, "flushed-watchdog", timeout=TTL, watchdog=True)
    assert renewed.acquire()
    entry = renewal_of(renewed)
    eventually(lambda: entry.renewals >= 1)
    before = entry.renewals
    r.script_flush()
    eventually(lambda: entry.renewals >= before + 2, what="renewals after SCRIPT FLUSH")
    assert r.script_exists(EXTEND.sha) == [True]
    assert not renewed.lost
    assert renewed.owned()
    renewed.release()


class CountingConnection(redis.Connection):
    """A real connection that counts the packets it writes: one per round trip."""

    writes = 0

    def send_packed_command(self, command: object, check_health: bool = True) -> None:
        CountingConnection.writes += 1
        super().send_packed_command(command, check_health)  # type: ignore[arg-type]


def test_many_locks_renewed_in_one_round_trip_per_tick(
    redis_server: RedisServer, r: redis.Redis, watchdog: Watchdog
) -> None:
    count, ttl = 500, 3.0
    pool = redis.ConnectionPool(
        host="127.0.0.1", port=redis_server.port, connection_class=CountingConnection
    )
    client = redis.Redis(connection_pool=pool)
    locks = [tasklock.Lock(client, f"batch:{i}", timeout=ttl, watchdog=True) for i in range(count)]
    started = time.monotonic()
    for lock in locks:
        assert lock.acquire()
    span = time.monotonic() - started
    entries = [renewal_of(lock) for lock in locks]
    r.script_load(EXTEND.source)  # NOSCRIPT recovery would add a round trip (tested above)
    r.config_resetstat()
    writes = CountingConnection.writes
    eventually(lambda: all(e.renewals >= 1 for e in entries), timeout=10, what="all renewed")
    # Renewals are due a third of a TTL after acquisition, and everything due within a sixth of
    # a TTL goes in the same tick: locks taken in a burst shorter than that share one tick.
    assert watchdog.ticks <= 1 + int(span / (ttl / 6)), f"{watchdog.ticks} ticks, span {span:.2f}s"
    assert watchdog.round_trips == watchdog.ticks, "one round trip per tick"
    assert watchdog.calls == count
    assert CountingConnection.writes - writes == watchdog.round_trips, "one packet per round trip"
    stats = r.info("commandstats")
    assert stats["cmdstat_evalsha"]["calls"] == count
    assert all(client.pttl(f"batch:{i}") > (ttl - 1.5) * 1000 for i in range(0, count, 50))
    for lock in locks:
        lock.release()
    assert watchdog.held() == 0
    client.close()
    pool.disconnect()
