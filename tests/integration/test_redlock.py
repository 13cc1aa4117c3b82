"""Redlock against five real, independent redis-server processes: the lock's interface (the same
as tasklock.Lock), the two-round fencing, extend and watchdog renewal needing a quorum, wake-up by
release, and what Redlock stores on each master. Faults (stopped or paused masters, restarts,
paused processes) are in test_redlock_faults.py."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import tasklock
from tasklock.core.keys import wake_channel
from tasklock.core.owner import parse_value
from tasklock.core.redlock import Redlock
from tasklock.errors import LockError, LockLostError, LockNotOwnedError, QuorumNotReached
from tests.support.fences import server_micros
from tests.support.polling import eventually
from tests.support.servers import RedisServer
from tests.support.waking import evalsha_calls

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = pytest.mark.usefixtures("resp")

NODE_TIMEOUT = 0.25  # generous: these tests are about behaviour, not about slow masters
BIG_SLEEP = 30.0  # a waiter's first poll would come 15-30 s after it went to sleep
WAKE_DEADLINE = 10.0


@pytest.fixture
def clients(nodes: list[RedisServer]) -> Iterator[list[redis.Redis]]:
    made = [server.client() for server in nodes]
    yield made
    for client in made:
        client.close()


def redlock(clients: list[redis.Redis], name: str = "job", **options: Any) -> Redlock:
    options.setdefault("timeout", 10)
    options.setdefault("node_timeout", NODE_TIMEOUT)
    return Redlock(clients, name, **options)


def stored(clients: list[redis.Redis], key: str) -> list[bytes | None]:
    return [client.get(key) for client in clients]


def nothing_left(clients: list[redis.Redis], name: str) -> bool:
    return not any(client.exists(name) for client in clients)


def test_cycle_stores_the_fenced_value_on_a_quorum(clients: list[redis.Redis]) -> None:
    lock = redlock(clients, owner_info={"task": "t-1"})
    assert lock.acquire(blocking=False) is True
    fence = lock.fence
    assert isinstance(fence, int)
    assert fence >= 1
    value = lock.local.token
    assert value.endswith(b"#%d" % fence)
    assert b'"task":"t-1"' in value
    owner = value.rsplit(b"#", 1)[0]
    holder = parse_value(value)  # what operators' tools read: token, metadata, fence
    assert holder.fence == fence
    assert holder.meta["task"] == "t-1"
    assert {"host", "pid"} <= set(holder.meta)
    # The key is exactly the name; a quorum holds the fenced value (the others, if their round-1
    # answer came after the quorum, hold the round-1 value) and has the counter at the fence.
    values = stored(clients, "job")
    assert sum(v == value for v in values) >= 3
    assert all(v in (value, owner) for v in values if v is not None)
    counters = stored(clients, "{job}:fence")
    assert sum(c == str(fence).encode() for c in counters) >= 3
    assert all(0 < client.pttl("job") <= 10_000 for client in clients if client.exists("job"))
    assert lock.owned()
    assert lock.locked()
    lock.release()
    eventually(lambda: nothing_left(clients, "job"), what="released on every master")
    assert not lock.owned()
    assert not lock.locked()


def test_fences_strictly_increase_across_lock_objects(clients: list[redis.Redis]) -> None:
    fences = []
    for i in range(12):
        lock = redlock(clients, fence_key="shared:fence" if i % 2 else None)
        with lock:
            fences.append(lock.fence)
        # A lock object per cycle, alternating two fence counters: each counter increases.
    assert fences[0::2] == sorted(set(fences[0::2]))
    assert fences[1::2] == sorted(set(fences[1::2]))
    # Round 2 wrote the last fence on a quorum; a master outside that quorum may lag, never lead.
    counters = [int(c.get("shared:fence") or 0) for c in clients]
    assert counters.count(fences[-1]) >= 3
    assert max(counters) == fences[-1]


def test_a_held_lock_is_not_acquired_again(clients: list[redis.Redis]) -> None:
    holder = redlock(clients)
    assert holder.acquire()
    other = redlock(clients)
    assert other.acquire(blocking=False) is False
    assert other.acquire(blocking_timeout=0.3) is False
    assert other.fence is None
    assert not other.owned()
    with pytest.raises(LockError, match="not reentrant"):
        holder.acquire()
    # The failed attempts left nothing behind: the holder's value is intact everywhere.
    assert stored(clients, "job").count(holder.local.token) >= 3
    holder.release()
    assert other.acquire(blocking=False)
    assert other.fence is not None
    assert other.fence > (holder.fence or 0)
    other.release()


def test_release_and_extend_errors(clients: list[redis.Redis]) -> None:
    lock = redlock(clients, timeout=0.4)
    with pytest.raises(LockError, match="not owned"):
        lock.release()
    with pytest.raises(LockError, match="unlocked"):
        lock.extend(1)
    assert lock.acquire()
    lock.release()
    with pytest.raises(LockError):
        lock.release()
    assert lock.acquire()
    eventually(lambda: nothing_left(clients, "job"), what="the TTL ran out on every master")
    with pytest.raises(LockNotOwnedError):
        lock.extend(1)
    assert lock.acquire()
    eventually(lambda: nothing_left(clients, "job"), what="the TTL ran out on every master")
    with pytest.raises(LockNotOwnedError):
        lock.release()


def test_extend_and_reacquire_reach_every_master(clients: list[redis.Redis]) -> None:
    lock = redlock(clients, timeout=2)
    assert lock.acquire()
    # Each call goes to every master and returns once a quorum has answered (a master that is
    # slower than that, or not connected yet, is not waited for): a quorum is what is promised.
    assert lock.extend(20) is True
    eventually(lambda: sum(c.pttl("job") > 15_000 for c in clients) >= 3, what="extended")
    assert lock.extend(5, replace_ttl=True) is True
    eventually(lambda: sum(0 < c.pttl("job") <= 5_000 for c in clients) >= 3, what="replaced")
    assert lock.reacquire() is True
    eventually(lambda: sum(1_000 < c.pttl("job") <= 2_000 for c in clients) >= 3, what="reset")
    # Gone on a majority: extend is refused and the hold ends.
    for client in clients[:3]:
        client.delete("job")
    with pytest.raises(LockNotOwnedError):
        lock.extend(1)
    assert lock.fence is None


def test_thread_local_holds(clients: list[redis.Redis]) -> None:
    lock = redlock(clients, name="tl")
    other_thread: dict[str, Any] = {}
    assert lock.acquire()

    def elsewhere() -> None:
        other_thread["fence"] = lock.fence
        other_thread["acquired"] = lock.acquire(blocking=False)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(10)
    assert other_thread == {"fence": None, "acquired": False}
    lock.release()


def test_waiter_is_woken_by_the_release(clients: list[redis.Redis]) -> None:
    holder = redlock(clients, name="wake", timeout=60)
    assert holder.acquire()
    held_fence = holder.fence or 0
    waiter = redlock(clients, name="wake", timeout=60, sleep=BIG_SLEEP, thread_local=False)
    before = [evalsha_calls(c) for c in clients]
    result: dict[str, Any] = {}

    def wait() -> None:
        result["acquired"] = waiter.acquire(blocking_timeout=WAKE_DEADLINE * 2)
        result["fence"] = waiter.fence

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    channel = wake_channel("wake").encode()
    eventually(
        lambda: all(dict(c.pubsub_numsub(channel)).get(channel, 0) >= 1 for c in clients),
        what="the waiter subscribed on every master",
    )
    # Each failed attempt is decided by at least a majority's answers (3 "held" of 5): two
    # attempts ran at least 6 scripts in all. (Not "2 on every master": a master whose connection
    # was still being made when the others had decided the round is not asked in that round.)
    eventually(
        lambda: sum(evalsha_calls(c) for c in clients) >= sum(before) + 2 * 3,
        what="the waiter tried twice (before and after subscribing), then slept",
    )
    holder.release()
    thread.join(WAKE_DEADLINE)
    assert not thread.is_alive(), "the waiter was not woken by the release"
    assert result["acquired"] is True
    assert result["fence"] > held_fence
    waiter.release()


def test_watchdog_renews_past_several_ttls_then_reports_loss(
    clients: list[redis.Redis],
) -> None:
    lost: list[str] = []
    lock = redlock(
        clients, name="wd", timeout=0.6, watchdog=True, on_lost=lambda lk: lost.append(lk.name)
    )
    assert lock.acquire()
    holders = [c for c in clients if c.exists("wd")]
    assert len(holders) >= 3
    # Renewed at about a third of the TTL: after 3 TTLs the key is still ours on every holder.
    threading.Event().wait(1.8)  # the duration under test, not a synchronisation
    assert lock.owned()
    assert not lock.lost
    # (a master whose round-1 answer came after the quorum holds the round-1 value, unfenced)
    ours = (lock.local.token, lock.local.token.rsplit(b"#", 1)[0])
    assert all(c.get("wd") in ours for c in holders)
    # Taken away on a majority (as if it had expired there): the next renewal finds it gone.
    for client in clients[:3]:
        client.set("wd", "someone-else", px=60_000)
    assert lock.lost.wait(5), "the watchdog did not notice the loss"
    eventually(lambda: lost == ["wd"], what="on_lost was called once")
    with pytest.raises(LockLostError):
        lock.release()
    # Our own value is still on the two other masters until its TTL: not touched by anyone else.
    for client in clients[:3]:
        client.delete("wd")


def test_majority_silent_raises_quorum_not_reached_naming_the_masters(
    nodes: list[RedisServer], clients: list[redis.Redis]
) -> None:
    lock = redlock(clients, name="q", node_timeout=0.05)
    for server in nodes[:3]:
        server.pause()
    try:
        with pytest.raises(QuorumNotReached) as info:
            lock.acquire(blocking=False)
    finally:
        for server in nodes[:3]:
            server.resume()
    error = info.value
    assert isinstance(error, tasklock.BackendUnavailable)
    labels = {server.url.partition("?")[0] for server in nodes[:3]}  # (named without options)
    assert set(error.failures) == labels
    assert all(url in str(error) for url in labels)
    assert "3 of 5 masters gave no verdict" in str(error)
    eventually(lambda: nothing_left(clients, "q"), what="the failed attempt was undone")


def test_single_master_warns_but_works(nodes: list[RedisServer]) -> None:
    client = nodes[0].client()
    with pytest.warns(RuntimeWarning, match="not fault tolerant"):
        lock = Redlock([client], "solo", timeout=5)
    before = server_micros(client)
    with lock:
        assert lock.fence is not None
        assert lock.fence > before
        assert client.get("solo") == lock.local.token
    assert not client.exists("solo")
    client.close()


def test_urls_work_like_clients(nodes: list[RedisServer]) -> None:
    lock = Redlock([server.url for server in nodes], "by-url", timeout=5, node_timeout=0.2)
    checks = [server.client() for server in nodes]
    before = min(server_micros(client) for client in checks)
    with lock:
        assert lock.fence is not None
        assert lock.fence > before
        assert stored(checks, "by-url").count(lock.local.token) >= 3
    eventually(lambda: nothing_left(checks, "by-url"), what="released on every master")
    for client in checks:
        client.close()


def _child_cycles(lock: Redlock, held: Redlock, go: Any, results: Any) -> None:
    # The parent's hold is not inherited; the lock objects (and their masters) work in the child
    # over the child's own connections, while the parent keeps using its own.
    results.put(("inherited", held.fence))
    go.wait(10)
    fences = []
    for _ in range(100):
        with lock:
            fences.append(lock.fence)
    results.put(("fences", fences))


def test_forked_child_uses_its_own_connections(clients: list[redis.Redis]) -> None:
    ctx = multiprocessing.get_context("fork")
    lock = redlock(clients, name="forked")
    held = redlock(clients, name="held-by-parent")
    assert held.acquire()
    with lock:  # the parent's connections to every master are stocked before the fork
        pass
    go, results = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=_child_cycles, args=(lock, held, go, results))
    child.start()
    go.set()
    # Both processes run cycles at the same time: shared sockets would mix up their replies.
    fences = []
    for _ in range(100):
        with lock:
            fences.append(lock.fence)
    child.join(60)
    assert child.exitcode == 0
    got = dict(results.get(timeout=5) for _ in range(2))
    assert got["inherited"] is None
    both = fences + got["fences"]
    assert len(set(both)) == 200
    assert fences == sorted(fences)
    assert got["fences"] == sorted(got["fences"])
    assert held.owned()
    held.release()


def test_clients_that_decode_responses(nodes: list[RedisServer]) -> None:
    clients = [server.client(decode_responses=True) for server in nodes]
    lock = redlock(clients, name="decoded")
    assert lock.acquire()
    assert lock.owned()
    assert lock.locked()
    assert isinstance(lock.fence, int)
    lock.release()
    assert not lock.locked()
    for client in clients:
        client.close()


def test_extend_without_a_quorum_keeps_the_hold(
    nodes: list[RedisServer], clients: list[redis.Redis]
) -> None:
    lock = redlock(clients, name="keep", node_timeout=0.05)
    assert lock.acquire()
    for server in nodes[:3]:
        server.pause()
    try:
        with pytest.raises(QuorumNotReached, match="while extending"):
            lock.extend(5)
        assert lock.fence is not None  # no verdict is not a loss: still ours, retry later
    finally:
        for server in nodes[:3]:
            server.resume()
    assert lock.extend(5) is True
    lock.release()


@pytest.mark.parametrize("action", ["release", "extend"])
def test_release_and_extend_never_touch_another_owners_hold(
    clients: list[redis.Redis], action: str
) -> None:
    """The owner check of Redlock's release and extend scripts on every master: the first
    holder's keys ran out and a second owner holds the name; the first one's release or extend
    fails and leaves the second's keys as they were (test_lock_basics has the single-Redis
    scripts)."""
    first, second = redlock(clients), redlock(clients)
    assert first.acquire(blocking=False)
    for client in clients:
        client.delete("job")  # its keys ran out (without the wait)
    assert second.acquire(blocking=False)
    before = [(client.dump("job"), client.pttl("job")) for client in clients]
    act = first.release if action == "release" else lambda: first.extend(100)
    with pytest.raises(LockNotOwnedError):
        act()
    after = [(client.dump("job"), client.pttl("job")) for client in clients]
    assert [value for value, _ in after] == [value for value, _ in before]
    assert all(0 < ttl <= old for (_, ttl), (_, old) in zip(after, before, strict=True))
    assert second.owned()
    second.release()
    assert nothing_left(clients, "job")
