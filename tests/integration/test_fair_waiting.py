"""Fair waiting (issue 13): waiters are served in arrival order, a release wakes only the next one,
and a waiter that gives up or dies leaves the queue (at once, or after its short liveness)."""

from __future__ import annotations

import os
import signal
import threading
from multiprocessing import get_context
from pathlib import Path

import pytest
import redis

import tasklock
from tasklock.core.keys import queue_keys_for, wake_channel, wake_id
from tasklock.core.queue_scripts import NEXT_PREFIX
from tasklock.core.wakeup import ChannelBook
from tests.support.polling import eventually
from tests.support.servers import RedisServer

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("resp")]


def queued(r: redis.Redis, name: str) -> list[bytes]:
    """The waiter tokens queued on ``name``, first first."""
    return list(r.lrange(queue_keys_for(name)[0], 0, -1))


def token_of(value: bytes) -> bytes:
    """The owner token's random part (what names an owner across its retries) in a stored value
    (``<token>#<fence>``) or a queued waiter (``<wake id> <token id>``)."""
    if b"#" in value:
        return value.rpartition(b"#")[0].split(b" ", 1)[0]
    return value.split(b" ", 1)[1]


def test_waiters_are_served_in_arrival_order(r: redis.Redis) -> None:
    holder = tasklock.Lock(r, "fifo", timeout=30)
    assert holder.acquire()
    order: list[int] = []
    threads = []
    for i in range(5):

        def wait(i: int = i) -> None:
            lock = tasklock.Lock(r, "fifo", timeout=30)
            assert lock.acquire(blocking_timeout=30)
            order.append(i)
            lock.release()

        thread = threading.Thread(target=wait)
        thread.start()
        threads.append(thread)
        # The next one starts only once this one is queued: arrival order is i.
        eventually(lambda i=i: len(queued(r, "fifo")) == i + 1, what=f"waiter {i} queued")
    holder.release()
    for thread in threads:
        thread.join(30)
    assert order == [0, 1, 2, 3, 4]
    assert not r.exists(*queue_keys_for("fifo"))  # the queue went with its last waiter


def test_a_newcomer_queues_behind_the_waiters_instead_of_barging(r: redis.Redis) -> None:
    holder = tasklock.Lock(r, "barge", timeout=30)
    assert holder.acquire()
    first = tasklock.Lock(r, "barge", timeout=30, thread_local=False)
    got = threading.Event()
    thread = threading.Thread(target=lambda: first.acquire(blocking_timeout=30) and got.set())
    thread.start()
    eventually(lambda: len(queued(r, "barge")) == 1, what="the waiter queued")
    # Between the release and the woken waiter's attempt the lock is free, but not for a
    # newcomer: only the first in the queue may take it.
    r.eval(  # the release, as the holder's script does it, minus the wake-up
        "redis.call('DEL', KEYS[1])", 1, "barge"
    )
    newcomer = tasklock.Lock(r, "barge", timeout=30)
    assert newcomer.acquire(blocking=False) is False
    assert got.wait(10), "the queued waiter took the free lock (at its next try)"
    first.release()
    assert newcomer.acquire(blocking=False)
    newcomer.release()
    thread.join(5)


def own_channel(name: str) -> str:
    """This process's channel of ``name``'s wake channel: where a release names a waiter of
    this process (every waiter in these tests runs in the test's own process)."""
    return f"{wake_channel(name)}@{wake_id()}"


def test_a_release_names_only_the_first_waiter(r: redis.Redis) -> None:
    """The release publishes one message naming the first queued waiter; each listener wakes
    only that waiter (the herd is gone: others sleep on)."""
    holder = tasklock.Lock(r, "next", timeout=30)
    assert holder.acquire()
    waiters = [tasklock.Lock(r, "next", timeout=30, thread_local=False) for _ in range(3)]
    threads = []
    for i, lock in enumerate(waiters):
        thread = threading.Thread(target=lambda lock=lock: lock.acquire(blocking_timeout=30))
        thread.start()
        threads.append(thread)
        eventually(lambda i=i: len(queued(r, "next")) == i + 1, what=f"waiter {i} queued")
    first_token = queued(r, "next")[0]
    process_channel = own_channel("next").encode()
    assert first_token.startswith(wake_id().encode() + b" ")
    listener = r.pubsub()
    listener.subscribe(wake_channel("next"), process_channel)
    for _ in range(2):
        assert listener.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]
    holder.release()
    message = eventually(lambda: listener.get_message(timeout=1), what="the wake-up message")
    # On the waiter's process channel only: the other processes' listeners never hear of it.
    assert (message["channel"], message["data"]) == (process_channel, NEXT_PREFIX + first_token)
    assert listener.get_message(timeout=0.2) is None
    eventually(lambda: waiters[0].fence is not None, what="the first waiter took it")
    assert token_of(r.get("next") or b"") == token_of(first_token)
    for lock, thread in zip(waiters, threads, strict=True):
        thread.join(30)
        lock.release()
    listener.close()


