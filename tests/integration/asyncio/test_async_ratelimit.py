"""tasklock.asyncio.RateLimit on a real redis-server: the blocking class's contract, awaited
(tests/integration/test_ratelimit.py), and asyncio's own part: a task cancelled while it sleeps
to its slot leaves that slot unused.

As there, every assertion is on what the server answered or stored, never on how long anything
took here.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import redis.asyncio as aioredis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tasklock.asyncio import RateLimit
from tasklock.core.rate_scripts import RATE
from tasklock.core.rates import Admission
from tasklock.errors import BackendUnavailable, ConfigurationError
from tests.integration.asyncio.test_async_lock import eventually
from tests.support.servers import RedisServer, free_port

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("resp")]

SECOND = 1_000_000
#: Never binds here, but keeps a short limit's key alive for seconds (see test_ratelimit.py).
KEEP_ALIVE, KEEP_ALIVE_BURST = "1000/h", 1000


async def server_us(client: aioredis.Redis) -> int:
    seconds, micros = await client.time()
    return int(seconds) * SECOND + int(micros)


async def stored(client: aioredis.Redis, name: str) -> dict[str, float]:
    # The slots; the ``:starts`` fields left out (see test_ratelimit.stored).
    found = await client.hgetall(name)
    return {k.decode(): float(v) for k, v in found.items() if not k.endswith(b":starts")}


async def tat(client: aioredis.Redis, name: str, field: str) -> float:
    value = await client.hget(name, field)
    assert value is not None, f"{name} has no {field}"
    return float(value)


def wait_us(admission: Admission) -> int:
    us = admission.retry_after * SECOND
    assert abs(us - round(us)) < 1e-3, admission
    return round(us)


async def bracketed(client: aioredis.Redis, call: Any) -> tuple[int, Admission, int]:
    before = await server_us(client)
    answer = await call()
    return before, answer, await server_us(client)


def assert_wait_is_exact(before: int, admission: Admission, after: int, slot: float) -> None:
    """The script answers ceil(slot - now) µs, with before <= now <= after."""
    assert math.ceil(slot - after) <= wait_us(admission) <= math.ceil(slot - before), (
        before,
        admission,
        after,
        slot,
    )


class Spied(RateLimit):
    """Notes each round trip's answer with the server's TIME around it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen: list[tuple[int, Admission, int]] = []

    async def admit(self, max_wait: float | None, **kwargs: Any) -> Admission:
        before = await server_us(self.redis)
        admission = await super().admit(max_wait, **kwargs)
        self.seen.append((before, admission, await server_us(self.redis)))
        return admission


async def test_a_burst_then_an_exact_refusal_that_consumes_nothing(ar: aioredis.Redis) -> None:
    limit = RateLimit(ar, "a:burst", "10/m", burst=3)  # one per 6 s, three at once
    answers = [await limit.try_acquire() for _ in range(3)]
    assert [bool(a) for a in answers] == [True] * 3
    assert [a.remaining for a in answers] == [2, 1, 0]
    state = await stored(ar, "a:burst")
    waits = []
    for _ in range(5):
        before, refused, after = await bracketed(ar, limit.try_acquire)
        assert not refused
        assert 0 < refused.retry_after <= 6.0
        assert_wait_is_exact(before, refused, after, state["60000ms"] - 2 * 6 * SECOND)
        waits.append(wait_us(refused))
    assert any(w % 1000 for w in waits), waits  # microseconds, not rounded to milliseconds
    assert await stored(ar, "a:burst") == state
    assert 0 < await ar.pttl("a:burst") <= 3 * 6000 + 1


async def test_a_list_refuses_atomically(ar: aioredis.Redis) -> None:
    limit = RateLimit(ar, "a:pair", ["10/m", "1/h"], burst=[5, 1])
    assert await limit.try_acquire()
    state = await stored(ar, "a:pair")
    before, refused, after = await bracketed(ar, limit.try_acquire)
    assert not refused
    assert_wait_is_exact(before, refused, after, state["3600000ms"])
    assert await stored(ar, "a:pair") == state
    alone = await RateLimit(ar, "a:pair", "10/m", burst=5).try_acquire()
    assert alone.remaining == 3  # one taken before, this one: the refused call took nothing


async def test_the_key_expires_when_idle_and_reset_forgets(ar: aioredis.Redis) -> None:
    limit = RateLimit(ar, "a:idle", "20/s", burst=2)
    assert await limit.try_acquire()
    assert await limit.try_acquire()
    assert -1 != await ar.pttl("a:idle") <= 2 * 50 + 1  # (-2: already gone, on a slow box)

    async def gone() -> bool:
        return not await ar.exists("a:idle")

    await eventually(gone, "the idle limit's key expired")
    assert (await limit.try_acquire()).remaining == 1
    slow = RateLimit(ar, "a:slow", "1/h")
    assert await slow.try_acquire()
    assert not await slow.try_acquire()
    await slow.reset()
    assert not await ar.exists("a:slow")
    assert await slow.try_acquire()


async def test_acquire_returns_false_and_consumes_nothing_when_the_slot_is_too_far(
    ar: aioredis.Redis,
) -> None:
    limit = RateLimit(ar, "a:far", "1/m")
    assert await limit.acquire() is True
    state = await stored(ar, "a:far")
    assert await limit.acquire(blocking_timeout=0.5) is False
    assert await limit.acquire(blocking=False) is False
    assert await limit.acquire(blocking_timeout=0) is False
    assert await stored(ar, "a:far") == state


