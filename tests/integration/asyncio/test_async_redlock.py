"""tasklock.asyncio.Redlock against five real, independent redis-server processes: the cycle and
its fences, input errors, wake-up by release on any master, paused masters (SIGSTOP) within and
beyond the fault tolerance, the watchdog, and cancellation."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis
import redis.asyncio as aioredis

import tasklock
from tasklock.asyncio import Redlock
from tasklock.core.keys import wake_channel
from tasklock.errors import QuorumNotReached
from tests.support.polling import async_eventually as eventually
from tests.support.servers import RedisServer

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("resp")]

NODE_TIMEOUT = 0.25  # generous: these tests are about behaviour, not about slow masters
SLACK = 2.0  # scheduling on a busy CI machine; still below the 5 s socket timeout
ACQUIRE_BOUND = 3 * NODE_TIMEOUT + SLACK  # round 1, round 2, undo: each bounded by the deadline
#: A waiter's first fallback poll would come 15-30 s after it went to sleep: a waiter that holds
#: the lock well before that was woken by the release.
BIG_SLEEP = 30.0
WAKE_DEADLINE = 10.0
CLEANUP = 10.0  # well below the 30 s TTL: a key gone by then was deleted, not expired


def connect(servers: list[RedisServer]) -> list[aioredis.Redis]:
    return [aioredis.Redis.from_url(server.url, socket_timeout=5) for server in servers]


@pytest.fixture
async def clients(nodes: list[RedisServer]) -> AsyncIterator[list[aioredis.Redis]]:
    """The clients the locks use, one per master."""
    made = connect(nodes)
    yield made
    for client in made:
        await client.aclose()


@pytest.fixture
async def checks(nodes: list[RedisServer]) -> AsyncIterator[list[aioredis.Redis]]:
    """Clients of the test's own, to look at what the masters store."""
    made = connect(nodes)
    yield made
    for client in made:
        await client.aclose()


def redlock(clients: list[Any], name: str = "job", **options: Any) -> Redlock:
    options.setdefault("timeout", 30)
    options.setdefault("node_timeout", NODE_TIMEOUT)
    return Redlock(clients, name, **options)


async def stored(clients: list[aioredis.Redis], key: str) -> list[bytes | None]:
    return [await client.get(key) for client in clients]


async def nothing_left(clients: list[aioredis.Redis], name: str) -> bool:
    return not any([await client.exists(name) for client in clients])


async def cleaned_up(clients: list[aioredis.Redis], name: str, what: str) -> None:
    """No master holds ``name`` within CLEANUP seconds; else say which ones hold what."""
    try:
        await eventually(lambda: nothing_left(clients, name), what, timeout=CLEANUP)
    except pytest.fail.Exception:
        left = [(i, await c.get(name), await c.pttl(name)) for i, c in enumerate(clients)]
        pytest.fail(f"{what}: still held (master, value, pttl ms): {left}")


async def subscribed_everywhere(clients: list[aioredis.Redis], name: str) -> bool:
    channel = wake_channel(name)
    counts = [dict(await c.pubsub_numsub(channel)).get(channel.encode(), 0) for c in clients]
    return all(counts)


async def warm(lock: Redlock) -> None:
    """One cycle, so every master has an idle pooled connection: a later round-1 SET to a paused
    master is then written to its socket (and runs on resume) instead of failing to connect."""
    assert await lock.acquire(blocking=False)
    await lock.release()
    # The release round ends at a quorum: wait until every master's answer is in and its
    # connection back in the stock (else the next round needs a new connection there).
    await eventually(
        lambda: all(lane is not None and lane._idle for lane in lock._lanes),
        "an idle connection to every master",
    )


async def test_cycle_on_five_masters_with_strictly_increasing_fences(
    clients: list[aioredis.Redis], checks: list[aioredis.Redis]
) -> None:
    fences: list[int] = []
    for i in range(6):
        lock = redlock(clients, owner_info={"task": f"t-{i}"})
        assert await lock.acquire(blocking=False)
        assert isinstance(lock.fence, int)
        fences.append(lock.fence)
        value = lock.local.token
        assert value.endswith(b"#%d" % lock.fence)
        owner = value.rsplit(b"#", 1)[0]
        values = await stored(checks, "job")
        assert sum(v == value for v in values) >= 3
        assert all(v in (value, owner) for v in values if v is not None)
        assert await lock.owned()
        assert await lock.locked()
        holder, ttl = await lock.peek()
        assert holder is not None
        assert holder.fence == lock.fence
        assert holder.meta["task"] == f"t-{i}"
        assert ttl is not None
        assert 0 < ttl <= 30
        await lock.release()
        assert not await lock.owned()
        await eventually(lambda: nothing_left(checks, "job"), "released on every master")
        assert not await lock.locked()
        assert await lock.peek() == (None, None)
    assert fences == sorted(set(fences))
    async with redlock(clients) as again:
        assert again.fence is not None
        assert again.fence > fences[-1]


