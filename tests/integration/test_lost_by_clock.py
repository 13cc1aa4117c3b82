"""``lost`` by the process's own clock: a holder paused past its TTL knows it lost before it acts.

The idiom every holder type documents is ``while not lock.lost: act(fence=lock.fence)``. A
process SIGSTOPped past its TTL resumes with all its threads at once, and its loop asks ``lost``
before its watchdog has had the round trip that would tell it. ``lost`` must already be true
then, by the monotonic clock that ran on during the pause.

The pause is exact, not raced: the holder stops itself (``SIGSTOP`` to its own pid) right after
an act and its sleep, where the loop's next step is the ``lost`` check; the test resumes it only
once a standby has taken the lock over and acted on its newer fence. The acts go to one Redis
list, in the server's order, so "the old holder acted after the new one" is read off the list.
"""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
import redis

import tasklock
from tasklock.core.clock import use_clock
from tasklock.core.hold import drift_margin
from tasklock.core.watchdog import get_watchdog
from tests.support.clocks import ClockAhead
from tests.support.polling import eventually
from tests.support.scripts import ScriptProcess
from tests.support.servers import RedisServer

TTL = 2.0

# One holder process: takes the lock (blocking), then acts until ``lost``; the first holder stops
# itself after its third act. It prints what it did, one line each, for the test to read.
HOLDER = """
import asyncio, os, signal, sys, time
import redis, redis.asyncio
import tasklock, tasklock.asyncio

kind, url, name, ttl, pause = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), sys.argv[5]
r = redis.Redis.from_url(url)

def acted(fence, count):
    r.rpush(name + ":acts", fence)
    time.sleep(0.05)
    if pause == "pause" and count == 3:
        print("pausing", fence, flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)  # resumed by the test; next: the lost check

def done(holder, fence):
    print("lost", fence, holder.lost.reason, flush=True)

def sync_holder():
    if kind == "leader":
        return tasklock.Leader(url, name, ttl=ttl)
    if kind == "semaphore":
        return tasklock.Semaphore(r, name, 1, timeout=ttl, watchdog=True)
    return tasklock.Lock(r, name, timeout=ttl, watchdog=True)

def run_sync():
    holder = sync_holder()
    with holder:
        fence = holder.fence
        print("holding", fence, flush=True)
        count = 0
        while not holder.lost:
            count += 1
            acted(fence, count)
        done(holder, fence)

async def run_async():
    ar = redis.asyncio.Redis.from_url(url)
    lock = tasklock.asyncio.Lock(ar, name, timeout=ttl, watchdog=True)
    await lock.acquire()
    fence = lock.fence
    print("holding", fence, flush=True)
    count = 0
    while not lock.lost:
        count += 1
        await ar.rpush(name + ":acts", fence)
        await asyncio.sleep(0.05)
        if pause == "pause" and count == 3:
            print("pausing", fence, flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)
    done(lock, fence)

try:
    if kind == "asyncio":
        asyncio.run(run_async())
    else:
        run_sync()
except tasklock.LockError:
    pass  # the release found the lock gone: expected of the paused holder
print("finished", flush=True)
sys.stdin.read()
"""


class Holder(ScriptProcess):
    def __init__(self, kind: str, url: str, name: str, *, pause: bool) -> None:
        super().__init__(HOLDER, kind, url, name, str(TTL), "pause" if pause else "-")

    def words(self) -> list[str]:
        return self.line().split(maxsplit=2)


