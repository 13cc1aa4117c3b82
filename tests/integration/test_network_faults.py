"""Network faults between one client and its Redis, through a real TCP proxy on loopback.

A SIGSTOPped server is frozen for everyone; these faults are one client's alone, as in a real
partition: the server goes on answering the other clients while this one's bytes are late
(latency), held (a partition: delivered late on heal, as TCP retransmits them) or cut (a reset).

What must hold:

* a holder cut off from its Redis hears that its lock is lost no later than another client can
  take it, and its renewal delivered late on heal neither extends nor steals the new hold;
* a slow link (latency well under the TTL) costs time, never the hold;
* a reset connection is replaced and the hold kept;
* Redlock with one master partitioned keeps its quorum, and with a majority partitioned fails
  within its deadlines and leaves no key behind once the late writes arrive (they are undone).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import tasklock
from tasklock.core.base import BaseLock
from tasklock.core.redlock import Redlock
from tasklock.errors import QuorumNotReached
from tests.support.polling import async_eventually, async_holds_for, eventually, holds_for
from tests.support.servers import RedisServer, start_servers
from tests.support.tcp_proxy import TcpProxy

TTL = 0.5
NODE_TIMEOUT = 0.2
#: A client retry policy that sends nothing again (redis-py's from_url default).
NO_RETRY = Retry(NoBackoff(), 0)


@pytest.fixture(scope="module")
def servers() -> Iterator[list[RedisServer]]:
    with start_servers(3) as started:
        yield started


@pytest.fixture
def proxies(servers: list[RedisServer]) -> Iterator[list[TcpProxy]]:
    made = [TcpProxy(server.port) for server in servers]
    yield made
    for proxy in made:
        proxy.close()


def through(proxy: TcpProxy) -> redis.Redis:
    """A client whose every byte goes through ``proxy``."""
    return redis.Redis(host="127.0.0.1", port=proxy.port, socket_timeout=5)


class LostAt:
    """An ``on_lost`` callback that records when the loss was reported (monotonic)."""

    def __init__(self) -> None:
        self.at: float | None = None
        self.event = threading.Event()

    def __call__(self, lock: BaseLock) -> None:
        self.at = time.monotonic()
        self.event.set()


def taken_by_another(direct: redis.Redis, name: str, lost: LostAt) -> tasklock.Lock:
    """Another client (straight to the server) takes ``name`` once its key is gone; the cut-off
    holder must have heard of its loss by then. Returns the other client's lock, held."""
    other = tasklock.Lock(direct, name, timeout=30, sleep=0.01, fair=False)
    assert other.acquire(blocking_timeout=10 * TTL)
    taken_at = time.monotonic()
    assert lost.event.wait(5), "the cut-off holder never heard that its lock was lost"
    assert lost.at is not None
    assert lost.at <= taken_at, (
        f"the holder heard of its loss {lost.at - taken_at:.3f} s after another client took it"
    )
    return other


def kept_then_released(holder: tasklock.Lock, lost: LostAt, direct: redis.Redis) -> None:
    """The hold was never reported lost, and its release frees the key."""
    assert not lost.event.is_set()
    assert not holder.lost
    holder.release()
    assert direct.get(holder.name) is None


def test_a_partitioned_holder_hears_of_its_loss_before_another_client_can_take_the_lock(
    servers: list[RedisServer], proxies: list[TcpProxy]
) -> None:
    direct = servers[0].client()
    lost = LostAt()
    holder = tasklock.Lock(through(proxies[0]), "net:cut", timeout=TTL, watchdog=True,
                           on_lost=lost)  # fmt: skip
    assert holder.acquire(blocking=False)
    # The watchdog renews through the proxy: the hold outlives several TTLs.
    holds_for(lambda: direct.get("net:cut") is not None, 3 * TTL, what="renewed over the link")
    proxies[0].partition()
    other = taken_by_another(direct, "net:cut", lost)
    assert holder.lost
    new_value = direct.get("net:cut")
    # Heal: the renewals held in the partition now arrive; owner-checked, they change nothing.
    proxies[0].heal()
    holds_for(lambda: direct.get("net:cut") == new_value, 2 * TTL, what="the new hold untouched")
    assert other.owned()
    other.release()