def test_the_listener_wakes_only_the_named_waiter() -> None:
    """ChannelBook, the rules both listeners share: a message naming a token sets only that
    waiter's event (and the unfair waiters'); any other message wakes everyone."""
    book = ChannelBook(threading.Event)
    a, b, plain = threading.Event(), threading.Event(), threading.Event()
    book.join(b"ch", a, b"tok-a")
    book.join(b"ch", b, b"tok-b")
    book.join(b"ch", plain)
    book.dispatch({"type": "message", "channel": b"ch", "data": NEXT_PREFIX + b"tok-b"})
    assert (a.is_set(), b.is_set(), plain.is_set()) == (False, True, True)
    b.clear()
    plain.clear()
    book.dispatch({"type": "message", "channel": "ch", "data": "some-lock-name"})
    assert (a.is_set(), b.is_set(), plain.is_set()) == (True, True, True)
    for event in (a, b, plain):
        event.clear()
    # A fair release comes on this process's channel of the lock (ChannelBook.subscriptions).
    own = book.subscriptions(b"ch")[1]
    assert own == b"ch@" + wake_id().encode()
    book.dispatch({"type": "message", "channel": own, "data": NEXT_PREFIX + b"tok-a"})
    assert (a.is_set(), b.is_set(), plain.is_set()) == (True, False, True)
    a.clear()
    plain.clear()
    # Another process's channel of the same lock (a listener never subscribes one) wakes nobody.
    book.dispatch({"type": "message", "channel": b"ch@0000000z", "data": NEXT_PREFIX + b"tok-b"})
    assert (a.is_set(), b.is_set(), plain.is_set()) == (False, False, False)
    book.leave(b"ch", a, b"tok-a")
    book.leave(b"ch", b, b"tok-b")
    book.leave(b"ch", plain)
    assert book.channels[b"ch"].empty()


def _wait_then_give_up(port: int, result: str) -> None:
    lock = tasklock.Lock(redis.Redis(port=port), "giveup-proc", timeout=30)
    got = lock.acquire(blocking_timeout=1.5)
    # Read before this process ends: leaving is the give-up's own doing, not the liveness's.
    left = redis.Redis(port=port).llen(queue_keys_for("giveup-proc")[0])
    Path(result).write_text(f"{got} {left}")