async def test_acquire_sleeps_until_its_slot(ar: aioredis.Redis) -> None:
    limit = Spied(ar, "a:sleep", ["5/s", KEEP_ALIVE], [1, KEEP_ALIVE_BURST])  # 200 ms apart
    assert await limit.try_acquire()
    previous = await tat(ar, "a:sleep", "1000ms")
    for _ in range(2):
        assert await limit.acquire(blocking_timeout=10) is True
        woke = await server_us(ar)
        before, admission, after = limit.seen[-1]
        slot = await tat(ar, "a:sleep", "1000ms") - 200_000  # one slot reserved
        assert slot >= previous
        assert_wait_is_exact(before, admission, after, slot)
        assert woke >= slot  # never early, on the server's clock
        previous = slot + 200_000


async def test_waiters_are_served_in_the_order_they_asked(
    ar: aioredis.Redis, redis_server: RedisServer
) -> None:
    """Tasks ask one after the other (each once the server shows the previous one's slot taken:
    the TAT moved one interval). Each is given the next slot, exactly, and none returns before
    it. (Which task the loop runs first once several are due is not the library's business, so
    the order of the wake-ups themselves is not asserted.)"""
    waiters, interval = 4, 50_000
    await ar.script_load(RATE.source)
    bursts = [1, KEEP_ALIVE_BURST]
    assert await RateLimit(ar, "a:fifo", ["2/s", KEEP_ALIVE], bursts).try_acquire()  # busy 0.5 s
    limits = [Spied(ar, "a:fifo", ["20/s", KEEP_ALIVE], bursts) for _ in range(waiters)]
    woke: dict[int, int] = {}

    async def wait(i: int) -> bool:
        answer = await limits[i].acquire(blocking_timeout=10)
        woke[i] = await server_us(ar)
        return answer

    tats = [await tat(ar, "a:fifo", "1000ms")]
    tasks = []
    for i in range(waiters):
        tasks.append(asyncio.create_task(wait(i)))

        async def reserved() -> bool:
            return await tat(ar, "a:fifo", "1000ms") != tats[-1]

        await eventually(reserved, f"waiter {i} reserved its slot")
        tats.append(await tat(ar, "a:fifo", "1000ms"))
    assert await asyncio.gather(*tasks) == [True] * waiters
    for i in range(waiters):
        slot = tats[i + 1] - interval  # the TAT its call left, less one interval
        assert slot >= tats[i], f"waiter {i} got a slot before an earlier waiter's"
        [(before, admission, after)] = limits[i].seen
        assert_wait_is_exact(before, admission, after, slot)
        assert woke[i] >= slot, f"waiter {i} woke before its slot"


async def test_a_task_cancelled_in_its_sleep_leaves_its_slot_unused(ar: aioredis.Redis) -> None:
    limit = RateLimit(ar, "a:cancel", "1/m")
    assert await limit.try_acquire()
    first = await tat(ar, "a:cancel", "60000ms")
    sleeper = asyncio.create_task(limit.acquire())  # its slot is a minute away

    async def reserved() -> bool:
        return await tat(ar, "a:cancel", "60000ms") == first + 60 * SECOND

    await eventually(reserved, "the sleeper reserved its slot")
    sleeper.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeper
    # The slot stays taken: lost capacity, never an extra call.
    assert await stored(ar, "a:cancel") == {"60000ms": first + 60 * SECOND}
    refused = await limit.try_acquire()
    assert not refused
    assert refused.retry_after > 60


async def test_a_deferred_call_comes_back_to_its_slot(ar: aioredis.Redis) -> None:
    limit = RateLimit(ar, "a:jobs", ["10/s", "1/m"])
    reservation = "{a:jobs}:res:1"
    assert await limit.try_acquire()
    slot = (await stored(ar, "a:jobs"))["60000ms"]
    before, deferred, after = await bracketed(
        ar, lambda: limit.admit(0.0, reservation=reservation, keep=2)
    )
    assert deferred.deferred
    assert not deferred
    assert_wait_is_exact(before, deferred, after, slot)
    assert float(await ar.get(reservation)) == slot
    reserved = {"1000ms": slot + 100_000, "60000ms": slot + 60 * SECOND}
    assert await stored(ar, "a:jobs") == reserved
    assert (await limit.admit(0.0, reservation=reservation, early=0)).deferred
    assert await stored(ar, "a:jobs") == reserved
    before, admitted, after = await bracketed(
        ar, lambda: limit.admit(0.0, reservation=reservation, early=120)
    )
    assert admitted
    assert_wait_is_exact(before, admitted, after, slot)
    assert not await ar.exists(reservation)
    assert await stored(ar, "a:jobs") == reserved


async def test_a_key_of_another_type_is_a_configuration_error(ar: aioredis.Redis) -> None:
    await ar.set("a:taken", "x")
    with pytest.raises(ConfigurationError, match="the key 'a:taken' holds a "):
        await RateLimit(ar, "a:taken", "10/s").try_acquire()


async def test_an_unreachable_server_is_backend_unavailable() -> None:
    port = free_port()
    client = aioredis.Redis(port=port, socket_connect_timeout=0.5, retry=Retry(NoBackoff(), 0))
    limit = RateLimit(client, "a:nowhere", "10/s")
    for call, doing in [
        (limit.try_acquire, "rate limiting 'a:nowhere'"),
        (limit.acquire, "rate limiting 'a:nowhere'"),
        (limit.reset, "resetting rate limit 'a:nowhere'"),
    ]:
        with pytest.raises(BackendUnavailable) as info:
            await call()
        assert f"127.0.0.1:{port}" in str(info.value) or f"localhost:{port}" in str(info.value)
        assert doing in str(info.value)
    await client.aclose()
