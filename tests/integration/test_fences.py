"""Fence tokens never go back, even when the store forgets the counter, and counters expire.

Issue 10, defects 1 and 2: a Redis restarted without persistence gave two overlapping holders the
same fence, an evicted counter made the fence go 6 -> 1, and every distinct lock name left a
counter key behind for ever. A counter that has to be made again now starts at the server's clock
in microseconds, above every token issued before, so the counter may expire (and be evicted).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

import tasklock
from tasklock.core import keys
from tasklock.core.keys import fence_key_for
from tests.support.polling import eventually
from tests.support.servers import RedisServer, start_servers

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = pytest.mark.usefixtures("resp")


@pytest.fixture
def forgetful() -> Iterator[RedisServer]:
    """A server of its own (these tests restart it and fill its memory), without persistence."""
    with start_servers(1) as servers:
        yield servers[0]


def test_a_restart_without_persistence_never_repeats_a_fence(forgetful: RedisServer) -> None:
    first = tasklock.Lock(forgetful.client(), "ledger", timeout=30)
    assert first.acquire()
    held_fence = first.fence
    assert held_fence is not None
    forgetful.restart()  # forgets the lock and the counter while `first` still thinks it holds
    second = tasklock.Lock(forgetful.client(), "ledger", timeout=30)
    assert second.acquire()  # the documented double hold when the store forgets...
    assert second.fence is not None
    assert second.fence > held_fence  # ...but a fenced store can tell the two holders apart
    second.release()


def test_an_evicted_counter_never_makes_the_fence_go_back(forgetful: RedisServer) -> None:
    r = forgetful.client()
    lock = tasklock.Lock(r, "evicted", timeout=30)
    fences = []
    for _ in range(6):
        with lock:
            fences.append(lock.fence)
    assert fences == sorted(set(fences))
    # allkeys-lru with a memory limit: filling the server evicts the (idle) counter.
    used = int(r.info("memory")["used_memory"])
    r.config_set("maxmemory", str(used + 2_000_000))
    r.config_set("maxmemory-policy", "allkeys-lru")
    filler = b"x" * 10_000
    counter = fence_key_for("evicted")
    written = 0
    while r.exists(counter):
        r.set(f"filler:{written}", filler)
        written += 1
        assert written < 5_000, "the counter was never evicted"
    r.config_set("maxmemory", "0")
    with lock:
        assert lock.fence is not None
        assert lock.fence > fences[-1]


def test_counters_expire_and_a_new_counter_starts_above_the_old_tokens(
    r: redis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keys, "FENCE_COUNTER_TTL", 0.2)
    last: dict[str, int] = {}
    for i in range(200):  # per-entity locking: one name per invoice
        lock = tasklock.Lock(r, f"invoice:{i}", timeout=0.1)
        with lock:
            assert lock.fence is not None
            last[lock.name] = lock.fence
    counters = [fence_key_for(name) for name in last]
    # Each with a TTL of at most the 0.2 s, or already expired (-2) on a slow run; never -1.
    assert all(r.pttl(counter) == -2 or 0 < r.pttl(counter) <= 200 for counter in counters)
    eventually(lambda: r.dbsize() == 0, timeout=10, what="every fence counter expired")
    lock = tasklock.Lock(r, "invoice:199", timeout=0.1)
    with lock:
        assert lock.fence is not None
        assert lock.fence > last["invoice:199"]


def test_the_default_counter_ttl_is_an_hour_or_the_lock_ttl(r: redis.Redis) -> None:
    with tasklock.Lock(r, "short", timeout=5):
        assert 3_590_000 < r.pttl(fence_key_for("short")) <= 3_600_000
    with tasklock.Lock(r, "long", timeout=7200):
        assert 7_190_000 < r.pttl(fence_key_for("long")) <= 7_200_000


def test_a_counter_ahead_of_the_clock_keeps_counting_and_gets_a_ttl(r: redis.Redis) -> None:
    ahead = 9 * 10**15  # a token from a server whose clock ran ahead (below 2**53: exact in Lua)
    r.set(fence_key_for("ahead"), ahead)
    with tasklock.Lock(r, "ahead", timeout=5) as lock:
        assert lock.fence == ahead + 1
    assert r.pttl(fence_key_for("ahead")) > 0
    r.set(fence_key_for("legacy"), 41)  # tokens 1..41 were issued by tasklock 0.1
    with tasklock.Lock(r, "legacy", timeout=5) as lock:
        assert lock.fence is not None
        assert lock.fence > 41


def test_a_counter_rolled_back_never_repeats_a_token(r: redis.Redis) -> None:
    """A failover to a replica that missed the last increments, or an old snapshot, restores an
    older counter: the next token is still above the lost one (the sentinel finding)."""
    lock = tasklock.Lock(r, "rolled", timeout=5)
    with lock:
        older = lock.fence
    snapshot = r.get(fence_key_for("rolled"))
    with lock:
        lost = lock.fence
    r.set(fence_key_for("rolled"), snapshot)  # the state the replica had
    with lock:
        assert lock.fence is not None
        assert lost is not None
        assert older is not None
        assert lock.fence > lost > older


def test_redlock_fences_survive_every_master_forgetting() -> None:
    with start_servers(3) as servers:
        clients = [server.client() for server in servers]
        lock = tasklock.Redlock(clients, "ledger", timeout=10, node_timeout=0.5)
        with lock:
            before = lock.fence
        assert before is not None
        for server in servers:
            server.restart()
        clients = [server.client() for server in servers]
        lock = tasklock.Redlock(clients, "ledger", timeout=10, node_timeout=0.5)
        with lock:
            assert lock.fence is not None
            assert lock.fence > before
        # Round 2 writes the counter on the quorum that acquired; none is left without a TTL.
        ttls = [client.pttl(fence_key_for("ledger")) for client in clients]
        assert sum(0 < ttl <= 3_600_000 for ttl in ttls) >= 2, ttls
        assert -1 not in ttls
