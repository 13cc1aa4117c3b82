"""tasklock.Semaphore (issue 12): at most ``limit`` holders, each permit with its own owner and TTL.

Proven from recorded histories (processes x threads, and holders SIGKILLed mid-hold), plus the
edges: a lowered limit, a plain Lock on the same name, the watchdog, a lost permit, wake-up.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from multiprocessing import get_context
from pathlib import Path

import pytest
import redis

import tasklock
from tasklock.core.keys import fence_key_for
from tests.support.history import (
    HistoryLog,
    Hold,
    assert_at_most,
    assert_later_holds_fenced_higher,
    run_processes,
)
from tests.support.polling import eventually, holds_for
from tests.support.servers import RedisServer
from tests.support.waking import BIG_SLEEP, assert_woken_by_release, evalsha_calls, subscribers

# Both RESP versions (tests/conftest.py: resp): redis-py 8 speaks RESP3 unless told otherwise.
pytestmark = pytest.mark.usefixtures("resp")


def test_limit_holders_then_the_next_waits(r: redis.Redis) -> None:
    sems = [tasklock.Semaphore(r, "api", 3, timeout=10) for _ in range(4)]
    assert [s.acquire(blocking=False) for s in sems[:3]] == [True, True, True]
    assert sems[3].acquire(blocking=False) is False
    assert sems[3].locked()
    fences = [s.fence for s in sems[:3]]
    assert fences == sorted(set(fences)), "fences strictly increase across permits"
    holders = sems[0].holders()
    assert len(holders) == 3
    assert {h.fence for h, _ in holders} == set(fences)
    assert all(0 < left <= 10 for _, left in holders if left is not None)
    sems[1].release()
    assert not sems[0].locked()
    assert sems[3].acquire(blocking=False)
    assert sems[3].fence is not None
    assert sems[3].fence > max(f for f in fences if f is not None)
    for s in (sems[0], sems[2], sems[3]):
        assert s.owned()
        s.release()
        assert not s.owned()
    assert not r.exists("api")


def test_one_round_trip_to_acquire_and_one_to_release(r: redis.Redis) -> None:
    sem = tasklock.Semaphore(r, "rt", 2, timeout=10)
    before = evalsha_calls(r)
    assert sem.acquire()
    sem.release()
    assert evalsha_calls(r) - before == 2


def test_a_release_wakes_a_waiter(r: redis.Redis) -> None:
    holders = [tasklock.Semaphore(r, "wake", 2, timeout=30) for _ in range(2)]
    for h in holders:
        assert h.acquire()
    waiter = tasklock.Semaphore(r, "wake", 2, timeout=30, sleep=BIG_SLEEP, thread_local=False)
    before = evalsha_calls(r)

    def asleep() -> None:
        eventually(lambda: subscribers(r, "wake") >= 1, what="the waiter subscribed")
        eventually(lambda: evalsha_calls(r) >= before + 2, what="the waiter tried twice")

    assert_woken_by_release(waiter, holders[0].release, asleep)
    waiter.release()
    holders[1].release()


def test_a_permit_without_renewal_frees_itself_at_its_ttl(r: redis.Redis) -> None:
    crashed = tasklock.Semaphore(r, "ttl", 1, timeout=0.3)
    assert crashed.acquire()
    other = tasklock.Semaphore(r, "ttl", 1, timeout=10)
    assert other.acquire(blocking_timeout=10)  # waits for the first permit's TTL
    with pytest.raises(tasklock.LockNotOwnedError):
        crashed.release()
    other.release()


def test_the_watchdog_renews_a_permit_and_reports_it_lost(r: redis.Redis) -> None:
    lost: list[tasklock.Lock] = []
    sem = tasklock.Semaphore(r, "renewed", 2, timeout=0.5, watchdog=True, on_lost=lost.append)
    assert sem.acquire()
    assert holds_for(sem.owned, 1.2) > 0  # more than twice the TTL
    r.delete("renewed")  # an operator (or eviction) removed the permits
    eventually(lambda: sem.lost, what="the watchdog found the permit gone")
    assert lost == [sem]
    with pytest.raises(tasklock.LockLostError):
        sem.release()


def test_extend_and_reacquire_move_only_this_permit(r: redis.Redis) -> None:
    a = tasklock.Semaphore(r, "ext", 2, timeout=5)
    b = tasklock.Semaphore(r, "ext", 2, timeout=5)
    assert a.acquire()
    assert b.acquire()
    a.extend(100)
    left = {h.fence: s for h, s in a.holders()}
    assert left[a.fence] is not None
    assert left[a.fence] > 100
    assert left[b.fence] is not None
    assert left[b.fence] <= 5
    assert r.pttl("ext") > 100_000  # the set lives as long as its longest permit
    b.reacquire()
    a.release()
    b.release()
    with pytest.raises(tasklock.LockError):
        a.extend(1)


def test_a_lowered_limit_keeps_the_holders_and_admits_nobody_new(r: redis.Redis) -> None:
    held = [tasklock.Semaphore(r, "tenant", 3, timeout=30) for _ in range(3)]
    for s in held:
        assert s.acquire()
    lowered = tasklock.Semaphore(r, "tenant", 2, timeout=30)
    assert not lowered.acquire(blocking=False)
    assert all(s.extend(1) for s in held)  # the holders above the new limit keep their permits
    held[0].release()
    assert not lowered.acquire(blocking=False)  # 2 still hold: at the new limit
    held[1].release()
    assert lowered.acquire(blocking=False)
    lowered.release()
    held[2].release()


def test_a_lock_and_a_semaphore_on_one_name_exclude_each_other(r: redis.Redis) -> None:
    """A task whose limit changes between 1 and N in a deployment: old and new workers share the
    name as a Lock and as a Semaphore; neither kind gets in beside the other, and nothing fails."""
    lock = tasklock.Lock(r, "moving", timeout=10)
    sem = tasklock.Semaphore(r, "moving", 3, timeout=10)
    assert lock.acquire()
    assert not sem.acquire(blocking=False)
    assert sem.locked()
    [(holder, _)] = sem.holders()
    assert holder.fence == lock.fence
    lock.release()
    assert sem.acquire(blocking=False)
    assert not lock.acquire(blocking=False)
    assert lock.locked()
    sem.release()
    assert lock.acquire(blocking=False)
    lock.release()


def test_keys_share_one_cluster_slot(r: redis.Redis) -> None:
    sem = tasklock.Semaphore(r, "jobs:{acct-7}:export", 2)
    assert sem.fence_key == fence_key_for("jobs:{acct-7}:export")
    assert sem.acquire()
    assert r.type("jobs:{acct-7}:export") == b"zset"
    sem.release()


@pytest.mark.parametrize("limit", [0, -1, 1.5, "3", True, None])
def test_a_bad_limit_is_refused(r: redis.Redis, limit: object) -> None:
    with pytest.raises(tasklock.ConfigurationError, match="limit"):
        tasklock.Semaphore(r, "bad", limit)  # type: ignore[arg-type]


def test_threads_share_one_object_and_each_take_a_permit(r: redis.Redis) -> None:
    sem = tasklock.Semaphore(r, "threads", 2, timeout=10)
    inside, peak, lock = [0], [0], threading.Lock()

    def work() -> None:
        for _ in range(5):
            with sem:
                with lock:
                    inside[0] += 1
                    peak[0] = max(peak[0], inside[0])
                time.sleep(0.005)  # (the body's work; not synchronisation)
                with lock:
                    inside[0] -= 1

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert peak[0] == 2


# -- recorded histories, many processes and threads, holders killed mid-hold ---------------------

LIMIT = 3


def _contend(port: int, rounds: int, threads: int, history: str) -> None:
    log = HistoryLog(history)
    client = redis.Redis(port=port)

    def one_thread() -> None:
        sem = tasklock.Semaphore(client, "pool", LIMIT, timeout=10)
        for _ in range(rounds):
            requested = time.monotonic_ns()
            assert sem.acquire(blocking_timeout=60)
            start = time.monotonic_ns()
            time.sleep(0.002)  # the body's work
            end = time.monotonic_ns()
            fence = sem.fence
            sem.release()
            log.record(Hold("pool", fence, start, end, os.getpid(), requested))

    workers = [threading.Thread(target=one_thread) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def test_processes_and_threads_never_exceed_the_limit(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    history = tmp_path / "history.jsonl"
    processes, threads, rounds = 4, 3, 10
    run_processes(
        _contend, [(redis_server.port, rounds, threads, str(history))] * processes, timeout=120
    )
    holds = HistoryLog(history).holds()
    assert len(holds) == processes * threads * rounds
    assert assert_at_most(holds, LIMIT) == LIMIT  # the limit was reached, and never passed
    assert_later_holds_fenced_higher(holds)


def _hold_until_killed(port: int, started: str) -> None:
    """Take a permit (renewed by the watchdog), say so, and hold it until SIGKILLed."""
    # watchdog=True: an explicit timeout alone turns the watchdog off (redis-py's meaning), and
    # a permit that expired by itself after 1 s while the test still counted it as held made a
    # slow start of the contenders look like LIMIT + 1 holders at once.
    sem = tasklock.Semaphore(redis.Redis(port=port), "pool", LIMIT, timeout=1, watchdog=True)
    requested = time.monotonic_ns()
    assert sem.acquire(blocking_timeout=30)
    Path(started).write_text(f"{requested} {time.monotonic_ns()} {sem.fence}")
    threading.Event().wait()


def test_killed_holders_permits_come_back_and_the_limit_holds(
    redis_server: RedisServer, r: redis.Redis, tmp_path: Path
) -> None:
    """Two holders are SIGKILLed mid-hold; their permits free within their 1 s TTL without anyone's
    help, while living contenders keep running. Each killed hold is recorded from its start until
    its process was gone; the whole history never shows more than LIMIT at once."""
    history = tmp_path / "history.jsonl"
    log = HistoryLog(history)
    ctx = get_context("spawn")
    victims = []
    for i in range(2):
        started = tmp_path / f"victim-{i}"
        proc = ctx.Process(target=_hold_until_killed, args=(redis_server.port, str(started)))
        proc.start()
        victims.append((proc, started))
    for _proc, started in victims:
        eventually(started.exists, timeout=30, what="the victim holds a permit")
    contenders = [
        ctx.Process(target=_contend, args=(redis_server.port, 8, 2, str(history))) for _ in range(2)
    ]
    for proc in contenders:
        proc.start()
    eventually(lambda: len(log.holds()) >= 4, timeout=60, what="contenders ran beside the victims")
    for proc, started in victims:
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        requested, start, fence = map(int, started.read_text().split())
        log.record(Hold("pool", fence, start, time.monotonic_ns(), proc.pid, requested))
    for proc in contenders:
        proc.join(120)
        assert proc.exitcode == 0
    holds = log.holds()
    assert len(holds) == 2 * 2 * 8 + 2
    assert_at_most(holds, LIMIT)
    assert_later_holds_fenced_higher(holds)
    eventually(lambda: not r.exists("pool"), timeout=10, what="the killed permits expired")
