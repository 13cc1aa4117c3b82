"""Waiting for a held lock against a real redis-server: deadlines, wake-up by release (in this
process and in another one), wake-up by expiry, and threads contending for one name.

The wake-up tests prove the waiter was woken by the release's PUBLISH and not by polling: the
waiter's initial backoff is 30 s (so its first poll is 15-30 s away) and the holder's TTL is long,
so only the wake-up can make it acquire within the test's deadline; and the server's own command
counter shows that the waiter made no attempt between going to sleep and being woken.
"""

from __future__ import annotations

import json
import os
import threading
import time
from multiprocessing import get_context
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

import tasklock
from tasklock.core.wakeup import hub_for
from tests.support.history import Hold, assert_fences_increase, assert_no_overlap
from tests.support.polling import eventually, holds_for
from tests.support.servers import RedisServer, start_servers
from tests.support.waking import assert_woken_by_release, evalsha_calls, subscribers

# The waiter's first poll would come 15-30 s after it went to sleep: far beyond these deadlines.
BIG_SLEEP = 30.0
WAKE_DEADLINE = 10.0


def wait_until_asleep(r: redis.Redis, name: str, attempts_before: int) -> None:
    """The waiter subscribed and made its two attempts (before and after subscribing): it is now
    in (or entering) its backoff sleep, armed for a wake-up."""
    eventually(lambda: subscribers(r, name) >= 1, what="the waiter subscribed")
    eventually(
        lambda: evalsha_calls(r) >= attempts_before + 2, what="the waiter tried twice, then slept"
    )


@pytest.mark.parametrize(("blocking_timeout", "sleep"), [(0.3, 0.1), (0.5, BIG_SLEEP)])
def test_blocking_timeout_is_honoured(
    r: redis.Redis, blocking_timeout: float, sleep: float
) -> None:
    holder = tasklock.Lock(r, "busy", timeout=60)
    assert holder.acquire()
    waiter = tasklock.Lock(r, "busy", timeout=5, sleep=sleep)
    start = time.monotonic()
    assert waiter.acquire(blocking_timeout=blocking_timeout) is False
    elapsed = time.monotonic() - start
    assert elapsed >= blocking_timeout, "returned before the timeout"
    # What a wrong waiter does is sleep its whole poll interval past the deadline (BIG_SLEEP,
    # 30 s); the bound is half of that, so it tells the two apart on any machine, however slow.
    assert elapsed < blocking_timeout + BIG_SLEEP / 2, (
        f"took {elapsed:.2f}s for {blocking_timeout}s"
    )
    assert not waiter.owned()
    holder.release()


def test_blocking_timeout_from_the_constructor_and_context_manager(r: redis.Redis) -> None:
    holder = tasklock.Lock(r, "busy-ctx", timeout=60)
    assert holder.acquire()
    waiter = tasklock.Lock(r, "busy-ctx", timeout=5, blocking_timeout=0.2)
    start = time.monotonic()
    with pytest.raises(tasklock.LockError, match="Unable to acquire lock"), waiter:
        pytest.fail("entered a lock that is held")
    assert time.monotonic() - start >= 0.2
    assert tasklock.Lock(r, "busy-ctx", blocking=False).acquire() is False
    holder.release()


def test_waiter_thread_is_woken_by_release(r: redis.Redis) -> None:
    # fair=False here and below: a queued waiter tries every second to keep its place, and these
    # tests prove "no poll" by counting EVALSHAs (the fair path: test_fair_waiting.py).
    with tasklock.Lock(r, "warm-up", timeout=5, fair=False):  # scripts loaded: no NOSCRIPT below
        pass
    holder = tasklock.Lock(r, "handoff", timeout=300, fair=False)
    assert holder.acquire()
    waiter = tasklock.Lock(r, "handoff", timeout=30, sleep=BIG_SLEEP, fair=False)
    acquired = threading.Event()
    outcome: list[bool] = []

    def wait() -> None:
        outcome.append(waiter.acquire(blocking_timeout=25))
        acquired.set()

    r.config_resetstat()
    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    wait_until_asleep(r, "handoff", 0)
    holder.release()  # one EVALSHA
    assert acquired.wait(WAKE_DEADLINE), "not woken by the release"
    thread.join(5)
    assert outcome == [True]
    assert evalsha_calls(r) == 4, "two tries, the release, one try after the wake-up: no polls"
    assert waiter.owned() is False  # thread-local: owned by the waiter thread, not this one
    assert r.get("handoff") is not None
    # The channel lingers a moment (a waiter soon after needs no SUBSCRIBE), then goes.
    eventually(lambda: subscribers(r, "handoff") == 0, timeout=5, what="unsubscribed")