def test_a_holder_cut_off_right_after_its_acquire_hears_of_the_loss_first(
    servers: list[RedisServer], proxies: list[TcpProxy]
) -> None:
    """The first lease counts from when the acquire was sent, not from its answer: the server's
    TTL started in between, so counting from the answer overestimated it by the way back."""
    direct = servers[0].client()
    lost = LostAt()
    proxies[0].latency = 0.1  # the acquire's answer comes 0.1 s after the server set the key
    client = through(proxies[0])
    warm_up(client)
    holder = tasklock.Lock(client, "net:cut-early", timeout=TTL, watchdog=True, on_lost=lost)
    assert holder.acquire(blocking=False)
    proxies[0].partition()  # no renewal gets through from here on
    other = taken_by_another(direct, "net:cut-early", lost)
    proxies[0].heal()
    other.release()


def warm_up(client: redis.Redis) -> None:
    """Make the first calls' one-off round trips before the hold: a new connection's handshake
    and the scripts' NOSCRIPT and SCRIPT LOAD cost several round trips, over a 0.1 s link more
    than a 0.5 s lease has left once its renewals stop at the release."""
    for _ in range(3):
        with tasklock.Lock(client, "net:warm-up", timeout=5) as warm:
            warm.extend(1)


def test_a_slow_link_costs_time_never_the_hold(
    servers: list[RedisServer], proxies: list[TcpProxy]
) -> None:
    direct = servers[0].client()
    lost = LostAt()
    proxies[0].latency = 0.05  # 0.1 s per round trip, more than a sixth of the 0.5 s TTL
    client = through(proxies[0])
    warm_up(client)
    holder = tasklock.Lock(client, "net:slow", timeout=TTL, watchdog=True, on_lost=lost)
    assert holder.acquire(blocking=False)
    value = direct.get("net:slow")
    holds_for(lambda: direct.get("net:slow") == value, 6 * TTL, what="held over a slow link")
    kept_then_released(holder, lost, direct)


def test_a_reset_connection_is_replaced_and_the_hold_kept(
    servers: list[RedisServer], proxies: list[TcpProxy]
) -> None:
    direct = servers[0].client()
    lost = LostAt()
    holder = tasklock.Lock(through(proxies[0]), "net:reset", timeout=1.0, watchdog=True,
                           on_lost=lost)  # fmt: skip
    assert holder.acquire(blocking=False)
    value = direct.get("net:reset")
    eventually(lambda: proxies[0].connections() > 0, what="a connection through the proxy")
    for _ in range(3):
        proxies[0].reset()
        holds_for(lambda: direct.get("net:reset") == value, 1.0, what="held across a reset")
    kept_then_released(holder, lost, direct)


def test_redlock_keeps_its_quorum_with_one_master_cut_off_and_cleans_up_after_heal(
    servers: list[RedisServer], proxies: list[TcpProxy]
) -> None:
    direct = [server.client() for server in servers]
    proxies[2].partition()
    lock = Redlock([through(p) for p in proxies], "net:one-cut", timeout=10,
                   node_timeout=NODE_TIMEOUT)  # fmt: skip
    assert lock.acquire(blocking=False)
    assert lock.fence is not None
    assert [bool(c.exists("net:one-cut")) for c in direct] == [True, True, False]
    lock.release()
    assert not any(c.exists("net:one-cut") for c in direct[:2])
    # Heal: the cut-off master now gets the acquire's SET, late, and the release after it (or
    # the undo): it must not keep the key until its 10 s TTL.
    proxies[2].heal()
    eventually(lambda: not direct[2].exists("net:one-cut"), timeout=5,
               what="the late write on the healed master undone")  # fmt: skip


def test_redlock_with_a_majority_cut_off_fails_in_time_and_leaves_no_key_after_heal(
    servers: list[RedisServer], proxies: list[TcpProxy]
) -> None:
    direct = [server.client() for server in servers]
    proxies[1].partition()
    proxies[2].partition()
    lock = Redlock([through(p) for p in proxies], "net:majority-cut", timeout=10,
                   node_timeout=NODE_TIMEOUT)  # fmt: skip
    started = time.monotonic()
    with pytest.raises(QuorumNotReached):
        lock.acquire(blocking=False)
    # Bounded by the node deadline (three fan-outs at most), not by the 5 s socket timeout.
    assert time.monotonic() - started < 3 * NODE_TIMEOUT + 2.0
    assert lock.fence is None
    assert not any(c.exists("net:majority-cut") for c in direct)
    proxies[1].heal()
    proxies[2].heal()
    # The held SETs now run on the healed masters; each is undone, long before the 10 s TTL.
    eventually(lambda: not any(c.exists("net:majority-cut") for c in direct), timeout=5,
               what="no key left after the partition healed")  # fmt: skip


