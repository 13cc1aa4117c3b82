"""tasklock behind Redis Sentinel: a master, one replica, three sentinels (quorum 2).

Through ``Sentinel(...).master_for(service)``: the lock works and a waiter is woken by the
release. Then the failure the README documents for one Redis with failover: replication is
asynchronous, so a failover can promote a replica that never received the lock. The test makes
that happen for sure (the replica is stopped and its link cut while the lock is taken, then the
old master is stopped and the replica promoted): a second client then takes the same lock on the
new master while the first still believes it holds it (the double hold). Fencing is what keeps
that safe: the second holder's fence is higher than the first's, so a fenced store rejects the
first holder's late write.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

import tasklock
from tasklock.core.keys import wake_channel
from tasklock.errors import BackendUnavailable
from tests.support.guarding import check_singleton
from tests.support.history import FencedRegister
from tests.support.polling import eventually
from tests.support.servers import HOST, RedisServer, SentinelServers, wait_for
from tests.support.waking import evalsha_calls as count_evalsha

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]

BIG_SLEEP = 30.0  # a waiter's first poll would come 15-30 s after it went to sleep
WAKE_DEADLINE = 10.0


@pytest.fixture
def master(redis_sentinel: SentinelServers) -> Iterator[redis.Redis]:
    """A client through the sentinels to whichever server is master now, emptied first."""
    client = redis_sentinel.master_client()
    client.flushall()
    yield client
    client.close()


def role_of(server: RedisServer) -> str:
    client = server.client()
    try:
        role = client.execute_command("ROLE")[0]
    finally:
        client.close()
    return role.decode() if isinstance(role, bytes) else str(role)


def named_master(sentinel: RedisServer, service: str) -> int:
    client = sentinel.client()
    try:
        return int(client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", service)[1])
    finally:
        client.close()


def evalsha_calls(server: RedisServer) -> int:
    client = server.client()
    try:
        return count_evalsha(client)
    finally:
        client.close()


def test_lock_and_wakeup_through_the_sentinels(
    redis_sentinel: SentinelServers, master: redis.Redis
) -> None:
    current = redis_sentinel.current_master()
    with tasklock.Lock(master, "warm-up", timeout=5):  # scripts loaded: no NOSCRIPT below
        pass
    holder = tasklock.Lock(master, "handoff", timeout=300)
    assert holder.acquire()
    first_fence = holder.fence
    assert isinstance(first_fence, int)
    waiter = tasklock.Lock(master, "handoff", timeout=30, sleep=BIG_SLEEP)
    outcome: list[bool] = []
    acquired = threading.Event()

    def wait() -> None:
        outcome.append(waiter.acquire(blocking_timeout=25))
        acquired.set()

    client = current.client()
    client.config_resetstat()
    channel = wake_channel("handoff")
    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    try:
        eventually(
            lambda: dict(client.pubsub_numsub(channel)).get(channel.encode(), 0) >= 1,
            what="the waiter subscribed on the master",
        )
        eventually(lambda: evalsha_calls(current) >= 2, what="the waiter tried twice, then slept")
        holder.release()
        assert acquired.wait(WAKE_DEADLINE), "not woken by the release"
        thread.join(5)
        assert outcome == [True]
        assert evalsha_calls(current) == 4, "two tries, the release, one try after: no polls"
        stored = client.get("handoff")
        assert stored is not None
        assert int(stored.rsplit(b"#", 1)[1]) > first_fence
    finally:
        client.close()


def test_a_singleton_on_a_sentinel_url_excludes_a_duplicate(
    redis_sentinel: SentinelServers, master: redis.Redis
) -> None:
    guard = check_singleton(redis_sentinel.url, "sentinel.settle")
    assert master.exists(guard.fence_key)  # on the master the sentinels name


def _promote(sentinels: SentinelServers, new_master: RedisServer) -> None:
    """Ask a sentinel to fail over (it needs fresh INFO from the replica first: retried), then
    wait until every sentinel names ``new_master`` and it answers as a master."""

    def failover_started() -> bool:
        client = sentinels.sentinels[0].client()
        try:
            client.execute_command("SENTINEL FAILOVER", sentinels.service)
        except redis.ResponseError as exc:
            if "INPROG" not in str(exc):  # NOGOODSLAVE until the replica's INFO is fresh
                return False
        finally:
            client.close()
        return True

    wait_for(failover_started, "a sentinel accepted SENTINEL FAILOVER", timeout=30)

    def promoted() -> bool:
        return role_of(new_master) == "master" and all(
            named_master(sentinel, sentinels.service) == new_master.port
            for sentinel in sentinels.sentinels
        )

    wait_for(promoted, f"port {new_master.port} promoted and named by every sentinel", timeout=30)


@pytest.mark.parametrize(
    "locked_before",
    [
        pytest.param(False, id="first-hold-of-the-name"),
        pytest.param(True, id="counter-replicated-earlier"),
    ],
)
def test_a_failover_that_loses_the_lock_double_holds_and_fencing_rejects_the_stale_write(
    redis_sentinel: SentinelServers, master: redis.Redis, tmp_path: Path, locked_before: bool
) -> None:
    old_master = redis_sentinel.current_master()
    [replica] = [s for s in redis_sentinel.servers if s is not old_master]
    register = FencedRegister(tmp_path / "register.sqlite")
    old = old_master.client()
    if locked_before:
        # The name was locked before: its fence counter exists, and reaches the replica.
        with tasklock.Lock(master, "ledger", timeout=30) as earlier:
            assert register.write("ledger", earlier.fence, "earlier")  # type: ignore[arg-type]
    else:
        master.set("unrelated", "x")
    assert old.execute_command("WAIT", 1, 5000) == 1, "the replica did not catch up"

    # The replica stops and its link is cut: nothing written from now on reaches it (a stopped
    # replica would still apply what sits in its socket buffer once resumed).
    replica.pause()
    try:
        old.execute_command("CLIENT KILL TYPE replica")
        first = tasklock.Lock(master, "ledger", timeout=60)
        assert first.acquire(blocking=False)
        first_fence = first.fence
        assert isinstance(first_fence, int)
        assert register.write("ledger", first_fence, "first holder, on time")
        old.close()
        # The old master crashes; the replica, which never saw the lock, comes back and is
        # promoted.
        old_master.stop()
    finally:
        replica.resume()
    second_client = redis_sentinel.master_client()
    try:
        _promote(redis_sentinel, replica)
        # A second client, through the sentinels, on the new master: the lock is free there.
        second = tasklock.Lock(second_client, "ledger", timeout=60)
        assert second.acquire(blocking=False), "the promoted replica should not have the lock"
        # The documented double hold: the first holder still believes it holds the lock (its
        # task body would still be running).
        assert first.fence == first_fence
        second_fence = second.fence
        assert isinstance(second_fence, int)
        # The first holder's release (through the sentinels, so on the new master) can never
        # delete the second holder's lock.
        with pytest.raises((tasklock.LockNotOwnedError, BackendUnavailable)):
            first.release()
        assert second.owned()
    finally:
        # The old master comes back empty, as a replica of the new one.
        old_master.extra_args = ("--replicaof", HOST, str(replica.port))
        old_master.start()
        redis_sentinel.wait_until_settled(replica)

    # Fencing is what makes the double hold safe: the second hold's fence is higher...
    assert second_fence > first_fence, (
        f"second holder's fence {second_fence} is not above the first's {first_fence}"
    )
    assert register.write("ledger", second_fence, "second holder")
    # ...so the store rejects the first holder's late write.
    assert register.write("ledger", first_fence, "first holder, late") is False
    register.assert_consistent()
    second.release()
    second_client.close()
