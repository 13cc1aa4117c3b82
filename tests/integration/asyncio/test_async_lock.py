"""tasklock.asyncio.Lock on a real redis-server: the contract, holds per task, cancellation,
wake-up on release, the per-loop watchdog."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import weakref
from typing import Any

import pytest
import redis.asyncio as aioredis

import tasklock
from tasklock.asyncio import Lock
from tasklock.asyncio.watchdog import get_async_watchdog
from tasklock.core.keys import queue_keys_for, wake_channel
from tests.support.polling import async_eventually as eventually
from tests.support.servers import RedisServer
from tests.support.sockets import unread_bytes

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("resp")]

#: A waiter's first fallback poll would come 15-30 s after it went to sleep: a waiter that holds
#: the lock well before that was woken by the release.
BIG_SLEEP = 30.0
WAKE_DEADLINE = 10.0


async def subscribers(r: aioredis.Redis, name: str) -> int:
    channel = wake_channel(name)
    return int(dict(await r.pubsub_numsub(channel)).get(channel.encode(), 0))


async def test_acquire_release_fence_and_the_stored_value(ar: aioredis.Redis) -> None:
    lock = Lock(ar, "a:cycle", timeout=10)
    assert await lock.acquire(blocking=False)
    assert lock.fence is not None
    assert await ar.get("a:cycle") == lock.local.token
    assert lock.local.token.endswith(b"#%d" % lock.fence)
    assert 9000 < await ar.pttl("a:cycle") <= 10000
    assert await lock.owned()
    assert await lock.locked()
    assert await Lock(ar, "a:cycle", timeout=10).acquire(blocking=False) is False
    first = lock.fence
    await lock.release()
    assert not await ar.exists("a:cycle")
    assert lock.local.token is None
    async with Lock(ar, "a:cycle", timeout=10) as again:
        assert again.fence > first


async def test_redis_asyncio_lock_class_and_errors(ar: aioredis.Redis) -> None:
    lock = ar.lock("a:compat", timeout=5, lock_class=Lock)
    assert isinstance(lock, Lock)
    with pytest.raises(tasklock.LockError):
        await lock.release()
    assert await lock.acquire()
    await ar.set("a:compat", "someone else")
    with pytest.raises(tasklock.LockNotOwnedError):
        await lock.extend(1)
    assert lock.local.token is None  # the hold ended with the failed extend
    quiet = ar.lock("a:compat2", timeout=0.1, lock_class=Lock, raise_on_release_error=False)
    async with quiet:
        await quiet.release()
    with pytest.raises(tasklock.ConfigurationError, match="redis.asyncio client"):
        Lock(object(), "x")


async def test_a_hold_belongs_to_its_task_and_the_tasks_it_starts(ar: aioredis.Redis) -> None:
    lock = Lock(ar, "a:owner", timeout=10)
    other_task_saw: list[object] = []

    async def unrelated() -> None:
        await acquired.wait()
        other_task_saw.append(lock.local.token)
        with pytest.raises(tasklock.LockError):
            await lock.release()  # not this task's hold
        with pytest.raises(tasklock.LockError):
            await lock.extend(5)

    acquired = asyncio.Event()
    bystander = asyncio.create_task(unrelated())  # started before the hold: not its child
    assert await lock.acquire()
    acquired.set()
    await bystander
    assert other_task_saw == [None]
    assert await lock.owned()

    async def child() -> None:  # started while holding: it may extend and release
        assert lock.local.token is not None
        await lock.extend(5)
        await lock.release()

    await asyncio.create_task(child())
    assert lock.local.token is None, "the child's release ended the parent's hold too"
    assert not await ar.exists("a:owner")


async def test_thread_local_false_shares_the_token_between_tasks(ar: aioredis.Redis) -> None:
    lock = Lock(ar, "a:shared", timeout=10, thread_local=False)
    assert await lock.acquire(token="shared-token")
    assert lock.local.token.startswith(b"shared-token#")

    async def other() -> None:
        await lock.release()

    await asyncio.create_task(other())
    assert not await ar.exists("a:shared")


async def test_a_waiter_is_woken_by_the_release(ar: aioredis.Redis) -> None:
    holder = Lock(ar, "a:wake", timeout=300)
    assert await holder.acquire()
    waiter = Lock(ar, "a:wake", timeout=30, sleep=BIG_SLEEP)

    async def wait_then_release() -> int | None:
        assert await waiter.acquire(blocking_timeout=25)
        fence = waiter.fence  # (the hold is this task's: it releases it)
        await waiter.release()
        return fence

    waiting = asyncio.create_task(wait_then_release())
    await eventually(lambda: subscribers(ar, "a:wake"), "the waiter subscribed")
    first = holder.fence
    await holder.release()
    async with asyncio.timeout(WAKE_DEADLINE):
        fence = await waiting
    assert fence is not None
    assert first is not None
    assert fence > first


async def test_blocking_timeout_gives_up_and_leaves_no_subscription(ar: aioredis.Redis) -> None:
    holder = Lock(ar, "a:busy", timeout=30)
    assert await holder.acquire()
    assert await Lock(ar, "a:busy", timeout=5, sleep=0.05).acquire(blocking_timeout=0.3) is False
    with pytest.raises(tasklock.LockError, match="Unable to acquire"):
        async with Lock(ar, "a:busy", timeout=5, blocking_timeout=0.1):
            pass
    await holder.release()


async def test_a_waiter_cancelled_while_waiting_leaves_no_key(ar: aioredis.Redis) -> None:
    holder = Lock(ar, "a:cancel-wait", timeout=300)
    assert await holder.acquire()
    waiter = Lock(ar, "a:cancel-wait", timeout=30, sleep=BIG_SLEEP)
    waiting = asyncio.create_task(waiter.acquire())
    await eventually(lambda: subscribers(ar, "a:cancel-wait"), "the waiter subscribed")
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    await holder.release()
    assert not await ar.exists("a:cancel-wait")


async def test_an_attempt_cancelled_in_flight_releases_what_it_took(
    redis_server: RedisServer,
) -> None:
    """The attempt's EVALSHA reaches a paused server; the caller is cancelled; the server
    resumes and runs it: the key it took must be released, not left for its TTL."""
    client = aioredis.Redis.from_url(redis_server.url, socket_timeout=10)
    await client.ping()
    lock = Lock(client, "a:cancel-flight", timeout=60)
    async with lock:  # a connection ready for the next attempt: it is sent, not connecting
        taken = lock.fence
    assert taken is not None
    redis_server.pause()
    try:
        attempt = asyncio.create_task(lock.acquire())
        # In flight: the script reached the paused server, which has not read it.
        await eventually(lambda: unread_bytes(redis_server.port) > 0, "the script in flight")
        attempt.cancel()
        with pytest.raises(asyncio.CancelledError):
            await attempt
    finally:
        redis_server.resume()
    # The script ran and took the lock (its fence counter moved past the first hold's) ...
    await eventually(
        lambda: _counter_above(client, lock.fence_key, taken), "the attempt ran on the server"
    )
    await eventually(
        lambda: _not(client.exists("a:cancel-flight")), "the cancelled attempt's key released"
    )
    assert lock.local.token is None
    await client.aclose()


async def _counter_above(client: aioredis.Redis, key: str, fence: int) -> bool:
    return int(await client.get(key) or 0) > fence


async def _not(value: object) -> bool:
    return not await value  # type: ignore[misc]


async def test_release_cancellation_preserves_lock_state(ar: aioredis.Redis) -> None:
    """redis-py #3847: a release cancelled while running still completes, or the hold stays."""
    for cancel_after in (0, 1, 2):
        lock = Lock(ar, "a:cancel-release", timeout=30)
        assert await lock.acquire(blocking=False)
        token = lock.local.token
        release = asyncio.create_task(lock.release())
        for _ in range(cancel_after):
            await asyncio.sleep(0)
        release.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await release
        if lock.local.token is not None:
            assert lock.local.token == token
            await lock.release()  # the same release, awaited again, or a new one
        assert lock.local.token is None
        assert await lock.locked() is False