def _wait_in_other_process(port: int, name: str, result: str) -> None:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)
    lock = tasklock.Lock(client, name, timeout=30, sleep=BIG_SLEEP, fair=False)
    acquired = lock.acquire(blocking_timeout=25)
    at = time.monotonic()
    fence = lock.fence
    if acquired:
        lock.release()
    Path(result + ".tmp").write_text(json.dumps({"acquired": acquired, "at": at, "fence": fence}))
    os.replace(result + ".tmp", result)


def test_waiter_in_another_process_is_woken_by_release(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    with tasklock.Lock(r, "warm-up", timeout=5, fair=False):  # scripts loaded: no NOSCRIPT below
        pass
    holder = tasklock.Lock(r, "handoff-proc", timeout=300, fair=False)
    assert holder.acquire()
    result = tmp_path / "result.json"
    r.config_resetstat()
    process = get_context("spawn").Process(
        target=_wait_in_other_process, args=(redis_server.port, "handoff-proc", str(result))
    )
    process.start()
    try:
        wait_until_asleep(r, "handoff-proc", 0)
        released_at = time.monotonic()
        holder.release()
        process.join(WAKE_DEADLINE)
        assert process.exitcode == 0, "the waiter was not woken by the release"
    finally:
        if process.is_alive():
            process.kill()
            process.join(5)
    report = json.loads(result.read_text())
    assert report["acquired"] is True
    assert report["fence"] == holder_fence_after(r, "handoff-proc")
    assert report["at"] - released_at < WAKE_DEADLINE
    # two tries, the release, the woken try, the waiter's own release: no polling in between
    assert evalsha_calls(r) == 5


def holder_fence_after(r: redis.Redis, name: str) -> int:
    """The fence counter now: the waiter's hold was the last one issued."""
    return int(r.get(f"{{{name}}}:fence") or 0)


def test_waiter_is_woken_when_the_holders_key_expires(r: redis.Redis) -> None:
    """A holder that dies publishes nothing; the waiter sleeps no longer than the holder's TTL."""
    holder = tasklock.Lock(r, "expires", timeout=1.0)
    assert holder.acquire()
    waiter = tasklock.Lock(r, "expires", timeout=5, sleep=BIG_SLEEP)
    start = time.monotonic()
    # Without the clamp the first wait would be 12 s (cut to the deadline), not about 1 s.
    assert waiter.acquire(blocking_timeout=12) is True
    elapsed = time.monotonic() - start
    assert elapsed < WAKE_DEADLINE, f"took {elapsed:.1f}s: the holder's TTL did not cut the wait"
    assert waiter.fence > holder.fence  # type: ignore[operator]
    with pytest.raises(tasklock.LockNotOwnedError):
        holder.release()
    waiter.release()


@pytest.mark.parametrize("shared_object", [False, True], ids=["own-objects", "one-object"])
def test_threads_contending_for_one_name(r: redis.Redis, shared_object: bool) -> None:
    threads, rounds = 6, 25
    shared = tasklock.Lock(r, "threads")
    holds: list[Hold] = []
    record = threading.Lock()
    errors: list[BaseException] = []

    def contend() -> None:
        try:
            lock = shared if shared_object else tasklock.Lock(r, "threads")
            for _ in range(rounds):
                assert lock.acquire(blocking_timeout=30)
                start = time.monotonic_ns()
                fence = lock.fence
                assert lock.owned()
                end = time.monotonic_ns()
                lock.release()
                with record:
                    holds.append(Hold("threads", fence, start, end, threading.get_ident()))
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=contend) for _ in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert errors == []
    assert len(holds) == threads * rounds
    assert_no_overlap(holds)
    assert_fences_increase(holds)
    assert not r.exists("threads")