async def test_urls_and_clients_are_both_accepted(
    nodes: list[RedisServer], clients: list[aioredis.Redis], checks: list[aioredis.Redis]
) -> None:
    from_urls = redlock([server.url for server in nodes], "urls")
    assert all(isinstance(c, aioredis.Redis) for c in from_urls.clients)
    assert from_urls.quorum == 3
    async with from_urls:
        assert (await stored(checks, "urls")).count(from_urls.local.token) >= 3
    mixed = redlock([nodes[0].url, *clients[1:]], "mixed")
    assert mixed.clients[1:] == clients[1:]
    async with mixed:
        assert await mixed.locked()
    await eventually(lambda: nothing_left(checks, "urls"), "urls released")
    await eventually(lambda: nothing_left(checks, "mixed"), "mixed released")
    for client in from_urls.clients + mixed.clients[:1]:
        await client.aclose()


async def test_bad_input_names_the_argument(
    nodes: list[RedisServer], clients: list[aioredis.Redis]
) -> None:
    with pytest.raises(tasklock.ConfigurationError, match="at least one Redis master"):
        Redlock([], "x")
    with pytest.raises(tasklock.ConfigurationError, match="clients has 2 masters"):
        Redlock(clients[:2], "x")
    with pytest.raises(tasklock.ConfigurationError, match="clients must be a list"):
        Redlock(nodes[0].url, "x")  # type: ignore[arg-type]
    with pytest.raises(tasklock.ConfigurationError, match=r"clients\[1\]"):
        Redlock([nodes[0].url, "redis://localhost:notaport/0", nodes[2].url], "x")
    with pytest.raises(tasklock.ConfigurationError, match=r"clients\[2\].*Cluster"):
        Redlock([nodes[0].url, nodes[1].url, "redis+cluster://localhost:7000"], "x")
    sync_client = redis.Redis.from_url(nodes[0].url)
    with pytest.raises(tasklock.ConfigurationError, match=r"clients\[0\] must be a redis.asyncio"):
        Redlock([sync_client, *clients[1:3]], "x")
    sync_client.close()
    with pytest.raises(tasklock.ConfigurationError, match=r"clients\[0\] and clients\[2\]"):
        Redlock([clients[0], clients[1], clients[0]], "x")
    with pytest.raises(tasklock.ConfigurationError, match="node_timeout"):
        Redlock(clients[:3], "x", node_timeout=0)
    with pytest.raises(tasklock.ConfigurationError, match="drift_factor"):
        Redlock(clients[:3], "x", drift_factor=2)
    with pytest.warns(RuntimeWarning, match="single master"):
        Redlock(clients[:1], "x")


async def test_a_held_redlock_is_not_acquired_again(
    clients: list[aioredis.Redis], checks: list[aioredis.Redis]
) -> None:
    holder = redlock(clients)
    assert await holder.acquire()
    other = redlock(clients)
    assert await other.acquire(blocking=False) is False
    assert await other.acquire(blocking_timeout=0.3) is False
    assert other.fence is None
    assert not await other.owned()
    # The failed attempts left nothing behind: the holder's value is intact on a quorum.
    assert (await stored(checks, "job")).count(holder.local.token) >= 3
    first = holder.fence
    await holder.release()
    assert await other.acquire(blocking=False)
    assert other.fence is not None
    assert first is not None
    assert other.fence > first
    await other.release()


async def test_a_waiter_is_woken_by_the_release(
    clients: list[aioredis.Redis], checks: list[aioredis.Redis]
) -> None:
    holder = redlock(clients, "wake")
    assert await holder.acquire()
    waiter = redlock(clients, "wake", sleep=BIG_SLEEP)

    async def wait_hold_release() -> bool:  # the hold is the waiting task's
        if not await waiter.acquire(blocking_timeout=BIG_SLEEP * 2):
            return False
        assert await waiter.owned()
        await waiter.release()
        return True

    task = asyncio.ensure_future(wait_hold_release())
    await eventually(lambda: subscribed_everywhere(checks, "wake"), "waiter subscribed")
    await holder.release()
    async with asyncio.timeout(WAKE_DEADLINE):
        assert await task  # only a wake-up can make it in time: its first poll is >= 15 s away