def test_a_waiter_process_that_gives_up_leaves_the_queue_at_once(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    holder = tasklock.Lock(r, "giveup-proc", timeout=30)
    assert holder.acquire()
    result = tmp_path / "result"
    process = get_context("spawn").Process(
        target=_wait_then_give_up, args=(redis_server.port, str(result))
    )
    process.start()
    eventually(lambda: len(queued(r, "giveup-proc")) == 1, timeout=30, what="it queued")
    process.join(30)
    assert process.exitcode == 0
    assert result.read_text() == "False 0"
    holder.release()


def test_a_waiter_that_gives_up_leaves_the_queue_at_once(r: redis.Redis) -> None:
    holder = tasklock.Lock(r, "giveup", timeout=30)
    assert holder.acquire()
    quitter = tasklock.Lock(r, "giveup", timeout=30)
    assert quitter.acquire(blocking_timeout=0.3) is False
    assert queued(r, "giveup") == []
    assert r.zcard(queue_keys_for("giveup")[1]) == 0
    holder.release()


def test_a_waiter_leaving_first_passes_the_wake_up_on(r: redis.Redis) -> None:
    """The first waiter leaves while the lock is free (its timeout passed just as it was woken):
    the leave script wakes the waiter now first, instead of leaving it to its next try."""
    queue, waiters = queue_keys_for("pass-on")
    seconds, micros = r.time()
    r.rpush(queue, "ghost")  # a live waiter first in the queue, which will give up
    r.zadd(waiters, {"ghost": seconds * 1000 + micros // 1000 + 60_000})
    second = tasklock.Lock(r, "pass-on", timeout=30, thread_local=False)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(second.acquire(blocking_timeout=30)))
    thread.start()
    eventually(lambda: len(queued(r, "pass-on")) == 2, what="queued behind the first")
    assert not r.exists("pass-on")  # free, but not the second's to take yet
    second_token = queued(r, "pass-on")[1]
    listener = r.pubsub()
    listener.subscribe(own_channel("pass-on"))
    assert listener.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]
    assert second._layout.leave is not None
    script, keys, tail = second._layout.leave
    script(r, keys, ("ghost", *tail))
    message = eventually(lambda: listener.get_message(timeout=1), what="the wake-up message")
    assert message["data"] == NEXT_PREFIX + second_token
    thread.join(30)
    assert got == [True]
    second.release()
    listener.close()


def _queue_and_hang(port: int, ready: str) -> None:
    client = redis.Redis(port=port)
    lock = tasklock.Lock(client, "dead-waiter", timeout=30)
    Path(ready).write_text("waiting")
    lock.acquire()  # queued behind the test's holder until SIGKILLed


def test_a_killed_waiter_leaves_the_queue_after_its_liveness(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    holder = tasklock.Lock(r, "dead-waiter", timeout=60)
    assert holder.acquire()
    ready = tmp_path / "ready"
    process = get_context("spawn").Process(
        target=_queue_and_hang, args=(redis_server.port, str(ready))
    )
    process.start()
    try:
        eventually(lambda: len(queued(r, "dead-waiter")) == 1, timeout=30, what="it queued")
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.join(10)
    behind = tasklock.Lock(r, "dead-waiter", timeout=30, thread_local=False)
    got: list[bool] = []
    thread = threading.Thread(target=lambda: got.append(behind.acquire(blocking_timeout=30)))
    thread.start()
    eventually(lambda: len(queued(r, "dead-waiter")) == 2, what="queued behind the dead one")
    holder.release()  # names the dead waiter, which never comes
    thread.join(30)
    assert got == [True], "the dead waiter blocked the queue"
    assert queued(r, "dead-waiter") == []
    behind.release()


def test_fair_false_keeps_the_old_race(r: redis.Redis) -> None:
    holder = tasklock.Lock(r, "unfair", timeout=30, fair=False)
    assert holder.acquire()
    waiter = tasklock.Lock(r, "unfair", timeout=30, fair=False)
    assert waiter.acquire(blocking_timeout=0.2) is False
    assert not r.exists(*queue_keys_for("unfair"))  # no queue at all
    holder.release()
    with pytest.raises(tasklock.ConfigurationError, match="fair"):
        tasklock.Lock(r, "bad", fair="yes")  # type: ignore[arg-type]


def test_semaphore_waiters_are_served_in_arrival_order(r: redis.Redis) -> None:
    holders = [tasklock.Semaphore(r, "sem-fifo", 2, timeout=30) for _ in range(2)]
    for h in holders:
        assert h.acquire()
    order: list[int] = []
    done = []
    for i in range(4):

        def wait(i: int = i) -> None:
            sem = tasklock.Semaphore(r, "sem-fifo", 2, timeout=30, thread_local=False)
            assert sem.acquire(blocking_timeout=30)
            order.append(i)
            done.append(sem)

        threading.Thread(target=wait, daemon=True).start()
        eventually(lambda i=i: len(queued(r, "sem-fifo")) == i + 1, what=f"waiter {i} queued")
    holders[0].release()
    eventually(lambda: order == [0], what="the first waiter took the freed permit")
    holders[1].release()
    eventually(lambda: order == [0, 1], what="then the second")
    assert len(queued(r, "sem-fifo")) == 2
    for _ in range(2):  # let the last two in (and out), so no thread is left waiting
        done.pop(0).release()
    eventually(lambda: len(done) == 2, what="the last two took the permits")
    for sem in done:
        sem.release()


def test_two_quick_permit_releases_wake_two_waiters(r: redis.Redis) -> None:
    """The second release names the second waiter too, though the first has not taken its permit
    yet (it used to name the first one twice, leaving the second to its next try)."""
    holders = [tasklock.Semaphore(r, "sem-two", 2, timeout=30) for _ in range(2)]
    for h in holders:
        assert h.acquire()
    waiters = [tasklock.Semaphore(r, "sem-two", 2, timeout=30, thread_local=False) for _ in "ab"]
    threads = []
    for i, sem in enumerate(waiters):
        thread = threading.Thread(target=lambda sem=sem: sem.acquire(blocking_timeout=30))
        thread.start()
        threads.append(thread)
        eventually(lambda i=i: len(queued(r, "sem-two")) == i + 1, what=f"waiter {i} queued")
    tokens = queued(r, "sem-two")
    listener = r.pubsub()
    listener.subscribe(own_channel("sem-two"))
    assert listener.get_message(timeout=5)["type"] == "subscribe"  # type: ignore[index]
    # Both releases back to back, by their scripts (the holders' hold state is left as it is):
    # neither waiter can take its permit in between.
    script = holders[0]._layout.release
    for h in holders:
        hold = h._hold()
        assert hold is not None
        script(r, h._layout.release_keys, (hold.value, *h._layout.release_tail))
    named: set[bytes] = set()
    wanted = {NEXT_PREFIX + token for token in tokens}

    def both_named() -> bool:
        message = listener.get_message(timeout=0.1)
        if message is not None:
            named.add(message["data"])
        return named >= wanted

    eventually(both_named, timeout=5, what="both waiters named by the two releases")
    assert named == wanted
    for sem, thread in zip(waiters, threads, strict=True):
        thread.join(30)
        sem.release()
    listener.close()