def test_asyncio_a_slow_link_costs_time_never_the_hold(
    servers: list[RedisServer], proxies: list[TcpProxy]
) -> None:
    """The asyncio watchdog judges renewals by the same rules (tasklock.core.renewal)."""
    import redis.asyncio as aioredis

    from tasklock.asyncio import Lock as AsyncLock

    direct = servers[0].client()
    proxies[0].latency = 0.05

    async def scenario() -> bool:
        client = aioredis.Redis(host="127.0.0.1", port=proxies[0].port, socket_timeout=5)
        # As warm_up: the first calls' one-off round trips. The asyncio lock's own calls go on
        # connections of their own, the watchdog's through the client's pool: put one there
        # (as any use of the client would), and load the renewal's script (extend runs it).
        for _ in range(3):
            async with AsyncLock(client, "net:async-warm-up", timeout=5) as warm:
                await warm.extend(1)
        await client.ping()
        lock = AsyncLock(client, "net:async-slow", timeout=TTL, watchdog=True)
        assert await lock.acquire(blocking=False)
        value = direct.get("net:async-slow")
        await async_holds_for(lambda: direct.get("net:async-slow") == value, 6 * TTL,
                              what="held over a slow link")  # fmt: skip
        lost = bool(lock.lost)
        await lock.release()
        await client.aclose()
        return lost

    assert asyncio.run(scenario()) is False
    assert direct.get("net:async-slow") is None


def test_asyncio_a_silent_server_times_the_call_out_and_its_connection_is_dropped(
    servers: list[RedisServer], proxies: list[TcpProxy]
) -> None:
    """The asyncio lock's own connections keep the client's ``socket_timeout``: an acquire that
    hears nothing (a partition) fails once it has passed, whether the connection's one timer was
    armed by an earlier call or by this one; and the connection is closed, so its late reply is
    never read as the answer of a later call."""
    import redis.asyncio as aioredis

    from tasklock.asyncio import Lock as AsyncLock
    from tasklock.asyncio.lanes import async_lane_for
    from tasklock.errors import BackendUnavailable

    direct = servers[0].client()
    read_timeout = 0.3

    async def scenario() -> None:
        # No retries: redis-py 8's default (10, with backoff) would try again on the lane, as it
        # would on a pooled connection (see test_a_call_sent_before_the_silence_is_sent_once).
        client = aioredis.Redis(
            host="127.0.0.1", port=proxies[0].port, socket_timeout=read_timeout, retry=NO_RETRY
        )
        lane = async_lane_for(client)
        assert lane is not None
        for _ in range(3):  # a lane connection in stock, the scripts loaded
            async with AsyncLock(client, "net:async-silent-warm-up", timeout=5):
                pass
        for armed_before in (True, False):  # the timer armed by the warm-up's calls, then not
            if not armed_before:
                await asyncio.sleep(2 * read_timeout)  # (that timer has fired; none is armed)
            proxies[0].partition()
            lock = AsyncLock(client, "net:async-silent", timeout=0.5)
            started = time.monotonic()
            with pytest.raises(BackendUnavailable):
                await asyncio.wait_for(lock.acquire(blocking=False), 10)
            waited = time.monotonic() - started
            assert read_timeout <= waited < read_timeout + 1.0, waited
            assert not lane._idle, "the timed-out connection went back to the stock"
            proxies[0].heal()  # the held acquire reaches the server now: its key expires
            await async_eventually(lambda: not direct.exists("net:async-silent"),
                                   "the late acquire's key expired", timeout=5)  # fmt: skip
            async with AsyncLock(client, "net:async-silent", timeout=5) as again:
                assert direct.get("net:async-silent") == again.local.token
        await client.aclose()

    asyncio.run(scenario())