def pubsub_connections(r: redis.Redis) -> int:
    return sum(1 for c in r.client_list() if int(c.get("sub", 0)) + int(c.get("psub", 0)) > 0)


def hand_off(r: redis.Redis, name: str) -> None:
    """A waiter in a thread, woken by the release (BIG_SLEEP: polling could not make it)."""
    holder = tasklock.Lock(r, name, timeout=300)
    assert holder.acquire()
    waiter = tasklock.Lock(r, name, timeout=30, sleep=BIG_SLEEP)
    outcome: list[bool] = []
    thread = threading.Thread(
        target=lambda: outcome.append(waiter.acquire(blocking_timeout=25)), daemon=True
    )
    attempts_before = evalsha_calls(r)  # before the waiter can make any
    thread.start()
    wait_until_asleep(r, name, attempts_before)
    holder.release()
    thread.join(WAKE_DEADLINE)
    assert outcome == [True], "not woken by the release"
    assert r.delete(name) == 1


def test_the_listener_stops_when_nobody_waits_and_starts_again(r: redis.Redis) -> None:
    hub = hub_for(r)
    hand_off(r, "idle-listener")
    eventually(lambda: hub._thread is None, timeout=10, what="the idle listener stopped")
    assert pubsub_connections(r) == 0, "and closed its connection"
    hand_off(r, "idle-listener")  # the next waiter starts it again


def test_the_listener_of_a_dead_server_stops_once_nobody_waits() -> None:
    with start_servers(1) as (server,):
        client = server.client(retry=Retry(NoBackoff(), 0))  # no reconnect loop to sit out
        holder = tasklock.Lock(client, "dead", timeout=300)
        assert holder.acquire()
        waiter = tasklock.Lock(client, "dead", timeout=30, sleep=0.1)
        errors: list[BaseException] = []

        def wait() -> None:
            try:
                waiter.acquire(blocking_timeout=25)
            except tasklock.BackendUnavailable as exc:
                errors.append(exc)

        thread = threading.Thread(target=wait)
        thread.start()
        eventually(lambda: subscribers(client, "dead") == 1, what="the waiter subscribed")
        hub = hub_for(client)
        server.stop()
        thread.join(20)
        assert errors, "the waiter saw the server go"
        # Nobody waits there any more: the listener gives up instead of reconnecting for ever.
        eventually(lambda: hub._thread is None, timeout=10, what="the listener stopped")


def test_a_plain_and_a_tls_client_of_one_address_get_different_wakeup_hubs() -> None:
    """A hub is a connection to one server: a plain client's hub must never serve a TLS client
    of the same host and port (a server restarted with TLS, or a port reused)."""
    plain = redis.Redis(host="127.0.0.1", port=1)
    tls = redis.Redis(host="127.0.0.1", port=1, ssl=True)
    assert hub_for(plain) is not hub_for(tls)
    assert hub_for(plain) is hub_for(redis.Redis(host="127.0.0.1", port=1, db=3))  # server-wide


def test_closing_the_client_the_listener_came_from_leaves_the_listener_connected() -> None:
    """The listener's connection is its own. ``Redis.close()`` disconnects every connection of
    the client's pool: were the listener's among them, it would be closed under the listener's
    thread (over TLS its SSL object then read whatever new socket got the descriptor's number)."""
    with start_servers(1) as (server,):  # a server no hub knows yet: the hub comes from `first`
        observer = server.client()
        first = server.client()
        holder = tasklock.Lock(observer, "closed-client", timeout=300)
        assert holder.acquire()
        waiter = tasklock.Lock(first, "closed-client", timeout=30, sleep=BIG_SLEEP)

        def subscribed_then_close_first() -> None:
            eventually(lambda: subscribers(observer, "closed-client") == 1, what="subscribed")
            listening = pubsub_client_ids(observer)
            first.close()
            holds_for(
                lambda: pubsub_client_ids(observer) == listening,
                1.0,
                what="the listener kept its connection after the first client closed",
            )

        assert_woken_by_release(waiter, holder.release, subscribed_then_close_first)
        observer.close()


def pubsub_client_ids(r: redis.Redis) -> set[int]:
    return {int(c["id"]) for c in r.client_list() if int(c.get("sub", 0)) > 0}