async def test_a_release_cancelled_in_flight_completes_and_keeps_the_hold_until_then(
    redis_server: RedisServer,
) -> None:
    """The release reaches a paused server and its caller is cancelled: the hold stays (the
    token is not forgotten, redis-py #3847), and a second release() reports the first's outcome
    once the server answers."""
    client = aioredis.Redis.from_url(redis_server.url, socket_timeout=10)
    lock = Lock(client, "a:cancel-release-flight", timeout=60)
    assert await lock.acquire()
    token = lock.local.token
    redis_server.pause()
    try:
        release = asyncio.create_task(lock.release())
        await eventually(lambda: unread_bytes(redis_server.port) > 0, "the release in flight")
        release.cancel()
        with pytest.raises(asyncio.CancelledError):
            await release
        assert lock.local.token == token, "the hold stays while the release is unanswered"
    finally:
        redis_server.resume()
    await lock.release()  # waits for the same release; it succeeded
    assert lock.local.token is None
    assert not await client.exists("a:cancel-release-flight")
    await client.aclose()


async def test_the_watchdog_renews_and_reports_a_lost_hold(
    ar: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    lost: list[Lock] = []

    async def on_lost(lock: Lock) -> None:  # a coroutine function works too
        lost.append(lock)

    lock = Lock(ar, "a:renewed", timeout=0.3, watchdog=True, on_lost=on_lost)
    assert await lock.acquire()
    watchdog = get_async_watchdog()
    before = watchdog.calls
    await eventually(lambda: watchdog.calls >= before + 3, "renewed three times")
    assert await ar.pttl("a:renewed") > 0
    assert not lock.lost
    await ar.delete("a:renewed")
    with caplog.at_level(logging.ERROR, logger="tasklock.lock"):
        async with asyncio.timeout(5):
            await lock.lost.wait()
    await eventually(lambda: lost == [lock], "on_lost ran")
    assert "gone" in (lock.lost.reason or "")
    with pytest.raises(tasklock.LockLostError):
        await lock.release()


async def test_the_watchdog_task_ends_when_nothing_is_held(ar: aioredis.Redis) -> None:
    async with Lock(ar, "a:idle", timeout=0.3, watchdog=True):
        watchdog = get_async_watchdog()
        assert watchdog._task is not None
    await eventually(lambda: watchdog._task is None, "the idle watchdog task ended")


def test_a_closed_loop_is_not_kept_alive(redis_server: RedisServer) -> None:
    """asyncio.run cancels what is left at the end: the watchdog and the listener end with it,
    and nothing of tasklock's keeps the closed loop alive (its per-loop mappings are weak)."""

    async def hold_and_wait() -> None:
        client = aioredis.Redis.from_url(redis_server.url)
        holder = Lock(client, "a:loop", timeout=30, watchdog=True)
        assert await holder.acquire()
        waiter = Lock(client, "a:loop", timeout=1)

        async def wait_then_release() -> None:
            assert await waiter.acquire(blocking_timeout=10)
            await waiter.release()

        waiting = asyncio.create_task(wait_then_release())
        await eventually(lambda: subscribers(client, "a:loop"), "the waiter subscribed")
        await holder.release()
        await waiting
        assert await holder.acquire()  # held (and renewed) when the loop ends
        await client.aclose()
        loops.append(weakref.ref(asyncio.get_running_loop()))

    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    asyncio.run(hold_and_wait())
    gc.collect()  # frees the client's pool, whose finalizer lets go of the lock's own connections,
    gc.collect()  # which this second pass frees
    assert loops[0]() is None, "the closed loop is still referenced"


async def test_the_first_hand_off_on_a_new_listener_is_woken_by_the_release(
    ar: aioredis.Redis, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two waiters arrive together on a loop with no listener yet (a fresh process, or the first
    contention after an idle spell closed it): the second used to start the listener while the
    first's SUBSCRIBE was still connecting; it failed on the unmade connection, counted the
    channel as confirmed and slept 0.2 s, so the release's wake-up was read only then: ~200 ms
    a first hand-off instead of ~1 ms (issue 32; bench_asyncio times it). The listener must
    start on a made connection and hear the release at once."""
    caplog.set_level(logging.DEBUG, logger="tasklock.wakeup")
    real_subscribe = aioredis.client.PubSub.subscribe

    async def slow_subscribe(self: Any, *args: Any, **kwargs: Any) -> Any:
        await asyncio.sleep(0.05)  # a cold connect that takes a while: the second waiter comes
        return await real_subscribe(self, *args, **kwargs)

    monkeypatch.setattr(aioredis.client.PubSub, "subscribe", slow_subscribe)
    holder = Lock(ar, "a:first-hand-off", timeout=30)
    assert await holder.acquire()
    waiters = [Lock(ar, "a:first-hand-off", timeout=30) for _ in range(2)]

    async def take(lock: Lock) -> None:
        async with lock:
            pass

    tasks = [asyncio.ensure_future(take(lock)) for lock in waiters]
    queue, _ = queue_keys_for("a:first-hand-off")
    await eventually(lambda: _queued(ar, queue, 2), "both waiters queued", interval=0.001)
    await holder.release()
    await asyncio.gather(*tasks)
    errors = [r.getMessage() for r in caplog.records if "listener error" in r.getMessage()]
    assert not errors, errors


async def _queued(ar: aioredis.Redis, queue: str, count: int) -> bool:
    return bool(await ar.llen(queue) >= count)