@pytest.fixture
def holders() -> Iterator[list[Holder]]:
    started: list[Holder] = []
    yield started
    for holder in started:
        holder.stop()


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["lock", "semaphore", "asyncio", "leader"])
def test_a_holder_resumed_past_its_ttl_knows_it_lost_before_acting(
    kind: str, r: redis.Redis, redis_server: RedisServer, holders: list[Holder]
) -> None:
    name = f"paused:{kind}"
    first = Holder(kind, redis_server.url, name, pause=True)
    holders.append(first)
    word, old_fence = first.words()
    assert word == "holding"
    standby = Holder(kind, redis_server.url, name, pause=False)
    holders.append(standby)
    assert first.words() == ["pausing", old_fence]
    assert first.process.poll() is None
    eventually(
        lambda: first.process.poll() is None and _stopped(first.process.pid),
        what="the first holder stopped itself",
    )
    # Its key runs out; the standby takes over and acts on a newer fence.
    word, new_fence = standby.words()
    assert word == "holding"
    assert int(new_fence) > int(old_fence)
    eventually(
        lambda: r.lrange(f"{name}:acts", 0, -1)[-1:] == [new_fence.encode()],
        what="the new holder acting",
    )
    first.process.send_signal(signal.SIGCONT)
    word, fence, reason = first.words()
    assert (word, fence) == ("lost", old_fence)
    acts = [int(fence) for fence in r.lrange(f"{name}:acts", 0, -1)]
    newest = acts.index(int(new_fence))
    assert int(old_fence) not in acts[newest:], (
        f"the paused holder acted after its successor: {acts}"
    )
    assert acts[:newest] == [int(old_fence)] * 3
    # The first thing it saw on resuming was its own clock's finding (the watchdog's round trip
    # came later), and the reason says so.
    assert reason.startswith("lease ran out by this process's clock (paused"), reason


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


# -- in this process: a clock moved on, as a pause would ---------------------------------------


def test_a_lock_without_watchdog_is_lost_by_the_clock_at_its_ttl(r: redis.Redis) -> None:
    lock = tasklock.Lock(r, "clock:plain", timeout=0.5)
    assert lock.acquire()
    assert not lock.lost
    assert lock.lost.reason is None
    # No watchdog and no round trip: the flag's wait returns at the lease's end by the clock.
    assert lock.lost.wait(10)
    assert lock.lost
    assert not lock.lost.is_set()  # the clock's finding, not the watchdog's
    assert "no watchdog" in lock.lost.reason
    left = lock.lease_left()
    assert left is not None
    assert left < drift_margin(0.5)


def test_a_confirmed_extend_brings_the_lease_back(r: redis.Redis) -> None:
    lock = tasklock.Lock(r, "clock:extend", timeout=30)
    assert lock.acquire()
    previous = use_clock(ClockAhead(30))
    try:
        assert lock.lost
        assert "held 30" in lock.lost.reason
        lock.extend(30, replace_ttl=True)  # the key was still ours: nobody else can have held it
        assert not lock.lost
        assert lock.lost.reason is None
    finally:
        use_clock(previous)
    lock.release()
    assert not lock.lost  # released in time: nothing was lost


def test_released_in_time_is_never_lost_later(r: redis.Redis) -> None:
    lock = tasklock.Lock(r, "clock:released", timeout=0.2)
    assert lock.acquire()
    lock.release()
    assert not lock.lost.wait(0.4)  # its TTL would have run out by now
    assert not lock.lost


def test_a_release_after_the_clock_ran_out_keeps_the_hold_lost(r: redis.Redis) -> None:
    """A holder resumed past its TTL that releases before its watchdog has run: the clock had
    counted the hold lost, the release finds the key gone, and ``lost`` must stay true after it
    (the end of the hold used to end the clock's finding too, so ``lost`` read False, with no
    reason, for a hold that was lost: a flake of test_paused_holder_is_fenced_off)."""
    lock = tasklock.Lock(r, "clock:gone", timeout=30)
    assert lock.acquire()
    previous = use_clock(ClockAhead(30))
    try:
        assert lock.lost
        r.delete("clock:gone")  # what the server's TTL did meanwhile
        with pytest.raises(tasklock.LockLostError, match="gone or held by another owner"):
            lock.release()
    finally:
        use_clock(previous)
    assert lock.lost
    assert lock.lost.is_set()  # final: the server said so
    assert "gone or held by another owner when the release reached the server" in (
        lock.lost.reason or ""
    )
    assert "run out by this process's clock" in (lock.lost.reason or "")


