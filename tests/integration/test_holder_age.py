"""A holder's ``at`` (what ``tasklock ls``/``show``, the admin page's Age and the exporter's oldest
hold age count from) is the time of the attempt that took the lock, not when the waiting began.

A waiter that waited 5 s used to show an age of 5.6 s for a hold taken 0.5 s earlier (issue 32):
its token, with ``at``, was made once when ``acquire()`` began. Now each retry restamps it, and
the token's random part, which names the waiter in the fair queue, stays.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import tasklock
from tests.support.servers import RedisServer


def _floor_ms(seconds: float) -> float:
    return math.floor(seconds * 1000) / 1000  # ``at`` is written to the millisecond, rounded


Maker = Callable[[redis.Redis, str], Any]

MAKERS: dict[str, Maker] = {
    "fair lock": lambda r, name: tasklock.Lock(r, name, timeout=30, thread_local=False),
    "unfair lock": lambda r, name: tasklock.Lock(
        r, name, timeout=30, thread_local=False, fair=False
    ),
    "semaphore": lambda r, name: tasklock.Semaphore(r, name, 1, timeout=30, thread_local=False),
}


@pytest.mark.parametrize("kind", sorted(MAKERS))
def test_a_waiters_age_counts_from_the_attempt_that_took_the_lock(
    r: redis.Redis, kind: str
) -> None:
    name = f"age:{kind.replace(' ', '-')}"
    first, second = MAKERS[kind](r, name), MAKERS[kind](r, name)
    assert first.acquire()
    took = threading.Event()

    def wait() -> None:
        assert second.acquire(blocking_timeout=30)
        took.set()

    waiter = threading.Thread(target=wait)
    waiter.start()
    try:
        # Waiting: queued (fair) or polling; either way not holding.
        assert not took.wait(0.3)
        released_at = time.time()
        first.release()
        assert took.wait(30)
    finally:
        waiter.join(30)
    holder, _ = second.peek()
    assert holder is not None
    assert holder.meta["at"] >= _floor_ms(released_at), (
        f"the age counts from {released_at - holder.meta['at']:.3f} s before the lock was free"
    )
    second.release()  # the hold's value is what was stored: the release is owner-checked


def test_a_token_the_caller_chose_is_stored_as_given(r: redis.Redis) -> None:
    first = tasklock.Lock(r, "age:token")
    second = tasklock.Lock(r, "age:token", thread_local=False)
    assert first.acquire()
    result: list[bool] = []
    waiter = threading.Thread(
        target=lambda: result.append(second.acquire(blocking_timeout=30, token="mine"))
    )
    waiter.start()
    first.release()
    waiter.join(30)
    assert result == [True]
    assert r.get("age:token").startswith(b"mine#")
    second.release()


async def test_an_asyncio_waiters_age_counts_from_the_attempt_that_took_it(
    redis_server: RedisServer,
) -> None:
    import asyncio

    import redis.asyncio

    import tasklock.asyncio

    client = redis.asyncio.Redis.from_url(redis_server.url)
    first = tasklock.asyncio.Lock(client, "age:async", timeout=30)
    second = tasklock.asyncio.Lock(client, "age:async", timeout=30, thread_local=False)
    assert await first.acquire()
    waiting = asyncio.ensure_future(second.acquire(blocking_timeout=30))
    await asyncio.sleep(0.3)  # let it wait; what is checked does not depend on how long
    assert not waiting.done()
    released_at = time.time()
    await first.release()
    assert await waiting
    holder, _ = await second.peek()
    assert holder is not None
    assert holder.meta["at"] >= _floor_ms(released_at)
    await second.release()
    await client.aclose()