@pytest.mark.parametrize("noticed", [False, True], ids=["unnoticed", "noticed"])
def test_asyncio_redlock_release_reaches_a_master_whose_connection_was_broken(
    servers: list[RedisServer], proxies: list[TcpProxy], noticed: bool
) -> None:
    """A master's connection breaks while the lock is held, and the link to it turns slow.
    Unnoticed, the release is written on the broken connection and fails there: it is sent
    again on a new one. Noticed (the loop saw the reset), the release needs a new connection,
    which takes longer to make than the round lasts: it is sent once made, not dropped. Either
    way the key is freed long before its TTL."""
    import redis.asyncio as aioredis

    from tasklock.asyncio import Redlock as AsyncRedlock
    from tasklock.asyncio.lanes import async_lane_for

    direct = [server.client() for server in servers]

    async def scenario() -> None:
        clients = [aioredis.Redis(host="127.0.0.1", port=p.port) for p in proxies]
        lock = AsyncRedlock(clients, "net:late-release", timeout=10, node_timeout=NODE_TIMEOUT)
        # A round ends at a quorum: a master whose connection was still being made (or busy
        # with the previous round's reply) may not get the SET. Take it until all three have.
        for _ in range(50):
            assert await lock.acquire(blocking=False)
            try:
                await async_eventually(lambda: all(c.exists("net:late-release") for c in direct),
                                       "held on every master", timeout=0.5)  # fmt: skip
            except AssertionError:
                await lock.release()
                continue
            break
        assert all(c.exists("net:late-release") for c in direct), "never held on every master"
        proxies[2].reset()  # the third master's connections break while the lock is held
        proxies[2].latency = 0.3  # and a new one takes longer to make than the round lasts
        if noticed:  # the event loop has read the reset: that master's connection is gone
            lane = async_lane_for(clients[2])
            assert lane is not None
            await async_eventually(lambda: not any(c.usable for c in lane._idle),
                                   "the reset noticed", timeout=5)  # fmt: skip
        await lock.release()  # a quorum (the first two) released in the round
        # Keep the loop running while the late release is sent and answered.
        await async_eventually(lambda: not direct[2].exists("net:late-release"),
                               "the release reached the third master", timeout=5)  # fmt: skip
        for client in clients:
            await client.aclose()

    asyncio.run(scenario())
    assert not any(c.exists("net:late-release") for c in direct)


def test_redlock_release_reaches_a_master_whose_connection_was_broken(
    servers: list[RedisServer], proxies: list[TcpProxy]
) -> None:
    """The blocking Redlock, as the asyncio one above: the key on the master whose connection
    broke (and whose link turned slow) is freed long before its TTL."""
    direct = [server.client() for server in servers]
    lock = Redlock([through(p) for p in proxies], "net:sync-late-release", timeout=10,
                   node_timeout=NODE_TIMEOUT)  # fmt: skip
    for _ in range(50):  # until the SET reached all three (a round ends at a quorum)
        assert lock.acquire(blocking=False)
        try:
            eventually(lambda: all(c.exists("net:sync-late-release") for c in direct), 0.5)
        except AssertionError:
            lock.release()
            continue
        break
    assert all(c.exists("net:sync-late-release") for c in direct), "never held on every master"
    proxies[2].reset()
    proxies[2].latency = 0.3
    lock.release()
    eventually(lambda: not direct[2].exists("net:sync-late-release"), timeout=5,
               what="the release reached the third master")  # fmt: skip