def test_a_release_that_finds_the_key_gone_unannounced_raises_not_owned(r: redis.Redis) -> None:
    """Nothing had said the hold was lost (the key was deleted under it): LockNotOwnedError, not
    LockLostError; the hold counts as lost from then on all the same."""
    lock = tasklock.Lock(r, "clock:deleted", timeout=30)
    assert lock.acquire()
    assert not lock.lost
    r.delete("clock:deleted")
    with pytest.raises(tasklock.LockNotOwnedError) as raised:
        lock.release()
    assert not isinstance(raised.value, tasklock.LockLostError)
    assert lock.lost
    assert lock.lost.reason == (
        "the lock key was gone or held by another owner when the release reached the server"
    )


async def test_an_asyncio_release_after_the_clock_ran_out_keeps_the_hold_lost(
    redis_server: RedisServer,
) -> None:
    import redis.asyncio

    import tasklock.asyncio

    client = redis.asyncio.Redis.from_url(redis_server.url)
    lock = tasklock.asyncio.Lock(client, "clock:async-gone", timeout=30)
    assert await lock.acquire()
    previous = use_clock(ClockAhead(30))
    try:
        await client.delete("clock:async-gone")
        with pytest.raises(tasklock.LockLostError, match="gone or held by another owner"):
            await lock.release()
    finally:
        use_clock(previous)
    assert lock.lost
    assert "run out by this process's clock" in (lock.lost.reason or "")
    await client.aclose()


def test_a_renewal_that_finds_the_key_still_ours_unloses_the_hold(r: redis.Redis) -> None:
    """The clock counts a hold lost first; when the watchdog's next renewal finds the key still
    this hold's (an owner-checked script: the key never left the server, so nobody else held
    the lock), the hold goes on and ``on_lost`` never runs."""
    called: list[str] = []
    lock = tasklock.Lock(
        r, "clock:unlost", timeout=1.5, watchdog=True, on_lost=lambda lk: called.append("lost")
    )
    assert lock.acquire()
    renewals = get_watchdog().calls
    previous = use_clock(ClockAhead(1.5))
    try:
        assert lock.lost
        assert lock.lost.reason is not None
        assert lock.lost.reason.startswith("lease ran out by this process's clock")
        eventually(lambda: not lock.lost, what="the watchdog's renewal confirming the hold")
        assert get_watchdog().calls > renewals
    finally:
        use_clock(previous)
    assert lock.owned()
    lock.release()
    assert called == []


async def test_the_asyncio_flag_waits_for_the_clock(redis_server: RedisServer) -> None:
    import redis.asyncio

    import tasklock.asyncio

    client = redis.asyncio.Redis.from_url(redis_server.url)
    lock = tasklock.asyncio.Lock(client, "clock:async", timeout=0.5)
    assert await lock.acquire()
    assert not lock.lost
    assert await lock.lost.wait() is True  # returns at the lease's end by the clock
    assert lock.lost
    assert "no watchdog" in lock.lost.reason
    await client.aclose()


def test_a_paused_leader_reads_lost_off_its_clock(redis_server: RedisServer) -> None:
    leader = tasklock.Leader(redis_server.url, "clock:leader", ttl=30)
    assert leader.campaign()
    previous = use_clock(ClockAhead(30))
    try:
        assert leader.lost
        assert not leader.lost.is_set()
        assert not leader.is_leader
    finally:
        use_clock(previous)
    assert leader.is_leader
    leader.resign()


def test_redlock_reads_lost_off_its_clock(nodes: list[RedisServer]) -> None:
    lock = tasklock.Redlock([server.url for server in nodes], "clock:redlock", timeout=30)
    assert lock.acquire()
    previous = use_clock(ClockAhead(30))
    try:
        assert lock.lost
        assert lock.lost.wait(0)
    finally:
        use_clock(previous)
    assert not lock.lost
    lock.release()