async def test_one_paused_master_of_five(
    nodes: list[RedisServer], clients: list[aioredis.Redis], checks: list[aioredis.Redis]
) -> None:
    lock = redlock(clients, "paused1")
    await warm(lock)
    loop = asyncio.get_running_loop()
    nodes[0].pause()
    try:
        started = loop.time()
        assert await lock.acquire(blocking=False)
        assert loop.time() - started < ACQUIRE_BOUND
        assert lock.fence is not None
        live = (await stored(checks[1:], "paused1")).count(lock.local.token)
        assert live >= 3
        await lock.release()
    finally:
        nodes[0].resume()
    # The SET queued on the paused master ran when it resumed: it was undone right after.
    await cleaned_up(checks, "paused1", "no key after resume")


async def test_a_late_set_on_a_master_resumed_while_held_is_released_with_the_hold(
    nodes: list[RedisServer], clients: list[aioredis.Redis], checks: list[aioredis.Redis]
) -> None:
    lock = redlock(clients, "late")
    await warm(lock)
    nodes[4].pause()
    try:
        assert await lock.acquire(blocking=False)
    finally:
        nodes[4].resume()
    owner = lock.local.token.rsplit(b"#", 1)[0]
    # The SET written before the pause runs on resume: that master holds the round-1 value.
    await eventually(lambda: checks[4].get("late"), "the late SET ran")
    assert await checks[4].get("late") == owner
    await lock.release()
    await eventually(lambda: nothing_left(checks, "late"), "released everywhere", timeout=CLEANUP)


async def test_three_paused_masters_of_five(
    nodes: list[RedisServer], clients: list[aioredis.Redis], checks: list[aioredis.Redis]
) -> None:
    lock = redlock(clients, "paused3")
    await warm(lock)
    down = nodes[:3]
    loop = asyncio.get_running_loop()
    for server in down:
        server.pause()
    try:
        started = loop.time()
        with pytest.raises(QuorumNotReached) as info:
            await lock.acquire(blocking=False)
        assert loop.time() - started < ACQUIRE_BOUND
        assert len(info.value.failures) == 3
        assert lock.fence is None
        assert lock.local.token is None
    finally:
        for server in down:
            server.resume()
    # The SETs queued on the paused masters ran on resume, and the undos queued behind them.
    await cleaned_up(checks, "paused3", "no key after resume")


async def test_the_watchdog_renews_past_the_ttl(clients: list[aioredis.Redis]) -> None:
    lock = redlock(clients, "renewed", timeout=2, watchdog=True)
    assert await lock.acquire()
    loop = asyncio.get_running_loop()
    until = loop.time() + 5  # 2.5 TTLs: held only if renewed
    while loop.time() < until:
        assert await lock.owned()
        await asyncio.sleep(0.1)
    assert not lock.lost
    assert await lock.locked()
    await lock.release()


async def test_a_cancelled_waiter_leaves_no_key_of_its_own(
    clients: list[aioredis.Redis], checks: list[aioredis.Redis]
) -> None:
    holder = redlock(clients, "cancel")
    assert await holder.acquire()
    value = holder.local.token
    owner = value.rsplit(b"#", 1)[0]
    waiter = redlock(clients, "cancel", sleep=0.01)  # attempts come fast: cancel one in flight
    task = asyncio.ensure_future(waiter.acquire())
    await eventually(lambda: subscribed_everywhere(checks, "cancel"), "waiter subscribed")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert waiter.local.token is None

    async def only_the_holders() -> bool:
        values = await stored(checks, "cancel")
        # (None: a master the holder's round 1 never reached, its connection still being made
        # when a quorum had answered)
        return all(v in (value, owner, None) for v in values) and values.count(value) >= 3

    # Any attempt in flight at the cancel finishes and is undone: only the holder's keys stay.
    await eventually(only_the_holders, "only the holder's value")
    await holder.release()
    await eventually(lambda: nothing_left(checks, "cancel"), "released everywhere")