@pytest.mark.parametrize("kind", ["blocking", "asyncio"])
def test_redlock_release_reaches_a_master_that_lost_its_scripts_and_answers_late(
    servers: list[RedisServer], proxies: list[TcpProxy], kind: str
) -> None:
    """A master that has lost tasklock's scripts (restarted, or SCRIPT FLUSH) answers the
    release's EVALSHA with NOSCRIPT after the others have decided the round: the release did not
    run there, and must run again (as EVAL), not be dropped as "never ran". The asyncio Redlock
    dropped it and the key lived until its TTL: the flake of test_async_redlock's
    test_cycle_on_five_masters_with_strictly_increasing_fences under load, where the masters
    are new (no script loaded yet) and the release to a master still busy with the round-2 write
    needs a new connection, so its NOSCRIPT comes last. Here the proxy makes it come last."""
    import redis.asyncio as aioredis

    from tasklock.asyncio import Redlock as AsyncRedlock

    name = f"net:noscript-{kind}"
    direct = [server.client() for server in servers]

    def on_every_master() -> bool:
        return all(c.exists(name) for c in direct)

    async def scenario() -> None:
        clients: list[Any] = [aioredis.Redis(host="127.0.0.1", port=p.port) for p in proxies]
        lock = AsyncRedlock(clients, name, timeout=10, node_timeout=NODE_TIMEOUT)
        for _ in range(50):  # until the SET reached all three (a round ends at a quorum)
            assert await lock.acquire(blocking=False)
            try:
                await async_eventually(on_every_master, "held on every master", timeout=0.5)
            except AssertionError:
                await lock.release()
                continue
            break
        assert on_every_master(), "never held on every master"
        direct[2].script_flush()
        proxies[2].latency = 0.3  # its NOSCRIPT comes well after the others' releases
        await lock.release()
        await async_eventually(lambda: not direct[2].exists(name),
                               "the release ran on the third master", timeout=5)  # fmt: skip
        for client in clients:
            await client.aclose()

    if kind == "asyncio":
        asyncio.run(scenario())
        return
    lock = Redlock([through(p) for p in proxies], name, timeout=10, node_timeout=NODE_TIMEOUT)
    for _ in range(50):
        assert lock.acquire(blocking=False)
        try:
            eventually(on_every_master, 0.5)
        except AssertionError:
            lock.release()
            continue
        break
    assert on_every_master(), "never held on every master"
    direct[2].script_flush()
    proxies[2].latency = 0.3
    lock.release()
    eventually(lambda: not direct[2].exists(name), timeout=5,
               what="the release ran on the third master")  # fmt: skip


def acquires_run(direct: redis.Redis, name: str) -> int:
    """How many scripts on the lock ``name`` the server ran (its slow log at 0 us: every command,
    the scripts' own calls in it too, which name no script)."""
    return sum(
        1
        for entry in direct.slowlog_get(1000)
        if entry["command"].startswith(b"EVALSHA ") and entry["command"].split()[3] == name.encode()
    )


@pytest.mark.parametrize("driver", ["blocking", "asyncio"])
def test_a_call_sent_before_the_silence_is_sent_once(
    servers: list[RedisServer], driver: str
) -> None:
    """A call written on the hot path's own connection that hears nothing back may have run: with
    a client that allows no retry it fails (BackendUnavailable) and is never sent again, by the
    ordinary path or any other. The server, paused (SIGSTOP) while the call was written, runs
    what it was sent once it resumes: exactly one acquire. (Before, the blocking driver sent it a
    second time through the pool, whatever the client's retry policy said.)"""
    from tasklock.asyncio import Lock as AsyncLock
    from tasklock.errors import BackendUnavailable

    server = servers[0]
    direct = server.client()
    direct.flushall()
    direct.config_set("slowlog-log-slower-than", 0)
    direct.config_set("slowlog-max-len", 1000)
    name = f"net:sent-once-{driver}"
    settings: dict[str, Any] = {"host": "127.0.0.1", "port": server.port, "retry": NO_RETRY}
    try:
        if driver == "blocking":
            client = redis.Redis(socket_timeout=0.3, **settings)
            for _ in range(8):  # past the warm-up: the thread's own connection, scripts loaded
                with tasklock.Lock(client, f"{name}-warm-up", timeout=5):
                    pass
            direct.slowlog_reset()
            server.pause()
            with pytest.raises(BackendUnavailable):
                tasklock.Lock(client, name, timeout=5).acquire(blocking=False)
        else:
            import redis.asyncio as aioredis

            async def scenario() -> None:
                client = aioredis.Redis(socket_timeout=0.3, **settings)
                for _ in range(3):
                    async with AsyncLock(client, f"{name}-warm-up", timeout=5):
                        pass
                direct.slowlog_reset()
                server.pause()
                lock = AsyncLock(client, name, timeout=5)
                with pytest.raises(BackendUnavailable):
                    await asyncio.wait_for(lock.acquire(blocking=False), 10)
                await client.aclose()

            asyncio.run(scenario())
        server.resume()  # it reads what it was sent while paused
        eventually(lambda: acquires_run(direct, name) >= 1, 5, what="the acquire reached it")
        holds_for(lambda: acquires_run(direct, name) == 1, 0.5, what="the acquire ran once")
    finally:
        if server.paused:
            server.resume()
        direct.config_set("slowlog-log-slower-than", 10000)
